"""`--deep` measurements of one node, judged against thresholds.py: bf16 GEMM, host<->device copies,
memory bandwidth, GPU-to-GPU copies, hot-tier write/read.

Each figure is judged against thresholds.py: a sourced floor fails the node below it; a derived one
(no source covers the node) warns first and fails only far below, and says it is derived."""

from __future__ import annotations

from statistics import median

from ..facts import Facts
from ..parsers import node
from ..registry import Verdict, check
from ..thresholds import (
    GEMM_FAIL_BEHIND_BEST,
    GEMM_FAIL_OF_PEAK,
    GEMM_FALL_WARN,
    GEMM_PASS_OF_PEAK,
    GEMM_WARN_BEHIND_BEST,
    Kind,
    size_text,
    threshold,
)

DEEP = "trainready check --deep"

def _measured(ctx, key: str) -> dict | Verdict:
    data = ctx.deep(key)
    if data is None:
        return Verdict.skip("no deep.json (run with --deep)" if ctx.bundle.text("deep.json") is None else
                    f"not measured (deep.json has no {key}: collected by an older trainready)", DEEP)
    if not isinstance(data, dict) or data.get("skipped") or data.get("error"):
        why = (data.get("skipped") or data.get("error")) if isinstance(data, dict) else "unreadable"
        return Verdict.skip(f"not measured: {why}")
    return data


def _no_floor(observed: str, ctx) -> Verdict:
    return Verdict(status="warn", observed=observed, expected="unknown",
                   reason=f"no figure to judge by ({ctx.unknown_instance if ctx.instance is None else 'no datasheet numbers'})",
                   advice="pass --instance TYPE")


def _per_gpu(ctx, key: str, fields: list[tuple[str, Kind, str]], what: str, advice: str) -> Verdict:
    data = _measured(ctx, key)
    if isinstance(data, Verdict):
        return data
    rows = [r for r in data.get("gpus", []) if isinstance(r, dict)]
    if not rows:
        return Verdict.skip(f"deep.json {key} has no per-GPU rows")
    observed, bad, expected, statuses = [], [], [], []
    for field, kind, label in fields:
        values = {r.get("index"): node.gbps(r.get(field)) for r in rows}
        values = {i: v for i, v in values.items() if v is not None}
        if not values:
            continue
        observed.append(f"{label} min {min(values.values()):.1f} / median {median(values.values()):.1f} GB/s")
        th = threshold(kind, ctx.instance, ctx.gpu)
        if th is None:
            continue
        expected.append(f"{label} {th.describe()}")
        for index, value in sorted(values.items(), key=lambda kv: str(kv[0])):
            status = th.judge(value)
            statuses.append(status)
            if status != "pass":
                bad.append(f"GPU {index} {label} {value:.1f} GB/s")
    size = data.get("bytes")
    observed_text = "; ".join(observed) + (f" ({len(rows)} GPUs, {size_text(size)})" if isinstance(size, int) and size > 0 else "")
    if not observed:
        return Verdict.skip(f"deep.json {key} has no readable figures")
    if not expected:
        return _no_floor(observed_text, ctx)
    status = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "pass"
    v = Verdict(status=status, observed=observed_text, expected="; ".join(expected)[:400])
    v.reason = (f"{what} below the floor: " + "; ".join(bad[:8])) if bad else f"every GPU's {what} at or above the floor"
    if status != "pass":
        v.advice = advice
    return v


@check("gpu.h2d-d2h", "gpu", deep=True)
def host_copies(f: Facts) -> Verdict | None:
    ctx = f.ctx
    return _per_gpu(ctx, "copy", [("h2d_gbps", "h2d", "H2D"), ("d2h_gbps", "d2h", "D2H")],
                    "host<->device bandwidth",
                    "check gpu.pcie (link width/generation), the CPU/NUMA the process ran on (nvidia-smi topo -m), "
                    "and IOMMU settings; a GPU alone below its peers is a bad slot: stop/start the instance")


