"""Looking at checkpoints from outside a job: list, verify, pull a copy, prune.

The library behind `trainready ckpt` (no CLI code here). A location is a plain local path (a
node's hot tier, or a local copy of an archive: the layout is the same) or any fsspec URL
(`s3://bucket/prefix`, `file:///...`, honouring AWS_ENDPOINT_URL_S3). Needs no torch.

Errors: an empty location or --to (never taken to mean the current directory), a location that
cannot be read (missing, unreachable, no permission; on S3 an invalid or missing bucket or a
prefix with nothing under it), a step with no checkpoint (nothing there, or only an uncommitted
directory), an unknown --run-id, or a pull target that cannot be written is a `UsageError`
(exit 2). Damage is exit 1 wherever it is found: a checkpoint that fails its checks or whose
manifest or directory cannot be used (unreadable, a symlink in its place), also when its step is
named; `pull` raises `CheckpointError`, verification returns it (never raises); one damaged
checkpoint directory is reported under its own name, never fails the whole listing.

Long work reports progress through plain callables (no CLI code here): `on_total(bytes)` once
the amount is known, then `on_progress(bytes)` as bytes are read or copied.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from trainready.errors import UsageError
from trainready.io import CHUNK, create_exclusive, dir_mode, fsync_dir, make_dir, redact, write_synced
from trainready.io.urls import bucket_name_problem

from . import retention
from .errors import ArchiveUnavailableError, CheckpointError
from .manifest import MANIFEST, TMP_PREFIX, FileEntry, Lease
from .tiers import ArchiveTier, HotTier, Ref

Tier = HotTier | ArchiveTier
Progress = Callable[[int], None]
Confirm = Callable[[list[str], str], bool]


class StorageAccessError(UsageError):
    """The location could not be read: it does not exist, is unreachable, or access is denied (exit 2)."""


# ---------------------------------------------------------------------------------------------
# Output models (docs/schemas/ckpt-*.schema.json)


class CheckpointInfo(BaseModel):
    """One checkpoint directory at the location."""

    name: str = Field(description="Directory name, step-<12 digits>-g<4 digits>.")
    step: int
    generation: int = Field(description="Writer generation.")
    tier: str = Field(description="'local' (a plain directory: a node's hot tier or a local archive) or 'archive' (a URL).")
    run_id: str | None = Field(description="From the manifest; null when not committed.")
    committed: bool = Field(description="A readable manifest is present (written last, so the checkpoint is complete).")
    status: str = Field("committed", description=(
        "'committed'; 'fenced' (committed by a writer that had lost the prefix to a newer generation: never "
        "restored); 'uncommitted' (no manifest: in progress, or debris of a crash); 'unreadable' (a manifest is "
        "there but cannot be used: kept and reported, never deleted automatically)."))
    size_bytes: int = Field(description="Committed: bytes the manifest lists for this location; otherwise bytes present.")
    files: int = Field(description="Committed: files the manifest lists for this location; otherwise files present.")
    world_size: int | None = None
    nodes: int | None = None
    node: int | None = Field(None, description="Which node's share a local directory holds, for a multi-node checkpoint "
                                               "on a node's hot tier; null for a full copy.")
    created_unix: float | None = None
    verified: bool | None = Field(None, description="Every file's size matches the manifest (`ls --verify`: sizes only, "
                                                    "no data read; a changed byte is not seen: `ckpt verify` compares "
                                                    "SHA-256); false also for an unreadable checkpoint (it cannot be "
                                                    "checked: damaged); null: not checked, or uncommitted.")
    problem: str = Field("", description="Why it is not committed, or what verification found; empty when fine.")


class CheckpointListing(BaseModel):
    """`trainready ckpt ls --json`."""

    schema_version: int = 1
    url: str
    run_id: str | None = Field(None, description="The run the writer lease (writer.json) names; null: no readable lease.")
    generation: int | None = Field(None, description="The lease's writer generation.")
    lease_problem: str = Field("", description="Why writer.json could not be read, when it could not.")
    checked: str = Field("", description="'sizes' with `ls --verify` (each file's size against the manifest; no data "
                                         "read); empty when nothing was checked. SHA-256: `ckpt verify`.")
    checkpoints: list[CheckpointInfo] = Field(description="Oldest first (by step, then generation).")


class CheckpointCheck(BaseModel):
    name: str
    step: int
    generation: int
    status: str = Field("committed", description="As in `ckpt ls`: committed, fenced or unreadable.")
    files: int
    size_bytes: int
    ok: bool
    problems: list[str] = Field(description="One line per bad file (missing, wrong size, checksum mismatch).")


class VerifyReport(BaseModel):
    """`trainready ckpt verify --json`."""

    schema_version: int = 1
    url: str
    checksums: bool = Field(description="True: every file read and its SHA-256 compared; false: sizes only.")
    ok: bool = Field(description="Every checked checkpoint is intact (false when there was none to check).")
    checkpoints: list[CheckpointCheck]
    problem: str = Field("", description="Set when there was nothing to check.")


class PullResult(BaseModel):
    """`trainready ckpt pull --json`."""

    schema_version: int = 1
    url: str
    name: str
    step: int
    generation: int
    path: str = Field(description="The committed local copy (TO/<name>).")
    files: int
    size_bytes: int
    seconds: float


class PruneResult(BaseModel):
    """`trainready ckpt prune --json`."""

    schema_version: int = 1
    url: str
    keep: int
    dry_run: bool
    deleted: list[str] = Field(description="Deleted (with dry_run: would be deleted), oldest first.")
    kept: list[str] = Field(description="Every checkpoint directory left in place, oldest first.")
    broken: list[str] = Field(default_factory=list, description="Committed but failing the size check: kept, and not "
                                                                "counted toward `keep`.")
    run_id: str | None = Field(None, description="Whose checkpoints were considered: the run the writer lease names "
                                                 "(or --run-id). Other runs' checkpoints are never deleted.")
    untouched: list[str] = Field(default_factory=list, description="Kept because they are not deleted automatically: "
                                                                   "unreadable manifests, fenced commits, other runs.")
    cancelled: bool = Field(False, description="The confirmation was answered no: nothing was deleted, and `deleted` "
                                               "lists what would have been (as with dry_run).")


# ---------------------------------------------------------------------------------------------
# Opening a location


def open_tier(url: str) -> Tier:
    """A plain path -> HotTier (same layout as an archive, plain file I/O, no fsspec needed);
    anything with a scheme -> ArchiveTier. The location must exist: a local directory, or on S3 a
    bucket and (unless the URL names the bucket alone) at least one object under the prefix. An
    empty location is refused: it never means the current directory (an unset shell variable)."""
    scheme, sep, rest = url.partition("://")
    if not url.strip() or (sep and not rest.strip() and scheme not in ("s3", "s3a")):  # file:// is the cwd too
        raise UsageError(f"empty location {url!r}: name a checkpoint directory or URL (an empty path is never taken "
                         "to mean the current directory; write . for that)")
    if "://" not in url:
        path = Path(url).expanduser()
        if problem := _local_dir_problem(path, str(path.parent)):
            raise StorageAccessError(f"{url}: {problem}")
        return HotTier(path)
    try:
        tier = ArchiveTier(url)
    except ImportError as exc:
        raise UsageError(f"{redact(url)}: URLs need fsspec (and s3fs for s3://): {exc}") from None
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    if tier.is_local:
        if problem := _local_dir_problem(Path(tier.root), "file://" + str(Path(tier.root).parent)):
            raise StorageAccessError(f"{tier.url}: {problem}")
    else:
        _remote_exists(tier)
    return tier


def _local_dir_problem(path: Path, parent: str) -> str:
    """Why a local location cannot be listed ('' when it can be); `parent` as the user wrote it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such directory" + _nearest_names(path.name, _local_siblings(path.parent), parent)
    except NotADirectoryError:
        return "no such directory (a parent is a file)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return "" if stat.S_ISDIR(mode) else "not a directory"


