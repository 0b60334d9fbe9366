"""Who killed a process with SIGKILL, where the machine can say: the kernel's OOM killer counts its kills per
memory cgroup (cgroup v2 `memory.events` oom_kill, v1 `memory.oom_control` oom_kill), and the boot id tells a
machine restart from a kill. The launcher notes both when a launch begins; a SIGKILL seen later (a worker's exit,
or the launcher itself gone without recording its end) is then attributed: the OOM killer when this cgroup's count
rose meanwhile, else something outside trainready. Every read is of a small kernel file and may fail: None
(unknown), never an error."""

from __future__ import annotations

import os
import socket
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


def pid_namespace() -> str | None:
    """This process's pid namespace ('pid:[4026531836]'): a launcher's pid means something only inside it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def at_launch() -> dict[str, Any]:
    """What a launch notes when it begins (run.json's launch entry): where its pid can be looked up (host, pid
    namespace), the boot, and its memory cgroup's OOM-kill count."""
    return {"host": socket.gethostname(), "pid_ns": pid_namespace(), "boot_id": boot_id(), "oom_kill": oom_kills()}


def seen_from_here(noted: dict[str, Any]) -> bool:
    """Whether this process can tell that launch's fate: the same host and pid namespace (another machine reading a
    shared run directory, or a container's /proc, would see its pid as gone while it runs)."""
    return (isinstance(noted, dict) and noted.get("host") == socket.gethostname()
            and noted.get("pid_ns") is not None and noted.get("pid_ns") == pid_namespace())


def sigkill_cause(noted: dict[str, Any]) -> str | None:
    """Who sent a SIGKILL seen now, from what the launch noted when it began: the OOM killer, something outside
    trainready, or None (unknown: nothing was noted, or the counter cannot be read now)."""
    before = noted.get("oom_kill") if isinstance(noted, dict) else None
    if (not isinstance(before, dict) or type(before.get("count")) is not int or before["count"] < 0
            or not isinstance(before.get("file"), str)):
        return None
    now = oom_kills()
    if now is None or now["file"] != before["file"] or now["count"] < before["count"]:
        return None
    if now["count"] > before["count"]:  # a kill in the cgroup, not necessarily of ours: said as likely, not as fact
        return (f"most likely by the kernel's OOM killer: {now['count'] - before['count']} OOM kill(s) in this "
                f"memory cgroup since the launch began (its memory limit, or the host's memory; {now['file']})")
    return ("not by the OOM killer of this memory cgroup (its OOM kill count did not change): by something outside "
            "trainready, e.g. kill -9, a scheduler or a node agent")


def restarted_since(noted: dict[str, Any], later: dict[str, Any] | None = None) -> bool | None:
    """Whether the machine booted again after the launch began: its boot id against the next launch's on the same
    host (`later`), else against now; None when that cannot be known here (another host or pid namespace)."""
    then = noted.get("boot_id") if isinstance(noted, dict) else None
    if not isinstance(then, str):
        return None
    if isinstance(later, dict) and isinstance(later.get("boot_id"), str) and later.get("host") == noted.get("host"):
        return later["boot_id"] != then
    if not seen_from_here(noted):
        return None
    now = boot_id()
    return None if now is None else then != now


def vanished_as(noted: dict[str, Any], later: dict[str, Any] | None = None) -> str | None:
    """The status of a launch that recorded no end: "interrupted" (the machine restarted), "killed" (the same boot:
    a signal the launcher cannot record), or None (unknown from here)."""
    return {True: "interrupted", False: "killed"}.get(restarted_since(noted, later))
