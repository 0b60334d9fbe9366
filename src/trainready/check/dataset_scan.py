"""`trainready check --dataset URL`: is the training data laid out so GPUs can be fed from it?

Many small objects are the usual reason a node waits on its data: every object is one request
(a GET to S3 costs ~10-50 ms before the first byte; an open on NFS/Lustre a metadata round trip),
so a loader reading 14 KiB objects moves a few MB/s however fast the link is. A packed dataset
(trainready data pack: tar shards + index.json) or large objects are fine.

The listing is bounded (max_objects, time_limit_s): a prefix of millions of objects is sampled
from the start of its listing, and the result says so. Nothing is read but index.json.
"""

from __future__ import annotations

import errno
import os
import statistics
import time
from collections import Counter
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

from trainready.data.format import INDEX, DataIndex
from trainready.data.index_io import is_local, open_dataset, shard_url, storage_call
from trainready.errors import UsageError
from trainready.io import parse_json, read_regular, redact

from .findings import Finding

MIB = 1 << 20
SMALL_BYTES = 1 * MIB        # an object under this is latency-bound to read
MANY_LOCAL = 1000            # this many small files on a filesystem: warn
MANY_REMOTE = 250            # on object storage every object is a network round trip: warn sooner


class DatasetScan(BaseModel):
    """What a bounded listing of a dataset URL showed."""

    url: str
    objects_seen: int
    sampled: bool = Field(description="the listing stopped at the bound (max_objects or time_limit_s): more objects may exist")
    stopped_by: Literal["max_objects", "time_limit"] | None = None
    remote: bool = Field(description="object storage (every object is a request), not a local or mounted filesystem")
    total_bytes_seen: int
    median_size_bytes: int
    small_objects: int = Field(description=f"objects under {SMALL_BYTES} bytes (1 MiB)")
    small_share: float
    packed: bool = Field(description="an index.json of kind trainready-data-index at the URL's root")
    index_shards: int | None = None
    index_samples: int | None = None
    index_bytes: int | None = None
    index_complete: bool | None = None
    index_problem: str | None = Field(None, description="an index.json that is not a valid trainready index: why")
    extensions: dict[str, int] = Field(default_factory=dict, description="the 5 most common file extensions, with counts")
    seconds: float


def scan_dataset(url: str, max_objects: int = 10_000, time_limit_s: float = 20) -> DatasetScan:
    """List at most max_objects objects under url (and for at most ~time_limit_s) and read index.json.
    UsageError (exit 2) when nothing exists there or the storage cannot be reached."""
    started = time.monotonic()
    shown = redact(url)
    fs, root = open_dataset(url)
    remote = not is_local(fs)
    deadline = started + time_limit_s
    sizes, names, stopped = storage_call(url, "listing", _list, fs, root, remote, max(1, max_objects), deadline)
    if not sizes and not storage_call(url, "checking", _exists, fs, root):
        raise UsageError(f"--dataset {shown}: nothing exists there (check the path, bucket and prefix)")
    index, problem = _read_index(fs, root, url, remote) if sizes else (None, None)
    small = sum(s < SMALL_BYTES for s in sizes)
    exts = Counter(_ext(n) for n in names).most_common(5)
    return DatasetScan(url=shown, objects_seen=len(sizes), sampled=stopped is not None, stopped_by=stopped, remote=remote,
                       total_bytes_seen=sum(sizes), median_size_bytes=int(statistics.median(sizes)) if sizes else 0,
                       small_objects=small, small_share=round(small / len(sizes), 4) if sizes else 0.0,
                       packed=index is not None, index_problem=problem,
                       index_shards=len(index.shards) if index else None, index_samples=index.total_samples if index else None,
                       index_bytes=index.total_bytes if index else None, index_complete=index.complete if index else None,
                       extensions=dict(exts), seconds=round(time.monotonic() - started, 3))


def _exists(fs: Any, root: str) -> bool:
    return bool(fs.exists(root))


def _ext(name: str) -> str:
    return PurePosixPath(name).suffix.lower() or "(none)"


Listing = tuple[list[int], list[str], Literal["max_objects", "time_limit"] | None]