def _local_siblings(parent: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(parent) if e.is_dir()]
    except OSError:
        return []


def _nearest_names(name: str, siblings: list[str], parent: str) -> str:
    """'; nearest: ...' for names next to a missing one that look like a typo of it, else ''."""
    candidates = [n for n in siblings if name.startswith(".") or not n.startswith(".")]
    near = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6) if name else []
    return f"; nearest: {', '.join(f'{parent.rstrip(chr(47))}/{n}' for n in near)}" if near else ""


def _remote_exists(tier: ArchiveTier) -> None:
    """A missing bucket or an S3 prefix with nothing under it is a wrong location (exit 2), not an
    empty one: S3 has no empty folders, and a job's prefix holds writer.json from its first start."""
    bucket = tier.root.split("/", 1)[0]  # (an s3:// URL without a valid bucket never opens: validate_bucket)
    try:
        info = tier._call("look up the location", tier.fs.info, tier.root)
        if info.get("type") == "file":
            raise StorageAccessError(f"{tier.url}: is a file, not a folder of checkpoints")
        return
    except FileNotFoundError:
        pass
    except ArchiveUnavailableError as exc:
        raise StorageAccessError(str(exc)) from None
    if tier.is_s3 and tier.root != bucket:
        try:
            tier._call("find the bucket", tier.fs.info, bucket)
        except FileNotFoundError:
            bucket = ""
        except ArchiveUnavailableError as exc:
            raise StorageAccessError(str(exc)) from None
    if tier.is_s3 and (not bucket or tier.root == bucket):
        name = tier.root.split("/", 1)[0]
        why = bucket_name_problem(name)
        raise StorageAccessError(f"{tier.url}: bucket {name!r} does not exist (or is not visible with these "
                                 f"credentials)" + (f"; {why}" if why else ""))
    parent, _, name = tier.root.rpartition("/")
    try:
        siblings = [p.rstrip("/").rsplit("/", 1)[-1] for p in tier.fs.ls(parent, detail=False)] if parent else []
    except Exception:  # only a hint: the location is missing either way
        siblings = []
    scheme = tier.url.split("://", 1)[0]
    hint = _nearest_names(name, siblings, f"{scheme}://{parent}")
    why = "nothing is stored under this prefix" if tier.is_s3 else "no such location"
    raise StorageAccessError(redact(f"{tier.url}: {why}{hint}"))


