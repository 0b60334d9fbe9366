"""Pick and load the newest checkpoint every rank can read.

Candidates come from each node's hot tier and the archive. A checkpoint is read from the hot
tiers when every node has it committed, else from the archive (each node downloads it into
its hot tier, checks every checksum, commits it there). A candidate that fails verification or
loading on any rank is skipped on all ranks, with a warning that names what was wrong."""

from __future__ import annotations

import logging
import shutil
from typing import TYPE_CHECKING, Any

from .errors import ArchiveUnavailableError, CheckpointError
from .faults import fault_point
from .loading import load_into
from .tiers import Ref, as_store_error, redact

if TYPE_CHECKING:
    from .manager import CheckpointManager, RestoreResult

log = logging.getLogger("trainready.store")


def _candidates(mgr: CheckpointManager) -> tuple[list[tuple[str, str]], dict[str, Ref], list[str]]:
    ctx = mgr.ctx
    hot = {r.name: r for r in mgr._own(mgr.hot.list()) if r.committed} if ctx.node_leader else {}
    per_node = ctx.all_gather((ctx.node, sorted(hot) if ctx.node_leader else None))
    node_sets: dict[int, set[str]] = {node: set(names) for node, names in per_node if names is not None}
    on_every_node = set.intersection(*node_sets.values()) if node_sets else set()
    archive: dict[str, Ref] = {}
    notes: list[str] = []
    if ctx.rank == 0 and mgr.archive is not None:
        try:
            archive = {r.name: r for r in mgr._own(mgr.archive.list()) if r.committed}
        except ArchiveUnavailableError as exc:
            notes.append(f"archive not consulted: {exc}")
    archive, notes = ctx.broadcast((archive, notes))
    order = sorted(on_every_node | set(archive), key=lambda n: _order(n), reverse=True)
    tries = []
    for name in order:
        if name in on_every_node:
            tries.append((name, "hot"))
        if name in archive:
            tries.append((name, "archive"))
    return tries, archive, notes


def _order(name: str) -> tuple[int, int]:
    from .manifest import parse_name

    return parse_name(name) or (-1, -1)


def restore_newest(mgr: CheckpointManager, state: dict[str, Any], step: int | None) -> RestoreResult | None:
    from .manager import RestoreResult

    ctx = mgr.ctx
    tries, archive, notes = _candidates(mgr)
    for note in notes:
        log.warning(note)
    if step is not None:
        tries = [t for t in tries if _order(t[0])[0] == step]
        if not tries:
            raise CheckpointError(f"no committed checkpoint at step {step}; `trainready ckpt ls` lists them")
    if not tries:
        return None
    skipped: list[str] = []
    for name, tier in tries:
        problem = ""
        try:
            if tier == "archive":
                _download(mgr, name, archive[name])
            problem = _verify_local(mgr, name)
        except (CheckpointError, OSError) as exc:
            problem = redact(str(exc))
        problems = [p for p in ctx.all_gather(problem) if p]
        if not problems:
            try:
                notes = load_into(state, mgr.hot.path(name), ctx)
            except BaseException as exc:  # one that cannot be loaded is skipped, like a corrupt one
                if not isinstance(exc, Exception) and type(exc).__name__ != "CheckpointException":
                    raise  # KeyboardInterrupt, SystemExit (DCP's CheckpointException is a BaseException)
                notes, problem = [], redact(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            problems = [p for p in ctx.all_gather(problem) if p]
            if not problems:
                for note in notes:
                    log.warning(note)
                return RestoreResult(_order(name)[0], name, tier, tuple(skipped))
        why = f"{name} ({tier}): {problems[0]}"
        log.warning("skipping checkpoint %s", why)
        skipped.append(why)
    raise CheckpointError(f"{len(skipped)} checkpoint(s) found, none restorable: " + " | ".join(skipped[:4]) +
                          " — move them aside to start fresh, or repair the newest")


def _verify_local(mgr: CheckpointManager, name: str) -> str:
    ref = next((r for r in mgr.hot.list() if r.name == name), None)
    if ref is None or ref.manifest is None:
        return f"not committed on node {mgr.ctx.node}'s hot tier"
    entries = ref.manifest.node_files.get(mgr.ctx.node)
    if entries is None:  # downloaded from the archive: it holds every file
        entries = ref.manifest.files
    problems = mgr.hot.verify(name, entries, mgr._checksums)
    return "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")


def _download(mgr: CheckpointManager, name: str, ref: Ref) -> None:
    """Each node's first rank copies the archived checkpoint into its hot tier (checksummed)."""
    ctx = mgr.ctx
    error = ""
    if ctx.node_leader:
        try:
            _download_node(mgr, name, ref)
        except (CheckpointError, OSError) as exc:
            error = redact(str(exc))
    errors = [e for e in ctx.all_gather(error) if e]
    if errors:
        raise CheckpointError(errors[0])


def _download_node(mgr: CheckpointManager, name: str, ref: Ref) -> None:
    manifest = ref.manifest.model_copy(update={"node_files": {}})  # a downloaded copy holds every file
    final = mgr.hot.path(name)
    if final.exists():
        if not mgr.hot.verify(name, manifest.files, True):
            return
        mgr.hot.delete(name)  # a broken local copy of an archived checkpoint: replace it
    tmp = mgr.hot.tmp_path(name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for entry in manifest.files:
            mgr.archive.download(name, entry, tmp)
        fault_point("restore.downloaded")
        mgr.hot.commit(tmp, name, manifest)
    except OSError as exc:
        raise as_store_error(exc, mgr.hot.root) from exc
    if mgr._replicator is not None:
        mgr._replicator.status.mark_archived(name)
