"""`--deep` measurements: bf16 GEMM TFLOP/s, host<->device, memory and GPU-to-GPU copies
(deep_gpu.py), collectives (all_reduce, all_gather, reduce_scatter, all_to_all), pairwise node tests
across nodes, storage bandwidth.

Results go into the bundle as `deep.json`, so `check --bundle` judges them like everything else.
Collectives follow nccl-tests: algbw = bytes / time, busbw = algbw x the collective's factor
(all_reduce 2(n-1)/n). Under torchrun (WORLD_SIZE set) they measure the job's own world, across
nodes, and then pairs of nodes (bisect.py) to name a slow node or link; otherwise one process per
local GPU is spawned (NCCL), or two gloo processes on a CPU-only machine (the CPU analogue)."""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .deep_gpu import MiB
from .thresholds import COLLECTIVES


GEMM_SECONDS = 4.0
"""Timed GEMM work per GPU, every GPU of the node at once: seconds, so clocks settle at the power and thermal
limits a training step meets (a tenth of a second measures the boost clock of a cold GPU)."""
GEMM_WINDOWS = 8  # timed windows per GPU: the last half gives the steady rate, the first one the starting rate


def gemm(size: int = 8192, seconds: float = GEMM_SECONDS, windows: int = GEMM_WINDOWS) -> dict[str, Any]:
    """bf16 `size`^3 GEMMs on every local GPU at once, one thread each, timed in `windows` windows by CUDA
    events: per GPU the steady TFLOP/s (median of the last half) and the first window's."""
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device (a CPU GEMM says nothing about a GPU's peak)"}
    import threading

    n = torch.cuda.device_count()
    per_gpu: list[dict[str, Any] | None] = [None] * n
    errors: list[str] = []

    def run(index: int) -> None:
        try:
            with torch.cuda.device(index):
                a = torch.randn(size, size, device=f"cuda:{index}", dtype=torch.bfloat16)
                b = torch.randn(size, size, device=f"cuda:{index}", dtype=torch.bfloat16)
                for _ in range(3):
                    a @ b
                torch.cuda.synchronize(index)
                probe = time.perf_counter()
                for _ in range(5):
                    a @ b
                torch.cuda.synchronize(index)
                calls = max(1, int(seconds / windows / ((time.perf_counter() - probe) / 5)))
                marks = [torch.cuda.Event(enable_timing=True) for _ in range(windows + 1)]
                marks[0].record()
                for w in range(windows):
                    for _ in range(calls):
                        a @ b
                    marks[w + 1].record()
                torch.cuda.synchronize(index)
                per_gpu[index] = {"index": index, "device": torch.cuda.get_device_name(index), "calls": calls,
                                  "window_seconds": [marks[w].elapsed_time(marks[w + 1]) / 1000
                                                     for w in range(windows)]}
        except Exception as exc:  # noqa: BLE001 - one GPU's failure is that GPU's finding
            errors.append(f"GPU{index}: {type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return gemm_summary(size, [g for g in per_gpu if g is not None], errors)


def gemm_summary(size: int, per_gpu: list[dict[str, Any]], errors: list[str] | None = None) -> dict[str, Any]:
    """deep.json's `gemm`: per GPU the steady TFLOP/s (median window of the last half), the first window's, and
    the worst GPU's steady rate as `tflops` (what older readers show)."""
    flops = 2 * size**3
    gpus = []
    for g in per_gpu:
        rates = [flops * g["calls"] / t / 1e12 for t in g["window_seconds"] if t > 0]
        if not rates:
            continue
        tail = sorted(rates[len(rates) // 2:])
        gpus.append({"index": g["index"], "device": g.get("device", ""), "tflops": tail[len(tail) // 2],
                     "first_tflops": rates[0], "seconds": sum(g["window_seconds"])})
    out: dict[str, Any] = {"size": size, "gpus": gpus}
    if gpus:
        out["tflops"] = min(g["tflops"] for g in gpus)
        out["device"] = gpus[0]["device"]
    if errors:
        out["errors"] = errors
    return out


def allreduce_in_world(max_mib: int = 256, iters: int = 10) -> dict[str, Any]:
    """In an initialized process group (torchrun): every rank calls this; rank 0's result counts."""
    from .deep_gpu import collective_in_world

    return collective_in_world("all_reduce", max_mib * MiB, iters)


def _spawned(rank: int, world: int, port: int, backend: str, plan: dict[str, int], out: Any) -> None:
    from trainready.parent_death import die_with_parent

    die_with_parent()  # a killed `check --deep` takes its ranks along (they would wait for its store 5 minutes)
    import torch
    import torch.distributed as dist

    from .deep_gpu import collective_in_world

    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world_size=world, is_master=False)  # the parent's (collectives_local)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    result = {}
    for kind, max_bytes in plan.items():
        try:
            result[kind] = collective_in_world(kind, max_bytes)
        except Exception as exc:  # one failing collective is a finding, not the end of the others
            result[kind] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if rank == 0:
        out.put(result)
    dist.barrier()
    dist.destroy_process_group()


def collectives_local(plan: dict[str, int] | None = None) -> dict[str, Any]:
    """Each collective of `plan` (kind -> largest message, bytes) over every local GPU with NCCL, or
    over two gloo processes on a CPU-only machine (16 MiB at most: the CPU analogue, not judged)."""
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        return {kind: {"skipped": "torch is not installed"} for kind in plan or COLLECTIVES}
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, world = ("nccl", gpus) if gpus >= 2 else ("gloo", 2)
    plan = dict(plan or {kind: (256 if backend == "nccl" else 16) * MiB for kind in COLLECTIVES})
    if gpus == 1:
        return {kind: {"skipped": "one GPU: nothing to exchange with"} for kind in plan}
    if backend == "gloo":
        plan = {kind: min(size, 16 * MiB) for kind, size in plan.items()}
    # This process hosts the ranks' store on a port it binds and keeps: a port picked, let go of and bound
    # again by rank 0 can be taken by another process in between (EADDRINUSE).
    store = dist.TCPStore("127.0.0.1", 0, world_size=world, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_spawned, args=(world, store.port, backend, plan, queue), nprocs=world, join=True,
                       start_method="spawn")
    del store
    results = queue.get()
    if backend == "gloo":
        for result in results.values():
            result["note"] = "CPU-only machine: gloo over loopback (the CPU analogue), not judged against NVLink"
    return results


def allreduce_local(max_mib: int | None = None) -> dict[str, Any]:
    """The all-reduce sweep alone (see collectives_local)."""
    size = max_mib * MiB if max_mib is not None else _default_max()
    return collectives_local({"all_reduce": size})["all_reduce"]


def _default_max() -> int:
    try:
        import torch

        return (256 if torch.cuda.is_available() else 16) * MiB
    except ImportError:
        return 16 * MiB


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
    """How many steps run_deep reports (GEMM and copies; collectives and pairwise; each directory)."""
    return 2 + bool(hot_dir) + bool(shared_dir)


# The key deep.json keeps each collective under (all_reduce: "allreduce", as bundles always had it).
DEEP_KEY = {"all_reduce": "allreduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
            "all_to_all": "all_to_all"}
OTHERS_MAX = 1 << 30  # all_gather, reduce_scatter, all_to_all: up to 1 GiB (time), never past a floor's size


def plan_sizes(instance_type: str | None, nodes: int, backend: str) -> dict[str, int]:
    """The largest message per collective: the all-reduce floor's size (multi-GiB where aznhc
    measures there), a quarter of a GPU's memory at most."""
    from .deep_gpu import max_message
    from .thresholds import threshold

    instance, gpu = _catalog_entry(instance_type)
    memory = int(gpu.memory_gib * (1 << 30)) if gpu else _gpu_memory()
    plan = {}
    for kind in COLLECTIVES:
        floor = threshold(kind, instance, gpu, nodes) if gpu else None
        size = floor.size_bytes if floor and floor.size_bytes else None
        if kind != "all_reduce":
            size = min(size or OTHERS_MAX, OTHERS_MAX)
        plan[kind] = max_message(memory, size, backend)
    return plan


def _catalog_entry(instance_type: str | None):
    if not instance_type:
        return None, None
    from trainready.catalog import load_catalog

    catalog = load_catalog()
    try:
        instance = catalog.instance(instance_type)
    except Exception:  # an unknown type: measure with the defaults
        return None, None
    return instance, catalog.gpu_of(instance)


def _gpu_memory() -> int | None:
    try:
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    except Exception:
        return None


def _guarded(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return measure()
    except Exception as exc:  # a failing measurement is a finding, not a crash
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _local_rank_zero() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0"


def run_deep(hot_dir: str | None, shared_dir: str | None, storage_mib: int = 1024,
             on_progress: Callable[[float], None] | None = None, instance_type: str | None = None) -> dict[str, Any]:
    """Every --deep measurement; `on_progress(1)` after each of deep_steps(...)."""
    from . import deep_gpu

    tick = on_progress or (lambda _n: None)
    result: dict[str, Any] = {"schema_version": 3}
    if _local_rank_zero():  # one process per node measures the node's GPUs (the GEMMs all at once)
        result["gemm"] = _guarded(gemm)
        result["copy"] = _guarded(deep_gpu.copy_bandwidth)
        result["memory"] = _guarded(deep_gpu.memory_bandwidth)
        result["p2p"] = _guarded(deep_gpu.p2p_bandwidth)
    tick(1)
    result.update(_collectives(instance_type))
    tick(1)
    if hot_dir:
        result["hot_tier"] = storage_bandwidth(hot_dir, storage_mib)
        tick(1)
    if shared_dir:
        result["shared"] = storage_bandwidth(shared_dir, storage_mib)
        tick(1)
    return result


def _collectives(instance_type: str | None) -> dict[str, Any]:
    try:
        import torch.distributed as dist

        in_world = dist.is_available() and dist.is_initialized()
    except ImportError:
        in_world = False
    if not in_world:
        try:
            import torch

            backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"
        except ImportError:
            backend = "gloo"
        try:
            measured = collectives_local(plan_sizes(instance_type, 1, backend))
        except Exception as exc:
            error = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            measured = {kind: error for kind in COLLECTIVES}
        return {"nodes": 1, **{DEEP_KEY[k]: v for k, v in measured.items()}}
    from .deep_gpu import collective_in_world

    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
    nodes = world // local if local and world % local == 0 else 1
    plan = plan_sizes(instance_type, nodes, dist.get_backend())
    out: dict[str, Any] = {"nodes": nodes}
    for kind, size in plan.items():
        out[DEEP_KEY[kind]] = _guarded(lambda k=kind, n=size: collective_in_world(k, n))
    if nodes >= 2:
        out["pairwise"] = _guarded(lambda: pairwise_in_world(instance_type, plan["all_reduce"], local))
    return out


def pairwise_in_world(instance_type: str | None, size: int, local: int, iters: int = 5) -> dict[str, Any]:
    """After the world test: all-reduce between pairs of nodes, round by round (bisect.py), so a slow
    node or link is named. Every rank calls this; every rank sees every result (all_gather_object),
    so every rank plans the same next round."""
    import socket

    import torch
    import torch.distributed as dist

    from .bisect import PairResult, plan_all
    from .deep_gpu import collective_rows
    from .thresholds import threshold

    world, rank = dist.get_world_size(), dist.get_rank()
    nodes, node = world // local, dist.get_rank() // local
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    instance, gpu = _catalog_entry(instance_type)
    floor = threshold("all_reduce", instance, gpu, nodes=2) if gpu else None
    known = floor.floor_gbps if floor is not None and not floor.derived else None
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"

    def measure(pairs: list[tuple[int, int]]) -> list[PairResult]:
        groups = [dist.new_group([*range(a * local, (a + 1) * local), *range(b * local, (b + 1) * local)])
                  for a, b in pairs]  # every rank creates every group, in the same order
        mine = None
        for (a, b), group in zip(pairs, groups, strict=True):
            if node in (a, b):
                busbw = collective_rows("all_reduce", [size], device, iters, group=group)[0]["busbw_gbps"]
                if node == a and rank % local == 0:
                    mine = (a, b, busbw)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        for group in groups:
            dist.destroy_process_group(group)
        return [PairResult(*g) for g in gathered if g]

    rounds, used = plan_all(nodes, measure, known)
    return {"nodes": [hosts[n * local] for n in range(nodes)], "size_bytes": size, "floor_gbps": used,
            "floor_source": floor.source if floor is not None and known is not None else
            "75% of the median pair (no published 2-node figure for this instance)",
            "rounds": [[{"a": r.a, "b": r.b, "busbw_gbps": r.busbw_gbps} for r in rnd] for rnd in rounds]}
