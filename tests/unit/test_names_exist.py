"""Every module, file and folder that the handwritten text names still exists (issue 44).

Code moved between modules many times; the words about it did not always follow. This scans
the docstrings and comments of the handwritten Python (denv/, adapters/openenv/, bench/,
scripts/, tests/, examples/, envs/), and the shell scripts, the docs (README.md, docs/*.md,
bench/README.md, envs/*/README.md), pyproject.toml and the Makefiles, for three kinds of
names, and fails listing each one that names nothing, as ``file:line: name``:

- dotted module paths, ``denv.server.lifecycle.envs`` or ``denv_api_client.models``, maybe
  followed by attributes (``denv.server.db.Store``). They are resolved on disk, in the
  packages' source folders as pyproject.toml maps them, never imported; the first attribute
  must be one of the module's top-level names (read with ``ast``). ``denv`` is also every
  example's client (``denv.fork(...)``) and the prefix of labels (``denv.managed``), so a
  ``denv.`` path is only checked when its first part is one of denv's modules;
- relative paths of files or folders: ``docker/live/netns.py``, ``node/seam/``,
  ``tests/e2e/test_warm.py``, ``tests/server/test_server_node_seam`` (a module, no
  ``.py``). A path with a folder in it counts as existing when some file or folder of the
  repo ends with it (text names a module from the folder it is talking about). A single
  folder (``docs/``) in a Python file must resolve against the repo root, denv/,
  denv/server/, denv/cluster/, denv/client/, adapters/openenv/, or the folder of the file
  or any folder above it; in a doc, anywhere in the repo. URLs, absolute, ``~`` and
  templated or globbed paths (``<state>/x``, ``DIR/x``, ``test_*.py``, ``x.{json,md}``),
  host names (``ghcr.io/``) and FOREIGN_PATHS (other projects' trees) are skipped;
- bare file names, ``relay.py``: some file of the repo has that name (or that name plus
  ``.tmpl``: what an export writes), or it is one of FOREIGN_FILES.

Code itself is not scanned: the interpreter, mypy and the other tests check its names.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PY_GLOBS = (
    "denv/**/*.py",
    "adapters/openenv/**/*.py",
    "bench/**/*.py",
    "scripts/*.py",
    "tests/**/*.py",
    "examples/*.py",
    "envs/**/*.py",
)
TEXT_GLOBS = (
    "scripts/*.sh",
    "images/*.sh",
    "README.md",
    "docs/*.md",
    "bench/README.md",
    "envs/*/README.md",
    "pyproject.toml",
    "Makefile",
    "mk/*.mk",
)

#: Import packages and their source folders (pyproject.toml's package-dir).
PACKAGES = {
    "denv": ROOT / "denv",
    "denv.openenv": ROOT / "adapters" / "openenv",
    "denv_api_client": ROOT / "generated" / "denv_api_client",
}

#: Where a single folder named in a Python file may be, besides its folder and those above.
BASES = tuple(
    ROOT / p for p in ("", "denv", "denv/server", "denv/cluster", "denv/client", "adapters/openenv")
)

#: Endings that make a relative path a file of ours worth checking.
_TEXT_EXTENSIONS = {"py", "sh", "md", "txt", "tmpl", "html", "js", "css"}
FILE_EXTENSIONS = frozenset({*_TEXT_EXTENSIONS, "yaml", "yml", "toml", "json", "cfg", "ini"})

#: Folders never walked for the repo's files (nor is any dot folder: .git, .venv, caches).
SKIPPED_FOLDERS = frozenset({"build", "node_modules", "__pycache__"})

#: Other trees' paths: the Harbor task an export writes (docs/export.md), Docker Hub's
#: ``library/``, a server's or Docker's state folders, a Debian root's, the installed wheel's,
#: OpenEnv's envs.
FOREIGN_PATHS = frozenset(
    {
        "envs/echo_env",
        "tests/Dockerfile",
        "tests/test.sh",
        "library/",
        "image-refs/",
        "fs/",
        "overlay2/l/",
        "docs/man/locale",
        "denv/openenv/",
    }
)
FOREIGN_PATH_STARTS = ("environment/",)  # the Harbor task's, with whatever follows

#: Other projects' file names: the team's design notes (not in this repo), a reader's script.
FOREIGN_FILES = frozenset({"DESIGN.md", "block.py"})

DOTTED = re.compile(r"(?<![\w.$/=-])(denv(?:_api_client)?(?:\.[A-Za-z_]\w*)+)(?![\w-]|\.\w)")
_SEG = r"\w[\w.+-]*"
#: Not after a character that makes it part of a URL, an absolute path, a template or glob;
#: not before one that does (``test_*.py``, ``x.{json,md}``, ``<id>``).
_NOT_BEFORE = r"(?<![\w./:~$@%{}<>*\\=-])"
_NOT_AFTER = r"(?![\w*{}<>$@/\\-]|\.[\w*{])"
PATH = re.compile(rf"{_NOT_BEFORE}((?:\.\.?/)*{_SEG}(?:/{_SEG})*/(?:{_SEG})?){_NOT_AFTER}")
BARE = re.compile(rf"{_NOT_BEFORE}([\w-]+\.(?:py|sh|md)){_NOT_AFTER}")


def _sources() -> Iterator[tuple[Path, bool]]:
    for pattern in PY_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            if "__pycache__" not in path.parts:
                yield path, True
    for pattern in TEXT_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            yield path, False


def _texts(path: Path, is_python: bool) -> Iterator[tuple[int, str]]:
    """(first line, text) of each docstring and comment of a Python file, each line of others.

    A docstring is a string that is a statement of its own (a module's, a class's, a
    function's or an attribute's), told apart from the strings of code by the tokens around it.
    """
    source = path.read_text()
    if not is_python:
        yield from enumerate(source.splitlines(), start=1)
        return
    statement_start = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
    before = tokenize.NEWLINE
    candidate: tokenize.TokenInfo | None = None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
            continue
        if token.type == tokenize.NL:
            continue
        if candidate is not None and token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            yield candidate.start[0], candidate.string
        candidate = token if token.type == tokenize.STRING and before in statement_start else None
        before = token.type


def _bound(body: list[ast.stmt]) -> Iterator[str]:
    """The names a block binds, through its if/try/with blocks (not inside defs)."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                yield alias.asname or alias.name.split(".")[0]
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        else:
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _bound([s for s in inner if isinstance(s, ast.stmt)])
            for handler in getattr(node, "handlers", []):
                yield from _bound(handler.body)


