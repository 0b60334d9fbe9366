"""Which checkpoints may go: a pure function, so the safety rules are tested on their own.

Rules: only committed checkpoints count toward `keep`; the newest checkpoint that reached the
archive is never deleted; a hot checkpoint not yet archived is deleted only once a newer one
is archived (or there is no archive); uncommitted debris older than the newest committed
checkpoint is removed (a newer one may still be in progress)."""

from __future__ import annotations

from .tiers import Ref


def hot_deletions(hot: list[Ref], archived: set[str], keep: int, has_archive: bool) -> list[str]:
    committed = sorted((r for r in hot if r.committed), key=lambda r: r.order, reverse=True)
    newest_archived = max((r.order for r in committed if r.name in archived), default=None)
    doomed = []
    for ref in committed[max(keep, 1):]:
        safe = (not has_archive) or ref.name in archived or (newest_archived is not None and newest_archived > ref.order)
        if safe and ref.order != newest_archived:
            doomed.append(ref.name)
    return doomed + _debris(hot, committed)


def archive_deletions(archive: list[Ref], keep: int | None) -> list[str]:
    committed = sorted((r for r in archive if r.committed), key=lambda r: r.order, reverse=True)
    doomed = [] if keep is None else [r.name for r in committed[max(keep, 1):]]
    return doomed + _debris(archive, committed)


def _debris(refs: list[Ref], committed: list[Ref]) -> list[str]:
    if not committed:
        return []
    newest = committed[0].order
    return [r.name for r in refs if not r.committed and r.order < newest]