@check("gpu.memory-bandwidth", "gpu", deep=True)
def memory_bandwidth(f: Facts) -> Verdict | None:
    ctx = f.ctx
    return _per_gpu(ctx, "memory", [("gbps", "memory", "copy")], "memory bandwidth",
                    "check gpu.throttle and gpu.clocks (memory clock); a GPU alone below its peers: drain the node")


@check("gpu.p2p", "gpu", deep=True)
def p2p(f: Facts) -> Verdict | None:
    ctx = f.ctx
    data = _measured(ctx, "p2p")
    if isinstance(data, Verdict):
        return data
    pairs = [p for p in data.get("pairs", []) if isinstance(p, dict) and node.gbps(p.get("gbps")) is not None]
    if not pairs:
        return Verdict.skip("deep.json p2p has no pairs")
    values = [node.gbps(p["gbps"]) for p in pairs]
    observed = f"{len(pairs)} ordered pairs: min {min(values):.1f} / median {median(values):.1f} GB/s"
    th = threshold("p2p", ctx.instance, ctx.gpu)
    if th is None:
        return _no_floor(observed, ctx)
    judged = [(p, th.judge(node.gbps(p["gbps"]))) for p in pairs]
    no_peer = [p for p in pairs if p.get("peer_access") is False]
    bad = [p for p, status in judged if status != "pass"]
    status = "fail" if any(s == "fail" for _, s in judged) else "warn" if bad else "pass"
    if no_peer and ctx.gpu is not None and ctx.gpu.has_nvlink and status == "pass":
        status = "warn"
    v = Verdict(status=status, observed=observed, expected=th.describe())
    slow = _slow_gpus(bad)
    v.reason = ("pairs below the floor: " + "; ".join(f"GPU{p['src']}->GPU{p['dst']} {node.gbps(p['gbps']):.1f}"
                                                              for p in bad[:8]) + (f" (common to all: GPU {slow})" if slow else "")
                      if bad else "every pair at or above the floor")
    if no_peer:
        v.reason += f"; peer access off for {len(no_peer)} pair(s) (copies go through host memory)"
    if status != "pass":
        v.advice = "check gpu.nvlink-links and nvswitch.fabric; one GPU in every slow pair is the bad one: drain the node"
    return v


def _slow_gpus(bad: list[dict]) -> str:
    """A GPU that is in every slow pair, when there is one (it is the one at fault)."""
    if len(bad) < 2:
        return ""
    common = set.intersection(*({p.get("src"), p.get("dst")} for p in bad))
    return ", ".join(str(g) for g in sorted(common, key=str)) if common else ""



def _gemm_gpus(data: dict) -> tuple[list[tuple[str, float, float | None]], str]:
    """(GPU label, steady TFLOP/s, first-window TFLOP/s or None) per GPU from deep.json's gemm, each field
    checked (a hostile or broken file gives fewer rows, not a crash); and a note for a file that measured GPU 0
    only (trainready before every GPU was measured)."""
    number = node.gbps  # deep.json's one reader of a figure: finite, non-negative, bounded, else None
    rows = []
    gpus = data.get("gpus")
    if isinstance(gpus, list):
        for g in gpus[:64]:
            if not isinstance(g, dict) or number(g.get("tflops")) is None:
                continue
            index = g.get("index")
            label = f"GPU{index}" if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 64 else "GPU?"
            rows.append((label, number(g["tflops"]), number(g.get("first_tflops"))))
        return rows, ""
    if number(data.get("tflops")) is not None:
        return [("GPU0", number(data["tflops"]), None)], "GPU 0 only, for about 0.1 s (collected by an older trainready)"
    return [], ""


