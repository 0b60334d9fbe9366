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


def describe_environment(command: list[str]) -> dict[str, Any]:
    from trainready import __version__

    versions: dict[str, Any] = {"trainready": __version__, "python": platform.python_version()}
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
        versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except ImportError:
        versions["torch"] = None
    return {"versions": versions, "host": socket.gethostname(), "platform": platform.platform(),
            "cwd": os.getcwd(), "executable": sys.executable, "git": git_info(command),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
