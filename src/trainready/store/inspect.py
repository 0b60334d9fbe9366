"""Looking at checkpoints from outside a job: list, verify, pull a copy, prune.

The library behind `trainready ckpt` (no CLI code here). A location is a plain local path (a
node's hot tier, or a local copy of an archive: the layout is the same) or any fsspec URL
(`s3://bucket/prefix`, `file:///...`, honouring AWS_ENDPOINT_URL_S3). Needs no torch.

Errors: a location that cannot be read (missing, unreachable, no permission) or a step that is
not there is a `UsageError` (exit 2); a checkpoint that fails its checks while being pulled is
a `CheckpointError` (exit 1). Problems found by verification are returned, not raised.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from trainready.errors import UsageError
from trainready.io import dir_mode, fsync_dir, redact, sha256_file

from . import retention
from .errors import ArchiveUnavailableError, CheckpointError
from .manifest import MANIFEST, FileEntry, Lease
from .tiers import ArchiveTier, HotTier, Ref, as_store_error

Tier = HotTier | ArchiveTier


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
    verified: bool | None = Field(None, description="Sizes checked against the manifest (`ls --verify`); null: not checked "
                                                    "or not committed.")
    problem: str = Field("", description="Why it is not committed, or what verification found; empty when fine.")


class CheckpointListing(BaseModel):
    """`trainready ckpt ls --json`."""

    schema_version: int = 1
    url: str
    run_id: str | None = Field(None, description="The run the writer lease (writer.json) names; null: no readable lease.")
    generation: int | None = Field(None, description="The lease's writer generation.")
    lease_problem: str = Field("", description="Why writer.json could not be read, when it could not.")
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


# ---------------------------------------------------------------------------------------------
# Opening a location


def open_tier(url: str) -> Tier:
    """A plain path -> HotTier (same layout as an archive, plain file I/O, no fsspec needed);
    anything with a scheme -> ArchiveTier. A local location must exist."""
    if "://" not in url:
        path = Path(url).expanduser()
        if not path.is_dir():
            raise StorageAccessError(f"{url}: {'not a directory' if path.exists() else 'no such directory'}")
        return HotTier(path)
    try:
        tier = ArchiveTier(url)
    except ImportError as exc:
        raise UsageError(f"{redact(url)}: URLs need fsspec (and s3fs for s3://): {exc}") from None
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    if tier.is_local and not Path(tier.root).is_dir():
        raise StorageAccessError(f"{tier.url}: no such directory")
    if tier.is_s3:
        _bucket_exists(tier)
    return tier


def _bucket_exists(tier: ArchiveTier) -> None:
    """A missing bucket is a wrong location (exit 2), not an empty one; an empty prefix is fine."""
    bucket = tier.root.split("/", 1)[0]
    if not bucket:
        raise StorageAccessError(f"{tier.url}: no bucket in the URL (s3://BUCKET/prefix)")
    try:
        tier._call("find the bucket", tier.fs.info, bucket)
    except FileNotFoundError:
        raise StorageAccessError(f"{tier.url}: bucket {bucket!r} does not exist (or is not visible with these "
                                 "credentials)") from None
    except ArchiveUnavailableError as exc:
        raise StorageAccessError(str(exc)) from None


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


def _check(tier: Tier, ref: Ref, checksums: bool) -> tuple[list[FileEntry], int | None, list[str]]:
    with _reading(tier):
        entries, node = _expected(tier, ref)
        problems = tier.verify(ref.name, entries, checksums)
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


def _at_step(tier: Tier, refs: list[Ref], step: int) -> list[Ref]:
    """The committed checkpoints at `step` (oldest generation first), or a UsageError that says
    what is there instead."""
    hits = [r for r in refs if r.committed and r.step == step]
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
                problem=ref.problem))
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
                             checkpoints=items)


def verify_checkpoints(url: str, step: int | None = None, checksums: bool = True) -> VerifyReport:
    """Check committed checkpoints (all of them, or those at `step`): every file present with
    its size, and with `checksums` its SHA-256. Unreadable manifests are reported as failing."""
    tier = open_tier(url)
    refs, _lease, _problem = _refs(tier)
    chosen = [r for r in refs if r.committed or r.unreadable] if step is None else _at_step(tier, refs, step)
    checks = []
    for ref in chosen:
        if ref.unreadable:
            with _reading(tier):
                present = _present(tier, ref.name)
            checks.append(CheckpointCheck(name=ref.name, step=ref.step, generation=ref.generation, status=ref.status,
                                          files=len(present), size_bytes=sum(present.values()), ok=False,
                                          problems=[ref.problem]))
            continue
        entries, _node, problems = _check(tier, ref, checksums)
        checks.append(CheckpointCheck(name=ref.name, step=ref.step, generation=ref.generation, status=ref.status,
                                      files=len(entries), size_bytes=sum(e.size for e in entries), ok=not problems,
                                      problems=problems))
    problem = "" if checks else f"no committed checkpoint in {tier.url}"
    return VerifyReport(url=tier.url, checksums=checksums, ok=bool(checks) and all(c.ok for c in checks),
                        checkpoints=checks, problem=problem)


def pull(url: str, step: int, to_dir: str | os.PathLike) -> PullResult:
    """Copy the committed checkpoint at `step` (its newest generation) to `to_dir/<name>`:
    files into a temporary directory, each checked against its SHA-256, then the manifest,
    then an atomic rename. The target is never overwritten."""
    started = time.monotonic()
    tier = open_tier(url)
    ref = _at_step(tier, _refs(tier)[0], step)[-1]
    with _reading(tier):
        entries, node = _expected(tier, ref)
    if node is not None:
        raise UsageError(f"{tier.url} holds only node {node}'s share of {ref.name} (a {ref.manifest.nodes}-node "
                         "checkpoint on a node's hot tier); pull it from the archive, which holds every file")
    dest = HotTier(to_dir)
    final = dest.path(ref.name)
    if final.exists():
        raise UsageError(f"{final} already exists; pull never overwrites (remove it, or choose another --to)")
    dest.ensure()
    tmp = dest.tmp_path(ref.name)
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted pull of the same checkpoint
    try:
        tmp.mkdir(mode=dir_mode())
        for entry in entries:
            if isinstance(tier, HotTier):
                _copy_checked(tier, ref.name, entry, tmp)
            else:
                _download_checked(tier, ref.name, entry, tmp)
        for directory in sorted({(tmp / e.path).parent for e in entries}, reverse=True):
            fsync_dir(directory)
        dest.commit(tmp, ref.name, ref.manifest.model_copy(update={"node_files": {}}))  # a full copy, like a download
    except OSError as exc:
        raise as_store_error(exc, dest.root) from exc
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}; nothing written to {dest.root}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PullResult(url=tier.url, name=ref.name, step=ref.step, generation=ref.generation, path=str(final),
                      files=len(entries), size_bytes=sum(e.size for e in entries),
                      seconds=round(time.monotonic() - started, 3))


def _download_checked(tier: ArchiveTier, name: str, entry: FileEntry, dest: Path) -> None:
    """ArchiveTier.download checks size and SHA-256; other OSErrors are about writing `dest`."""
    try:
        tier.download(name, entry, dest)
    except FileNotFoundError:
        raise CheckpointError(f"{tier.url}: {name}/{entry.path} is missing") from None
    except ArchiveUnavailableError as exc:
        raise StorageAccessError(str(exc)) from None


def _copy_checked(tier: HotTier, name: str, entry: FileEntry, dest: Path) -> None:
    source = tier.path(name) / entry.path
    target = dest / entry.path
    try:
        if not stat.S_ISREG(os.lstat(source).st_mode):
            raise CheckpointError(f"{tier.url}: {name}/{entry.path} is not a regular file (a checkpoint never points "
                                  "outside itself)")
    except FileNotFoundError:
        raise CheckpointError(f"{tier.url}: {name}/{entry.path} is missing") from None
    target.parent.mkdir(parents=True, exist_ok=True, mode=dir_mode())
    try:
        shutil.copyfile(source, target, follow_symlinks=False)
    except FileNotFoundError:
        raise CheckpointError(f"{tier.url}: {name}/{entry.path} is missing") from None
    with open(target, "rb+") as handle:
        os.fsync(handle.fileno())
    if os.path.getsize(target) != entry.size or sha256_file(target) != entry.sha256:
        raise CheckpointError(f"{tier.url}: {name}/{entry.path} does not match its manifest (size or checksum)")


def prune(url: str, keep: int, dry_run: bool = False, run_id: str | None = None) -> PruneResult:
    """Delete all but the newest `keep` committed checkpoints of the run that owns the location
    (the writer lease's run, or `run_id`), and uncommitted debris older than the newest committed
    one (a newer one may still be being written): the manager's own retention rule
    (`retention.plan`). Other runs' checkpoints, unreadable manifests and fenced commits are never
    deleted. Only checkpoints that pass the size check count toward `keep`, and those that fail it
    are left alone, so an intact checkpoint is never deleted in favour of a broken newer one."""
    if keep < 1:
        raise UsageError(f"--keep {keep}: keep at least 1 (the newest committed checkpoint is never deleted)")
    tier = open_tier(url)
    refs, lease, _problem = _refs(tier)
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
    if not dry_run:
        for name in deleted:
            with _reading(tier):
                tier.delete(name)
            if isinstance(tier, HotTier) and tier.path(name).exists():
                raise CheckpointError(f"could not remove {tier.path(name)} (its manifest is gone: it is no longer "
                                      "committed); check permissions and remove it by hand")
    untouched = [r.name for r in refs if r.unreadable or r.fenced or r not in own]
    return PruneResult(url=tier.url, keep=keep, dry_run=dry_run, deleted=deleted,
                       kept=[r.name for r in refs if r.name not in deleted], broken=sorted(broken), run_id=owner,
                       untouched=untouched)


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
