"""The two places checkpoints live: the hot tier (a local directory, atomic by rename) and the
archive (any fsspec URL, committed by writing the manifest last)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ArchiveUnavailableError, CheckpointError, StorageFullError
from .faults import fault_point
from .manifest import LEASE, MANIFEST, PARTS_DIR, TMP_PREFIX, FileEntry, Lease, Manifest, parse_name, sha256_file


@dataclass
class Ref:
    """A checkpoint directory as found on a tier."""

    name: str
    step: int
    generation: int
    tier: str                      # "hot" or "archive"
    manifest: Manifest | None      # None: not committed (no manifest) or unreadable
    problem: str = ""              # why the manifest is unusable, if it is

    @property
    def committed(self) -> bool:
        return self.manifest is not None

    @property
    def order(self) -> tuple[int, int]:
        return (self.step, self.generation)


def redact(text: str) -> str:
    """Drop credentials from a message: URL user-info and the values of AWS secrets in env."""
    text = re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", str(text))
    for var in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _read_manifest(data: bytes, name: str) -> tuple[Manifest | None, str]:
    try:
        manifest = Manifest.from_bytes(data)
    except Exception as exc:  # any malformed manifest is a finding, not a crash
        return None, f"manifest unreadable: {str(exc).splitlines()[0]}"
    if parse_name(name) != (manifest.step, manifest.generation):
        return None, f"manifest says step {manifest.step} g{manifest.generation}, directory says {name}"
    return manifest, ""


class HotTier:
    """A local directory (the node's NVMe). Commit = fsync files, write manifest, rename, fsync parent."""

    tier = "hot"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)

    def ensure(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create hot tier {self.root}: {exc.strerror}") from exc

    def list(self) -> list[Ref]:
        if not self.root.is_dir():
            return []
        refs = []
        for entry in sorted(os.listdir(self.root)):
            parsed = parse_name(entry)
            if parsed is None:
                continue
            manifest, problem = None, "no manifest (never committed)"
            path = self.root / entry / MANIFEST
            if path.exists():
                manifest, problem = _read_manifest(path.read_bytes(), entry)
            refs.append(Ref(entry, *parsed, "hot", manifest, problem))
        return refs

    def path(self, name: str) -> Path:
        return self.root / name

    def tmp_path(self, name: str) -> Path:
        return self.root / f"{TMP_PREFIX}{name}"

    def stale_tmp(self) -> list[Path]:
        return [self.root / e for e in os.listdir(self.root) if e.startswith(TMP_PREFIX)] if self.root.is_dir() else []

    def commit(self, tmp: Path, name: str, manifest: Manifest) -> None:
        final = self.path(name)
        if final.exists():
            raise CheckpointError(f"{final} already exists; a committed checkpoint is never overwritten")
        try:
            write_durable(tmp / MANIFEST, manifest.to_bytes())
            fsync_dir(tmp)
            fault_point("hot.manifest_written")
            os.rename(tmp, final)
            fault_point("hot.renamed")
            fsync_dir(self.root)
        except OSError as exc:
            raise as_store_error(exc, self.root) from exc

    def delete(self, name: str) -> None:
        """Uncommit first (manifest gone, dir fsynced), then remove the data."""
        path = self.path(name)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path / MANIFEST)
            fsync_dir(path)
        fault_point("retention.deleting")
        shutil.rmtree(path, ignore_errors=True)

    def verify(self, name: str, entries: list[FileEntry], checksums: bool | None) -> list[str]:
        """Problems with the files of a checkpoint; sizes always; checksums when `checksums` is
        True, or (None = auto) for files modified after the manifest was written."""
        base = self.path(name)
        problems = []
        try:
            committed_at = os.stat(base / MANIFEST).st_mtime
        except OSError:
            committed_at = 0.0
        for entry in entries:
            path = base / entry.path
            try:
                stat = os.stat(path)
            except OSError:
                problems.append(f"{entry.path}: missing")
                continue
            if stat.st_size != entry.size:
                problems.append(f"{entry.path}: {stat.st_size} bytes, manifest says {entry.size}")
                continue
            check = checksums if checksums is not None else (stat.st_mtime > committed_at or entry.size < (1 << 20))
            if check and sha256_file(str(path)) != entry.sha256:
                problems.append(f"{entry.path}: checksum mismatch (file changed since it was written)")
        return problems

    def read_lease(self) -> Lease | None:
        return _parse_lease(self.root / LEASE)

    def write_lease(self, lease: Lease) -> None:
        tmp = self.root / f"{LEASE}.tmp"
        write_durable(tmp, lease.model_dump_json().encode())
        os.replace(tmp, self.root / LEASE)


