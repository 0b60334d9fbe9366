"""`--deep` checks: judge the measurements in deep.json against the catalog.

Expected figures (a model, documented in docs/check.md): GEMM >= 60% of the datasheet bf16
dense peak passes (our H200 reached 79% at 8192^3); all-reduce bus bandwidth inside an
NVLink node ~ 0.77 x links x per-link speed (nccl-tests: ~230 GB/s on 8x A100 = 0.77 x 300),
PCIe-only nodes ~ 0.6 x the PCIe per-direction bandwidth, across nodes ~ 0.8 x the network."""

from __future__ import annotations

from .context import Context
from .findings import Finding, skip
from .registry import check


def _judge(finding: Finding, ratio: float, what: str, advice: str) -> Finding:
    finding.status = "pass" if ratio >= 0.7 else "warn" if ratio >= 0.4 else "fail"
    finding.reason = f"{ratio:.0%} of the expected {what}"
    if finding.status != "pass":
        finding.advice = advice
    return finding


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


def expected_busbw(ctx: Context, world: int) -> tuple[float, str] | None:
    inst, gpu = ctx.instance, ctx.gpu
    if inst is None or gpu is None:
        return None
    if world > inst.gpu_count:
        if not inst.network_gbps:
            return None
        return 0.8 * inst.network_gbps / 8, f"0.8 x {inst.network_gbps:g} Gbit/s network"
    if gpu.nvlink_links and gpu.nvlink_link_gbps and inst.topology == "nvswitch":
        per_gpu = gpu.nvlink_links * gpu.nvlink_link_gbps
        return 0.77 * per_gpu, f"0.77 x {gpu.nvlink_links} NVLinks x {gpu.nvlink_link_gbps:g} GB/s"
    if gpu.nvlink_links and gpu.nvlink_link_gbps:  # cube-mesh: rings use a subset of links
        per_gpu = gpu.nvlink_links * gpu.nvlink_link_gbps
        return 0.6 * per_gpu, f"0.6 x {gpu.nvlink_links} NVLinks x {gpu.nvlink_link_gbps:g} GB/s (cube-mesh)"
    if gpu.pcie_gbps_per_dir:
        return 0.6 * gpu.pcie_gbps_per_dir, f"0.6 x PCIe {gpu.pcie_gbps_per_dir:g} GB/s per direction"
    return None


@check("nccl.allreduce", "nccl", deep=True)
def allreduce(ctx: Context) -> Finding:
    data = ctx.deep("allreduce")
    if data is None:
        return skip("nccl.allreduce", "nccl", "no deep.json (run with --deep)", "trainready check --deep")
    if "busbw_gbps" not in data:
        return skip("nccl.allreduce", "nccl", data.get("skipped") or data.get("error") or "no all-reduce result")
    world, backend = data.get("world_size", 0), data.get("backend", "?")
    observed = f"{data['busbw_gbps']:.1f} GB/s bus bandwidth ({backend}, {world} ranks, largest of the sweep)"
    if backend != "nccl":
        return Finding(id="nccl.allreduce", area="nccl", status="skip", observed=observed, expected="NCCL on GPUs",
                       reason=data.get("note", "measured with gloo (no GPUs): not comparable with NVLink/EFA figures"))
    want = expected_busbw(ctx, world)
    if want is None:
        return Finding(id="nccl.allreduce", area="nccl", status="warn", observed=observed, expected="unknown",
                       reason="no expected figure for this instance", advice="pass --instance TYPE")
    finding = Finding(id="nccl.allreduce", area="nccl", status="pass", observed=observed,
                      expected=f"~{want[0]:.0f} GB/s ({want[1]})")
    return _judge(finding, data["busbw_gbps"] / want[0], "bus bandwidth",
                  "run with NCCL_DEBUG=INFO and check net.nccl-env, gpu.nvlink-links and net.efa; across nodes: "
                  "cluster placement group, security group allowing all traffic to and from itself")


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