def tier_kind(tier: Tier) -> str:
    return "local" if isinstance(tier, HotTier) else "archive"


@contextlib.contextmanager
def _reading(tier: Tier) -> Iterator[None]:
    """Failures to reach or read the location become a StorageAccessError (exit 2)."""
    try:
        yield
    except ArchiveUnavailableError as exc:
        raise StorageAccessError(str(exc)) from None
    except OSError as exc:
        raise StorageAccessError(redact(f"cannot read {tier.url}: {exc.strerror or exc}")) from None


def _refs(tier: Tier) -> tuple[list[Ref], Lease | None, str]:
    """Every checkpoint directory (oldest first, fenced commits flagged), the writer lease, and why
    the lease could not be read (if it could not)."""
    with _reading(tier):
        refs = sorted(tier.list(), key=lambda r: r.order)
        state = tier.read_lease()
    retention.mark_fenced(refs, state.lease)
    return refs, state.lease, state.damaged


# ---------------------------------------------------------------------------------------------
# What a directory should hold


def _present(tier: Tier, name: str) -> dict[str, int]:
    """Relative path -> size of every file in a checkpoint directory (manifest excluded)."""
    if isinstance(tier, HotTier):
        base = tier.path(name)
        found = {}
        if not stat.S_ISDIR(os.lstat(base).st_mode):
            return {}  # a symlink or file in a checkpoint's place: nothing is read through it
        for dirpath, _dirs, files in os.walk(base):
            for file in files:
                full = Path(dirpath) / file
                with contextlib.suppress(OSError):  # a dangling link or a file removed meanwhile
                    found[full.relative_to(base).as_posix()] = os.lstat(full).st_size
    else:
        prefix = f"{tier.root}/{name}/"
        try:
            infos = tier._call("list files", tier.fs.find, prefix.rstrip("/"), detail=True)
        except FileNotFoundError:
            infos = {}
        found = {path.split(prefix, 1)[-1]: int(info.get("size") or 0) for path, info in infos.items()}
    found.pop(MANIFEST, None)
    return found


def _expected(tier: Tier, ref: Ref) -> tuple[list[FileEntry], int | None]:
    """The files this location should hold for a committed checkpoint, and which node's share
    that is (None: the whole checkpoint). A node's hot tier holds only its own node's files of a
    multi-node checkpoint; an archive, or a copy downloaded from one, holds every file."""
    manifest = ref.manifest
    assert manifest is not None
    if isinstance(tier, ArchiveTier) or len(manifest.node_files) <= 1:
        return manifest.files, None
    present = _present(tier, ref.name)
    if all(entry.path in present for entry in manifest.files):
        return manifest.files, None
    node = max(sorted(manifest.node_files), key=lambda n: sum(e.path in present for e in manifest.node_files[n]))
    return manifest.node_files[node], node


