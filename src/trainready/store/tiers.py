"""The two places checkpoints live: the hot tier (a local directory, atomic by rename) and the
archive (any fsspec URL, committed by writing the manifest last, create-only).

A checkpoint directory found on a tier is a `Ref` in one of three states: committed (a valid
manifest), uncommitted (no manifest: a save in progress or debris of a crash) or unreadable (a
manifest is there but cannot be used: malformed, another schema version, a name mismatch, no
permission). Unreadable is not uncommitted: it is kept and reported, never deleted automatically.

Writer leases (`writer.json`) are read with a version tag and replaced conditionally (S3
If-Match / If-None-Match; locally an flock'ed compare-and-replace), so two writers claiming at
once cannot both win. A damaged lease is reported, not fatal: the claim rebuilds it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from glob import has_magic
from pathlib import Path
from typing import IO, Any

from trainready.io import (
    S3_PART,
    IntegrityError,
    PreconditionFailed,
    SourceChangedError,
    fsync_dir,
    hash_stream,
    is_local,
    is_s3,
    local_tag,
    make_dir,
    open_url,
    put_if,
    put_if_local,
    read_regular,
    read_versioned,
    redact,
    stored_matches,
    upload_checked,
    verify_file,
    write_synced,
)

from .errors import ArchiveUnavailableError, CheckpointError, StorageFullError
from .faults import fault_point
from .manifest import LEASE, MANIFEST, PARTS_DIR, TMP_PREFIX, FileEntry, Lease, Manifest, parse_name

MAX_MANIFEST_BYTES = 64 << 20
MAX_LEASE_BYTES = 1 << 20


class _EntryError(Exception):
    """One archive object cannot be read (denied, a directory, oversized): that entry's problem."""


class LocalCopyChangedError(CheckpointError):
    """A hot checkpoint's file no longer matches its manifest: it cannot be archived as it is."""


Progress = Callable[[int], None]  # called with the number of bytes just dealt with


class _Counted:
    """A binary handle whose reads are reported to `report` (bytes read), for progress bars."""

    def __init__(self, handle: IO[bytes], report: Progress):
        self.handle, self.report = handle, report

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        if data:
            self.report(len(data))
        return data


class _Tally:
    """Passes reported bytes on and counts them, so a file's remainder (not read: missing, off in
    size, failed halfway, or not hashed at all) can be reported once it is dealt with."""

    def __init__(self, report: Progress):
        self.report, self.count = report, 0

    def __call__(self, amount: int) -> None:
        self.count += amount
        self.report(amount)

    def finish(self, size: int) -> None:
        if size > self.count:
            self.report(size - self.count)
        self.count = 0


def _fsspec_progress(report: Progress) -> Any:
    """An fsspec Callback that reports the bytes each transfer step adds."""
    from fsspec.callbacks import Callback

    class _Bytes(Callback):
        sent = 0

        def call(self, *args: Any, **kwargs: Any) -> None:
            if self.value > self.sent:
                report(self.value - self.sent)
                self.sent = self.value

    return _Bytes()


@dataclass
class Ref:
    """A checkpoint directory as found on a tier."""

    name: str
    step: int
    generation: int
    tier: str                      # "hot" or "archive"
    manifest: Manifest | None      # None: not committed, or unreadable
    problem: str = ""              # why the manifest is absent or unusable
    unreadable: bool = False       # a manifest is there but cannot be used (kept, reported, never auto-deleted)
    fenced: bool = False           # committed by a writer that had lost the prefix (never restored)

    @property
    def committed(self) -> bool:
        return self.manifest is not None

    @property
    def status(self) -> str:
        if self.unreadable:
            return "unreadable"
        if self.manifest is None:
            return "uncommitted"
        return "fenced" if self.fenced else "committed"

    @property
    def order(self) -> tuple[int, int]:
        return (self.step, self.generation)


@dataclass
class LeaseState:
    """What a tier's writer.json says, with the version tag a conditional replace needs."""

    lease: Lease | None = None
    tag: str | None = None         # None: there is no writer.json
    damaged: str = ""              # why an existing writer.json could not be read

    @property
    def exists(self) -> bool:
        return self.tag is not None


