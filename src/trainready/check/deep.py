"""`--deep` measurements: bf16 GEMM TFLOP/s, all-reduce bus bandwidth, storage bandwidth.

Results go into the bundle as `deep.json`, so `check --bundle` judges them like everything else.
All-reduce follows nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n. Under torchrun
(WORLD_SIZE set) it measures the job's own world, across nodes; otherwise it spawns one process
per local GPU (NCCL), or two gloo processes on a CPU-only machine (the CPU analogue)."""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def gemm(size: int = 8192, iters: int = 20) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device (a CPU GEMM says nothing about a GPU's peak)"}
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / iters
    return {"size": size, "tflops": 2 * size**3 / seconds / 1e12, "device": torch.cuda.get_device_name(0)}


def _allreduce_sweep(sizes_bytes: list[int], device: str, iters: int) -> list[dict[str, float]]:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    rows = []
    for size in sizes_bytes:
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        if device != "cpu":
            torch.cuda.synchronize()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if device != "cpu":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / iters
        algbw = size / seconds / 1e9
        rows.append({"size_bytes": size, "time_us": seconds * 1e6, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * 2 * (world - 1) / world})
    return rows


def allreduce_in_world(max_mib: int = 256, iters: int = 10) -> dict[str, Any]:
    """In an initialized process group (torchrun): every rank calls this; rank 0's result counts."""
    import torch
    import torch.distributed as dist

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    sizes = [1 << 20 << k for k in range(0, max_mib.bit_length()) if (1 << k) <= max_mib]
    rows = _allreduce_sweep(sizes, device, iters)
    return {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "rows": rows,
            "busbw_gbps": max(r["busbw_gbps"] for r in rows)}


def _spawned(rank: int, world: int, port: int, backend: str, max_mib: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    result = allreduce_in_world(max_mib)
    if rank == 0:
        out.put(result)
    dist.barrier()
    dist.destroy_process_group()


def allreduce_local(max_mib: int | None = None) -> dict[str, Any]:
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        return {"skipped": "torch is not installed"}
    import socket

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, world = ("nccl", gpus) if gpus >= 2 else ("gloo", 2)
    if gpus == 1:
        return {"skipped": "one GPU: nothing to all-reduce across"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_spawned, args=(world, port, backend, max_mib or (256 if backend == "nccl" else 16), queue),
                       nprocs=world, join=True, start_method="spawn")
    result = queue.get()
    if backend == "gloo":
        result["note"] = "CPU-only machine: gloo over loopback (the CPU analogue), not judged against NVLink"
    return result


def _scratch_name() -> str:
    # unique per call: a name others can predict is a name they can plant a symlink at
    return f".trainready-bw-{os.getpid()}-{secrets.token_hex(8)}"


def storage_bandwidth(directory: str | Path, size_mib: int = 1024) -> dict[str, Any]:
    """Sequential write then read of one file with O_DIRECT (page cache bypassed), then removed.

    The directory may be shared (--shared-dir): the file is created with O_EXCL|O_NOFOLLOW under a
    unique name and read back through the same descriptor, so nothing planted there is followed."""
    from trainready.io import create_exclusive

    root = Path(directory)
    if not root.is_dir():
        return {"skipped": f"{root} is not a directory"}
    path = root / _scratch_name()
    block = 16 << 20
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(1 << 20) * (block >> 20))
    blocks = max(1, (size_mib << 20) // block)
    direct = getattr(os, "O_DIRECT", 0)
    created = False
    try:
        fd = create_exclusive(path, 0o600, read=True)
        created = True
        try:
            if direct:
                try:  # Linux lets F_SETFL turn O_DIRECT on for an open file
                    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | direct)
                except OSError:  # tmpfs and some network filesystems refuse O_DIRECT
                    direct = 0
            started = time.perf_counter()
            for _ in range(blocks):
                os.write(fd, buf)
            os.fsync(fd)
            write_s = time.perf_counter() - started
            if not direct and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.lseek(fd, 0, os.SEEK_SET)
            started = time.perf_counter()
            while os.readv(fd, [buf]) > 0:
                pass
            read_s = time.perf_counter() - started
        finally:
            os.close(fd)
    except OSError as exc:
        return {"skipped": f"could not test {root}: {exc.strerror or exc}"}
    finally:
        if created:  # only our own file: a name we could not create is someone else's
            path.unlink(missing_ok=True)
        buf.close()
    total = blocks * block
    return {"directory": str(root), "bytes": total, "direct_io": bool(direct),
            "write_gbps": total / write_s / 1e9, "read_gbps": total / read_s / 1e9}


def deep_steps(hot_dir: str | None, shared_dir: str | None) -> int:
    """How many measurements run_deep makes (GEMM, all-reduce, and each directory given): for progress."""
    return 2 + bool(hot_dir) + bool(shared_dir)


def run_deep(hot_dir: str | None, shared_dir: str | None, storage_mib: int = 1024,
             on_progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Every --deep measurement; `on_progress(1)` after each of deep_steps(...)."""
    tick = on_progress or (lambda _n: None)
    result: dict[str, Any] = {"schema_version": 1, "gemm": gemm()}
    tick(1)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            result["allreduce"] = allreduce_in_world()
        else:
            result["allreduce"] = allreduce_local()
    except Exception as exc:  # a failing collective is a finding, not a crash
        result["allreduce"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    tick(1)
    if hot_dir:
        result["hot_tier"] = storage_bandwidth(hot_dir, storage_mib)
        tick(1)
    if shared_dir:
        result["shared"] = storage_bandwidth(shared_dir, storage_mib)
        tick(1)
    return result