def _list(fs: Any, root: str, remote: bool, bound: int, deadline: float) -> Listing:
    """(sizes, names, why the listing stopped early or None): files under root, at most `bound`."""
    if not remote:
        return _list_local(root, bound, deadline)
    if hasattr(fs, "_iterdir") and getattr(fs, "loop", None) is not None:
        return _list_s3(fs, root, bound, deadline)
    return _list_walk(fs, root, bound, deadline)


def _list_local(root: str, bound: int, deadline: float) -> Listing:
    """os.scandir, one entry at a time: a directory of millions of files is not listed whole.
    Hidden names (.tmp files of a pack in progress, .git) are skipped, as `data pack` skips them."""
    if os.path.isfile(root):
        return [os.path.getsize(root)], [root], None
    if not os.path.isdir(root):
        return [], [], None
    sizes: list[int] = []
    names: list[str] = []
    stack = [root]
    while stack:
        if sizes and time.monotonic() > deadline:
            return sizes, names, "time_limit"
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file():
                    if len(sizes) >= bound:
                        return sizes, names, "max_objects"
                    sizes.append(entry.stat().st_size)
                    names.append(entry.name)
                    if len(sizes) % 1000 == 0 and time.monotonic() > deadline:
                        return sizes, names, "time_limit"
    return sizes, names, None


