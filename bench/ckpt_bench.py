"""How fast is CheckpointManager next to the plain alternatives? (one run, figures measured now)

Measures, for a dict state of float32 tensors of --size-gib (default 1 GiB) in --tensors pieces:

1. disk: sequential write of the same bytes to one file (one write per tensor), flush, fsync.
2. sync save: CheckpointManager(async_save=False, keep_hot=1).save() against (1) (target >= 70%)
   and against torch.save(state, f) + flush + fsync of the same state (target >= 1x).
3. async save: how long save() blocks (staging to host memory) with wait() between saves,
   against the sync save time (target <= 10%).
4. restore: mgr.restore(state) into existing tensors against torch.load(weights_only=True),
   with the files evicted from the page cache first (cold) and again straight after (warm).
5. upload: replication of a saved checkpoint to a local S3 server (moto, started here) -- the
   time from save() returning to wait() returning -- against one boto3 put_object of a file of
   the same size (single stream), and a one-thread boto3 multipart upload with the manager's part
   size. --s3-size-gib (default min(size, 0.5)); --no-s3 skips it.
Context rows (no target): single-thread sha256 speed, the hash-then-write bound, a plain copy_.

Every timed write goes to a new file (new checkpoint directory, new file name), and each ends
with fsync, so no write stays in this machine's page cache (a virtual disk may still be cached
by its host: the disk row shows what fsync costs here); the previous round's files are deleted
outside the timed region (except the manager's own retention, which is part of its save).
Rounds interleave the contenders so disk-speed drift hits them alike; medians of --repeats.

Usage: python bench/ckpt_bench.py [--size-gib 1] [--tensors 16] [--repeats 3] [--dir D] [--keep]
                                  [--s3-size-gib X] [--no-s3] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from trainready.store.manager import CheckpointManager, CheckpointManagerOptions  # noqa: E402

GB = 1e9


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_state(total_bytes: int, count: int, seed: int = 0) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    numel = max(1, total_bytes // 4 // count)
    return {"model": {f"layer{i:03d}.weight": torch.empty(numel, dtype=torch.float32).uniform_(generator=gen)
                      for i in range(count)}}


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state["model"].values())


def zeros_like_state(state: dict[str, Any]) -> dict[str, Any]:
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}


def timed(fn: Any) -> float:
    return timed_result(fn)[0]


def timed_result(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_write(state: dict[str, Any], path: Path) -> None:
    with open(path, "wb", buffering=0) as handle:
        for tensor in state["model"].values():
            handle.write(memoryview(tensor.numpy()).cast("B"))
        os.fsync(handle.fileno())


def copy_state(state: dict[str, Any], into: dict[str, Any]) -> None:
    for key, tensor in state["model"].items():
        into["model"][key].copy_(tensor)


def sha256_state(state: dict[str, Any]) -> None:
    digest = hashlib.sha256()
    for tensor in state["model"].values():
        digest.update(memoryview(tensor.numpy()).cast("B"))


def torch_save(state: dict[str, Any], path: Path) -> None:
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


def evict(paths: list[Path]) -> bool:
    """Drop these files' pages from the page cache (they are clean: written with fsync)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def rm(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ---- 1-4: local disk -------------------------------------------------------------------------


