"""What run.json records about where a run ran: versions, host, git commit of the code."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info(command: list[str]) -> dict[str, Any] | None:
    """The commit of the repository holding the training script (or the working directory)."""
    script = next((Path(a) for a in command[1:] if a.endswith(".py") and Path(a).exists()), None)
    where = (script.resolve().parent if script else Path.cwd())
    commit = _git(where, "rev-parse", "HEAD")
    if commit is None:
        return None
    dirty = _git(where, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(dirty), "repo": _git(where, "rev-parse", "--show-toplevel")}


def torch_versions() -> dict[str, Any]:
    """torch's, its CUDA's and NCCL's versions without importing torch: the launch is billed, and
    `import torch` in the launcher took 2-3 s before any worker started. From the installed
    package's metadata and torch/version.py (read as text, not run); NCCL from the
    nvidia-nccl-cu* wheel torch depends on (None when torch links another NCCL)."""
    import ast
    import importlib.metadata as md
    import importlib.util

    out: dict[str, Any] = {"torch": None, "cuda": None, "nccl": None}
    try:
        out["torch"] = md.version("torch")
        spec = importlib.util.find_spec("torch")
    except (md.PackageNotFoundError, ImportError, ValueError):
        return out
    for location in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse(Path(location, "version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])[:1]
            target = targets[0] if targets else None
            if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
                out["cuda"] = node.value.value
    if out["cuda"]:
        for dist in md.distributions():
            name = (dist.metadata["Name"] or "").lower()
            if name.startswith("nvidia-nccl-cu"):
                out["nccl"] = dist.version
                break
    return out


def describe_environment(command: list[str]) -> dict[str, Any]:
    from trainready.version import __version__

    versions: dict[str, Any] = {"trainready": __version__, "python": platform.python_version(), **torch_versions()}
    return {"versions": versions, "host": socket.gethostname(), "platform": platform.platform(),
            "cwd": os.getcwd(), "executable": sys.executable, "git": git_info(command),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
