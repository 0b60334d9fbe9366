"""`--deep` measurements of one node's GPUs and of the collectives between them.

- Host<->device copies per GPU: pinned host memory, timed with CUDA events (one GPU at a time, as
  nvbandwidth and aznhc measure them).
- Memory bandwidth per GPU: a device-to-device copy of a large buffer, counted as bytes read plus
  bytes written (as CUDA's bandwidthTest and DCGM count them).
- GPU-to-GPU copies per ordered pair (peer access where the driver allows it).
- Collectives the nccl-tests way: `size` is the larger buffer of one rank (all_gather: the gathered
  output, reduce_scatter: the input), algbw = size / time, busbw = algbw x factor with nccl-tests'
  factors: all_reduce 2(n-1)/n, all_gather, reduce_scatter and all_to_all (n-1)/n.

Without CUDA, the GPU measurements return {"skipped": why}; the collectives run over gloo on the CPU
(the analogue: reported, not judged)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


def _cuda():
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    return torch, ""


def _timed(torch, device: int, fn: Callable[[], Any], iters: int) -> float:
    """Seconds per call of `fn` on `device`'s current stream, by CUDA events after one warm-up call."""
    with torch.cuda.device(device):
        fn()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1000 / iters


def copy_bandwidth(size_mib: int = 256, iters: int = 10) -> dict[str, Any]:
    """H2D and D2H GB/s per GPU with pinned host memory."""
    torch, why = _cuda()
    if torch is None:
        return {"skipped": why}
    size = size_mib * MiB
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    rows = []
    for index in range(torch.cuda.device_count()):
        dev = torch.empty(size, dtype=torch.uint8, device=f"cuda:{index}")
        h2d = _timed(torch, index, lambda d=dev: d.copy_(host, non_blocking=True), iters)
        d2h = _timed(torch, index, lambda d=dev: host.copy_(d, non_blocking=True), iters)
        rows.append({"index": index, "h2d_gbps": size / h2d / 1e9, "d2h_gbps": size / d2h / 1e9})
        del dev
    return {"bytes": size, "pinned": True, "gpus": rows}


def memory_bandwidth(size_mib: int = 1024, iters: int = 10) -> dict[str, Any]:
    """Device-to-device copy per GPU: (read + write) bytes / time."""
    torch, why = _cuda()
    if torch is None:
        return {"skipped": why}
    size = size_mib * MiB
    rows = []
    for index in range(torch.cuda.device_count()):
        a = torch.empty(size, dtype=torch.uint8, device=f"cuda:{index}")
        b = torch.empty_like(a)
        seconds = _timed(torch, index, lambda a=a, b=b: b.copy_(a), iters)
        rows.append({"index": index, "gbps": 2 * size / seconds / 1e9})
        del a, b
    return {"bytes": size, "counted": "read + write", "gpus": rows}


def p2p_bandwidth(size_mib: int = 256, iters: int = 5) -> dict[str, Any]:
    """Every ordered pair: a copy from GPU src to GPU dst, timed on dst."""
    torch, why = _cuda()
    if torch is None:
        return {"skipped": why}
    n = torch.cuda.device_count()
    if n < 2:
        return {"skipped": "one GPU: no pair to copy between"}
    size = size_mib * MiB
    bufs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    pairs = []
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            seconds = _timed(torch, dst, lambda s=src, d=dst: bufs[d].copy_(bufs[s], non_blocking=True), iters)
            pairs.append({"src": src, "dst": dst, "gbps": size / seconds / 1e9,
                          "peer_access": bool(torch.cuda.can_device_access_peer(dst, src))})
    return {"bytes": size, "pairs": pairs}


def _buffers(torch, kind: str, size: int, world: int, device: str):
    """(input, output) of one rank for a collective whose nccl-tests `size` is `size` bytes (float32)."""
    count = size // 4
    part = max(1, count // world)
    if kind == "all_reduce":
        x = torch.ones(count, dtype=torch.float32, device=device)
        return x, x
    if kind == "all_gather":
        return (torch.ones(part, dtype=torch.float32, device=device),
                torch.empty(part * world, dtype=torch.float32, device=device))
    if kind == "reduce_scatter":
        return (torch.ones(part * world, dtype=torch.float32, device=device),
                torch.empty(part, dtype=torch.float32, device=device))
    x = torch.ones(part * world, dtype=torch.float32, device=device)  # all_to_all
    return x, torch.empty_like(x)


def _call(dist, kind: str, inp, out, group=None) -> None:
    if kind == "all_reduce":
        dist.all_reduce(out, group=group)
    elif kind == "all_gather":  # all_gather_single: torch >= 2.13's name for all_gather_into_tensor
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp, group=group)
    elif kind == "reduce_scatter":  # reduce_scatter_single: torch >= 2.13's name for reduce_scatter_tensor
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp, group=group)
    else:
        dist.all_to_all_single(out, inp, group=group)


def collective_rows(kind: str, sizes: list[int], device: str, iters: int, group=None) -> list[dict[str, float]]:
    """nccl-tests-style rows for `kind` in the current process group (or `group`)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    factor = BUSBW_FACTOR[kind](world)
    rows = []
    for size in sizes:
        inp, out = _buffers(torch, kind, size, world, device)
        moved = out.numel() * 4 if kind in ("all_gather", "all_reduce") else inp.numel() * 4
        reps = iters if size <= (256 * MiB) else max(2, iters // 4)
        for _ in range(2):
            _call(dist, kind, inp, out, group)
        if device != "cpu":
            torch.cuda.synchronize()
        dist.barrier(group=group)
        started = time.perf_counter()
        for _ in range(reps):
            _call(dist, kind, inp, out, group)
        if device != "cpu":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / reps
        algbw = moved / seconds / 1e9
        rows.append({"size_bytes": moved, "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
        del inp, out
    return rows


def sweep_sizes(max_bytes: int, min_bytes: int = MiB) -> list[int]:
    """Powers of two from `min_bytes` up to `max_bytes` (nccl-tests -f 2)."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes or [max_bytes]


def collective_in_world(kind: str, max_bytes: int, iters: int = 10) -> dict[str, Any]:
    """One collective's sweep in the initialized process group; every rank calls it, rank 0 reports."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    rows = collective_rows(kind, sweep_sizes(max_bytes), device, iters)
    return {"backend": backend, "world_size": dist.get_world_size(), "rows": rows,
            "busbw_gbps": max(r["busbw_gbps"] for r in rows)}


def max_message(gpu_memory_bytes: int | None, floor_size: int | None, backend: str) -> int:
    """The sweep's largest message: the floor's size where one applies (up to multi-GiB), at most a
    quarter of a GPU's memory; 256 MiB without a floor; 16 MiB on gloo (the CPU analogue)."""
    if backend != "nccl":
        return 16 * MiB
    want = floor_size or 256 * MiB
    if gpu_memory_bytes:
        want = min(want, gpu_memory_bytes // 4)
    return 1 << (max(want, MiB).bit_length() - 1)  # a power of two, as the sweep steps