@cache
def _top_level_names(module: Path) -> frozenset[str] | None:
    """The names a module binds at its top; None when it may have any (``*``, ``__getattr__``)."""
    names = frozenset(_bound(ast.parse(module.read_text()).body))
    return None if "*" in names or "__getattr__" in names else names


def _submodule(folder: Path, part: str) -> tuple[Path, bool] | None:
    """The package (its folder, True) or module (its file, False) ``part`` of ``folder``."""
    if (folder / part / "__init__.py").is_file():
        return folder / part, True
    if (folder / f"{part}.py").is_file():
        return folder / f"{part}.py", False
    return None


def dotted_exists(name: str) -> bool | None:
    """Whether a dotted path names a module (and attribute); None when it is not a module path."""
    dotted, *rest = name.split(".")
    here, is_package = PACKAGES[dotted], True
    if dotted == "denv" and (
        not rest or (f"denv.{rest[0]}" not in PACKAGES and _submodule(here, rest[0]) is None)
    ):
        return None  # a client (denv.fork), a label (denv.managed), a host (denv.test)
    while rest and is_package:
        dotted = f"{dotted}.{rest[0]}"
        found = (PACKAGES[dotted], True) if dotted in PACKAGES else _submodule(here, rest[0])
        if found is None:
            break
        (here, is_package), rest = found, rest[1:]
    if not rest:
        return True
    names = _top_level_names(here / "__init__.py" if is_package else here)
    return names is None or rest[0] in names


