"""Which checkpoints may go: one rule, pure functions, used by the manager's retention (hot tier
and archive) and by `trainready ckpt prune` alike.

Rules:
- Only a run's own checkpoints are considered (`owned`): another run's are never touched.
- Only valid committed checkpoints count toward `keep`; the newest `keep` are kept.
- On a hot tier with an archive, the newest checkpoint that reached the archive is kept too (the
  one a new node restores from). Older unarchived ones beyond `keep` are dropped (and reported),
  so an archive outage cannot fill the disk.
- `protect` (the checkpoint being uploaded) is never deleted; `broken` (failing a check) is
  never deleted and does not count toward `keep`.
- Unreadable manifests and checkpoints committed by a fenced writer are never deleted
  automatically (they are reported; remove them by hand once you have looked at them).
- Uncommitted debris (no manifest) older than the newest committed checkpoint is removed (a newer
  one may still be being written).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .manifest import Lease
from .tiers import Ref


@dataclass(frozen=True)
class Plan:
    delete: list[str] = field(default_factory=list)            # oldest first
    dropped_unarchived: list[str] = field(default_factory=list)  # of `delete`: hot checkpoints never archived


def owned(refs: Iterable[Ref], run_id: str | None) -> list[Ref]:
    """`run_id`'s checkpoints, plus those whose run cannot be known (no readable manifest)."""
    return [r for r in refs if run_id is None or r.manifest is None or r.manifest.run_id == run_id]


def mark_fenced(refs: Iterable[Ref], lease: Lease | None) -> None:
    """Flag checkpoints committed by a writer `lease` fenced (see Lease.fences)."""
    for ref in refs:
        ref.fenced = bool(lease and ref.committed and lease.fences(ref.step, ref.generation))


def plan(refs: list[Ref], keep: int | None, *, archived: set[str] | None = None, protect: Iterable[str] = (),
         broken: Iterable[str] = ()) -> Plan:
    """What to delete from one tier. `archived`: names already in the archive, for a hot tier that
    replicates (None: an archive itself, or a hot tier without one). `keep` None keeps every
    valid committed checkpoint."""
    spared = set(protect) | set(broken)
    valid = sorted((r for r in refs if r.committed and not r.fenced and r.name not in set(broken)),
                   key=lambda r: r.order, reverse=True)
    kept = {r.name for r in (valid if keep is None else valid[:max(keep, 1)])} | spared
    if archived is not None:
        newest_archived = max((r for r in valid if r.name in archived), key=lambda r: r.order, default=None)
        if newest_archived is not None:
            kept.add(newest_archived.name)
    doomed = [r for r in valid if r.name not in kept]
    newest = valid[0].order if valid else None
    debris = [r for r in refs if r.status == "uncommitted" and newest is not None and r.order < newest
              and r.name not in spared]
    ordered = sorted(doomed + debris, key=lambda r: r.order)
    dropped = [r.name for r in ordered if r.committed and archived is not None and r.name not in archived]
    return Plan([r.name for r in ordered], dropped)
