"""Every module under bench/ imports, reaches no private name of denv, and says how it is run.

The smoke (tests/e2e/test_bench_smoke.py) runs the benchmarks in `bench.__main__.BENCHMARKS`;
the scripts beside them (`python -m bench.bench_cluster`, the soak, the probes in
bench/live_fork_probe/ ...) run in no test, so a denv internal they import that was renamed
went unnoticed until someone ran them (issue 44). Here, without Docker or root:

- every module imports, in an interpreter of its own: the `bench` package's modules by name,
  each script in a folder that is no package (the probes) by its path, its folder first on
  sys.path as `python bench/live_fork_probe/<probe>.py` has it; and the denv imports of the
  code a module runs as a string (`python -c`, a subprocess's program) resolve;
- no module reaches a private name (a leading underscore) of denv: `from denv.x import _y`,
  `import denv._x`, `._y` on a name imported from denv or on an object made by one
  (`store = Store(...)`, then `store._conn()`), `getattr(that, "_y")`, or a string naming a
  private module of denv. The bench's own `_helpers` are its business;
- each module's docstring says how it is run: a benchmark of `BENCHMARKS` by
  `python -m bench --only <name>`, a script (`if __name__ == "__main__":`) by its command.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
FILES = sorted(p for p in BENCH.rglob("*.py") if "__pycache__" not in p.parts)
IMPORT_TIMEOUT_S = 300.0  # importing OpenEnv alone takes seconds on a busy 2-core machine
# A namedtuple's public methods, which carry an underscore so as not to clash with its fields.
NAMEDTUPLE_API = {"_asdict", "_field_defaults", "_fields", "_make", "_replace"}
Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def module_name(path: Path) -> str | None:
    """`bench.x` for a module of the bench package (every folder down to it a package), None
    for a script in a folder that is no package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    for depth in range(1, len(parts)):
        if not (ROOT.joinpath(*parts[:depth]) / "__init__.py").is_file():
            return None
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_denv(module: str | None) -> bool:
    return module is not None and (module == "denv" or module.startswith("denv."))


def code_strings(tree: ast.AST) -> Iterator[tuple[int, ast.Module]]:
    """(line, tree) of each string in `tree` that is Python that imports: the code a module
    runs in another process (`python -c`, a subprocess's program)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "import" not in node.value:
                continue
            try:
                code = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            if any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(code)):
                yield node.lineno, code


def denv_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, statement) of each import of denv in `tree`, one statement per name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and is_denv(node.module):
            for alias in node.names:
                yield node.lineno, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if is_denv(alias.name):
                    yield node.lineno, f"import {alias.name}"


# --- private reaches ----------------------------------------------------------------------


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` of a name or of a chain of attributes on one, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def own_nodes(scope: Scope) -> Iterator[ast.AST]:
    """The nodes of a module's or a function's body; a function in it is yielded, not entered."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, FUNCTIONS):
            todo.extend(ast.iter_child_nodes(node))


@dataclass
class Binding:
    """What a name is bound to: an expression, a denv import (`denv`), a type (`annotation`),
    or something that is never denv's (all None: a loop's item, *args)."""

    value: ast.expr | None = None
    annotation: ast.expr | None = None
    denv: bool = False