def _parse_lease(path: Path) -> Lease | None:
    try:
        return Lease.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise CheckpointError(f"{path} is not a valid writer lease: {exc}") from exc


def as_store_error(exc: OSError, where: Path | str) -> CheckpointError:
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"no space left on {where} ({exc.strerror}); committed checkpoints are intact. "
                                "Free space or lower keep_hot, then save again.")
    return CheckpointError(f"I/O error on {where}: {exc.strerror or exc}")


class ArchiveTier:
    """Any fsspec filesystem. Data objects first, each checked; the manifest last commits."""

    tier = "archive"

    def __init__(self, url: str):
        self.url = redact(url)
        self.fs, self.root = open_url(str(url))
        self.root = self.root.rstrip("/")
        self.is_local = is_local(self.fs)
        self.is_s3 = "s3" in _protocols(self.fs)

    def _p(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as exc:
            reason = redact(str(exc)) or type(exc).__name__
            raise ArchiveUnavailableError(f"archive {self.url}: {what} failed: {reason}") from None

    def list(self) -> list[Ref]:
        self.fs.invalidate_cache()
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self._call("list", self.fs.ls, self.root, detail=False)]
        except FileNotFoundError:
            return []
        refs = []
        for name in sorted(names):
            parsed = parse_name(name)
            if parsed is None:
                continue
            try:
                data = self._call("read manifest", self.fs.cat_file, self._p(name, MANIFEST))
                manifest, problem = _read_manifest(data, name)
            except FileNotFoundError:
                manifest, problem = None, "no manifest (never committed)"
            refs.append(Ref(name, *parsed, "archive", manifest, problem))
        return refs

    def remote_size(self, name: str, path: str) -> int | None:
        try:
            info = self._call("stat", self.fs.info, self._p(name, path))
        except FileNotFoundError:
            return None
        return int(info.get("size") or 0)

    def upload(self, local: Path, name: str, entry: FileEntry) -> None:
        """Put one file and check the object: size always, and the S3 ETag (an MD5) when it has one."""
        remote = self._p(name, entry.path)
        if self.is_local:
            dest = Path(remote)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, dest)
            with open(dest, "rb+") as handle:
                os.fsync(handle.fileno())
        else:
            self._call(f"upload {entry.path}", self.fs.put_file, str(local), remote, chunksize=_S3_PART)
        self.fs.invalidate_cache(remote)
        info = self._call(f"check {entry.path}", self.fs.info, remote)
        if int(info.get("size") or 0) != entry.size:
            raise CheckpointError(f"archive {self.url}: {name}/{entry.path} has {info.get('size')} bytes after upload, "
                                  f"expected {entry.size}")
        etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
        if self.is_s3 and etag and etag != s3_etag(local, entry.size):
            raise CheckpointError(f"archive {self.url}: {name}/{entry.path} ETag {etag} does not match the local file")

    def put_bytes(self, name: str, path: str, data: bytes) -> None:
        remote = self._p(name, path) if name else self._p(path)
        if self.is_local:
            dest = Path(remote)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".tmp")
            write_durable(tmp, data)
            os.replace(tmp, dest)
            fsync_dir(dest.parent)
        else:
            self._call(f"write {path}", self.fs.pipe_file, remote, data)

    def get_bytes(self, name: str, path: str) -> bytes:
        remote = self._p(name, path) if name else self._p(path)
        self.fs.invalidate_cache(remote)
        return self._call(f"read {path}", self.fs.cat_file, remote)

    def exists(self, name: str, path: str) -> bool:
        try:
            self.get_bytes(name, path) if path == MANIFEST else self._call("stat", self.fs.info, self._p(name, path))
            return True
        except FileNotFoundError:
            return False

    def download(self, name: str, entry: FileEntry, dest: Path) -> None:
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        self._call(f"download {entry.path}", self.fs.get_file, self._p(name, entry.path), str(target))
        with open(target, "rb+") as handle:
            os.fsync(handle.fileno())
        if os.path.getsize(target) != entry.size or sha256_file(str(target)) != entry.sha256:
            raise CheckpointError(f"archive {self.url}: {name}/{entry.path} does not match its manifest (size or checksum)")

    def verify(self, name: str, entries: list[FileEntry], checksums: bool | None) -> list[str]:
        """Sizes from object metadata; checksums (a full read) only when asked."""
        problems = []
        for entry in entries:
            size = self.remote_size(name, entry.path)
            if size is None:
                problems.append(f"{entry.path}: missing")
            elif size != entry.size:
                problems.append(f"{entry.path}: {size} bytes, manifest says {entry.size}")
            elif checksums:
                digest = hashlib.sha256()
                with self.fs.open(self._p(name, entry.path), "rb", block_size=8 << 20) as handle:
                    while block := handle.read(8 << 20):
                        digest.update(block)
                if digest.hexdigest() != entry.sha256:
                    problems.append(f"{entry.path}: checksum mismatch")
        return problems

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("delete manifest", self.fs.rm_file, self._p(name, MANIFEST))
        fault_point("retention.deleting")
        with contextlib.suppress(FileNotFoundError):
            self._call("delete", self.fs.rm, self._p(name), recursive=True)
        self.fs.invalidate_cache()

    def parts(self, name: str) -> list[str]:
        self.fs.invalidate_cache()
        try:
            return [p.rsplit("/", 1)[-1] for p in self._call("list parts", self.fs.ls, self._p(name, PARTS_DIR), detail=False)]
        except FileNotFoundError:
            return []

    def read_lease(self) -> Lease | None:
        try:
            data = self.get_bytes("", LEASE)
        except FileNotFoundError:
            return None
        try:
            return Lease.model_validate_json(data)
        except Exception as exc:
            raise CheckpointError(f"archive {self.url}/{LEASE} is not a valid writer lease: {exc}") from exc

    def write_lease(self, lease: Lease) -> None:
        self.put_bytes("", LEASE, lease.model_dump_json().encode())


