"""`--deep` checks: judge the measurements in deep.json against the catalog.

GEMM >= 60% of the datasheet bf16 dense peak passes (our H200 reached 79% at 8192^3). The
collectives, copies and memory bandwidth are judged against thresholds.py (checks_accept_deep.py)."""

from __future__ import annotations

from . import checks_accept_deep, checks_host, checks_node  # noqa: F401  (the acceptance checks register with these)
from .checks_accept_deep import judge_collective
from .context import Context
from .findings import Finding, skip
from .registry import check


@check("gpu.matmul", "gpu", deep=True)
def matmul(ctx: Context) -> Finding:
    data = ctx.deep("gemm")
    if data is None:
        return skip("gpu.matmul", "gpu", "no deep.json (run with --deep)", "trainready check --deep")
    if "tflops" not in data:
        return skip("gpu.matmul", "gpu", data.get("skipped") or data.get("error") or "no GEMM result")
    peak = ctx.gpu.peak_tflops("bf16") if ctx.gpu else None
    finding = Finding(id="gpu.matmul", area="gpu", status="pass", observed=f"{data['tflops']:.0f} TFLOP/s bf16 at {data.get('size')}^3",
                      expected=f">= 60% of {peak:.0f} TFLOP/s (datasheet bf16 dense)" if peak else "unknown (pass --instance)")
    if not peak:
        finding.status, finding.reason = "warn", "no peak to compare with"
        return finding
    ratio = data["tflops"] / peak
    finding.status = "pass" if ratio >= 0.6 else "warn" if ratio >= 0.4 else "fail"
    finding.reason = f"{ratio:.0%} of the datasheet peak"
    if finding.status != "pass":
        finding.advice = "check gpu.throttle and clocks (nvidia-smi -q -d CLOCK); power capping or a bad GPU slows every step"
    return finding


@check("nccl.allreduce", "nccl", deep=True)
def allreduce(ctx: Context) -> Finding:
    """Judged against thresholds.py: aznhc's floors inside one node (228 GB/s at 8 GiB on 8x A100, 460 at
    16 GiB on 8x H100), published 2-node EFA figures across nodes, a derived figure elsewhere."""
    return judge_collective(ctx, "nccl.allreduce", "all_reduce", "allreduce")


@check("storage.hot-tier-bandwidth", "storage", deep=True)
def hot_tier_bandwidth(ctx: Context) -> Finding:
    data = ctx.deep("hot_tier")
    if data is None:
        return skip("storage.hot-tier-bandwidth", "storage", "not measured (run with --deep --hot-dir PATH)",
                    "trainready check --deep --hot-dir /scratch")
    if "write_gbps" not in data:
        return skip("storage.hot-tier-bandwidth", "storage", data.get("skipped") or "no result")
    observed = (f"write {data['write_gbps']:.2f} GB/s, read {data['read_gbps']:.2f} GB/s on {data['directory']} "
                f"({data['bytes'] / 2**30:.1f} GiB{', direct I/O' if data.get('direct_io') else ', buffered + fsync'})")
    finding = Finding(id="storage.hot-tier-bandwidth", area="storage", status="pass", observed=observed,
                      expected=">= 1 GB/s write for a local NVMe hot tier (no per-instance figure we trust)")
    if data["write_gbps"] < 1.0:
        finding.status = "warn"
        finding.reason = "slower than one NVMe drive: checkpoint saves will take longer than planned"
        finding.advice = "put the hot tier on instance-store NVMe (RAID0 across drives), not EBS or the root disk"
    else:
        finding.reason = "fast enough for checkpoint saves"
    return finding
