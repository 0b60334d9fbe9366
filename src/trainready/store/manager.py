"""CheckpointManager: save, restore, retention and replication for a training job.

Concurrency contract: one manager per process (every rank makes one, collectively, like a
process group); its methods are called from the training thread only. Every decision all ranks
must share (save or skip this step, stop for a signal, raise a background error) is agreed by
one collective on the process's control group (trainready.dist), on the training thread. Saves
run in one background writer thread (at most one in flight) whose collectives use a group of
their own; uploads run in one replication thread per node (no collectives). Background errors
are re-raised by the next save/wait/close on every rank, never swallowed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import threading
import uuid
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from trainready.clock import SYSTEM_CLOCK, Clock
from trainready.dist import STOP, DistContext, StopRequest
from trainready.io import PreconditionFailed, redact

from . import retention
from .errors import (ArchiveUnavailableError, BadStateError, CheckpointError, FencedError, PreemptedError, describe,
                     raise_agreed)
from .manifest import Lease, Manifest, checkpoint_name
from .options import CheckpointManagerOptions
from .replicator import Replicator
from .restore import RestoreResult, restore_newest
from .snapshot import Stager, take_snapshot, write_hot
from .tiers import ArchiveTier, HotTier, Ref

log = logging.getLogger("trainready.store")
CLAIM_ATTEMPTS = 5

__all__ = ["CheckpointManager", "CheckpointManagerOptions", "RestoreResult"]



@dataclass(frozen=True)
class ManagerStatus:
    """CheckpointManager.status(): where saving and uploading stand."""

    run_id: str
    generation: int
    saving: bool
    """A save is being written in the background."""
    uploading: str | None
    """The checkpoint being uploaded to the archive, if any."""
    upload_failures: int
    """Failed upload attempts so far."""
    last_upload_error: str
    archived_step: int | None
    """The newest step in the archive."""
    upload_check: str
    """How the last upload was proven: "sha256" or "size" ("" before any)."""
    dropped_unarchived: tuple[str, ...]
    """Hot checkpoints retention removed before they reached the archive."""
    unarchivable: tuple[str, ...]
    """Checkpoints given up on: their hot copy changed."""

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def _option(name: str) -> property:
    def read(self: CheckpointManager) -> Any:
        return getattr(self.options, name)

    def write(self: CheckpointManager, _value: Any) -> None:
        raise AttributeError(f"CheckpointManager.{name} is an option: make the manager with "
                             f"options=CheckpointManagerOptions({name}=...)")
    return property(read, write, doc=f"options.{name} (read-only)")


class CheckpointManager:
    """Tiered checkpoints: `hot` is a local directory (the node's NVMe), `archive` any fsspec URL
    (local/shared path, file://, s3://) or None; `options` (CheckpointManagerOptions) say how many to keep
    and how to write, verify and upload them.

    run_id: names the run owning this prefix (default: the one found there, else a new one); a different run_id
      for a prefix that holds another run is refused (FencedError).
    metadata: written into every checkpoint's manifest (a save's own metadata is added to it).

    What it works with is passed in, each defaulting to the process's own:
    process_group / context: the ranks that save together (default: torch.distributed's world, or one process;
      a DistContext someone already holds, such as a Session's, is shared rather than built again);
    stop: the stop request that signals reach (trainready.dist.STOP);
    clock: the clock of the claim wait, the lease and the preemption deadline (trainready.clock).

    Earlier releases took the options' fields as keyword arguments of this constructor; they are still taken, with a
    DeprecationWarning, and cannot be mixed with `options`.
    """

    def __init__(self, hot: str | os.PathLike, archive: str | None = None,
                 options: CheckpointManagerOptions | None = None, *, run_id: str | None = None,
                 metadata: dict[str, Any] | None = None, process_group: Any = None, context: DistContext | None = None,
                 stop: StopRequest = STOP, clock: Clock = SYSTEM_CLOCK, **option_fields: Any):
        for name, where in (("hot", hot), ("archive", archive)):
            if isinstance(where, CheckpointManagerOptions):  # CheckpointManager(hot, options): archive's place
                raise BadStateError(f"{name}= got the options: pass them as options=CheckpointManagerOptions(...) "
                                    "(the second positional argument is the archive URL)")
            if not (isinstance(where, (str, os.PathLike)) or where is None and name == "archive"):
                raise BadStateError(f"{name}={type(where).__name__}: give a path or URL (str or os.PathLike)")
        options = _options_from(options, option_fields)
        if stop.clock is not clock:  # the preemption deadline is measured from `stop.at`: one clock for both
            raise BadStateError("the stop request and the manager must use the same clock: pass "
                                "stop=StopRequest(clock=...) with the clock given to the manager")
        self.options = options
        self.metadata = dict(metadata or {})
        self.stop, self.clock = stop, clock
        self.hot = HotTier(hot)
        self.archive = ArchiveTier(archive) if archive else None
        if context is not None and process_group is not None:
            raise BadStateError("give process_group or context, not both: a context already names its ranks")
        self.ctx = context.retain() if context is not None else DistContext.acquire(process_group)
        self._writer_group = self.ctx.worker_group("trainready-checkpoint-writer")
        self._errors: list[BaseException] = []
        self._inflight: Future | None = None
        self._executor = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainready-writer")
                          if options.async_save else None)
        self._stager = Stager() if options.async_save else None
        self._chores: ThreadPoolExecutor | None = None
        self._chore: Future | None = None
        self._retention_lock = threading.Lock()
        self._saved: set[int] = set()
        self._preempt: dict[str, Any] | None = None
        self._stopped_at: int | None = None  # the step the preemption save committed (then closed)
        self.dropped_unarchived: list[str] = []
        self.last_commit: tuple[int, float] | None = None  # (step, seconds) of the newest hot commit
        self._closed = False
        try:
            self.run_id, self.generation, self.lease = self._claim(run_id)
        except BaseException:
            self.ctx.release()
            raise
        self._replicator = None
        atexit.register(self._at_exit)
        if self.archive is not None and self.ctx.node_leader:
            self._replicator = Replicator(self.hot, self.archive, self.ctx.node, self.ctx.nodes, self.ctx.rank == 0,
                                          self._on_archived, self._check_archive_fence, options.retry_initial_s,
                                          options.retry_max_s)
            self._archived_at_start()

    # the options of earlier releases were attributes: readable still, and a write says where they went instead
    # of doing nothing (the manager reads `options`)
    keep_hot = _option("keep_hot")
    keep_archive = _option("keep_archive")
    async_save = _option("async_save")
    when_busy = _option("when_busy")
    save_interval_steps = _option("save_interval_steps")
    claim_wait_s = _option("claim_wait_s")

    # ---- ownership ---------------------------------------------------------------------------

    def _claim(self, run_id: str | None) -> tuple[str, int, Lease]:
        """Agree on the run id and take the next writer generation (fencing older writers)."""
        if self.ctx.node_leader:
            self.hot.ensure()
        found: Any = None
        if self.ctx.rank == 0:
            try:
                found = self._claim_rank0(run_id)
            except CheckpointError as exc:
                found = exc
            except Exception as exc:  # every rank must learn of it, or the others wait in the broadcast
                found = CheckpointError(f"claiming {self.hot.root} failed: {type(exc).__name__}: {redact(str(exc))}")
        found = self.ctx.broadcast(found)
        if isinstance(found, BaseException):
            raise found
        lease: Lease = found
        if self.ctx.node_leader:
            if self.ctx.rank != 0:  # rank 0 wrote its node's lease while claiming
                self.hot.write_lease(self._lease(lease.run_id, lease.generation, lease.fenced))
            for stale in self.hot.stale_tmp():  # leftovers of a crashed save; no writer owns them now
                shutil.rmtree(stale, ignore_errors=True)
        self.ctx.barrier()
        return lease.run_id, lease.generation, lease

    def _claim_rank0(self, run_id: str | None) -> Lease:
        """Read both leases and every checkpoint, pick run and generation, write the leases
        conditionally; a writer that claimed in between makes us read again and take the next."""
        for _ in range(CLAIM_ATTEMPTS):
            hot_state = self.hot.read_lease()
            refs = self.hot.list()
            archive_state, archive_refs = self._archive_for_claim(hot_state.lease is not None or any(
                r.committed for r in refs))
            refs += archive_refs
            states = [s for s in (hot_state, archive_state) if s is not None]
            for state in states:
                if state.damaged:
                    log.warning("%s: rebuilding it from the newest committed checkpoints", state.damaged)
            leases = [s.lease for s in states if s.lease is not None]
            run = self._pick_run(run_id, leases, refs)
            generation = 1 + max([lease.generation for lease in leases] + [r.generation for r in refs], default=0)
            # without the archive's view, what older writers committed there is unknown: fence nothing
            seen_all = self.archive is None or archive_state is not None
            lease = self._lease(run, generation, _fence_map(refs, run, leases) if seen_all else None)
            try:
                if self.archive is not None and archive_state is not None:
                    try:
                        self.archive.write_lease(lease, archive_state)
                    except ArchiveUnavailableError as exc:
                        log.warning("could not write the archive lease (%s); will retry with the first upload", exc)
                self.hot.write_lease(lease, hot_state)
            except PreconditionFailed:
                log.info("another writer claimed %s at the same moment; reading it again", self.hot.root)
                continue
            return lease
        raise FencedError(f"could not claim {self.hot.root}: other writers kept claiming it ({CLAIM_ATTEMPTS} tries)")

    def _archive_for_claim(self, hot_knows_run: bool) -> tuple[Any, list[Ref]]:
        """The archive's lease and checkpoints for a claim. Unreachable: a hot tier that knows the
        run claims without it (and catches up later); one that knows nothing waits up to
        claim_wait_s, then refuses rather than start from scratch beside an archive it cannot see."""
        if self.archive is None:
            return None, []
        deadline, delay = self.clock.monotonic() + self.options.claim_wait_s, max(self.options.retry_initial_s, 0.05)
        while True:
            try:
                return self.archive.read_lease(), self.archive.list()
            except ArchiveUnavailableError as exc:
                if hot_knows_run:
                    log.warning("archive unreachable at start (%s); claiming from the hot tier %s, which holds this "
                                "run, and catching up with the archive later", exc, self.hot.root)
                    return None, []
                if self.clock.monotonic() + delay > deadline:
                    raise ArchiveUnavailableError(
                        f"{exc}; this node's hot tier {self.hot.root} holds nothing of the run, so starting without the "
                        f"archive could start from scratch beside its checkpoints. Waited {self.options.claim_wait_s:.0f}s; "
                        "retry when it is reachable (or use another archive for a new run)") from None
                log.warning("archive unreachable at start (%s); retrying in %.1fs", exc, delay)
                self.clock.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _pick_run(self, run_id: str | None, leases: list[Lease], refs: list[Ref]) -> str:
        committed = [r for r in refs if r.committed]
        owners = {lease.run_id for lease in leases} | {r.manifest.run_id for r in committed}
        if run_id is None:
            newest = max(leases, key=lambda lease: lease.generation, default=None)
            last = max(committed, key=lambda r: (r.generation, r.step), default=None)  # wrote last
            run_id = newest.run_id if newest else (last.manifest.run_id if last else uuid.uuid4().hex[:12])
        others = owners - {run_id}
        if others:
            where = f"{self.hot.root}{' / ' + self.archive.url if self.archive else ''}"
            raise FencedError(f"checkpoint prefix {where} holds run {sorted(others)[0]!r}, not {run_id!r}: pass "
                              f"run_id={sorted(others)[0]!r} to resume it, or use another directory for a new run")
        return run_id

    def _lease(self, run_id: str, generation: int, fenced: dict[int, int] | None) -> Lease:
        return Lease(run_id=run_id, generation=generation, host=socket.gethostname(), pid=os.getpid(),
                     started_unix=self.clock.time(), fenced=fenced)

    def _is_mine(self, lease: Lease | None) -> bool:
        # generation and process identity: a writer that claimed the same generation while the
        # archive was unreachable is still someone else
        return lease is not None and (lease.run_id, lease.generation, lease.host, lease.pid) == (
            self.run_id, self.generation, socket.gethostname(), os.getpid())

    def _check_hot_fence(self) -> None:
        self._check_fence(self.hot)

    def _check_archive_fence(self) -> None:
        assert self.archive is not None
        self._check_fence(self.archive)

    def _check_fence(self, tier: HotTier | ArchiveTier) -> None:
        """Stop (FencedError) unless this writer owns `tier`. A higher generation wins: the lease
        of another run, of a newer generation or of this generation elsewhere fences this writer;
        a missing or damaged lease, or one a writer this one fenced left behind, is replaced with
        ours (conditionally) unless a newer generation has committed there meanwhile."""
        for _ in range(CLAIM_ATTEMPTS):  # a lost compare-and-replace means it changed: look again
            state = tier.read_lease()
            lease = state.lease
            if self._is_mine(lease):
                return
            if lease is not None and (lease.run_id != self.run_id or lease.generation >= self.generation):
                raise FencedError(f"{tier.url} now belongs to run {lease.run_id!r} generation {lease.generation} (this "
                                  f"writer: generation {self.generation}); this writer stops")
            newer = [r for r in retention.owned(tier.list(), self.run_id) if r.committed and r.generation > self.generation]
            if newer:
                raise FencedError(f"{tier.url} holds {newer[0].name}, committed by generation {newer[0].generation} "
                                  f"(this writer: generation {self.generation}); this writer stops")
            if state.damaged:
                log.warning("%s: writing this writer's lease again", state.damaged)
            elif lease is not None:
                log.warning("%s holds the lease of generation %d, which this writer (generation %d) fenced: replacing "
                            "it", tier.url, lease.generation, self.generation)
            with contextlib.suppress(PreconditionFailed):
                tier.write_lease(self._lease(self.run_id, self.generation, self.lease.fenced), state)
        raise FencedError(f"{tier.url}: the writer lease keeps changing under this writer (generation "
                          f"{self.generation}); this writer stops")

    # ---- saving ------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """True on every `save_interval_steps`-th step, and (with install_preemption_handler) once a
        stop signal reached any rank: agreed by all ranks, on the training thread."""
        if self._stopped_at is not None:  # stopped for preemption: nothing more to save
            return False
        if self._preempt is not None:
            (stop,) = self.ctx.any_true(self.stop.requested)
            if stop:
                self._agree_stop()
                return True
        every = self.options.save_interval_steps
        return bool(every) and step % every == 0

    def _agree_stop(self) -> None:
        self.stop.request(signal.SIGTERM)  # another rank was signalled: this one stops too
        self._preempt["agreed"] = True

    def save(self, step: int, state: dict[str, Any], *, metadata: dict[str, Any] | None = None) -> bool:
        """Checkpoint `state` as of `step`. Returns once the state is staged (async) or committed
        on the hot tier (sync); False when skipped (this step already saved, or busy with
        when_busy='skip'). Collective: every rank calls it with the same step."""
        if self._stopped_at is not None:
            # the loop went on after the stop's save: whatever it trained since is lost on the reclaimed node, and a
            # quiet return would let a final save 'succeed' and the process exit 0 with an older checkpoint
            raise PreemptedError(f"the checkpoint manager stopped for preemption after step {self._stopped_at} "
                                 f"(saved); save({step}) comes after it: leave the training loop when "
                                 f"mgr.reached_preemption(step) is true and exit (mgr.PREEMPTION_EXIT_CODE, 143)")
        self._check_open()
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise BadStateError(f"step must be a non-negative int, got {step!r}")
        busy = self._inflight is not None and not self._inflight.done()
        error = self._take_error(replicator=True)
        stopping = self._preempt is not None and (self.stop.requested or self._preempt["agreed"])
        everyone = self.ctx.all_gather((step in self._saved, busy, stopping, describe(error)))
        raise_agreed(error, [e[3] for e in everyone])
        already, busy, stopping = (any(e[i] for e in everyone) for i in range(3))
        if stopping:
            self._agree_stop()
        if already:
            return False
        if busy:
            if self.options.when_busy == "skip" and not stopping:
                return False
            self._await_inflight()
            raise_agreed(self._take_error(replicator=False), [])  # the writer's errors reach every rank alike
        snap = take_snapshot(step, state, {**self.metadata, **(metadata or {})}, self._stager)
        self._saved.add(step)
        if self._executor is None or stopping:
            try:
                self._commit(snap)
            except BaseException:
                self._saved.discard(step)  # not committed: saving this step again must work
                raise
        else:
            self._inflight = self._executor.submit(self._commit_in_background, snap)
        if stopping:
            self._finish_preemption(step)
        return True

    def _commit(self, snap: Any) -> Manifest:
        manifest = write_hot(snap, self.hot, self.ctx, self._writer_group, self.run_id, self.generation,
                             self._check_hot_fence)
        self.last_commit = (snap.step, manifest.save_seconds)  # what a final synchronous save would cost
        name = checkpoint_name(snap.step, self.generation)
        if self._replicator is not None:
            self._replicator.submit(name, manifest)
        if self.ctx.node_leader:
            self._housekeeping(self._apply_hot_retention)
        log.info("checkpoint %s committed on %s (%.1f MiB, %.2fs)", name, self.hot.root, manifest.total_bytes / 2**20,
                 manifest.save_seconds)
        return manifest

    def _housekeeping(self, task: Any) -> None:
        """Retention off the save's critical path (sync saves return once committed)."""
        if self._executor is not None:  # already on the background writer thread
            task()
            return
        if self._chores is None:
            self._chores = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainready-retention")
        self._chore = self._chores.submit(self._capture_errors, task)

    def _capture_errors(self, task: Any) -> None:
        try:
            task()
        except BaseException as exc:
            self._errors.append(exc)

    def _commit_in_background(self, snap: Any) -> None:
        try:
            self._commit(snap)
        except BaseException as exc:
            self._saved.discard(snap.step)
            self._errors.append(exc)

    def _await_inflight(self) -> None:
        if self._inflight is not None:
            self._inflight.result()
            self._inflight = None
        if self._chore is not None:
            self._chore.result()
            self._chore = None

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this CheckpointManager is closed; create a new one")

    def _take_error(self, replicator: bool) -> CheckpointError | None:
        """The first background error (the others are dropped: one report is enough), as a CheckpointError."""
        if replicator and self._replicator is not None and self._replicator.status.fatal is not None:
            self._errors.append(self._replicator.status.fatal)
            self._replicator.status.fatal = None
        if not self._errors:
            return None
        exc = self._errors.pop(0)
        self._errors.clear()
        if isinstance(exc, CheckpointError):
            return exc
        return CheckpointError(f"background save failed: {type(exc).__name__}: {redact(str(exc))}")

    # ---- retention ---------------------------------------------------------------------------

    def refs(self, tier: HotTier | ArchiveTier) -> list[Ref]:
        """This run's checkpoints on `tier`, with those committed by fenced writers flagged."""
        own = retention.owned(tier.list(), self.run_id)
        retention.mark_fenced(own, self.lease)
        return own

    def _archived_at_start(self) -> None:
        """Learn what the archive has; queue the newest hot checkpoint it lacks (catch-up after a crash)."""
        try:
            archived = {r.name for r in self.archive.list() if r.committed}
        except ArchiveUnavailableError:
            archived = set()
        self._replicator.status.mark_archived(*archived)
        hot = [r for r in self.refs(self.hot) if r.committed and not r.fenced]
        newest = max(hot, key=lambda r: r.order, default=None)
        if newest is not None and newest.name not in archived:
            self._replicator.submit(newest.name, newest.manifest)

    def _on_archived(self, name: str) -> None:
        self._apply_hot_retention()
        if self.ctx.rank == 0 and self.archive is not None:
            self._check_archive_fence()
            for doomed in retention.plan(self.refs(self.archive), self.options.keep_archive).delete:
                self.archive.delete(doomed)

    def _apply_hot_retention(self) -> None:
        with self._retention_lock:
            self._check_hot_fence()
            rep = self._replicator.status if self._replicator else None
            archived = set(rep.archived) if rep else None
            protect = [rep.pending] if rep and rep.pending else []
            decided = retention.plan(self.refs(self.hot), self.options.keep_hot, archived=archived, protect=protect)
            for name in decided.delete:
                self.hot.delete(name)
            if decided.dropped_unarchived:
                self.dropped_unarchived.extend(decided.dropped_unarchived)
                log.warning("dropped %s from the hot tier %s before it reached the archive %s (keep_hot=%d; last "
                            "upload error: %s); the newest archived checkpoint and the newest %d are kept",
                            ", ".join(decided.dropped_unarchived), self.hot.root,
                            self.archive.url if self.archive else "-", self.options.keep_hot,
                            (rep.last_error if rep else "") or "none", self.options.keep_hot)

    # ---- restoring ---------------------------------------------------------------------------

    def verify_hot(self, name: str, entries: Any) -> list[str]:
        """Problems with a hot checkpoint's files (sizes always; checksums as `checksums` says)."""
        return self.hot.verify(name, entries, self.options.verify_checksums)

    def note_archived(self, name: str) -> None:
        if self._replicator is not None:
            self._replicator.status.mark_archived(name)

    def latest_step(self) -> int | None:
        """Newest committed step on this node's hot tier or the archive (no verification)."""
        refs = self.refs(self.hot)
        if self.archive is not None:
            try:
                refs += self.refs(self.archive)
            except ArchiveUnavailableError:
                pass
        steps = [r.step for r in refs if r.committed and not r.fenced]
        return max(steps) if steps else None

    def restore(self, state: dict[str, Any], *, step: int | None = None) -> int | None:
        """Load the newest checkpoint that verifies (or exactly `step`); returns its step, or None
        when there is none. Every rank returns the same step."""
        result = self.restore_details(state, step=step)
        return result.step if result else None

    def restore_details(self, state: dict[str, Any], *, step: int | None = None) -> RestoreResult | None:
        self._check_open()
        self.wait_for_saves()
        result = restore_newest(self, state, step)
        if result is not None:
            self._saved.add(result.step)
        return result

    # ---- lifecycle ---------------------------------------------------------------------------

    def wait_for_saves(self) -> None:
        """Wait for the in-flight save; its error (if any) is raised on every rank."""
        self._await_inflight()
        mine = self._take_error(replicator=False)
        raise_agreed(mine, self.ctx.all_gather(describe(mine)))

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the in-flight save is committed and uploads are done (or `timeout_s` passes:
        ArchiveUnavailableError, training state stays safe on the hot tier). Collective: what any
        rank raises, every rank raises."""
        self._await_inflight()
        error = self._take_error(replicator=True)
        if error is None and self._replicator is not None and not self._replicator.wait(timeout_s):
            status = self._replicator.status
            error = ArchiveUnavailableError(f"upload of {status.pending} to {self.archive.url} not finished after "
                                            f"{timeout_s:.0f}s ({status.attempts} failed attempts; last: "
                                            f"{status.last_error or 'none'}); it is safe on the hot tier {self.hot.root}")
        if error is None:
            error = self._take_error(replicator=True)
        # on every rank, even where this node's upload failed: the collectives must pair up
        raise_agreed(error, self.ctx.all_gather(describe(error)))

    def status(self) -> ManagerStatus:
        """Where saving and uploading stand now (a snapshot: it does not change afterwards)."""
        rep = self._replicator.status if self._replicator else None
        saving = bool(self._inflight and not self._inflight.done())
        return ManagerStatus(run_id=self.run_id, generation=self.generation, saving=saving,
                             uploading=rep.pending if rep else None, upload_failures=rep.attempts if rep else 0,
                             last_upload_error=rep.last_error if rep else "",
                             archived_step=rep.newest_step if rep else None, upload_check=rep.checked if rep else "",
                             dropped_unarchived=tuple(self.dropped_unarchived),
                             unarchivable=tuple(rep.unarchivable) if rep else ())

    def close(self, timeout_s: float | None = 600.0) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        try:
            self.wait(timeout_s)
        finally:
            for pool in (self._executor, self._chores):
                if pool is not None:
                    pool.shutdown(wait=True)
            if self._replicator is not None:
                self._replicator.stop()
            self.ctx.release()  # the last user destroys the groups: no gloo work outlives the interpreter

    def _at_exit(self) -> None:
        """Never exit silently with a save unwritten or an error unreported (close() was not called)."""
        if self._closed:
            return
        try:
            self._await_inflight()
            error = self._take_error(replicator=True)
            if error is not None:
                raise error
        except Exception as exc:
            log.error("checkpoint save failed before exit: %s", exc)
        if self._replicator is not None and not self._replicator.idle():
            log.error("exiting with checkpoint %s not uploaded to %s (it is on the hot tier %s; the next run uploads "
                      "it); call close() to wait", self._replicator.status.pending, self.archive.url, self.hot.root)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # don't mask the original error; still finish what can be finished
            try:
                self.close()
            except Exception as exc:
                log.error("while closing after an error: %s", exc)

    # ---- preemption --------------------------------------------------------------------------

    PREEMPTION_EXIT_CODE = 143
    """What a preempted process conventionally exits with (128 + SIGTERM): the caller's to use."""

    def install_preemption_handler(self, deadline_s: float = 100.0, exit_code: int | None = None,
                                   signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        """On a stop signal (spot gives ~2 minutes) make `should_save` true on every rank; the
        next `save` is synchronous, then waits for its upload until `deadline_s` after the signal
        and closes. It never exits the process: the loop stops when `reached_preemption(step)` is
        true, and the caller decides how to exit (Orbax's `reached_preemption`; conventionally
        with PREEMPTION_EXIT_CODE). The signals go through trainready's one signal path
        (trainready.dist.STOP)."""
        if exit_code is not None:  # the argument of the releases whose save() exited the process
            warnings.warn("install_preemption_handler(exit_code=...) no longer exits the process: leave the loop when "
                          "reached_preemption(step) is true and exit with it yourself", DeprecationWarning,
                          stacklevel=2)
            self.PREEMPTION_EXIT_CODE = exit_code
        self._preempt = {"agreed": False, "deadline_s": deadline_s}
        self.stop.install(signals)

    def reached_preemption(self, step: int | None = None) -> bool:
        """Whether the training loop should stop for preemption: the ranks agreed to stop and the stop's
        checkpoint is committed (and uploaded, or the deadline passed); the same on every rank. Before that
        save it is False, so checking it first never leaves the loop unsaved. `step` is accepted as Orbax's
        `reached_preemption(step)` takes it."""
        return self._stopped_at is not None

    @property
    def preempted(self) -> bool:
        """Whether all ranks agreed to stop (in should_save or save): a signal this rank alone
        has seen does not count until then, so every rank leaves its loop at the same step."""
        return bool(self._preempt and self._preempt["agreed"])

    def _finish_preemption(self, step: int) -> None:
        started = self.stop.at or self.clock.monotonic()
        remaining = max(1.0, self._preempt["deadline_s"] - (self.clock.monotonic() - started))
        self._stopped_at = step
        try:
            self.close(timeout_s=remaining)
        except ArchiveUnavailableError as exc:
            log.error("preemption: %s", exc)


def _fence_map(refs: list[Ref], run_id: str, leases: list[Lease]) -> dict[int, int]:
    """For each older generation of `run_id` with a committed checkpoint: the newest step it may
    have committed. A bound an earlier lease set is kept (what it fenced stays fenced), and a
    generation an earlier lease did not list had nothing committed then: it stays out (fenced)."""
    newest: dict[int, int] = {}
    for ref in refs:
        if ref.committed and ref.manifest.run_id == run_id:
            newest[ref.generation] = max(newest.get(ref.generation, -1), ref.step)
    bounds = {}
    for generation, step in newest.items():
        bound = step
        for lease in leases:
            if lease.fenced is not None and lease.run_id == run_id and generation < lease.generation:
                bound = min(bound, lease.fenced.get(generation, -1))
        if bound >= 0:
            bounds[generation] = bound
    return bounds


def _options_from(options: CheckpointManagerOptions | None, fields: dict[str, Any]) -> CheckpointManagerOptions:
    """The options object, or one built from the keyword arguments of releases before it (deprecated)."""
    if options is not None and not isinstance(options, CheckpointManagerOptions):
        raise BadStateError(f"options={type(options).__name__}: give a CheckpointManagerOptions "
                            "(from trainready.store import CheckpointManagerOptions)")
    if not fields:
        return options if options is not None else CheckpointManagerOptions()
    known = set(CheckpointManagerOptions.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise TypeError(f"CheckpointManager() got unexpected keyword argument(s) {', '.join(unknown)}; "
                        f"its options are {', '.join(sorted(known))}")
    if options is not None:
        raise BadStateError(f"give the options in `options` alone, not also as keywords ({', '.join(sorted(fields))})")
    warnings.warn(f"CheckpointManager({', '.join(f'{k}=' for k in fields)}...): pass "
                  "options=CheckpointManagerOptions(...) instead", DeprecationWarning, stacklevel=3)
    return CheckpointManagerOptions(**fields)
