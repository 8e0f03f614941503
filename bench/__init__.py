"""denv's benchmarks (`make bench`, `make bench-quick`): measured side by side, never asserted.

Run ``python -m bench --help``. Each benchmark module (``bench_*.py``) measures one claim
against its alternative in the same run and returns a JSON-able result; ``bench.report``
turns the result files into ``results/SUMMARY.md`` and PNG plots.
"""