def _list_s3(fs: Any, root: str, bound: int, deadline: float) -> Listing:
    """One flat ListObjectsV2 (no delimiter), page by page, stopped at the bound: 1,000 keys a request."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(root)
    prefix = key.strip("/") + "/" if key.strip("/") else ""

    async def collect() -> Listing:
        sizes: list[int] = []
        names: list[str] = []
        async for item in fs._iterdir(bucket, max_items=bound + 1, delimiter="", prefix=prefix):
            if item.get("type") != "file" or item["name"].endswith("/"):  # "directory" placeholder objects
                continue
            if len(sizes) >= bound:
                return sizes, names, "max_objects"
            sizes.append(int(item.get("size") or 0))
            names.append(item["name"])
            if len(sizes) % 1000 == 0 and time.monotonic() > deadline:
                return sizes, names, "time_limit"
        return sizes, names, None

    sizes, names, stopped = sync(fs.loop, collect)
    if not sizes and key and fs.isfile(root):  # the URL names one object
        return [int(fs.info(root).get("size") or 0)], [root], None
    return sizes, names, stopped


def _list_walk(fs: Any, root: str, bound: int, deadline: float) -> Listing:
    """Any other fsspec filesystem: walk directory by directory, stop at the bound."""
    sizes: list[int] = []
    names: list[str] = []
    for _dir, _dirs, files in fs.walk(root, detail=True):
        for name, info in files.items():
            if len(sizes) >= bound:
                return sizes, names, "max_objects"
            sizes.append(int(info.get("size") or 0))
            names.append(name)
        if time.monotonic() > deadline:
            return sizes, names, "time_limit"
    return sizes, names, None


MAX_INDEX_BYTES = 256 * MIB  # an index of ~1M shards; a local index.json larger is not read


def _read_index(fs: Any, root: str, url: str, remote: bool = True) -> tuple[DataIndex | None, str | None]:
    """(index, None) when root holds a trainready index.json; (None, why) for another index.json,
    or a local one we will not read (a FIFO, a device, a symlink, larger than MAX_INDEX_BYTES:
    reading it could hang or never end); (None, None) for none."""
    try:
        if remote:
            data = storage_call(url, f"reading {INDEX}", fs.cat_file, shard_url(root, INDEX), missing=True)
        else:
            data = read_regular(os.path.join(root, INDEX), MAX_INDEX_BYTES)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None, None
    except OSError as exc:  # local only: storage_call turned remote errors into UsageError
        why = {errno.ELOOP: "a symlink, not followed", errno.EINVAL: "not a plain file",
               errno.EFBIG: f"larger than {MAX_INDEX_BYTES // MIB} MiB"}.get(exc.errno, exc.strerror or str(exc))
        return None, f"{INDEX} not read: {why}"
    try:
        kind = parse_json(data).get("kind")
    except (ValueError, AttributeError):
        return None, f"{INDEX} is not JSON"
    if kind != "trainready-data-index":
        return None, None  # someone else's index.json: not ours to judge
    try:
        return DataIndex.model_validate_json(data), None
    except ValueError as exc:
        return None, f"{INDEX} is not a valid trainready index ({str(exc).splitlines()[0]})"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def dataset_finding(scan: DatasetScan, url: str | None = None) -> Finding:
    """The `data.layout` finding of a scan; `url` (unredacted is fine: only shown) names the dataset in the advice."""
    url = scan.url if url is None else redact(url)
    many = MANY_REMOTE if scan.remote else MANY_LOCAL
    count = f"{scan.objects_seen:,} objects"
    if scan.sampled:
        why = ", the listing's time limit reached" if scan.stopped_by == "time_limit" else ""
        count = f"{scan.objects_seen:,}+ objects (sampled the first {scan.objects_seen:,} of the listing{why})"
    exts = ", ".join(f"{e} {n:,}" for e, n in scan.extensions.items())
    expected = f"a packed dataset (index.json + tar shards), or objects with a median of at least {human_bytes(SMALL_BYTES)}"
    finding = Finding(id="data.layout", area="data", status="pass", expected=expected)
    if scan.packed:
        state = "complete" if scan.index_complete else "INCOMPLETE (packing not finished)"
        finding.observed = (f"packed: index.json lists {scan.index_shards:,} shards, {scan.index_samples:,} samples, "
                            f"{human_bytes(scan.index_bytes or 0)}, {state}; listed {count}, "
                            f"median {human_bytes(scan.median_size_bytes)}")
        if not scan.index_complete:
            finding.status = "warn"
            finding.reason = "index.json says packing has not finished: readers see only the shards listed so far"
            finding.advice = "run the same `trainready data pack` command again: it resumes after the last committed shard"
        elif scan.index_shards and scan.index_bytes is not None and scan.index_bytes / scan.index_shards < SMALL_BYTES \
                and scan.index_shards > many:
            finding.status = "warn"
            finding.reason = f"packed, but {scan.index_shards:,} shards averaging under 1 MiB: still one request per few samples"
            finding.advice = "pack again with a larger --shard-size (100 MiB to 1 GiB suits object storage) and --restart"
        else:
            finding.reason = "packed into shards: one request reads thousands of samples"
        return finding
    finding.observed = (f"{count}, median {human_bytes(scan.median_size_bytes)}, {scan.small_share:.0%} under 1 MiB, "
                        f"{human_bytes(scan.total_bytes_seen)} seen" + (f"; {exts}" if exts else ""))
    if scan.index_problem:
        finding.observed += f"; {scan.index_problem}"
    if scan.objects_seen == 0:
        finding.status = "warn"
        finding.observed = f"no files under {url}"
        finding.reason = "the dataset location exists but is empty"
        finding.advice = "point --dataset at the data the job will read"
    elif scan.median_size_bytes < SMALL_BYTES and scan.objects_seen > many:
        where = "on object storage each object is one GET, ~10-50 ms before the first byte" if scan.remote \
            else "each file is an open and a read, a metadata round trip on NFS/Lustre"
        finding.status = "warn"
        finding.reason = f"reads of many small objects starve GPUs ({where}): data loaders wait on latency, not bandwidth"
        finding.advice = f"pack them: {_pack_command(scan, url)}"
    elif scan.median_size_bytes < SMALL_BYTES:
        finding.reason = f"small objects, but few ({scan.objects_seen:,}, warn above {many:,}): reading them is cheap"
    else:
        finding.reason = "objects are large enough to read at full bandwidth"
    return finding


def _pack_command(scan: DatasetScan, url: str) -> str:
    top = next(iter(scan.extensions), "")
    fmt = " --format jsonl" if top in (".jsonl", ".json") else " --format tokens" if top == ".npy" else ""
    base = url.rstrip("/")
    if scan.remote:  # data pack reads a local directory
        return (f"aws s3 sync {base} ./corpus && trainready data pack ./corpus{fmt} --out {base}-packed "
                f"(then train from {base}-packed with trainready.data.ShardedDataset)")
    return f"trainready data pack {base}{fmt} --out {base}-packed"
