"""The layers of ../shared/architecture.md, checked on the code (issue 25): every import in src/trainready, at the
top of a module or inside a function (a lazy import is still a dependency), goes down or sideways, never up, and
no module reaches itself again through its imports. `if TYPE_CHECKING:` imports are annotations only and are left
out. The package root is the public facade (`trainready.init()` reaches run.session), so nothing inside imports
it: the version lives in trainready.version, on the floor."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "trainready"

# lowest first; a module may import its own layer and those below it
LAYERS = {
    "errors": 0, "io": 0, "dist": 0, "parent_death": 0, "version": 0, "limits": 0, "clock": 0,
    "catalog": 1,
    "plan": 2, "cloud": 2,
    "store": 3, "data": 3,
    "run": 4, "check": 4,
    "report": 5,
    "cli": 6, "schemas": 6,
    "": 7, "__main__": 7,  # the package root (the facade: __version__, init) and `python -m trainready`
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def owner(name: str) -> str:
    """The module an imported name lives in: `trainready.io.redact` -> itself; `trainready.io.files.X` -> files."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for n in ast.walk(node) if n is not node}
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(owner(a.name) for a in node.names if a.name.split(".")[0] == "trainready")
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.split(".")[0] == "trainready":
                found.update(owner(f"{target}.{a.name}") for a in node.names)
    return found - {module, ""}


@functools.cache
def graph() -> dict[str, set[str]]:
    """Every module's imports, parsed when a test first asks (not at collection, in every xdist worker)."""
    return {m: imports(m, p) for m, p in MODULES.items()}


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def test_every_module_has_a_layer():
    assert sorted({m.split(".")[1] for m in MODULES if "." in m} - set(LAYERS)) == []


def test_no_import_goes_up_a_layer():
    upward = sorted(f"{m} imports {t}" for m, targets in graph().items() for t in targets if layer(t) > layer(m))
    assert upward == []


def test_no_module_imports_the_package_root():
    assert sorted(m for m, targets in graph().items() if "trainready" in targets) == []


def test_no_import_cycle():
    """Tarjan's strongly connected components: any with two or more modules is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph()[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph():
        if v not in index:
            visit(v)
    assert circles == []


def test_the_checker_sees_what_it_should():
    """The walk itself: relative, lazy and aliased imports are found, TYPE_CHECKING ones are not."""
    launcher = graph()["trainready.run.launcher"]
    assert "trainready.io" in launcher or "trainready.io.files" in launcher
    assert "trainready.run.session" in graph()["trainready"]  # inside init(): lazy
    assert "trainready.plan.hf_config" not in graph()["trainready.plan.hf_moe"]  # under TYPE_CHECKING only
    assert "trainready.plan.hf_moe" in graph()["trainready.plan.hf_config"]  # `from . import hf_moe`


def test_importing_any_module_changes_no_process_state():
    """issue 25: importing trainready does no work on the process: no warnings filter (dcp_io installed one),
    no logging handler or level, no signal handler. Every module, in a fresh interpreter."""
    import subprocess
    import sys

    names = sorted(m for m in MODULES if not m.endswith("__main__"))  # those run a command when imported
    # what other libraries do on import (torch and numpy add warnings filters) is theirs: imported first
    others = sorted(third_party_imports())
    probe = f"""
import logging, signal, sys, warnings, importlib
for name in {others!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
def state():
    return (list(warnings.filters), list(logging.getLogger().handlers), logging.getLogger().level,
            list(logging.getLogger("trainready").handlers), {{s: signal.getsignal(s) for s in
            (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)}})
before = state()
for name in {names!r}:
    try:
        importlib.import_module(name)
    except ImportError as exc:  # an optional dependency this environment lacks
        print("skipped", name, exc, file=sys.stderr)
after = state()
changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
print(changed)
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", (proc.stdout, proc.stderr[-2000:])


def third_party_imports() -> set[str]:
    """The modules of other packages that ours import at their top level."""
    import sys

    found: set[str] = set()
    for path in MODULES.values():
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found.update(n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"trainready"})
    return found


def test_init_leaves_the_root_logger_alone():
    import subprocess
    import sys

    probe = """
import logging, sys
from trainready.run.session import _show_our_log
_show_our_log()
print(len(logging.getLogger().handlers), logging.getLogger().level, len(logging.getLogger("trainready").handlers))
logging.getLogger("trainready.store").info("before the script configures logging")
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="script %(message)s")  # after init(), as scripts do
logging.getLogger("trainready.store").info("after")
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["0", str(logging_warning()), "1"], proc.stderr[-2000:]
    assert proc.stderr.count("before the script configures logging") == 1, proc.stderr
    assert proc.stderr.count("after") == 1 and "script after" in proc.stderr, proc.stderr  # once, the script's way


def logging_warning() -> int:
    import logging

    return logging.WARNING


def test_the_readmes_default_run_directory_is_ignored_by_git():
    """issue 25: `runs/` (where `trainready run` writes by default) must never be committed by accident."""
    import subprocess

    repo = ROOT.parents[1]
    if not (repo / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "check-ignore", "-q", "runs/x/run.json"], cwd=repo, timeout=30)
    assert proc.returncode == 0
