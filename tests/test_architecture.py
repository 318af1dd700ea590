"""The shape of the code, checked: import contracts, module sizes, no reaching into another
class's private members, and a package that imports where fcntl and resource do not exist."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "galahad_desktop"


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


def test_the_library_uses_no_private_member_of_another_class() -> None:
    """`self._x` is a class's own business; `other._x` reaches into another object."""
    offenders = []
    for path in (PACKAGE / "memory").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
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