def bench_local(state: dict[str, Any], base: Path, repeats: int) -> dict[str, Any]:
    nbytes = state_bytes(state)
    # warm-up (imports, DCP planner, first-touch of code paths) on a tiny state, untimed
    tiny = make_state(1 << 20, 2, seed=1)
    with CheckpointManager(base / "warmup", options=CheckpointManagerOptions(async_save=False, keep_hot=1)) as mgr:
        mgr.save(0, tiny)
        mgr.restore(zeros_like_state(tiny))
    torch_save(tiny, base / "warmup.pt")
    torch.load(base / "warmup.pt", weights_only=True)
    rm(base / "warmup")
    rm(base / "warmup.pt")

    sha = [timed(lambda: sha256_state(state)) for _ in range(repeats)]
    disk, tsave, msave = [], [], []
    sync = CheckpointManager(base / "hot-sync", options=CheckpointManagerOptions(async_save=False, keep_hot=1))
    order = ["disk", "torch", "mgr"]
    for r in range(repeats):
        log(f"  sync round {r + 1}/{repeats}")
        for which in order[r % 3:] + order[:r % 3]:  # rotate so no contender always goes first
            if which == "disk":
                path = base / f"raw-{r}.bin"
                disk.append(timed(lambda p=path: raw_write(state, p)))
                rm(path)
            elif which == "torch":
                path = base / f"torch-{r}.pt"
                tsave.append(timed(lambda p=path: torch_save(state, p)))
                if r < repeats - 1:
                    rm(path)  # the last one stays for the restore comparison
            else:
                msave.append(timed(lambda step=r + 1: sync.save(step, state)))

    log("  async saves")
    bufs = zeros_like_state(state)  # the staging floor: a plain copy into touched host buffers
    copy = [timed(lambda b=bufs: copy_state(state, b)) for _ in range(repeats)]
    del bufs
    asyn = CheckpointManager(base / "hot-async", options=CheckpointManagerOptions(async_save=True, keep_hot=1))
    first_block = None
    blocked, total = [], []
    try:
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            asyn.save(i + 1, state)
            t1 = time.perf_counter()
            asyn.wait()
            t2 = time.perf_counter()
            if i == 0:
                first_block = t1 - t0  # allocates the staging buffers
            else:
                blocked.append(t1 - t0)
                total.append(t2 - t0)
    finally:
        asyn.close()
    rm(base / "hot-async")

    log("  restores")
    torch_file = base / f"torch-{repeats - 1}.pt"
    ckpt_files = files_under(sync.hot.root)
    target = zeros_like_state(state)
    checked = False
    res: dict[str, list[float]] = {"mgr_cold": [], "torch_cold": [], "mgr_warm": [], "torch_warm": []}
    cold_ok = True
    for r in range(repeats):
        for mode in ("cold", "warm"):
            for which in (("mgr", "torch") if r % 2 == 0 else ("torch", "mgr")):
                if mode == "cold":
                    cold_ok &= evict(ckpt_files + [torch_file])
                if which == "mgr":
                    elapsed, step = timed_result(lambda: sync.restore(target))
                    res[f"mgr_{mode}"].append(elapsed)
                    if not checked:
                        if step != repeats or not all(torch.equal(target["model"][k], v)
                                                         for k, v in state["model"].items()):
                            raise RuntimeError(f"restore returned step {step} or different values")
                        checked = True
                else:
                    elapsed, loaded = timed_result(lambda: torch.load(torch_file, weights_only=True))
                    res[f"torch_{mode}"].append(elapsed)
                    del loaded
    sync.close()
    rm(torch_file)
    med = statistics.median
    return {
        "bytes": nbytes,
        "sha256_s": sha, "sha256_gbps": nbytes / med(sha) / GB,
        "disk_write_s": disk, "torch_save_s": tsave, "mgr_sync_save_s": msave,
        "disk_write_gbps": nbytes / med(disk) / GB,
        "torch_save_gbps": nbytes / med(tsave) / GB,
        "mgr_sync_save_gbps": nbytes / med(msave) / GB,
        "mgr_sync_save_median_s": med(msave),
        "host_copy_s": copy, "host_copy_median_s": med(copy),
        "async_first_blocked_s": first_block,
        "async_blocked_s": blocked, "async_total_s": total,
        "async_blocked_median_s": med(blocked),
        "async_total_median_s": med(total),
        "restore_evicted_with_fadvise": cold_ok,
        **{f"restore_{k}_s": v for k, v in res.items()},
        **{f"restore_{k}_gbps": nbytes / med(v) / GB for k, v in res.items()},
    }


