"""Who killed a process with SIGKILL, where the machine can say: the kernel's OOM killer counts its kills per
memory cgroup (cgroup v2 `memory.events` oom_kill, v1 `memory.oom_control` oom_kill), and the boot id tells a
machine restart from a kill. The launcher notes both when a launch begins; a SIGKILL seen later (a worker's exit,
or the launcher itself gone without recording its end) is then attributed: the OOM killer when this cgroup's count
rose meanwhile, else something outside trainready. Every read is of a small kernel file and may fail: None
(unknown), never an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _read(path: Path, limit: int = 65536) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None


def boot_id() -> str | None:
    text = _read(BOOT_ID, 100)
    return (text.strip() or None) if text else None


def _cgroup_files(proc_cgroup: str) -> list[Path]:
    """The files holding this process's memory cgroup's oom_kill counter, most specific first."""
    out: list[Path] = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2, the unified hierarchy
            out += [CGROUP_ROOT / rel / "memory.events", CGROUP_ROOT / "memory.events"]
        elif "memory" in controllers.split(","):  # cgroup v1
            out += [CGROUP_ROOT / "memory" / rel / "memory.oom_control", CGROUP_ROOT / "memory" / "memory.oom_control"]
    return out


def oom_kills() -> dict[str, Any] | None:
    """{"file": where it was read, "count": the OOM killer's kills in this process's memory cgroup}, or None."""
    text = _read(PROC_CGROUP)
    if text is None:
        return None
    for path in _cgroup_files(text):
        events = _read(path)
        if events is None:
            continue
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return {"file": str(path), "count": int(value.strip())}
    return None


def at_launch() -> dict[str, Any]:
    """What a launch notes when it begins (run.json's launch entry: boot_id, oom_kill)."""
    return {"boot_id": boot_id(), "oom_kill": oom_kills()}


def sigkill_cause(noted: dict[str, Any]) -> str | None:
    """Who sent a SIGKILL seen now, from what the launch noted when it began: the OOM killer, something outside
    trainready, or None (unknown: nothing was noted, or the counter cannot be read now)."""
    before = noted.get("oom_kill") if isinstance(noted, dict) else None
    if not isinstance(before, dict) or type(before.get("count")) is not int or not isinstance(before.get("file"), str):
        return None
    now = oom_kills()
    if now is None or now["file"] != before["file"]:
        return None
    if now["count"] > before["count"]:
        return (f"sent by the kernel's OOM killer: host memory ran out, {now['count'] - before['count']} kill(s) in "
                f"this memory cgroup since the launch began, per {now['file']}")
    return ("sent from outside trainready (kill -9, a scheduler, a node agent): not by this memory cgroup's OOM "
            "killer, whose kill count did not change")


def restarted_since(noted: dict[str, Any]) -> bool | None:
    """Whether the machine booted again since the launch began (its boot id changed); None when unknown."""
    then = noted.get("boot_id") if isinstance(noted, dict) else None
    now = boot_id()
    if not isinstance(then, str) or now is None:
        return None
    return then != now