def _check(tier: Tier, ref: Ref, checksums: bool,
           on_progress: Progress | None = None) -> tuple[list[FileEntry], int | None, list[str]]:
    with _reading(tier):
        entries, node = _expected(tier, ref)
        problems = tier.verify(ref.name, entries, checksums, on_progress=on_progress)
    return entries, node, problems


def _summary(problems: list[str]) -> str:
    return "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")


# ---------------------------------------------------------------------------------------------
# Picking checkpoints by step


def _nearest(step: int, steps: list[int]) -> str:
    below = max((s for s in steps if s < step), default=None)
    above = min((s for s in steps if s > step), default=None)
    near = [f"{below} (before)" if below is not None else "", f"{above} (after)" if above is not None else ""]
    return ", ".join(n for n in near if n)


def _newest(tier: Tier, refs: list[Ref]) -> Ref:
    """The newest committed checkpoint that may be restored (fenced commits never are)."""
    usable = [r for r in refs if r.committed and not r.fenced]
    if not usable:
        dirs = f"{len(refs)} checkpoint director{'y' if len(refs) == 1 else 'ies'}"
        others = f" ({dirs}, none committed and usable: trainready ckpt ls)" if refs else ""
        raise UsageError(f"no committed checkpoint in {tier.url} to pull{others}")
    return max(usable, key=lambda r: r.order)


def _at_step(tier: Tier, refs: list[Ref], step: int) -> list[Ref]:
    """The checkpoints at `step`, committed or damaged (an unreadable manifest or directory, a
    symlink in its place: damage, exit 1 when checked or pulled), oldest generation first; or a
    UsageError (exit 2) when there is none: nothing at that step, or only uncommitted directories."""
    hits = [r for r in refs if (r.committed or r.unreadable) and r.step == step]
    if hits:
        return hits
    committed = sorted({r.step for r in refs if r.committed})
    near = _nearest(step, committed)
    tail = f"nearest committed steps: {near}" if near else "there is no committed checkpoint there"
    uncommitted = [r for r in refs if r.step == step]
    if uncommitted:
        raise UsageError(f"step {step} in {tier.url} is not committed ({uncommitted[-1].name}: "
                         f"{uncommitted[-1].problem}); {tail}")
    raise UsageError(f"no checkpoint at step {step} in {tier.url}; {tail}")


# ---------------------------------------------------------------------------------------------
# The four operations


def list_checkpoints(url: str, verify: bool = False) -> CheckpointListing:
    """Every checkpoint directory, committed or not; with `verify`, sizes are checked against
    each manifest (no data is read)."""
    tier = open_tier(url)
    items = []
    refs, lease, lease_problem = _refs(tier)
    for ref in refs:
        m = ref.manifest
        if m is None:
            with _reading(tier):
                present = _present(tier, ref.name)
            items.append(CheckpointInfo(
                name=ref.name, step=ref.step, generation=ref.generation, tier=tier_kind(tier), run_id=None,
                committed=False, status=ref.status, size_bytes=sum(present.values()), files=len(present),
                verified=False if verify and ref.unreadable else None, problem=ref.problem))
            continue
        if verify:
            entries, node, problems = _check(tier, ref, checksums=False)
        else:
            with _reading(tier):
                entries, node = _expected(tier, ref)
            problems = []
        if ref.fenced:
            problems = [f"committed by generation {ref.generation} after generation {lease.generation} took over "
                        "(fenced): never restored", *problems]
        items.append(CheckpointInfo(
            name=ref.name, step=ref.step, generation=ref.generation, tier=tier_kind(tier), run_id=m.run_id,
            committed=True, status=ref.status, size_bytes=sum(e.size for e in entries), files=len(entries),
            world_size=m.world_size, nodes=m.nodes, node=node, created_unix=m.created_unix,
            verified=(not problems[ref.fenced:]) if verify else None, problem=_summary(problems)))
    return CheckpointListing(url=tier.url, run_id=lease.run_id if lease else None,
                             generation=lease.generation if lease else None, lease_problem=lease_problem,
                             checked="sizes" if verify else "", checkpoints=items)


