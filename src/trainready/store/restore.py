"""Pick and load the newest checkpoint every rank can read.

A function of the manager's public surface (`Tiers` below): candidates come from each node's
hot tier and the archive, as the manager lists them (its own run, fenced commits flagged). A
checkpoint is read from the hot tiers when every node has it committed, else from the archive
(each node downloads it into its hot tier, checks every checksum, commits it there). A candidate
that fails verification or loading on any rank is skipped on all ranks, with a warning that
names what was wrong. Checkpoints never restored (unreadable manifest, committed by a fenced
writer) are named in `skipped` when they are newer than the one restored.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from typing import Any, Protocol

from trainready.dist import DistContext
from trainready.io import dir_mode, redact

from .errors import ArchiveUnavailableError, CheckpointError
from .faults import fault_point
from .loading import load_into
from .manifest import parse_name
from .tiers import ArchiveTier, HotTier, Ref, as_store_error

log = logging.getLogger("trainready.store")


@dataclass(frozen=True)
class RestoreResult:
    step: int
    name: str
    tier: str
    skipped: tuple[str, ...]   # newer checkpoints passed over, each with why


class Tiers(Protocol):
    """What restore needs from a checkpoint manager (its public surface)."""

    ctx: DistContext
    hot: HotTier
    archive: ArchiveTier | None

    def refs(self, tier: HotTier | ArchiveTier) -> list[Ref]: ...

    def verify_hot(self, name: str, entries: Any) -> list[str]: ...

    def note_archived(self, name: str) -> None: ...


def _order(name: str) -> tuple[int, int]:
    return parse_name(name) or (-1, -1)


def _candidates(tiers: Tiers) -> tuple[list[tuple[str, str]], dict[str, Ref], list[str], list[Ref]]:
    ctx = tiers.ctx
    hot_refs = tiers.refs(tiers.hot) if ctx.node_leader else []
    hot = {r.name for r in hot_refs if r.committed and not r.fenced}
    per_node = ctx.all_gather((ctx.node, sorted(hot) if ctx.node_leader else None))
    node_sets: dict[int, set[str]] = {node: set(names) for node, names in per_node if names is not None}
    on_every_node = set.intersection(*node_sets.values()) if node_sets else set()
    archive: dict[str, Ref] = {}
    notes: list[str] = []
    never: list[Ref] = [r for r in hot_refs if r.unreadable or r.fenced]
    if ctx.rank == 0 and tiers.archive is not None:
        try:
            archive_refs = tiers.refs(tiers.archive)
            archive = {r.name: r for r in archive_refs if r.committed and not r.fenced}
            never += [r for r in archive_refs if r.unreadable or r.fenced]
        except ArchiveUnavailableError as exc:
            notes.append(f"archive not consulted: {exc}")
    archive, notes, never = ctx.broadcast((archive, notes, never if ctx.rank == 0 else None))
    order = sorted(on_every_node | set(archive), key=_order, reverse=True)
    tries = []
    for name in order:
        if name in on_every_node:
            tries.append((name, "hot"))
        if name in archive:
            tries.append((name, "archive"))
    return tries, archive, notes, never or []


def restore_newest(tiers: Tiers, state: dict[str, Any], step: int | None) -> RestoreResult | None:
    ctx = tiers.ctx
    tries, archive, notes, never = _candidates(tiers)
    for note in notes:
        log.warning(note)
    if step is not None:
        tries = [t for t in tries if _order(t[0])[0] == step]
        if not tries:
            raise CheckpointError(f"no committed checkpoint at step {step}; `trainready ckpt ls` lists them")
    if not tries:
        for ref in never:
            log.warning("not restorable: %s (%s): %s", ref.name, ref.tier, _why_never(ref))
        return None
    skipped: list[str] = []
    for name, tier in tries:
        problem = ""
        try:
            if tier == "archive":
                _download(tiers, name, archive[name])
            problem = _verify_local(tiers, name)
        except (CheckpointError, OSError) as exc:
            problem = redact(str(exc))
        problems = [p for p in ctx.all_gather(problem) if p]
        if not problems:
            try:
                loaded_notes = load_into(state, tiers.hot.path(name), ctx, listed=_listed(tiers, name))
            except BaseException as exc:  # one that cannot be loaded is skipped, like a corrupt one
                if not isinstance(exc, Exception) and type(exc).__name__ != "CheckpointException":
                    raise  # KeyboardInterrupt, SystemExit (DCP's CheckpointException is a BaseException)
                loaded_notes, problem = [], redact(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")[:300]
            problems = [p for p in ctx.all_gather(problem) if p]
            if not problems:
                for note in loaded_notes:
                    log.warning(note)
                newer = [f"{r.name} ({r.tier}): {_why_never(r)}" for r in never if r.order > _order(name)]
                return RestoreResult(_order(name)[0], name, tier, tuple(sorted(set(newer)) + skipped))
        why = f"{name} ({tier}): {problems[0]}"
        log.warning("skipping checkpoint %s", why)
        skipped.append(why)
    raise CheckpointError(f"{len(skipped)} checkpoint(s) found, none restorable: " + " | ".join(skipped[:4]) +
                          " — move them aside to start fresh, or repair the newest")


def _why_never(ref: Ref) -> str:
    if ref.fenced:
        return "committed by a writer that had lost the prefix to a newer one (fenced); kept, never restored"
    return f"{ref.problem}; kept, not restored"


def _entries(tiers: Tiers, name: str) -> list[Any] | None:
    """What this node's hot copy of `name` must hold, by its manifest (None: not committed)."""
    ref = next((r for r in tiers.hot.list() if r.name == name), None)
    if ref is None or ref.manifest is None:
        return None
    entries = ref.manifest.node_files.get(tiers.ctx.node)
    return ref.manifest.files if entries is None else entries  # downloaded from the archive: every file


def _listed(tiers: Tiers, name: str) -> set[str]:
    return {e.path for e in _entries(tiers, name) or []}


def _verify_local(tiers: Tiers, name: str) -> str:
    entries = _entries(tiers, name)
    if entries is None:
        return f"not committed on node {tiers.ctx.node}'s hot tier"
    problems = tiers.verify_hot(name, entries)
    return "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")


def _download(tiers: Tiers, name: str, ref: Ref) -> None:
    """Each node's first rank copies the archived checkpoint into its hot tier (checksummed)."""
    ctx = tiers.ctx
    error = ""
    if ctx.node_leader:
        try:
            _download_node(tiers, name, ref)
        except (CheckpointError, OSError) as exc:
            error = redact(str(exc))
    errors = [e for e in ctx.all_gather(error) if e]
    if errors:
        raise CheckpointError(errors[0])


def _download_node(tiers: Tiers, name: str, ref: Ref) -> None:
    assert tiers.archive is not None and ref.manifest is not None
    manifest = ref.manifest.model_copy(update={"node_files": {}})  # a downloaded copy holds every file
    hot = tiers.hot
    if hot.path(name).exists():
        if not hot.verify(name, manifest.files, True):
            return
        hot.delete(name)  # a broken local copy of an archived checkpoint: replace it
    tmp = hot.tmp_path(name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True, mode=dir_mode())
        for entry in manifest.files:
            tiers.archive.download(name, entry, tmp)
        fault_point("restore.downloaded")
        hot.commit(tmp, name, manifest)
    except OSError as exc:
        raise as_store_error(exc, hot.root) from exc
    tiers.note_archived(name)
