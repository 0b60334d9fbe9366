"""Reading and writing a packed dataset's storage: index.json (the commit point) and shards
(built in a local file, hashed on the way, then moved or uploaded into place).

Every storage failure becomes a UsageError naming the URL (credentials redacted): a dataset
location that is missing, unreachable or not a dataset is something the user fixes, not a bug.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from trainready.errors import TrainreadyError, UsageError
from trainready.io import (
    HashingWriter,
    create_exclusive,
    fsync_dir,
    fsync_file,
    is_local,
    open_url,
    redact,
    replace_durable,
    upload_checked,
)

from .format import (
    INDEX,
    SHARD_DIR,
    DataIndex,
    ShardInfo,
    SourcePosition,
    add_member,
    index_problem,
    member_bytes,
    shard_name,
    tar_file_size,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
WHERE = "a directory, file:///path or s3://bucket/prefix"


def open_dataset(url: str) -> tuple[Any, str]:
    """(fs, root) for a dataset URL: a local directory, file:///path, or s3://bucket/prefix.
    UsageError for a location that cannot be one: empty (which would mean the current
    directory), an S3 URL without a valid bucket name (open_url checks it), a local path through a
    symlink loop or with a name too long for the file system."""
    url = str(url)
    if not url.strip() or url.strip() in ("file://", "file:"):
        raise UsageError(f"the dataset location {url!r} is empty: give {WHERE} (use . for the current directory)")
    try:
        fs, root = open_url(url)
    except TrainreadyError as exc:
        raise UsageError(str(exc).replace("open archive", "open")) from None  # the store's wording, minus "archive"
    root = root.rstrip("/") or "/"
    if is_local(fs):
        check_local_path(Path(root), redact(url))
    return fs, root


def _name_max(path: Path) -> int:
    """The longest file name the file system holding `path` (or its nearest existing parent) allows."""
    for parent in (path, *path.parents):
        try:
            return os.pathconf(parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            continue
    return 255


def check_local_path(path: Path, shown: str | None = None) -> None:
    """UsageError when a local path cannot name a file: a name in it or the whole path too long
    (ENAMETOOLONG, whether or not its parents exist yet), a symlink loop on the way, a file where
    a directory should be, no permission to look. A path that does not exist yet is fine (pack
    creates it)."""
    shown = shown or str(path)
    longest = max(path.parts, key=lambda p: len(os.fsencode(p)), default="")
    size, limit = len(os.fsencode(longest)), _name_max(path)
    if size > limit:
        name = longest if len(longest) <= 40 else f"{longest[:20]}...{longest[-12:]}"
        raise UsageError(f"{shown}: the name {name!r} is {size:,} bytes, longer than the file system allows "
                         f"({limit}); choose a shorter name")
    try:
        os.stat(path)
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        code, reason = exc.errno, exc.strerror or type(exc).__name__
    if code == errno.ELOOP:
        raise UsageError(f"{shown}: a symlink loop (symbolic links that point at each other) on the way to it; "
                         "remove or fix the links, or choose another path")
    if code == errno.ENAMETOOLONG:
        raise UsageError(f"{shown}: the path is {len(os.fsencode(str(path))):,} bytes, longer than the system allows; "
                         "choose a shorter path")
    if code == errno.ENOTDIR:
        raise UsageError(f"{shown}: a part of the path is a file, not a directory")
    raise UsageError(f"{shown}: {reason}")


def shard_url(root: str, name: str) -> str:
    """Where shard `name` (as index.json lists it, e.g. shards/shard-000000.tar) lives, in the
    filesystem that open_dataset / load_index returned with `root`."""
    return f"{root.rstrip('/')}/{name}"


def storage_call(url: str, what: str, fn: Callable[..., T], *args: Any, missing: bool = False, **kwargs: Any) -> T:
    """fn(*args) with any storage error turned into a UsageError naming the URL and the step;
    with missing=True a FileNotFoundError is passed through for the caller to handle."""
    try:
        return fn(*args, **kwargs)
    except TrainreadyError:
        raise
    except FileNotFoundError:
        if missing:
            raise
        raise UsageError(f"{redact(url)}: {what} failed: not found (does the bucket or directory exist?)") from None
    except Exception as exc:  # botocore, aiohttp, OSError...: all mean "this location does not work"
        reason = getattr(exc, "strerror", None) or redact(str(exc)) or type(exc).__name__
        reason = " ".join(reason.split())  # one line: botocore's "Parameter validation failed:\n..." has two
        raise UsageError(f"{redact(url)}: {what} failed: {reason}") from None


def read_index(fs: Any, root: str, url: str) -> DataIndex | None:
    """The dataset's index, or None when there is no index.json (nothing committed yet)."""
    path = shard_url(root, INDEX)
    with contextlib.suppress(Exception):  # a stale listing cache must not hide a fresh index
        fs.invalidate_cache(path)
    try:
        data = storage_call(url, f"reading {INDEX}", fs.cat_file, path, missing=True)
    except FileNotFoundError:
        return None
    try:  # every field checked (format.py): names stay under shards/, sha256s are hex, counts add up
        return DataIndex.model_validate_json(data)
    except ValidationError as exc:
        raise UsageError(f"{redact(url)}/{INDEX} is not a trainready dataset index ({index_problem(exc)}); "
                         f"pack the data again with --restart or point at another URL") from None