def _why(exc: Exception) -> str:
    """One line on what is wrong with a file we parsed: a validation error names its field."""
    errors = exc.errors() if hasattr(exc, "errors") and callable(exc.errors) else []
    if errors:
        first = errors[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "top level"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return redact(f"{where}: {first.get('msg', 'invalid')}{more}")
    return redact((str(exc).splitlines() or [""])[0]) or type(exc).__name__


def _read_manifest(data: bytes, name: str) -> tuple[Manifest | None, str]:
    try:
        manifest = Manifest.from_bytes(data)
    except Exception as exc:  # any malformed manifest is a finding, not a crash
        return None, f"manifest unreadable: {_why(exc)}"
    if parse_name(name) != (manifest.step, manifest.generation):
        return None, f"manifest says step {manifest.step} g{manifest.generation}, directory says {name}"
    return manifest, ""


def _parse_lease(data: bytes, tag: str, where: str) -> LeaseState:
    try:
        return LeaseState(Lease.model_validate_json(data), tag)
    except Exception as exc:
        return LeaseState(None, tag, f"{where} is damaged ({_why(exc)})")


def _not_a_directory(path: str | os.PathLike) -> str:
    """'a symlink' or 'not a directory' for what is in a local checkpoint's place, '' for a directory."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return ""
    if stat.S_ISDIR(mode):
        return ""
    return "a symlink" if stat.S_ISLNK(mode) else "not a directory"


def as_store_error(exc: OSError, where: Path | str) -> CheckpointError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"no space left on {where} ({exc.strerror}); committed checkpoints are intact. "
                                "Free space or lower keep_hot, then save again.")
    return CheckpointError(f"I/O error on {where}: {exc.strerror or exc}")


class HotTier:
    """A local directory (the node's NVMe). Commit = fsync files, write manifest, rename, fsync parent."""

    tier = "hot"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)

    def ensure(self) -> None:
        try:
            make_dir(self.root)
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
            with contextlib.suppress(FileNotFoundError):  # deleted while we looked
                refs.append(self._ref(entry, parsed))
        return refs

    def _ref(self, entry: str, parsed: tuple[int, int]) -> Ref:
        st = os.lstat(self.root / entry)
        if not stat.S_ISDIR(st.st_mode):  # a symlink or file under a checkpoint's name: never read through it
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
            return Ref(entry, *parsed, "hot", None, f"{kind}, not a checkpoint directory", unreadable=True)
        try:
            data = read_regular(self.root / entry / MANIFEST, MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return Ref(entry, *parsed, "hot", None, "no manifest (never committed)")
        except OSError as exc:
            what = "manifest"
            try:
                os.listdir(self.root / entry)
            except OSError:
                what = "directory"  # e.g. mode 000: whether a manifest is in it cannot be known
            return Ref(entry, *parsed, "hot", None, f"{what} unreadable: {exc.strerror or exc}", unreadable=True)
        manifest, problem = _read_manifest(data, entry)
        return Ref(entry, *parsed, "hot", manifest, problem, unreadable=manifest is None)

    def path(self, name: str) -> Path:
        return self.root / name

    def tmp_path(self, name: str) -> Path:
        return self.root / f"{TMP_PREFIX}{name}"

    def stale_tmp(self) -> list[Path]:
        return [self.root / e for e in os.listdir(self.root) if e.startswith(TMP_PREFIX)] if self.root.is_dir() else []

    def commit(self, tmp: Path, name: str, manifest: Manifest) -> None:
        final = self.path(name)
        if os.path.lexists(final):
            raise CheckpointError(f"{final} already exists; a committed checkpoint is never overwritten")
        try:
            write_synced(tmp / MANIFEST, manifest.to_bytes())
            fsync_dir(tmp)
            fault_point("hot.manifest_written")
            os.rename(tmp, final)
            fault_point("hot.renamed")
            fsync_dir(self.root)
        except OSError as exc:
            raise as_store_error(exc, self.root) from exc

    def delete(self, name: str) -> None:
        """Uncommit first (manifest gone, dir fsynced), then remove the data. A symlink or file in
        a checkpoint's place is removed itself: nothing is ever deleted through it."""
        path = self.path(name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.remove(path)
            return
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.remove(path / MANIFEST)
            fsync_dir(path)
        fault_point("retention.deleting")
        shutil.rmtree(path, ignore_errors=True)

    def verify(self, name: str, entries: list[FileEntry], checksums: bool | None,
               on_progress: Progress | None = None) -> list[str]:
        """Problems with the files of a checkpoint; sizes always; checksums when `checksums` is
        True, or (None = auto) for files modified after the manifest was written. A symlink or
        anything but a regular file is a problem: a checkpoint never reads outside itself; so is
        a file that cannot be read (no permission). `on_progress` gets the bytes dealt with."""
        base = self.path(name)
        problems = []
        try:
            committed_at = os.lstat(base / MANIFEST).st_mtime
        except OSError:
            committed_at = 0.0
        tally = _Tally(on_progress) if on_progress is not None else None
        for entry in entries:
            problem = self._check_file(base, entry, checksums, committed_at, tally)
            if problem:
                problems.append(f"{entry.path}: {problem}")
            if tally is not None:
                tally.finish(entry.size)
        return problems

    @staticmethod
    def _check_file(base: Path, entry: FileEntry, checksums: bool | None, committed_at: float,
                    on_progress: Progress | None) -> str:
        """What is wrong with one file, or ''."""
        path = base / entry.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size != entry.size:
            return f"{st.st_size} bytes, manifest says {entry.size}"
        check = checksums if checksums is not None else (st.st_mtime > committed_at or entry.size < (1 << 20))
        if not check:
            return ""
        try:
            with open(path, "rb") as handle:
                digest = hash_stream(_Counted(handle, on_progress) if on_progress else handle)[0]
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"
        return "" if digest == entry.sha256 else "checksum mismatch (file changed since it was written)"

    def read_lease(self) -> LeaseState:
        path = self.root / LEASE
        tag = local_tag(path)
        if tag is None:
            return LeaseState()
        try:
            data = read_regular(path, MAX_LEASE_BYTES)
        except FileNotFoundError:
            return LeaseState()  # removed between the two looks
        except OSError as exc:
            return LeaseState(None, tag, f"{path} cannot be read ({exc.strerror or exc})")
        return _parse_lease(data, tag, str(path))

    def write_lease(self, lease: Lease, prior: LeaseState | None = None) -> None:
        """Replace writer.json if it is still what `prior` read (PreconditionFailed otherwise);
        without `prior`, unconditionally. Durable either way."""
        data = lease.model_dump_json().encode()
        condition: dict[str, Any] = {}
        if prior is not None:
            condition = {"if_match": prior.tag} if prior.exists else {"create_only": True}
        try:
            put_if_local(self.root / LEASE, data, **condition)
        except OSError as exc:
            raise CheckpointError(f"cannot write the writer lease {self.root / LEASE}: {exc.strerror or exc} "
                                  "(if something other than a file is there, remove it)") from None


class ArchiveTier:
    """Any fsspec filesystem. Data objects first, each proven; the manifest last, create-only."""

    tier = "archive"

    def __init__(self, url: str):
        self.url = redact(url)
        self.fs, root = open_url(str(url))
        self.root = root.rstrip("/")
        self.is_local = is_local(self.fs)
        self.is_s3 = is_s3(self.fs)
        self.part_size = S3_PART

    def _p(self, *parts: str) -> str:
        return "/".join((self.root, *(p for p in parts if p)))

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (FileNotFoundError, PreconditionFailed, SourceChangedError, _EntryError):
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
            if self.is_local and (kind := _not_a_directory(self._p(name))):  # never read through it
                refs.append(Ref(name, *parsed, "archive", None, f"{kind}, not a checkpoint directory", unreadable=True))
                continue
            try:
                data = self._call("read manifest", self._read_entry, self._p(name, MANIFEST))
            except FileNotFoundError:
                refs.append(Ref(name, *parsed, "archive", None, "no manifest (never committed)"))
                continue
            except _EntryError as exc:  # this one object: denied, a directory, too big; not the archive
                refs.append(Ref(name, *parsed, "archive", None, f"manifest unreadable: {exc}", unreadable=True))
                continue
            manifest, problem = _read_manifest(data, name)
            refs.append(Ref(name, *parsed, "archive", manifest, problem, unreadable=manifest is None))
        return refs

    def _read_entry(self, path: str) -> bytes:
        """One small object; problems of that object alone (not of the archive) are _EntryError."""
        try:
            if self.is_local:
                return read_regular(path, MAX_MANIFEST_BYTES)
            size = int(self.fs.info(path).get("size") or 0)
            if size > MAX_MANIFEST_BYTES:
                raise _EntryError(f"{size} bytes, more than a manifest may have")
            return self.fs.cat_file(path)
        except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
            raise _EntryError(redact(str(exc.strerror or exc))) from None
        except OSError as exc:
            if self.is_local and not isinstance(exc, FileNotFoundError):
                raise _EntryError(exc.strerror or str(exc)) from None
            raise

    def remote_size(self, name: str, path: str) -> int | None:
        try:
            info = self._call("stat", self.fs.info, self._p(name, path))
        except FileNotFoundError:
            return None
        return int(info.get("size") or 0)

    def holds(self, local: Path, name: str, entry: FileEntry) -> bool:
        """Whether the archive already has this exact file (by content, see io.stored_matches)."""
        return bool(self._call(f"check {entry.path}", stored_matches, self.fs, local, self._p(name, entry.path),
                               entry.sha256, entry.size, part_size=self.part_size))

    def upload(self, local: Path, name: str, entry: FileEntry) -> str:
        """Put one file and prove the stored object matches it (see trainready.io.upload_checked):
        returns "sha256" or "size" (what could be checked). An object that does not match is an
        ArchiveUnavailableError (retried); a local file that changed is LocalCopyChangedError."""
        remote = self._p(name, entry.path)
        try:
            checked = self._call(f"upload {entry.path}", upload_checked, self.fs, local, remote, entry.sha256,
                                 entry.size, part_size=self.part_size)
        except SourceChangedError as exc:
            raise LocalCopyChangedError(f"{name}/{entry.path} on the hot tier no longer matches its manifest "
                                        f"({exc}); it cannot be archived") from None
        except IntegrityError as exc:
            raise ArchiveUnavailableError(f"archive {self.url}: {name}/{entry.path}: {exc}") from None
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(remote)
        return checked

    def commit(self, name: str, manifest: Manifest) -> None:
        """Write the manifest, create-only: a committed checkpoint is never overwritten."""
        data = manifest.to_bytes()
        try:
            self._call("commit", put_if, self.fs, self._p(name, MANIFEST), data, create_only=True)
        except PreconditionFailed:
            if self.get_bytes(name, MANIFEST) != data:
                raise CheckpointError(f"archive {self.url}: {name} was committed by another writer") from None

    def put_bytes(self, name: str, path: str, data: bytes) -> None:
        self._call(f"write {path}", put_if, self.fs, self._p(name, path), data)

    def get_bytes(self, name: str, path: str) -> bytes:
        remote = self._p(name, path)
        self.fs.invalidate_cache(remote)
        return self._call(f"read {path}", self.fs.cat_file, remote)

    def exists(self, name: str, path: str) -> bool:
        try:
            self.get_bytes(name, path) if path == MANIFEST else self._call("stat", self.fs.info, self._p(name, path))
            return True
        except FileNotFoundError:
            return False

    def download(self, name: str, entry: FileEntry, dest: Path, on_progress: Progress | None = None) -> None:
        """Copy one file into `dest` and check its size and SHA-256 (CheckpointError if they differ).
        `on_progress` gets the bytes transferred, as they arrive where the filesystem says (the
        rest once the file is there, for a filesystem that reports less or nothing)."""
        target = dest / entry.path
        make_dir(target.parent)
        if on_progress is None:
            self._call(f"download {entry.path}", self.fs.get_file, self._p(name, entry.path), str(target))
        else:
            tally = _Tally(on_progress)
            self._call(f"download {entry.path}", self.fs.get_file, self._p(name, entry.path), str(target),
                       callback=_fsspec_progress(tally))
            tally.finish(entry.size)
        with open(target, "rb+") as handle:
            os.fsync(handle.fileno())
            handle.seek(0)
            why = verify_file(handle, entry.size, entry.sha256, "the manifest")
        if why:
            raise CheckpointError(f"archive {self.url}: {name}/{entry.path} does not match its manifest ({why})")

    def verify(self, name: str, entries: list[FileEntry], checksums: bool | None,
               on_progress: Progress | None = None) -> list[str]:
        """Sizes from object metadata; checksums (a full read) only when asked. `on_progress`
        gets the bytes dealt with (read, or skipped because the object is missing or off in size)."""
        problems = []
        tally = _Tally(on_progress) if on_progress is not None else None
        for entry in entries:
            size = self.remote_size(name, entry.path)
            if size is None:
                problems.append(f"{entry.path}: missing")
            elif size != entry.size:
                problems.append(f"{entry.path}: {size} bytes, manifest says {entry.size}")
            elif checksums and (why := self._checksum(name, entry, tally)):
                problems.append(f"{entry.path}: {why}")
            if tally is not None:
                tally.finish(entry.size)
        return problems

    def _checksum(self, name: str, entry: FileEntry, on_progress: Progress | None) -> str:
        """'' when the object's bytes hash to the manifest's SHA-256, else what is wrong with this
        one object; failing to reach the archive is an ArchiveUnavailableError."""
        try:
            with self.fs.open(self._p(name, entry.path), "rb", block_size=8 << 20) as handle:
                why = verify_file(_Counted(handle, on_progress) if on_progress else handle, entry.size, entry.sha256,
                                  "the manifest")
        except FileNotFoundError:
            return "missing"
        except (PermissionError, IsADirectoryError) as exc:  # this object alone (S3 AccessDenied, mode 000)
            return f"unreadable ({redact(exc.strerror or exc)})"
        except Exception as exc:
            reason = redact(str(exc)) or type(exc).__name__
            raise ArchiveUnavailableError(f"archive {self.url}: read {name}/{entry.path} failed: {reason}") from None
        return "checksum mismatch" if why else ""

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("delete manifest", self.fs.rm_file, self._p(name, MANIFEST))
        fault_point("retention.deleting")
        target = self._p(name)
        with contextlib.suppress(FileNotFoundError):
            if has_magic(target):  # `*?[` in the prefix: fsspec's rm would glob it (s3://b/run[1] -> run1/...)
                self._delete_literally(target)
            else:
                self._call("delete", self.fs.rm, target, recursive=True)
        self.fs.invalidate_cache()

    def _delete_literally(self, target: str) -> None:
        """Delete `target` and everything under it without any glob: each object found, by name."""
        if self.is_local:
            if _not_a_directory(target):
                os.remove(target)
            else:
                shutil.rmtree(target)
            return
        for path in sorted(self._call("list", self.fs.find, target), reverse=True):
            self._call("delete", self.fs.rm_file, path)

    def parts(self, name: str) -> list[str]:
        self.fs.invalidate_cache()
        try:
            return [p.rsplit("/", 1)[-1] for p in self._call("list parts", self.fs.ls, self._p(name, PARTS_DIR), detail=False)]
        except FileNotFoundError:
            return []

    def read_lease(self) -> LeaseState:
        try:
            data, tag = self._call("read lease", read_versioned, self.fs, self._p(LEASE))
        except FileNotFoundError:
            return LeaseState()
        return _parse_lease(data, tag, f"archive {self.url}/{LEASE}")

    def write_lease(self, lease: Lease, prior: LeaseState | None = None) -> None:
        """As HotTier.write_lease, with S3's conditional writes where the archive is S3."""
        data = lease.model_dump_json().encode()
        condition: dict[str, Any] = {}
        if prior is not None:
            condition = {"if_match": prior.tag} if prior.exists else {"create_only": True}
        self._call("write lease", put_if, self.fs, self._p(LEASE), data, **condition)
