"""NVIDIA's Xid codes as data (data/xid.toml, each entry with its source) and the rule that turns one
kernel line into a severity: the line's own words first (NVLink5's Fatal/Nonfatal, Xid 154's new
recovery action, "caused by previous Xid N"), then the catalog."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict

from .parsers.kernel import XidEvent

Severity = Literal["fail", "warn"]


class XidInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    # hardware | application | driver | thermal | nvlink | memory | consequence
    class_: str
    severity: Severity
    action: str | None = None
    source: str
    note: str = ""


@functools.cache
def catalog() -> dict[int, XidInfo]:
    data = tomllib.loads(resources.files("trainready.check").joinpath("data/xid.toml").read_text())
    sources = data.get("sources", {})
    out = {}
    for code, entry in data["xid"].items():
        info = XidInfo.model_validate({**{k: v for k, v in entry.items() if k != "class"}, "class_": entry["class"]})
        if info.source not in sources:
            raise ValueError(f"xid.toml: Xid {code} names source {info.source!r}, not in [sources]")
        out[int(code)] = info
    return out


@dataclass(frozen=True)
class Judged:
    severity: Severity
    why: str  # the name, and what decided the severity
    root: int | None = None  # the Xid that caused this one, when the line names it


def judge(event: XidEvent) -> Judged:
    table = catalog()
    info = table.get(event.code)
    name = info.name if info else "not in NVIDIA's Xid catalog as read into data/xid.toml"
    if 144 <= event.code <= 150 and event.word:
        return Judged("fail" if event.word == "fatal" else "warn",
                      f"{name} ({event.word}: the NVLink5 message's own word decides, per NVIDIA's Xid catalog)")
    if event.code == 154 and event.recovery:
        done = event.recovery.startswith("0x0")
        return Judged("warn" if done else "fail", f"{name}: recovery action now {event.recovery}" +
                      ("" if done else " (the GPU is not fit until it is done)"))
    if event.previous is not None:
        cause = table.get(event.previous)
        severity: Severity = cause.severity if cause else "warn"
        return Judged(severity, f"{name}, caused by Xid {event.previous}" +
                      (f" ({cause.name}, {cause.class_})" if cause else ""), root=event.previous)
    if info is None:
        return Judged("warn", name)
    return Judged(info.severity, f"{name} ({info.class_}" + (f"; NVIDIA: {info.action}" if info.action else "") + ")")