@dataclass
class Reaches:
    """The private names of denv that a module (or a code string in one) reaches.

    A name is denv's when it is imported from denv, or bound (anywhere in its scope: this is
    not a flow analysis) to a call of, a public attribute of, or an await of something of
    denv's, or is a parameter annotated with a type of denv's. An attribute bound so
    (`self.store = Store(...)`) counts in the whole module: a method reads what __init__ set.
    """

    where: str  # the file, for the messages
    offset: int = 0  # for a code string: the line its string starts on, less one
    found: list[str] = field(default_factory=list)
    attributes: set[str] = field(default_factory=set)
    reporting: bool = False

    def check(self, tree: ast.Module) -> list[str]:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and is_denv(node.module):
                assert node.module is not None
                if any(is_private(part) for part in node.module.split(".")):
                    self.report(node, f"`from {node.module} import ...`: a private module")
                for alias in node.names:
                    if is_private(alias.name):
                        self.report(node, f"`from {node.module} import {alias.name}`")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if is_denv(alias.name) and any(map(is_private, alias.name.split("."))):
                        self.report(node, f"`import {alias.name}`: a private module")
        self.walk(tree, set())  # finds the attributes bound in every scope
        self.reporting = True
        self.walk(tree, set())
        return self.found

    def report(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.where}:{getattr(node, 'lineno', 0) + self.offset}: {what}")

    def walk(self, scope: Scope, outer: set[str]) -> None:
        known = self.known(scope, outer)
        for node in own_nodes(scope):
            if isinstance(node, FUNCTIONS):
                self.walk(node, known)
            elif self.reporting and self.reaches(node, known):
                self.report(node, f"`{ast.unparse(node)}` reaches a private name of denv")

    def reaches(self, node: ast.AST, known: set[str]) -> bool:
        if isinstance(node, ast.Attribute):
            return (
                is_private(node.attr)
                and node.attr not in NAMEDTUPLE_API
                and self.derived(node.value, known)
            )
        if isinstance(node, ast.Call):
            name, args = dotted(node.func), node.args
            return (
                name in ("getattr", "setattr", "hasattr", "delattr")
                and len(args) >= 2
                and isinstance(args[1], ast.Constant)
                and isinstance(args[1].value, str)
                and is_private(args[1].value)
                and self.derived(args[0], known)
            )
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return bool(re.fullmatch(r"denv(\.\w+)+", node.value)) and any(
                map(is_private, node.value.split("."))
            )
        return False

    def known(self, scope: Scope, outer: set[str]) -> set[str]:
        """The names of denv's things in `scope`: the outer scope's it does not bind again,
        and those it binds to one of denv's things (until there are no more)."""
        bound: dict[str, list[Binding]] = {}
        for name, binding in self.bindings(scope):
            bound.setdefault(name, []).append(binding)
        known = {n for n in outer if n not in bound} | self.attributes
        while more := {
            name
            for name, bindings in bound.items()
            if name not in known and any(self.denv_thing(b, known) for b in bindings)
        }:
            known |= more
            self.attributes |= {name for name in more if "." in name}
        return known

    def bindings(self, scope: Scope) -> Iterator[tuple[str, Binding]]:
        if isinstance(scope, FUNCTIONS):
            args = scope.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                yield arg.arg, Binding(annotation=arg.annotation)
            for rest in (args.vararg, args.kwarg):
                if rest is not None:
                    yield rest.arg, Binding()  # a tuple, a dict: not denv's
        for node in own_nodes(scope):
            if isinstance(node, ast.ImportFrom | ast.Import):
                absolute = isinstance(node, ast.Import) or node.level == 0
                for alias in node.names:
                    module = node.module if isinstance(node, ast.ImportFrom) else alias.name
                    name = alias.asname or alias.name.split(".")[0]
                    yield name, Binding(denv=absolute and is_denv(module))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    yield from self.target(target, Binding(value=node.value))
            elif isinstance(node, ast.AnnAssign):
                yield from self.target(node.target, Binding(node.value, node.annotation))
            elif isinstance(node, ast.NamedExpr):
                yield from self.target(node.target, Binding(value=node.value))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                yield from self.target(node.optional_vars, Binding(value=node.context_expr))
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                yield from self.target(node.target, Binding())

    def target(self, target: ast.expr, binding: Binding) -> Iterator[tuple[str, Binding]]:
        if isinstance(target, ast.Tuple | ast.List):
            for item in target.elts:  # a, b = ...: neither is followed
                yield from self.target(item, Binding())
        elif (name := dotted(target)) is not None:
            yield name, binding

    def denv_thing(self, binding: Binding, known: set[str]) -> bool:
        return (
            binding.denv
            or self.derived(binding.value, known)
            or self.typed(binding.annotation, known)
        )

    def derived(self, node: ast.expr | None, known: set[str]) -> bool:
        """Whether `node` is one of denv's things: a name of one, a call of one, a public
        attribute of one, one awaited."""
        if node is None:
            return False
        if dotted(node) in known:
            return True
        if isinstance(node, ast.Attribute):
            return not is_private(node.attr) and self.derived(node.value, known)
        if isinstance(node, ast.Call):
            return self.derived(node.func, known)
        if isinstance(node, ast.Await):
            return self.derived(node.value, known)
        return False

    def typed(self, annotation: ast.expr | None, known: set[str]) -> bool:
        """Whether an annotation is a type of denv's: `Store`, `Store | None`, "Store"."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return False
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            return self.typed(annotation.left, known) or self.typed(annotation.right, known)
        return self.derived(annotation, known)


def private_reaches(source: str, where: str) -> list[str]:
    """Each private name of denv that `source` (a module, and the code strings in it)
    reaches, as `file:line: what`."""
    tree = ast.parse(source)
    found = Reaches(where).check(tree)
    for line, code in code_strings(tree):
        found += Reaches(where, offset=line - 1).check(code)
    return found


# --- the tests ----------------------------------------------------------------------------

IMPORTER = """
import importlib, importlib.util, json, os, sys, traceback

tasks = json.loads(sys.stdin.read())
failed = {}


def attempt(key, load):
    try:
        load()
    except BaseException:  # SystemExit too: importing must not exit
        failed[key] = traceback.format_exc()


def script(path, name):
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


for key, name in tasks["modules"]:
    attempt(key, lambda: importlib.import_module(name))
for key, statement in tasks["statements"]:
    attempt(key, lambda: exec(statement, {}))
for key, path, name in tasks["scripts"]:  # last: they put their folders on sys.path
    attempt(key, lambda: script(path, name))
with open(tasks["out"], "w") as out:
    json.dump(failed, out)