@cache
def _repo_paths() -> tuple[frozenset[str], frozenset[str]]:
    """Every trailing part of every file's and folder's path (``a/b/c``: ``c``, ``b/c``, ...),
    and every file's name."""
    tails: set[str] = set()
    names: set[str] = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".") and d not in SKIPPED_FOLDERS and not d.endswith(".egg-info")
        ]
        names.update(files)
        for entry in (*dirs, *files):
            parts = Path(folder, entry).relative_to(ROOT).parts
            tails.update("/".join(parts[i:]) for i in range(len(parts)))
    return frozenset(tails), frozenset(names)


def _is_ours(ref: str) -> bool:
    """Whether a relative path looks like one of this repo's, to be checked."""
    parts = ref.rstrip("/").split("/")
    first, last = parts[0], parts[-1]
    if ref in FOREIGN_PATHS or ref.startswith(FOREIGN_PATH_STARTS):
        return False
    if len(first) < 2 or first.isupper() or ("." in first and first not in (".", "..")):
        return False  # sed's s/, a placeholder (DIR/), a host (ghcr.io/)
    extension = last.rsplit(".", 1)[1] if "." in last.strip(".") else ""
    return ref.endswith("/") or extension in FILE_EXTENSIONS or (ROOT / first).is_dir()


def path_exists(ref: str, mentioned_in: Path, is_python: bool) -> bool | None:
    """Whether a relative path names a file or folder here; None when it is not one of ours."""
    if not _is_ours(ref):
        return None
    tails, _ = _repo_paths()
    folders = [*BASES, *(p for p in mentioned_in.parents if p.is_relative_to(ROOT))]
    if any((base / ref).exists() for base in folders):
        return True
    clean = "/".join(p for p in ref.split("/") if p not in ("", ".", ".."))
    if "/" not in clean and is_python:
        return False  # one folder of a module's text: where the module is, not anywhere
    return clean in tails or f"{clean}.py" in tails


def file_name_exists(name: str) -> bool:
    _, names = _repo_paths()
    return name in FOREIGN_FILES or name in names or f"{name}.tmpl" in names


def missing_names() -> list[str]:
    missing: list[str] = []
    for path, is_python in _sources():
        where = path.relative_to(ROOT)
        for first_line, text in _texts(path, is_python):
            for offset, line in enumerate(text.splitlines()):
                at = f"{where}:{first_line + offset}"
                for match in DOTTED.finditer(line):
                    if dotted_exists(match.group(1)) is False:
                        missing.append(f"{at}: {match.group(1)}")
                for match in PATH.finditer(line):
                    ref = match.group(1).rstrip(".")  # a sentence's full stop
                    if path_exists(ref, path, is_python) is False:
                        missing.append(f"{at}: {ref}")
                for match in BARE.finditer(line):
                    if not file_name_exists(match.group(1)):
                        missing.append(f"{at}: {match.group(1)}")
    return missing


def test_every_named_module_and_file_exists() -> None:
    missing = missing_names()
    assert not missing, "names of modules or files that do not exist:\n" + "\n".join(missing)


def test_the_check_tells_stale_names_from_live_ones() -> None:
    here = ROOT / "denv" / "server" / "docker" / "__init__.py"
    assert dotted_exists("denv.server.lifecycle.render") is False  # moved to api/render.py
    assert dotted_exists("denv.server.api.render") is True
    assert dotted_exists("denv.server.db.Store") is True
    assert dotted_exists("denv.server.db.NoSuchThing") is False
    assert dotted_exists("denv.openenv.state") is True  # adapters/openenv/state.py
    assert dotted_exists("denv_api_client.models.no_such_model") is False
    assert dotted_exists("denv.fork") is None  # a client's method, not a module
    assert path_exists("lifecycle/render.py", here, True) is False
    assert path_exists("docker/live/netns.py", here, True) is True
    assert path_exists("live/launcher/", here, True) is True
    assert path_exists("launcher/", here, True) is False  # now live/launcher/
    assert path_exists("tests/server/test_server_node_seam", here, True) is True
    assert [m.group(1) for m in PATH.finditer("see /tmp/a/b.py, https://x.org/a/b.py")] == []
    assert [m.group(1) for m in PATH.finditer("tests/e2e/test_*.py and x/y.{json,md}")] == []
    assert file_name_exists("relay.py") and not file_name_exists("live_apart.py")