_S3_PART = 64 << 20


def s3_etag(path: Path, size: int) -> str:
    """The ETag S3 gives an object uploaded by s3fs from this file (single PUT or multipart)."""
    from s3fs.core import calculate_chunksize

    part = calculate_chunksize(size, chunksize=_S3_PART)
    single = size < min(5 * 2**30, 2 * part)
    digests = []
    with open(path, "rb") as handle:
        while True:
            block = handle.read(size if single else part)
            if not block and digests:
                break
            digests.append(hashlib.md5(block, usedforsecurity=False).digest())
            if single or not block:
                break
    if single:
        return digests[0].hex()
    return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(digests)}"


def is_local(fs: Any) -> bool:
    """Whether an fsspec filesystem is the local disk."""
    return "file" in _protocols(fs)


def _protocols(fs: Any) -> set[str]:
    proto = fs.protocol
    return set(proto if isinstance(proto, (tuple, list)) else (proto,)) | ({"file"} if "local" in str(proto) else set())


def open_url(url: str) -> tuple[Any, str]:
    """fsspec filesystem + path for a URL; S3 honours AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL."""
    import fsspec.core

    options: dict[str, Any] = {}
    if url.startswith(("s3://", "s3a://")):
        try:
            import s3fs  # noqa: F401
        except ImportError as exc:
            raise CheckpointError("s3:// archives need s3fs: pip install 'trainready[s3]'") from exc
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["client_kwargs"] = {"endpoint_url": endpoint}
        options["config_kwargs"] = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 2}}
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise CheckpointError(f"cannot open archive {redact(url)}: {exc}") from exc
    return fs, path
