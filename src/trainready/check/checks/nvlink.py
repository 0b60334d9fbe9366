"""NVLink: the pattern of links between GPU pairs (topo -m) and every link's state (nvlink -s)."""

from __future__ import annotations

from ..facts import Facts
from ..facts.gpu import TOPO
from ..registry import Verdict, check
from .common import first_line, has_nvlink, presence


@check("gpu.nvlink-topology", "gpu", needs=(TOPO,), gpu=True)
def nvlink_topology(f: Facts) -> Verdict | None:
    topo, ctx = f.nvlink.topo, f.ctx
    if topo is None:
        return None
    n = len(topo.gpus)
    if n == 0:  # GPUs are there (gpu.count), this output does not show them: unreadable, not evidence
        line = topo.problems[0] if topo.problems else first_line(f.paste(TOPO).text)[:120]
        return Verdict("warn", observed="no GPU rows parsed", expected="a GPU matrix", unverified=True,
                       reason=f"unreadable: could not parse nvidia-smi topo -m ({TOPO}): {line}",
                       advice="run `nvidia-smi topo -m` by hand; a driver that cannot list GPUs needs reinstalling")
    pairs = topo.nvlink_pairs()
    counts = sorted(set(pairs.values()))
    observed = f"{n} GPUs; NVLink per pair: " + (", ".join(f"NV{c}" if c else "none" for c in counts) or "none")
    if topo.truncated:
        observed += " (output truncated)"
    matrix = ctx.instance.expected_nvlink if ctx.instance else None
    if matrix is None:
        return Verdict("warn" if ctx.instance is None else "skip", observed=observed, expected="unknown",
                       reason="instance type unknown" if ctx.instance is None else
                       f"the catalog does not know {ctx.instance.name}'s NVLink pattern",
                       advice="pass --instance TYPE" if ctx.instance is None else "compare with the vendor's diagram")
    short = []
    for i in range(min(n, len(matrix))):
        for j in range(i + 1, min(n, len(matrix))):
            want, got = matrix[i][j], pairs.get((i, j))
            if got is not None and got < want:
                short.append(f"GPU{i}-GPU{j} NV{got} (want NV{want})" if got else f"GPU{i}-GPU{j} none (want NV{want})")
    v = Verdict("pass", observed=observed, expected=_describe_expected(ctx.instance.name, matrix))
    if short:
        v.status = "fail"
        v.reason = f"{len(short)} GPU pairs with fewer NVLinks than {ctx.instance.name} has: " + "; ".join(short[:6])
        v.advice = "NVLink/NVSwitch fault: all-reduce falls back to slower paths; stop/start the instance or drain the node"
    elif topo.truncated:
        v.status, v.partial = "warn", True
        v.reason = "output truncated: the pairs shown match, the rest could not be judged"
        v.advice = "collect the full `nvidia-smi topo -m` output"
    else:
        v.reason = _why_ok(matrix)
    return v


def _describe_expected(name: str, matrix: list[list[int]]) -> str:
    values = sorted({v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j})
    if values == [0]:
        return f"no NVLink ({name} is PCIe-only)"
    if len(values) == 1:
        return f"NV{values[0]} between every pair (NVSwitch)"
    return "hybrid cube-mesh: " + ", ".join(f"NV{v}" if v else "SYS (no NVLink)" for v in values) + " by pair"


def _why_ok(matrix: list[list[int]]) -> str:
    values = {v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j}
    if values == {0}:
        return "PCIe-only instance: no NVLink is expected; GPU-GPU traffic crosses PCIe/host (slower all-reduce)"
    if 0 in values:
        return ("matches the V100 hybrid cube-mesh: some pairs have no NVLink and go through PCIe/the CPU, "
                "so all-reduce rings must route around them (what NCCL does)")
    return "every pair has the expected NVLinks"


@check("gpu.nvlink-links", "gpu", needs=("nvidia-smi-nvlink-s.txt",), applies=has_nvlink, decisive=True, gpu=True)
def nvlink_links(f: Facts) -> Verdict | None:
    facts, ctx = f.nvlink, f.ctx
    status = facts.status
    if facts.mig_refused:
        return Verdict.skip(f"links unknown: {facts.mig_refused}", "read the links with MIG off, or trust the MIG layout")
    if status is None:
        return None
    if not status.gpus:
        return Verdict("warn", observed="no NVLink status parsed", expected="every link active", unverified=True,
                       reason="unreadable: nvidia-smi-nvlink-s.txt" + (f": {status.problems[0]}" if status.problems else ""),
                       advice="run `nvidia-smi nvlink -s` by hand")
    want = ctx.gpu.nvlink_links if ctx.gpu else None
    speed = ctx.gpu.nvlink_link_gbps if ctx.gpu else None
    counts = {i: g.active_links for i, g in status.gpus.items()}
    most = max(counts.values())
    inactive, slow = [], []
    for index, gpu in sorted(status.gpus.items()):
        down = [link.id for link in gpu.links if not link.active]
        if down and (want or most):  # a GPU with links down while it (or another GPU) has active ones
            inactive.append(f"GPU{index} link{'s' if len(down) > 1 else ''} {_ids(down)} inactive")
        if speed:  # a link that trained at a lower rate is as bad as a missing one for all-reduce
            slow += [f"GPU{index} link {link.id} at {link.speed_gbps:g} GB/s (want {speed:g})"
                     for link in gpu.links if link.active and link.speed_gbps is not None and link.speed_gbps < 0.9 * speed]
    few = {i: c for i, c in counts.items() if want and c < want and not any(x.startswith(f"GPU{i} ") for x in inactive)}
    others = presence(f).count  # a cut-short listing: the GPUs it does not show are unknown
    short_listing = bool(others and presence(f).exact and len(status.gpus) < others)
    elided = facts.elided or bool(status.problems) or short_listing
    v = Verdict("pass", observed="active links per GPU: " + ", ".join(sorted({str(c) for c in counts.values()})),
                expected=f"{want} active links per GPU at {speed:g} GB/s" if want and speed else
                f"{want} active links per GPU" if want else "the same active links on every GPU")
    if not most and not want:
        v.status = "warn"
        v.reason = ("no GPU has an active NVLink: a PCIe card without bridges (expected), or every link down: "
                    "pass --instance TYPE to tell")
        v.advice = "pass --instance TYPE"
    elif inactive or slow or (few and not elided):
        v.status = "fail"
        parts = inactive[:8] + slow[:4] + [f"GPU{i} has {c} of {want}" for i, c in list(few.items())[:4]]
        v.reason = "; ".join(parts) + ("" if want else f" (other GPUs have {most} active)")
        v.advice = "an NVLink is down: GPU-GPU bandwidth drops; stop/start the instance or drain the node"
    elif elided:
        v.status, v.partial = "warn", True
        v.reason = ((f"nvlink -s shows {len(status.gpus)} of {others} GPUs" if short_listing else "the output is elided or cut") +
                    " (links not shown are unknown); the links shown are active" +
                    (": " + "; ".join(f"GPU{i} shows {c} of {want}" for i, c in list(few.items())[:4]) if few else ""))
        v.advice = "collect the full `nvidia-smi nvlink -s` output"
    else:
        v.reason = "every link active"
    return v


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:6])) + (f" (+{len(ids) - 6})" if len(ids) > 6 else "")