def load_index(url: str) -> tuple[DataIndex, Any, str]:
    """(index, fs, root) of a packed dataset; UsageError (never a traceback) when there is none.
    The index may be incomplete (a pack still running or interrupted): check `index.complete`."""
    fs, root = open_dataset(url)
    index = read_index(fs, root, url)
    if index is None:
        try:
            exists = bool(fs.exists(root))
        except Exception:
            exists = False
        hint = (f"{redact(url)} exists but has no {INDEX} (not a packed dataset, or packing has not committed a shard yet)"
                if exists else f"nothing exists at {redact(url)}")
        raise UsageError(f"no packed dataset at {redact(url)}: {hint}. Pack one with `trainready data pack SRC --out URL`.")
    return index, fs, root


def write_index(fs: Any, root: str, index: DataIndex, url: str = "") -> None:
    """Replace index.json so a reader sees the old or the new one, never a mix: a local file is
    written under a temporary name, fsynced and renamed; an S3 object is one PUT (atomic by itself)."""
    data = (index.model_dump_json(indent=2) + "\n").encode()
    path = shard_url(root, INDEX)
    if is_local(fs):
        target = Path(path)

        def replace() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            replace_durable(target, data)

        storage_call(url or root, f"writing {INDEX}", replace)
    else:
        storage_call(url or root, f"writing {INDEX}", fs.pipe_file, path, data)


class ShardBuilder:
    """One shard being written to a local file: tar members streamed, sha256 computed on the way
    (the shard is never read back to hash it). The file is created O_EXCL|O_NOFOLLOW: a leftover
    of a killed pack is removed first, and a symlink planted in its place is never written through."""

    def __init__(self, path: Path, number: int, first_sample: int):
        self.path, self.name, self.first_sample = path, shard_name(number), first_sample
        path.unlink(missing_ok=True)  # removes a symlink itself, never its target
        self.handle = os.fdopen(create_exclusive(path), "wb")
        self.out = HashingWriter(self.handle)  # closing it leaves self.handle open: closed below
        self.tar = tarfile.open(fileobj=self.out, mode="w|", format=tarfile.PAX_FORMAT)  # w|: no seeks
        self.samples = self.payload = self.tokens = self.members_bytes = 0
        self.end = SourcePosition(file=0, record=0)

    def file_size_with(self, member: str, size: int) -> int:
        """The shard's file size, tar headers and padding included, if a member of `size` bytes were added."""
        return tar_file_size(self.members_bytes + member_bytes(self.tar, member, size))

    def add(self, member: str, payload: bytes, tokens: int, end: SourcePosition) -> None:
        self.members_bytes += member_bytes(self.tar, member, len(payload))
        add_member(self.tar, member, payload)
        self.samples += 1
        self.payload += len(payload)
        self.tokens += tokens
        self.end = end

    def close(self) -> ShardInfo:
        self.tar.close()
        self.handle.close()
        return ShardInfo(name=self.name, samples=self.samples, bytes=self.out.size, sha256=self.out.hexdigest(),
                         tokens=self.tokens, first_sample=self.first_sample, source_end=self.end)

    def discard(self) -> None:
        with contextlib.suppress(Exception):  # closes the tar stream now, not in a later __del__
            self.tar.close()
        self.handle.close()
        self.path.unlink(missing_ok=True)


def shard_temp_path(fs: Any, root: str, name: str, scratch: Path) -> Path:
    """Where to build a shard before it goes live: next to its final place on a local disk (so
    going live is a rename), else in local scratch space (then uploaded)."""
    if is_local(fs):
        final = Path(shard_url(root, name))
        final.parent.mkdir(parents=True, exist_ok=True)
        return final.with_name(f".{final.name}.tmp")  # fixed: a resumed pack overwrites what a killed one left
    return scratch / Path(name).name


def put_shard(fs: Any, root: str, local: Path, name: str, size: int, sha256: str, url: str) -> None:
    """Move a finished shard into place and check it there. Overwrites an uncommitted shard of
    the same name left by an interrupted pack (readers never see unlisted shards). Local: a
    rename, then its size checked. Remote: trainready.io.upload_checked, which proves an S3 object
    by its SHA-256 checksum (other stores, and S3 servers that report none: by size)."""
    remote = shard_url(root, name)
    if not is_local(fs):
        proof = storage_call(url, f"uploading {name}", upload_checked, fs, local, remote, sha256, size)
        if proof != "sha256":
            log.info("%s/%s: the store reports no checksum, the upload was checked by size only", redact(url), name)
        local.unlink()
        return

    def rename() -> None:
        fsync_file(local)  # on disk before the name (and then the index) says it is there
        os.replace(local, remote)
        fsync_dir(Path(remote).parent)

    storage_call(url, f"writing {name}", rename)
    with contextlib.suppress(Exception):
        fs.invalidate_cache(remote)
    found = int(storage_call(url, f"checking {name}", fs.info, remote).get("size") or 0)
    if found != size:
        raise UsageError(f"{redact(url)}/{name} has {found} bytes after the move, expected {size}; run the same command again")


def clear_dataset(fs: Any, root: str, url: str) -> None:
    """--restart: uncommit first (index.json gone), then delete every shard, listed or not."""
    with contextlib.suppress(FileNotFoundError):
        storage_call(url, f"deleting {INDEX}", fs.rm_file, shard_url(root, INDEX), missing=True)
    shard_dir = shard_url(root, SHARD_DIR)
    with contextlib.suppress(Exception):
        fs.invalidate_cache(shard_dir)
    try:
        names = storage_call(url, f"listing {SHARD_DIR}/", fs.ls, shard_dir, detail=False, missing=True)
    except FileNotFoundError:
        return
    for path in names:
        base = path.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(("shard-", ".shard-")) and ".tar" in base:
            with contextlib.suppress(FileNotFoundError):
                storage_call(url, f"deleting {SHARD_DIR}/{base}", fs.rm_file, path, missing=True)
