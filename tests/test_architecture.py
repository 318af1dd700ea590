"""The shape of the code, checked: import contracts, module sizes, no reaching into another
class's private members, and a package that imports where fcntl and resource do not exist."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "galahad_desktop"


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a module, parsed once for all the checks here."""
    return tuple(ast.walk(ast.parse(path.read_text())))


def test_import_contracts_hold() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_module_is_over_700_lines() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
    }
    assert {k: v for k, v in sizes.items() if v > 700} == {}


def test_no_function_is_over_80_lines() -> None:
    """A function that long does several things; each gets its own name (there were 7)."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for path in PACKAGE.rglob("*.py")
        for node in _nodes(path)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > 80
    ]
    assert long == []


def test_the_library_uses_no_private_member_of_another_class() -> None:
    """`self._x` is a class's own business; `other._x` reaches into another object (another
    library's objects included: llama-cpp-python's `Llama` is not reached into either)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in _nodes(path):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and ast.unparse(node) != "os._exit"  # the standard library's own exit call
            ):
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert offenders == []


def test_memory_asks_storage_and_never_reaches_into_its_tables_or_ciphers() -> None:
    """Storage owns its catalog and its field cipher; the memory layer asks the vault and
    its records (`vault.catalog.update(...)`, `vault.fields.decrypt_bytes(...)` were 7)."""
    offenders = []
    for path in (PACKAGE / "memory").rglob("*.py"):
        for node in _nodes(path):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("catalog", "fields")
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "vault"
            ):
                offenders.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert offenders == []


BLOCKER = """
import importlib, importlib.abc, pkgutil, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("fcntl", "resource", "termios", "grp", "pwd"):
            raise ImportError(f"{name} does not exist on this platform")
        return None
sys.meta_path.insert(0, Block())
for name in ("fcntl", "resource"):
    sys.modules.pop(name, None)
import galahad_desktop
failed = []
for info in pkgutil.walk_packages(galahad_desktop.__path__, "galahad_desktop."):
    if info.name.endswith("__main__"):
        continue  # running the program is not importing it
    try:
        importlib.import_module(info.name)
    except ImportError as exc:
        failed.append(f"{info.name}: {exc}")
print("\\n".join(failed) or "all imported")
"""


@pytest.mark.model  # slow for the fast tier: it starts processes (runs in the full suite)
def test_every_module_imports_without_posix_only_modules() -> None:
    """Windows and macOS: fcntl and resource (POSIX/Linux) must not be needed to import."""
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"QT_QPA_PLATFORM": "offscreen", "PATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "all imported", proc.stdout


WINDOWS_FLAGS = """
import os, sys
os.O_BINARY = 0x8000  # as on Windows; on Linux x86-64 the same bit is O_LARGEFILE (harmless)
from galahad_desktop.system import files
seen = []
real_open = os.open
os.open = lambda path, flags, *mode: seen.append(flags) or real_open(path, flags, *mode)
target = sys.argv[1]
with files.atomic_file(__import__("pathlib").Path(target + ".atomic")) as handle:
    handle.write(b"x\\n")
os.close(files.open_private(__import__("pathlib").Path(target + ".private")))
writes = [flags for flags in seen if flags & os.O_WRONLY]
print(len(writes) == 2 and all(flags & 0x8000 for flags in writes), len(seen))
"""


