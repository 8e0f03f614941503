"""The ```python blocks of README.md and docs/*.md, and a runner that runs each as a script.

Every block is a whole script a reader can copy into a file and run: it imports what it
uses, defines every name, and closes what it opens. A block that is not meant to run (a
signature, a set-up that needs what `make demo` does not build) says so where a reader sees
it, on the line before the block:

    <!-- not run: the signature, with every default -->
    ```python

`tests/e2e/test_docs_snippets.py` runs every other block against a test server and counts
the marked ones, so that they cannot grow unnoticed; `make first-hour` (scripts/first_hour.py)
runs the README's as a newcomer does.

`python scripts/doc_snippets.py --serve` is the runner the test uses: it imports what the
blocks import once (OpenEnv's `openenv.core` alone takes 10-15 s of CPU: it imports gradio),
then for each request (a JSON line on stdin: the block's file, its environment, where its
output goes) forks a child that runs the file as `__main__` and ends as a script does
(non-daemon threads joined, atexit handlers run), and answers a JSON line with its exit
status and seconds. Each block gets a process of its own; only the imports are shared.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The line before a block that is not run, and why: `<!-- not run: REASON -->`.
NOT_RUN = re.compile(r"<!-- not run: (?P<why>[^>]+?) -->")
_BLOCK = re.compile(r"^```python[^\n]*\n(?P<code>.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Snippet:
    """One ```python block: where it is, its code, and why it is not run (None: it runs)."""

    doc: str  # the file, relative to the repository: "README.md", "docs/trainers.md"
    line: int  # the line of its opening fence
    code: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and docs/*.md, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def snippets(path: Path, root: Path = ROOT) -> list[Snippet]:
    """The ```python blocks of one Markdown file."""
    text = path.read_text()
    found = []
    for block in _BLOCK.finditer(text):
        before = text[: block.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marked = NOT_RUN.fullmatch(before.strip())
        found.append(
            Snippet(
                doc=str(path.relative_to(root)),
                line=text.count("\n", 0, block.start()) + 1,
                code=block.group("code"),
                not_run=marked.group("why") if marked else None,
            )
        )
    return found


def all_snippets(root: Path = ROOT) -> list[Snippet]:
    return [s for path in doc_files(root) for s in snippets(path, root)]


# -- the runner (--serve)

#: What the blocks import, loaded once before the first fork.
PRELOAD = ("openenv.core", "openenv", "denv", "denv.openenv", "httpx", "asyncio")


def serve() -> None:
    """Answer run requests on stdin, one child process per request (see the docstring)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    _answer({"ready": True, "threads": threading.active_count()})
    for line in sys.stdin:
        request = json.loads(line)
        if threading.active_count() != 1:  # a fork would copy a thread's locks mid-use
            _answer({"error": f"{threading.active_count()} threads in the runner"})
            continue
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _become(request)  # runs the block, then exits as a script does: never returns
        status = _wait(pid, float(request.get("timeout_s", 300)))
        _answer({**status, "seconds": round(time.monotonic() - started, 3)})


def _become(request: dict[str, object]) -> None:
    """In the child: the block's environment and output, then the block as `__main__`."""
    import runpy

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out = os.open(str(request["out"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})  # type: ignore[call-overload]
    os.chdir(str(request["cwd"]))
    path = str(request["path"])
    sys.argv = [path]
    runpy.run_path(path, run_name="__main__")
    # The block ended: leave the interpreter the way a script does (SystemExit unwinds this
    # process's stack to the top; threading joins non-daemon threads, atexit runs).
    raise SystemExit(0)


def _wait(pid: int, timeout_s: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"returncode": -9, "timeout": True}
        time.sleep(0.05)


def _answer(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()  # before the next fork: a child must not inherit unwritten output


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        for s in all_snippets():
            print(f"{s.name}\t{'not run: ' + s.not_run if s.not_run else 'runs'}")
