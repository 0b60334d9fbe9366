"""The bench scripts (bench/*.py) loaded as modules, for the tests that check what they compute."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


@cache
def bench_module(name: str) -> ModuleType:
    """bench/<name>.py as a module, loaded once per test process (registered in sys.modules first: its dataclasses
    look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