@check("gpu.matmul", "gpu", deep=True)
def matmul(f: Facts) -> Verdict | None:
    """bf16 GEMMs on every GPU at once for seconds: each against the datasheet peak and against the node's best
    GPU (a slow or throttling GPU sets the pace of every step), and each GPU's steady rate against its start."""
    ctx = f.ctx
    data = ctx.deep("gemm")
    if data is None:
        return Verdict.skip("no deep.json (run with --deep)", DEEP)
    if not isinstance(data, dict):
        return Verdict.skip("not measured: unreadable")
    rows, older = _gemm_gpus(data)
    raw_errors = data.get("errors")
    raw_errors = [raw_errors] if isinstance(raw_errors, str) else raw_errors if isinstance(raw_errors, list) else []
    errors = [str(e)[:200] for e in raw_errors[:8]]
    if not rows and not errors:
        return Verdict.skip(data.get("skipped") or data.get("error") or "no GEMM result")
    peak = ctx.gpu.peak_tflops("bf16") if ctx.gpu else None
    size = data.get("size") if isinstance(data.get("size"), int) else "?"
    observed = (", ".join(f"{label} {t:.0f}" for label, t, _ in rows) + f" TFLOP/s bf16 at {size}^3" if rows
                else "no GPU finished its GEMM")
    expected = (f">= {GEMM_PASS_OF_PEAK:.0%} of {peak:.0f} TFLOP/s (datasheet bf16 dense) and within "
                f"{GEMM_WARN_BEHIND_BEST:.0%} of the best GPU" if peak else
                f"within {GEMM_WARN_BEHIND_BEST:.0%} of the best GPU (no datasheet peak: pass --instance)")
    v = Verdict(status="pass", observed=observed, expected=expected)
    status, why = "pass", []

    def worse(s: str) -> str:
        return max(status, s, key=("pass", "warn", "fail").index)
    if errors:
        status, why = "fail", [f"GEMM failed on {'; '.join(errors)}"]
    best = max((t for _, t, _ in rows), default=0.0)
    for label, t, first in rows:
        if peak:
            ratio = t / peak
            if ratio < GEMM_PASS_OF_PEAK:
                status = worse("fail" if ratio < GEMM_FAIL_OF_PEAK else "warn")
                why.append(f"{label} at {ratio:.0%} of the datasheet peak")
        behind = 1 - t / best if best else 0.0
        if behind > GEMM_WARN_BEHIND_BEST:
            status = worse("fail" if behind > GEMM_FAIL_BEHIND_BEST else "warn")
            why.append(f"{label} {behind:.0%} behind the best GPU ({best:.0f})")
        if first and t < (1 - GEMM_FALL_WARN) * first:
            status = worse("warn")
            why.append(f"{label} fell from {first:.0f} to {t:.0f} under load (clocks throttled)")
    if not peak and status == "pass":
        status = "warn"
        why.append("no datasheet peak to compare with")
    if older:
        status = worse("warn")
        why.append(older + ": run check --deep again to measure every GPU")
    v.status = status
    v.reason = "; ".join(why) if why else (f"every GPU within {GEMM_WARN_BEHIND_BEST:.0%} of the best and at "
                                           f"{min(t for _, t, _ in rows) / peak:.0%}+ of the datasheet peak")
    if status != "pass":
        v.advice = ("check gpu.throttle and clocks (nvidia-smi -q -d CLOCK,PERFORMANCE); a slow GPU paces every "
                    "step: drain the node if one GPU stays behind")
    return v


@check("storage.hot-tier-bandwidth", "storage", deep=True)
def hot_tier_bandwidth(f: Facts) -> Verdict | None:
    ctx = f.ctx
    data = ctx.deep("hot_tier")
    if data is None:
        return Verdict.skip("not measured (run with --deep --hot-dir PATH)",
                    "trainready check --deep --hot-dir /scratch")
    if "write_gbps" not in data:
        return Verdict.skip(data.get("skipped") or "no result")
    observed = (f"write {data['write_gbps']:.2f} GB/s, read {data['read_gbps']:.2f} GB/s on {data['directory']} "
                f"({data['bytes'] / 2**30:.1f} GiB{', direct I/O' if data.get('direct_io') else ', buffered + fsync'})")
    v = Verdict(status="pass", observed=observed,
                      expected=">= 1 GB/s write for a local NVMe hot tier (no per-instance figure we trust)")
    if data["write_gbps"] < 1.0:
        v.status = "warn"
        v.reason = "slower than one NVMe drive: checkpoint saves will take longer than planned"
        v.advice = "put the hot tier on instance-store NVMe (RAID0 across drives), not EBS or the root disk"
    else:
        v.reason = "fast enough for checkpoint saves"
    return v