# ---- 5: S3 (moto) ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(base: Path) -> tuple[subprocess.Popen, str, Any]:
    port = free_port()
    logfile = open(base / "moto.log", "wb")  # noqa: SIM115 -- closed by the caller
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=logfile, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            logfile.close()
            raise RuntimeError(f"moto server exited with {proc.returncode}: "
                               f"{(base / 'moto.log').read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/", timeout=2):
                break
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not answer within 60 s") from None
            time.sleep(0.2)
    return proc, url, logfile


def bench_s3(state: dict[str, Any], base: Path, repeats: int) -> dict[str, Any]:
    import boto3
    from boto3.s3.transfer import TransferConfig

    from trainready.io import S3_PART as _S3_PART

    nbytes = state_bytes(state)
    proc, url, logfile = start_moto(base)
    saved_env = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                 "AWS_DEFAULT_REGION")}
    try:
        os.environ.update({"AWS_ENDPOINT_URL_S3": url, "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
        bucket = "bench"
        s3 = boto3.client("s3", endpoint_url=url)
        s3.create_bucket(Bucket=bucket)
        raw = base / "s3-raw.bin"
        raw_write(state, raw)
        mgr = CheckpointManager(base / "hot-s3",
                                options=CheckpointManagerOptions(async_save=False, keep_hot=1, keep_archive=1),
                                archive=f"s3://{bucket}/ckpt")
        upload, hot_save, put, multipart = [], [], [], []
        part = TransferConfig(multipart_threshold=_S3_PART, multipart_chunksize=_S3_PART, use_threads=False)
        try:
            for r in range(repeats):
                log(f"  s3 round {r + 1}/{repeats}")
                order = ["put", "multipart", "mgr"]
                for which in order[r % 3:] + order[:r % 3]:
                    if which == "put":
                        with open(raw, "rb") as body:
                            put.append(timed(lambda body=body: s3.put_object(Bucket=bucket, Key="ref/put", Body=body)))
                        s3.delete_object(Bucket=bucket, Key="ref/put")  # moto keeps objects in memory
                    elif which == "multipart":
                        multipart.append(timed(lambda: s3.upload_file(str(raw), bucket, "ref/multipart", Config=part)))
                        s3.delete_object(Bucket=bucket, Key="ref/multipart")
                    else:
                        t0 = time.perf_counter()
                        mgr.save(r + 1, state)
                        t1 = time.perf_counter()
                        mgr.wait()
                        hot_save.append(t1 - t0)
                        upload.append(time.perf_counter() - t1)
            archived = sorted(r.name for r in mgr.archive.list() if r.committed)
        finally:
            mgr.close()
        rm(raw)
        rm(base / "hot-s3")
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logfile.close()
    med = statistics.median
    return {
        "bytes": nbytes, "archived": archived,
        "mgr_upload_s": upload, "mgr_hot_save_s": hot_save, "boto3_put_s": put, "boto3_multipart_s": multipart,
        "mgr_upload_gbps": nbytes / med(upload) / GB,
        "boto3_put_gbps": nbytes / med(put) / GB,
        "boto3_multipart_gbps": nbytes / med(multipart) / GB,
    }


# ---- report ----------------------------------------------------------------------------------


def rows(local: dict[str, Any], s3: dict[str, Any] | None) -> list[dict[str, Any]]:
    serial = 1 / (1 / local["disk_write_gbps"] + 1 / local["sha256_gbps"])
    out = [
        {"measurement": "disk sequential write + fsync", "value": local["disk_write_gbps"], "unit": "GB/s",
         "reference": None, "ratio": None, "target": None, "met": None},
        {"measurement": "sha256, one thread (context)", "value": local["sha256_gbps"], "unit": "GB/s",
         "reference": local["disk_write_gbps"], "ratio": local["sha256_gbps"] / local["disk_write_gbps"],
         "target": None, "met": None},
        {"measurement": "hash-then-write serially, bound (context)", "value": serial, "unit": "GB/s",
         "reference": local["disk_write_gbps"], "ratio": serial / local["disk_write_gbps"], "target": None,
         "met": None},
        {"measurement": "mgr sync save vs disk write", "value": local["mgr_sync_save_gbps"], "unit": "GB/s",
         "reference": local["disk_write_gbps"], "ratio": local["mgr_sync_save_gbps"] / local["disk_write_gbps"],
         "target": ">= 0.70", "met": local["mgr_sync_save_gbps"] / local["disk_write_gbps"] >= 0.70},
        {"measurement": "mgr sync save vs torch.save+fsync", "value": local["mgr_sync_save_gbps"], "unit": "GB/s",
         "reference": local["torch_save_gbps"], "ratio": local["mgr_sync_save_gbps"] / local["torch_save_gbps"],
         "target": ">= 1.00", "met": local["mgr_sync_save_gbps"] / local["torch_save_gbps"] >= 1.0},
        {"measurement": "async save: blocked (staging) vs sync save", "value": local["async_blocked_median_s"],
         "unit": "s", "reference": local["mgr_sync_save_median_s"],
         "ratio": local["async_blocked_median_s"] / local["mgr_sync_save_median_s"], "target": "<= 0.10",
         "met": local["async_blocked_median_s"] / local["mgr_sync_save_median_s"] <= 0.10},
        {"measurement": "host copy_ of the state (staging floor, context)", "value": local["host_copy_median_s"],
         "unit": "s", "reference": local["mgr_sync_save_median_s"],
         "ratio": local["host_copy_median_s"] / local["mgr_sync_save_median_s"], "target": None, "met": None},
        {"measurement": "async save: first save blocked (allocates buffers)", "value": local["async_first_blocked_s"],
         "unit": "s", "reference": local["mgr_sync_save_median_s"],
         "ratio": local["async_first_blocked_s"] / local["mgr_sync_save_median_s"], "target": None, "met": None},
        {"measurement": "async save: save() to wait() done", "value": local["async_total_median_s"], "unit": "s",
         "reference": local["mgr_sync_save_median_s"],
         "ratio": local["async_total_median_s"] / local["mgr_sync_save_median_s"], "target": None, "met": None},
    ]
    for mode in ("cold", "warm"):
        m, t = local[f"restore_mgr_{mode}_gbps"], local[f"restore_torch_{mode}_gbps"]
        label = "page cache evicted" if mode == "cold" else "page cache warm"
        out.append({"measurement": f"restore vs torch.load ({label})", "value": m, "unit": "GB/s", "reference": t,
                    "ratio": m / t, "target": None, "met": None})
    if s3 is not None:
        m = s3["mgr_upload_gbps"]
        for key, label in (("boto3_put_gbps", "boto3 put_object"),
                           ("boto3_multipart_gbps", "boto3 multipart, 1 thread")):
            out.append({"measurement": f"S3 upload (moto) vs {label}", "value": m, "unit": "GB/s",
                        "reference": s3[key], "ratio": m / s3[key], "target": None, "met": None})
    return out


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" + (f" {unit}" if unit else "")


def print_table(table: list[dict[str, Any]], header: str, notes: list[str]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # noqa: N806
    cells = [[r["measurement"], fmt(r["value"], r["unit"]), fmt(r["reference"], r["unit"]), fmt(r["ratio"]),
              r["target"] or "—", "—" if r["met"] is None else ("yes" if r["met"] else "NO")] for r in table]
    cols = ["measurement", "value", "reference", "ratio", "target", "met?"]
    if Console is not None:
        t = Table(title=header, title_justify="left")
        for i, c in enumerate(cols):
            t.add_column(c, justify="left" if i == 0 else "right")
        for row in cells:
            t.add_row(*row)
        console = Console(width=max(120, Console().width))
        console.print(t)
        for note in notes:
            console.print(f"  {note}", highlight=False)
    else:
        print(header)
        for row in [cols, *cells]:
            print(f"  {row[0]:52s} " + " ".join(f"{c:>12s}" for c in row[1:]))
        for note in notes:
            print(f"  {note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0, help="state size (default 1.0)")
    ap.add_argument("--tensors", type=int, default=16, help="number of float32 tensors (default 16)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per measurement; medians are reported")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a new temp dir under /tmp)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the run directory (the last sync checkpoint, moto.log) instead of deleting it")
    ap.add_argument("--s3-size-gib", type=float, default=None, help="state size for the S3 part (default min(size, 0.5))")
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 (moto) upload measurement")
    ap.add_argument("--json", action="store_true", help="print a JSON object of all figures instead of the table")
    args = ap.parse_args(argv)
    if args.size_gib <= 0 or args.tensors < 1 or args.repeats < 1:
        ap.error("--size-gib > 0, --tensors >= 1, --repeats >= 1")
    logging.basicConfig(level=logging.WARNING)

    created = args.dir is None
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir="/tmp")) if created else args.dir.absolute()
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=base))  # fresh per run: nothing from an earlier run is reused
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0]
    try:
        log(f"state: {args.size_gib} GiB in {args.tensors} float32 tensors; writing under {work}")
        state = make_state(int(args.size_gib * 2**30), args.tensors)
        local = bench_local(state, work, args.repeats)
        del state
        s3 = None
        if not args.no_s3:
            s3_gib = args.s3_size_gib if args.s3_size_gib is not None else min(args.size_gib, 0.5)
            log(f"S3: {s3_gib} GiB to a local moto server")
            s3 = bench_s3(make_state(int(s3_gib * 2**30), args.tensors, seed=2), work, args.repeats)
    finally:
        if not args.keep:
            shutil.rmtree(work if not created else base, ignore_errors=True)
    elapsed = time.perf_counter() - t_start

    table = rows(local, s3)
    figures = {"config": {"size_gib": args.size_gib, "tensors": args.tensors, "repeats": args.repeats,
                          "dir": str(work), "cpus": len(os.sched_getaffinity(0)), "torch": torch.__version__,
                          "elapsed_s": round(elapsed, 1), "loadavg_1m_before": load_before,
                          "loadavg_1m_after": os.getloadavg()[0]},
               "local": local, "s3": s3, "table": table}
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    notes = [
        f"{local['bytes'] / GB:.3f} GB state, median of {args.repeats}; GB = 1e9 bytes; run took {elapsed:.0f} s.",
        "Every timed write goes to a new file (new checkpoint dir / file name) and ends with fsync; "
        "the manager's retention (deleting its previous checkpoint) is inside its save time.",
        "Restore: mgr.restore fills the existing tensors; torch.load allocates new ones. "
        + ("'evicted' = files dropped from the page cache with posix_fadvise(DONTNEED) before each read."
           if local["restore_evicted_with_fadvise"] else "posix_fadvise unavailable: 'evicted' reads may be cached."),
        "Context rows: the manager hashes (sha256) every byte as it writes, on each of its writer threads "
        "(trainready.store.dcp_io.WRITE_THREADS), so hashing overlaps other threads' writes; one thread doing both "
        "would be bounded by 1/(1/disk + 1/sha256).",
        "Async blocked time = save() call with the previous save finished (wait() between saves); the staging "
        "floor is a plain tensor copy_ of the state into already-touched host buffers.",
    ]
    if s3 is not None:
        notes.append(f"S3: {s3['bytes'] / GB:.3f} GB, moto server on this machine (in memory, sharing these CPUs): "
                     "manager = time from save() return to wait() return (upload + checks + manifest), "
                     "references = one file of the same size sent by boto3 as one put_object (one PUT), and as a "
                     "multipart upload with the manager's part size on one thread.")
    header = (f"checkpoint bench: {args.size_gib} GiB, {args.tensors} tensors, {figures['config']['cpus']} CPU(s), "
              f"torch {torch.__version__}, load avg {load_before:.1f} -> {figures['config']['loadavg_1m_after']:.1f}")
    print_table(table, header, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