def verify_checkpoints(url: str, step: int | None = None, checksums: bool = True, *,
                       on_progress: Progress | None = None, on_total: Progress | None = None) -> VerifyReport:
    """Check committed checkpoints (all of them, or those at `step`): every file present with
    its size, and with `checksums` its SHA-256. Unreadable manifests are reported as failing.
    With `checksums`, `on_total` gets the bytes to read and `on_progress` the bytes read."""
    tier = open_tier(url)
    refs, _lease, _problem = _refs(tier)
    chosen = [r for r in refs if r.committed or r.unreadable] if step is None else _at_step(tier, refs, step)
    if checksums and on_total is not None:
        with _reading(tier):
            on_total(sum(e.size for r in chosen if r.committed for e in _expected(tier, r)[0]))
    checks = []
    for ref in chosen:
        if ref.unreadable:
            with _reading(tier):
                present = _present(tier, ref.name)
            checks.append(CheckpointCheck(name=ref.name, step=ref.step, generation=ref.generation, status=ref.status,
                                          files=len(present), size_bytes=sum(present.values()), ok=False,
                                          problems=[ref.problem]))
            continue
        entries, _node, problems = _check(tier, ref, checksums, on_progress if checksums else None)
        checks.append(CheckpointCheck(name=ref.name, step=ref.step, generation=ref.generation, status=ref.status,
                                      files=len(entries), size_bytes=sum(e.size for e in entries), ok=not problems,
                                      problems=problems))
    problem = "" if checks else f"no committed checkpoint in {tier.url}"
    return VerifyReport(url=tier.url, checksums=checksums, ok=bool(checks) and all(c.ok for c in checks),
                        checkpoints=checks, problem=problem)