def test_every_write_path_opens_binary_on_windows(tmp_path: Path) -> None:
    """Block files, backups and downloads are written through system.files.open_private,
    which asks for O_BINARY where the platform has one (text mode would write \\r\\n)."""
    proc = subprocess.run(
        [sys.executable, "-c", WINDOWS_FLAGS, str(tmp_path / "f")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[0] == "True", proc.stdout
    writers = []
    for path in PACKAGE.rglob("*.py"):
        for node in _nodes(path):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "os.open"
                and "O_WRONLY" in ast.unparse(node)
                and "devnull" not in ast.unparse(node)
            ):
                writers.append(str(path.relative_to(PACKAGE)))
    # The window's log file is text; every stored byte goes through open_private.
    assert sorted(writers) == ["ui/app.py"], writers


def test_peak_memory_is_read_in_the_platforms_unit() -> None:
    from galahad_dev.bench import maxrss_mb

    assert maxrss_mb(2 * 2**20, "darwin") == 2.0  # bytes on macOS
    assert maxrss_mb(2048, "linux") == 2.0  # KiB on Linux


def test_a_bounded_child_sets_its_own_limits() -> None:
    """No preexec_fn (unsafe with threads): the child reads its limits and sets them."""
    probe = (
        "import resource; from galahad_desktop.system.child import apply_own_limits;"
        "print(apply_own_limits(), resource.getrlimit(resource.RLIMIT_AS)[0])"
    )
    from galahad_desktop.system.child import run_bounded

    done = run_bounded([sys.executable, "-c", probe], 30, 1024)
    assert done.returncode == 0
    limits, address_space = done.stdout.decode().rsplit(" ", 1)
    assert int(address_space) == 1024 * 2**20
    assert limits == f"({1024 * 2**20}, 31)"
    assert "preexec_fn=" not in (PACKAGE / "system" / "child.py").read_text()


def test_every_public_facade_method_says_what_it_does() -> None:
    """The facade is the core's one API (window, command and server call it): each public
    method carries a docstring."""
    import inspect

    from galahad_desktop.memory.galahad import Galahad

    silent = [
        name
        for name, member in inspect.getmembers(Galahad)
        if not name.startswith("_") and callable(member) and not inspect.getdoc(member)
    ]
    assert silent == []


def _imports_of(path: Path, module: str) -> set[str]:
    """The package's modules a module imports (at any depth of its code)."""
    found: set[str] = set()
    for node in _nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("galahad_desktop.")} - {module}


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Type-only imports count too: a circle there is a circle in the design (a Protocol
    beside the callee breaks it, as vault/held.py does for custody and the audit)."""
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    graph = {m: _imports_of(p, m) & modules.keys() for m, p in modules.items()}
    circles = []
    for start in graph:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert circles == []


NO_LLAMA = """
import sys
import galahad_desktop.memory.results, galahad_desktop.engine.protocol, galahad_dev.fake_engine
print(sorted(m for m in sys.modules if m == "llama_cpp" or m.startswith("llama_cpp.")))
"""


@pytest.mark.model  # it starts a process (runs in the full suite)
def test_the_results_the_protocol_and_the_fake_engine_load_no_llama_cpp() -> None:
    """The engine's value types live apart from the modules that load llama.cpp: the
    window's result types and the fast tier's fake engine import without it."""
    proc = subprocess.run(
        [sys.executable, "-c", NO_LLAMA], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_only_engine_native_holds_llama_cpp_handles() -> None:
    """One adapter owns llama.cpp's model, context and batch: no `Llama` object anywhere
    in the package, and no function of llama_cpp replaced at run time."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in _nodes(path):
            text = ast.unparse(node) if isinstance(node, ast.Attribute | ast.Assign) else ""
            if isinstance(node, ast.Attribute) and text in ("llama_cpp.Llama",):
                offenders.append(f"{path.name}:{node.lineno} {text}")
            if isinstance(node, ast.Assign) and any(
                ast.unparse(t).startswith("llama_cpp.") for t in node.targets
            ):
                offenders.append(f"{path.name}:{node.lineno} {text}")
    assert offenders == []


def test_the_typed_table_names_are_the_catalogs_tables() -> None:
    """Records takes a table as names.Table, so mypy refuses a misspelt one; the Literal
    and the catalog's declarations are one list."""
    from typing import get_args

    from galahad_desktop.vault.catalog import ENCRYPTED
    from galahad_desktop.vault.names import Table

    assert list(get_args(Table)) == list(ENCRYPTED)
