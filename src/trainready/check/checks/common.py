"""What several checks share: whether there is a GPU at all, where a check applies, how to name a
missing file. Checks import this module, never each other."""

from __future__ import annotations

import re

from trainready.errors import printable

from ..facts import Facts
from ..facts.gpu import smi_q
from ..parsers import node
from ..facts.presence import Presence, presence  # noqa: F401  (the checks ask through this module)
from ..registry import Verdict

NO_GPU_ADVICE = "install the NVIDIA driver (nvidia-smi must run), or run on a GPU node"
RECOLLECT = "a bundle from an older trainready: collect it again (trainready check collect --out DIR)"
ROOT = "collect the bundle again as root there: sudo trainready check collect --out DIR"


def settings(f: Facts) -> list[node.GpuSettings]:
    """Per-GPU settings of nvidia-smi -q (persistence, clocks, VBIOS, GSP, MIG)."""
    return node.gpu_settings(smi_q(f))


def unparsed(parsed, text: str) -> str:
    """What could not be read, shown: the parser's first problem, else the first line."""
    problems = getattr(parsed, "problems", None) or []
    if problems:
        return f": {problems[0]}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "(empty)")
    return f": first line {first[:120]!r}"


def has_nvswitch(f: Facts) -> str | None:
    """Applies where the instance has NVSwitches (p4d, p4de, p5*, p6): the fabric manager is needed."""
    if f.ctx.instance is not None and f.ctx.instance.topology != "nvswitch":
        return f"{f.ctx.instance.name} has no NVSwitch (its GPUs need no fabric manager)"
    return None


def has_nvlink(f: Facts) -> str | None:
    if f.ctx.gpu is not None and not f.ctx.gpu.has_nvlink:
        return f"{f.ctx.gpu.name} has no NVLink"
    return None


def missing(f: Facts, name: str) -> Verdict:
    """Skip: the file a check reads is not in the bundle. A manifest without a record of its probe
    means a trainready older than the probe collected the bundle: say so, and how to get it."""
    bundle = f.bundle
    if name not in bundle.files and name not in bundle.refused and bundle.manifest is not None \
            and bundle.record(name) is None and bundle.source != "live":
        return Verdict.skip(f"{name} was not collected: the bundle's manifest has no such probe "
                            f"(trainready {printable(bundle.manifest.tool_version)} collected it)", RECOLLECT)
    return Verdict.skip(bundle.why_missing(name), RECOLLECT if bundle.probe_state(name) == "unknown"
                        and bundle.source != "live" else "")


def kernel_unreadable(f: Facts) -> Verdict:
    if f.bundle.source == "live":
        return Verdict.skip("kernel log not readable (dmesg needs root here)", "sudo trainready check")
    return Verdict.skip(f"kernel log was not readable on {f.bundle.machine} (dmesg needs root there)", ROOT)


def gpus(indices: list) -> str:
    return ", ".join(map(str, indices[:16])) + (f" and {len(indices) - 16} more" if len(indices) > 16 else "")


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "(empty output)")[:160]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


_SPACES = re.compile(r"\s+")


def squeeze(text: str, limit: int = 500) -> str:
    text = _SPACES.sub(" ", text).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."