"""


@pytest.fixture(scope="module")
def import_failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """{what: traceback} of each bench module, and each denv import of a code string in one,
    that failed to import, all in one interpreter of their own (started from the checkout)."""
    out = tmp_path_factory.mktemp("bench-imports") / "failed.json"
    tasks: dict[str, object] = {"out": str(out)}
    modules, statements, scripts = [], [], []
    for path in FILES:
        name = module_name(path)
        if name is not None:
            modules.append([rel(path), name])
        else:
            alias = "bench_script_" + "_".join(path.relative_to(BENCH).with_suffix("").parts)
            scripts.append([rel(path), str(path), alias])
        for line, code in code_strings(ast.parse(path.read_text())):
            for code_line, statement in denv_imports(code):
                statements.append([f"{rel(path)}:{line + code_line - 1}: {statement}", statement])
    tasks.update(modules=modules, statements=statements, scripts=scripts)
    done = subprocess.run(
        [sys.executable, "-c", IMPORTER],
        input=json.dumps(tasks),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
    )
    assert done.returncode == 0 and out.is_file(), (
        f"the importer exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    failed: dict[str, str] = json.loads(out.read_text())
    return failed


def benchmarks() -> dict[str, list[str]]:
    """{module: its benchmarks' names} of `BENCHMARKS` in bench/__main__.py (`"start":
    bench_start.run`), read from its source: the smoke runs these."""
    for node in ast.parse((BENCH / "__main__.py").read_text()).body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if target is None or dotted(target) != "BENCHMARKS":
            continue
        assert isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict)
        found: dict[str, list[str]] = {}
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            assert isinstance(key, ast.Constant) and isinstance(value, ast.Attribute), value
            assert isinstance(value.value, ast.Name), ast.unparse(value)
            found.setdefault(value.value.id, []).append(str(key.value))
        return found
    raise AssertionError("bench/__main__.py has no BENCHMARKS = {...}")


def test_every_file_is_found() -> None:
    names = {rel(p) for p in FILES}
    assert {"bench/__main__.py", "bench/bench_console.py", "bench/harness.py"} <= names
    assert "bench/live_fork_probe/p5_fork8_phases.py" in names  # the probes' folder too
    assert set(benchmarks()) <= {p.stem for p in FILES if p.parent == BENCH}


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_imports(path: Path, import_failures: dict[str, str]) -> None:
    """The module imports, and so do the denv names the code strings in it import."""
    mine = {k: v for k, v in import_failures.items() if k.split(":")[0] == rel(path)}
    assert not mine, "\n".join(f"{key}:\n{trace}" for key, trace in mine.items())


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_no_private_reach(path: Path) -> None:
    found = private_reaches(path.read_text(), rel(path))
    assert not found, "\n".join(["private names of denv (use its public API):", *found])


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_says_how_it_is_run(path: Path) -> None:
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc, f"{rel(path)} has no docstring"
    names = benchmarks().get(path.stem, []) if path.parent == BENCH else []
    if names:
        pattern = rf"python -m bench\b.*--only [\w,]*\b({'|'.join(names)})\b"
        assert re.search(pattern, doc), (
            f"{rel(path)}'s docstring does not say `python -m bench --only {names[0]}`"
        )
    main = any(
        isinstance(node, ast.If) and "__name__ == '__main__'" in ast.unparse(node.test)
        for node in tree.body
    )
    if main:
        command = rf"\S*{path.stem}\.py\b"  # python bench/live_fork_probe/p1_fork_inside.py
        name = module_name(path)
        if name is not None:  # python -m bench.bench_cluster, python -m bench
            command += rf"|-m\s+{re.escape(name.removesuffix('.__main__'))}\b"
        assert re.search(rf"python3?\s+({command})", doc), (
            f"{rel(path)} runs as a script; its docstring does not say the command"
        )


# Each line marked `# reach` reaches a private name of denv; no other line does.
REACHES = '''
import denv.server._hidden  # reach
from denv import Denv
from denv.cluster import local
from denv.openenv import DenvProvider, _waits  # reach
from denv.server import db
from denv._cli_common import helper  # reach
from .harness import _bench_private, start_server

local._nodes  # reach


def run(server: Server, provider: DenvProvider | None, store: "db.Store") -> None:
    api = Denv(server.url, server.api_key)
    api._client.get("/")  # reach
    version = api.get_env("e").version
    version._raw  # reach
    server._proc  # the bench's own Server
    _bench_private()
    provider._binding  # reach
    store._conn()  # reach
    db._connect  # reach
    getattr(api, "_lease")  # reach
    sys.modules["denv.openenv._connection"]  # reach
    db.Record(1)._replace(x=2)  # a namedtuple's method


def loop(items: list[Item]) -> None:
    for api in items:
        api._x  # not denv's here


class Runner:
    def __init__(self) -> None:
        self.api = Denv("u", "k")

    def go(self, local: Path) -> None:
        self.api._client  # reach
        local._x  # a parameter, not the module denv.cluster.local
        return lambda: self.api._y  # reach


CODE = """
import sys
from denv.server._secret import thing  # reach
"""
'''


def test_the_check_finds_each_kind_of_reach() -> None:
    source = textwrap.dedent(REACHES)
    found = private_reaches(source, "x.py")
    lines = sorted(int(line.split(":")[1]) for line in found)
    marked = [n for n, line in enumerate(source.splitlines(), 1) if line.endswith("# reach")]
    assert lines == marked, "\n".join(found)