def pull(url: str, step: int | None, to_dir: str | os.PathLike, *, on_progress: Progress | None = None,
         on_total: Progress | None = None) -> PullResult:
    """Copy the committed checkpoint at `step` (its newest generation; None: the newest committed
    checkpoint that is not fenced) to `to_dir/<name>`: files into a temporary directory, each
    checked against its SHA-256 while it is copied, then the manifest, then an atomic rename.
    The target is never overwritten. A target that cannot be written is a UsageError naming it;
    a source file that is missing or does not match is a CheckpointError, and nothing is left."""
    started = time.monotonic()
    if not os.fspath(to_dir).strip():
        raise UsageError("--to is empty: name the directory to copy into (an empty path is never taken to mean the "
                         "current directory; write . for that)")
    tier = open_tier(url)
    refs = _refs(tier)[0]
    ref = _newest(tier, refs) if step is None else _committed_at(tier, refs, step)
    manifest = ref.manifest
    assert manifest is not None
    with _reading(tier):
        entries, node = _expected(tier, ref)
    if node is not None:
        raise UsageError(f"{tier.url} holds only node {node}'s share of {ref.name} (a {manifest.nodes}-node "
                         "checkpoint on a node's hot tier); pull it from the archive, which holds every file")
    size = sum(e.size for e in entries)
    root = Path(to_dir).expanduser().absolute()
    final = root / ref.name
    if os.path.lexists(final):
        raise UsageError(f"{final} already exists; pull never overwrites (remove it, or choose another --to)")
    tmp = root / f"{TMP_PREFIX}{ref.name}"
    created = _missing_dirs(root)  # removed again if the pull fails: only what it created
    try:
        make_dir(root)
        shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted pull of the same checkpoint
        free = shutil.disk_usage(root).free
        if free < size:
            raise UsageError(f"cannot write to {root}: {ref.name} needs {size:,} bytes and {free:,} are free there")
        tmp.mkdir(mode=dir_mode())
    except OSError as exc:
        _remove_created(created)
        raise _unwritable(root, exc) from None
    except BaseException:
        _remove_created(created)
        raise
    if on_total is not None:
        on_total(size)
    pulled = False
    try:
        for entry in entries:
            if isinstance(tier, HotTier):
                _copy_checked(tier, ref.name, entry, tmp, on_progress)
            else:
                _download_checked(tier, ref.name, entry, tmp, on_progress)
        for directory in sorted({(tmp / e.path).parent for e in entries}, reverse=True):
            fsync_dir(directory)
        write_synced(tmp / MANIFEST, manifest.model_copy(update={"node_files": {}}).to_bytes())  # a full copy
        fsync_dir(tmp)
        if os.path.lexists(final):
            raise UsageError(f"{final} appeared while pulling; pull never overwrites (nothing else was written)")
        os.rename(tmp, final)
        pulled = True
        fsync_dir(root)
    except OSError as exc:
        raise _unwritable(root, exc) from None
    except CheckpointError as exc:
        older = max((r.step for r in refs if r.committed and not r.fenced and r.order < ref.order), default=None)
        hint = f" (the newest committed; the one before it: --step {older})" if step is None and older is not None else ""
        raise CheckpointError(f"{exc}; nothing written to {root}{hint}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not pulled:
            _remove_created(created)
    return PullResult(url=tier.url, name=ref.name, step=ref.step, generation=ref.generation, path=str(final),
                      files=len(entries), size_bytes=size, seconds=round(time.monotonic() - started, 3))


def _committed_at(tier: Tier, refs: list[Ref], step: int) -> Ref:
    """The newest committed generation at `step`; a CheckpointError (damage, exit 1) when the
    checkpoints there are all unreadable, a UsageError (exit 2) when there is none."""
    hits = _at_step(tier, refs, step)
    committed = [r for r in hits if r.committed]
    if committed:
        return committed[-1]
    near = _nearest(step, sorted({r.step for r in refs if r.committed}))
    raise CheckpointError(f"step {step} in {tier.url} is damaged ({hits[-1].name}: {hits[-1].problem}); nothing was "
                          "pulled" + (f"; nearest committed steps: {near}" if near else ""))


def _missing_dirs(root: Path) -> list[Path]:
    """The directories `make_dir(root)` would create, deepest first."""
    missing = []
    for path in (root, *root.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    return missing


def _remove_created(created: list[Path]) -> None:
    """Remove the directories a failed pull created, deepest first, each only if empty."""
    for path in created:
        try:
            os.rmdir(path)
        except OSError:
            break  # not empty (someone else's files) or gone: leave it and its parents


def _unwritable(root: Path, exc: OSError) -> UsageError:
    """A pull target we cannot write to: the user's to choose another (exit 2), naming the path."""
    if exc.errno in (errno.EEXIST, errno.ENOTDIR) and not root.is_dir():
        return UsageError(f"cannot write to {root}: not a directory")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UsageError(f"cannot write to {root}: {exc.strerror} (nothing was left there)")
    return UsageError(f"cannot write to {root}: {exc.strerror or exc}")


def _download_checked(tier: ArchiveTier, name: str, entry: FileEntry, dest: Path,
                      on_progress: Progress | None) -> None:
    """ArchiveTier.download checks size and SHA-256; other OSErrors are about writing `dest`."""
    try:
        tier.download(name, entry, dest, on_progress=on_progress)
    except FileNotFoundError:
        raise CheckpointError(f"{tier.url}: {name}/{entry.path} is missing") from None
    except ArchiveUnavailableError as exc:
        raise StorageAccessError(str(exc)) from None


def _copy_checked(tier: HotTier, name: str, entry: FileEntry, dest: Path, on_progress: Progress | None) -> None:
    """Copy one file, hashing it on the way (one read), never through a symlink. Reading the source
    fails as the checkpoint's problem (CheckpointError) or the location's (StorageAccessError);
    an OSError that escapes is about writing `dest`."""
    source = tier.path(name) / entry.path
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"{tier.url}: {name}/{entry.path} is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(f"{tier.url}: {name}/{entry.path} is not a regular file (a checkpoint never points "
                                  "outside itself)") from None
        raise StorageAccessError(f"cannot read {source}: {exc.strerror or exc}") from None
    with open(fd, "rb", buffering=0, closefd=True) as src:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{tier.url}: {name}/{entry.path} is not a regular file (a checkpoint never points "
                                  "outside itself)")
        target = dest / entry.path
        make_dir(target.parent)
        digest, copied = hashlib.sha256(), 0
        with open(create_exclusive(target), "wb") as out:
            while True:
                try:
                    chunk = src.read(CHUNK)
                except OSError as exc:
                    raise CheckpointError(f"{tier.url}: {name}/{entry.path} cannot be read "
                                          f"({exc.strerror or exc})") from None
                if not chunk:
                    break
                out.write(chunk)
                digest.update(chunk)
                copied += len(chunk)
                if on_progress is not None:
                    on_progress(len(chunk))
            out.flush()
            os.fsync(out.fileno())
    if copied != entry.size or digest.hexdigest() != entry.sha256:
        what = f"{copied} bytes, manifest says {entry.size}" if copied != entry.size else "checksum mismatch"
        raise CheckpointError(f"{tier.url}: {name}/{entry.path} does not match its manifest ({what})")


def prune(url: str, keep: int, dry_run: bool = False, run_id: str | None = None, *,
          confirm: Confirm | None = None) -> PruneResult:
    """Delete all but the newest `keep` committed checkpoints of the run that owns the location
    (the writer lease's run, or `run_id`), and uncommitted debris older than the newest committed
    one (a newer one may still be being written): the manager's own retention rule
    (`retention.plan`). Other runs' checkpoints, unreadable manifests and fenced commits are never
    deleted. Only checkpoints that pass the size check count toward `keep`, and those that fail it
    are left alone, so an intact checkpoint is never deleted in favour of a broken newer one.

    `confirm(names, url)`, when given, is asked before anything is deleted (also with nothing to
    delete, so that it may refuse the same way every time); False cancels: nothing is deleted and
    the result says `cancelled`."""
    if keep < 1:
        raise UsageError(f"--keep {keep}: keep at least 1 (the newest committed checkpoint is never deleted)")
    if run_id is not None and not run_id.strip():
        raise UsageError(f"--run-id {run_id!r} is empty: name the run whose checkpoints to prune, or leave it out "
                         "for the run the writer lease names")
    tier = open_tier(url)
    refs, lease, _problem = _refs(tier)
    if run_id is not None:
        _known_run(tier, refs, lease, run_id)
    owner = run_id or (lease.run_id if lease else _only_run(tier, refs))
    own = retention.owned(refs, owner)
    broken: list[str] = []
    intact = 0
    for ref in sorted((r for r in own if r.committed and not r.fenced), key=lambda r: r.order, reverse=True):
        if intact >= keep:
            break
        if _check(tier, ref, checksums=False)[2]:
            broken.append(ref.name)
        else:
            intact += 1
    deleted = retention.plan(own, keep, broken=broken).delete  # oldest first: an interruption keeps the newer ones
    cancelled = bool(not dry_run and confirm is not None and not confirm(list(deleted), tier.url) and deleted)
    if not dry_run and not cancelled:
        for name in deleted:
            with _reading(tier):
                tier.delete(name)
            if isinstance(tier, HotTier) and tier.path(name).exists():
                raise CheckpointError(f"could not remove {tier.path(name)} (its manifest is gone: it is no longer "
                                      "committed); check permissions and remove it by hand")
    untouched = [r.name for r in refs if r.unreadable or r.fenced or r not in own]
    return PruneResult(url=tier.url, keep=keep, dry_run=dry_run, deleted=deleted,
                       kept=[r.name for r in refs if r.name not in deleted], broken=sorted(broken), run_id=owner,
                       untouched=untouched, cancelled=cancelled)


def _known_run(tier: Tier, refs: list[Ref], lease: Lease | None, run_id: str) -> None:
    """An --run-id that no committed checkpoint and no writer lease names is a typo (exit 2):
    pruning it would delete nothing and say so with exit 0."""
    runs = sorted({r.manifest.run_id for r in refs if r.manifest is not None} | ({lease.run_id} if lease else set()))
    if run_id in runs:
        return
    found = f"runs found: {', '.join(map(repr, runs[:10]))}" + (f" (+{len(runs) - 10} more)" if len(runs) > 10 else "") \
        if runs else "no committed checkpoint or writer lease names a run"
    near = difflib.get_close_matches(run_id, runs, n=1, cutoff=0.6)
    raise UsageError(f"--run-id {run_id!r}: no checkpoint of that run in {tier.url}; {found}"
                     + (f" (nearest: {near[0]!r})" if near else ""))


def _only_run(tier: Tier, refs: list[Ref]) -> str | None:
    """Without a lease: the one run whose checkpoints are there; several runs need --run-id."""
    runs = sorted({r.manifest.run_id for r in refs if r.manifest is not None})
    if len(runs) > 1:
        raise UsageError(f"{tier.url} holds checkpoints of runs {', '.join(runs)} and no writer lease names one: "
                         "choose with --run-id")
    return runs[0] if runs else None


__all__ = [
    "CheckpointInfo", "CheckpointListing", "CheckpointCheck", "VerifyReport", "PullResult", "PruneResult",
    "StorageAccessError", "open_tier", "list_checkpoints", "verify_checkpoints", "pull", "prune",
]
