"""CheckpointManager: save, restore, retention and replication for a training job.

Concurrency contract: one manager per process (every rank makes one, collectively, like a
process group); its methods are called from the training thread only. Saves run in one
background writer thread (at most one in flight), uploads in one replication thread per node.
Background errors are re-raised by the next save/wait/close, never swallowed."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from .dist import DistContext
from .errors import ArchiveUnavailableError, BadStateError, CheckpointError, FencedError
from .manifest import Lease, Manifest, checkpoint_name
from .replicator import Replicator
from .retention import archive_deletions, hot_deletions
from .snapshot import Stager, take_snapshot, write_hot
from .tiers import ArchiveTier, HotTier, Ref, redact

log = logging.getLogger("trainready.store")


@dataclass(frozen=True)
class RestoreResult:
    step: int
    name: str
    tier: str
    skipped: tuple[str, ...]   # newer checkpoints passed over, each with why


class CheckpointManager:
    """Tiered checkpoints: `hot` is a local directory (the node's NVMe), `archive` any fsspec URL
    (local/shared path, file://, s3://) or None.

    keep_hot / keep_archive: committed checkpoints to keep per tier (None: keep all).
    async_save: stage to host memory and write in the background.
    when_busy: a save while one is still being written either "wait"s for it or is "skip"ped.
    run_id: names the run owning this prefix (default: the one found there, else a new one);
      a different run_id for a prefix that holds another run is refused (FencedError).
    checksums: "auto" (for small files and files changed since commit), "always" or "never"
      (sizes are always checked) when restoring from the hot tier; downloads are always checked.
    """

    def __init__(self, hot: str | os.PathLike, archive: str | None = None, *, keep_hot: int = 2,
                 keep_archive: int | None = None, async_save: bool = True,
                 when_busy: Literal["wait", "skip"] = "wait", run_id: str | None = None,
                 save_interval_steps: int | None = None, checksums: Literal["auto", "always", "never"] = "auto",
                 metadata: dict[str, Any] | None = None, process_group: Any = None,
                 retry_initial_s: float = 0.5, retry_max_s: float = 30.0):
        if keep_hot < 1:
            raise BadStateError(f"keep_hot={keep_hot}: keep at least 1 checkpoint on the hot tier")
        if keep_archive is not None and keep_archive < 1:
            raise BadStateError(f"keep_archive={keep_archive}: use None to keep every archived checkpoint, or >= 1")
        if when_busy not in ("wait", "skip"):
            raise BadStateError(f"when_busy={when_busy!r}: valid values are 'wait', 'skip'")
        if checksums not in ("auto", "always", "never"):
            raise BadStateError(f"checksums={checksums!r}: valid values are 'auto', 'always', 'never'")
        self.keep_hot, self.keep_archive, self.async_save, self.when_busy = keep_hot, keep_archive, async_save, when_busy
        self.save_interval_steps, self.metadata = save_interval_steps, dict(metadata or {})
        self._checksums = {"auto": None, "always": True, "never": False}[checksums]
        self.ctx = DistContext.detect(process_group)
        self.hot = HotTier(hot)
        self.archive = ArchiveTier(archive) if archive else None
        self._errors: list[BaseException] = []
        self._inflight: Future | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainready-writer") if async_save else None
        self._stager = Stager() if async_save else None
        self._chores: ThreadPoolExecutor | None = None
        self._chore: Future | None = None
        self._saved: set[int] = set()
        self._preempt: dict[str, Any] | None = None
        self.last_commit: tuple[int, float] | None = None  # (step, seconds) of the newest hot commit
        self._closed = False
        self.run_id, self.generation = self._claim(run_id)
        self._replicator = None
        atexit.register(self._at_exit)
        if self.archive is not None and self.ctx.node_leader:
            self._replicator = Replicator(self.hot, self.archive, self.ctx.node, self.ctx.nodes, self.ctx.rank == 0,
                                          self._on_archived, self._check_archive_fence, retry_initial_s, retry_max_s)
            self._archived_at_start()

    # ---- ownership ---------------------------------------------------------------------------

    def _claim(self, run_id: str | None) -> tuple[str, int]:
        """Agree on the run id and take the next writer generation (fencing older writers)."""
        if self.ctx.node_leader:
            self.hot.ensure()
        found = None
        if self.ctx.rank == 0:
            try:
                found = self._claim_rank0(run_id)
            except CheckpointError as exc:
                found = exc
        found = self.ctx.broadcast(found)
        if isinstance(found, BaseException):
            raise found
        run, generation = found
        if self.ctx.node_leader:
            self.hot.write_lease(self._lease(run, generation))
            for stale in self.hot.stale_tmp():  # leftovers of a crashed save; no writer owns them now
                shutil.rmtree(stale, ignore_errors=True)
        self.ctx.barrier()
        return run, generation

    def _claim_rank0(self, run_id: str | None) -> tuple[str, int]:
        leases = [self.hot.read_lease()]
        refs = self.hot.list()
        if self.archive is not None:
            try:
                leases.append(self.archive.read_lease())
                refs += self.archive.list()
            except ArchiveUnavailableError as exc:
                log.warning("archive unreachable at start (%s); claiming from the hot tier only", exc)
        owners = {lease.run_id for lease in leases if lease} | {r.manifest.run_id for r in refs if r.manifest}
        if run_id is None:
            newest = max((lease for lease in leases if lease), key=lambda lease: lease.generation, default=None)
            run_id = newest.run_id if newest else (owners.pop() if len(owners) == 1 else uuid.uuid4().hex[:12])
        others = owners - {run_id}
        if others:
            raise FencedError(f"checkpoint prefix {self.hot.root}{' / ' + self.archive.url if self.archive else ''} "
                              f"holds run {sorted(others)[0]!r}, not {run_id!r}: pass run_id={sorted(others)[0]!r} to "
                              "resume it, or use another directory for a new run")
        generation = 1 + max([lease.generation for lease in leases if lease] + [r.generation for r in refs], default=0)
        lease = self._lease(run_id, generation)
        if self.archive is not None:
            try:
                self.archive.write_lease(lease)
            except ArchiveUnavailableError as exc:
                log.warning("could not write the archive lease (%s); will retry with the first upload", exc)
        return run_id, generation

    def _lease(self, run_id: str, generation: int) -> Lease:
        return Lease(run_id=run_id, generation=generation, host=socket.gethostname(), pid=os.getpid(),
                     started_unix=time.time())

    def _is_mine(self, lease: Lease) -> bool:
        # generation and process identity: a writer that claimed the same generation while the
        # archive was unreachable is still someone else
        return (lease.run_id, lease.generation, lease.host, lease.pid) == (
            self.run_id, self.generation, socket.gethostname(), os.getpid())

    def _check_hot_fence(self) -> None:
        lease = self.hot.read_lease()
        if lease and not self._is_mine(lease):
            raise FencedError(f"{self.hot.root} now belongs to run {lease.run_id!r} generation {lease.generation} "
                              f"(this writer: generation {self.generation}); this writer stops")

    def _check_archive_fence(self) -> None:
        lease = self.archive.read_lease() if self.archive else None
        if lease is None:
            self.archive.write_lease(self._lease(self.run_id, self.generation))
        elif not self._is_mine(lease):
            raise FencedError(f"archive {self.archive.url} now belongs to run {lease.run_id!r} generation "
                              f"{lease.generation} (this writer: generation {self.generation}); uploads stop")

    # ---- saving ------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """True on every `save_interval_steps`-th step, and once preemption is signalled (agreed by all ranks)."""
        if self._preempt is not None and self.ctx.any_true(self._preempt["signalled"]):
            self._preempt["signalled"] = True  # every rank now takes the preemption path together
            self._preempt["at"] = self._preempt["at"] or time.monotonic()
            return True
        return bool(self.save_interval_steps) and step % self.save_interval_steps == 0

    def save(self, step: int, state: dict[str, Any], *, metadata: dict[str, Any] | None = None) -> bool:
        """Checkpoint `state` as of `step`. Returns once the state is staged (async) or committed
        on the hot tier (sync); False when skipped (this step already saved, or busy with when_busy='skip')."""
        self._raise_background_errors()
        self._check_open()
        if not isinstance(step, int) or step < 0:
            raise BadStateError(f"step must be a non-negative int, got {step!r}")
        if step in self._saved:
            return False
        if self._inflight is not None and not self._inflight.done():
            if self.when_busy == "skip" and not self.preempted:
                return False
            self._await_inflight()
        self._raise_background_errors()
        snap = take_snapshot(step, state, {**self.metadata, **(metadata or {})}, self._stager)
        self._saved.add(step)
        if self._executor is None or self.preempted:
            try:
                self._commit(snap)
            except BaseException:
                self._saved.discard(step)  # not committed: saving this step again must work
                raise
        else:
            self._inflight = self._executor.submit(self._commit_in_background, snap)
        if self.preempted:
            self._finish_preemption()
        return True

    def _commit(self, snap: Any) -> Manifest:
        manifest = write_hot(snap, self.hot, self.ctx, self.run_id, self.generation, self._check_hot_fence)
        self.last_commit = (snap.step, manifest.save_seconds)  # what a final synchronous save would cost
        name = checkpoint_name(snap.step, self.generation)
        if self._replicator is not None:
            self._replicator.submit(name, manifest)  # it applies retention once the upload is done
        elif self.ctx.node_leader:
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

    def _raise_background_errors(self) -> None:
        if self._replicator is not None and self._replicator.status.fatal is not None:
            self._errors.append(self._replicator.status.fatal)
            self._replicator.status.fatal = None
        if self._errors:
            exc = self._errors.pop(0)
            self._errors.clear()
            if isinstance(exc, CheckpointError):
                raise exc
            raise CheckpointError(f"background save failed: {type(exc).__name__}: {redact(str(exc))}") from exc

    # ---- retention ---------------------------------------------------------------------------

    def _archived_at_start(self) -> None:
        """Learn what the archive has; queue the newest hot checkpoint it lacks (catch-up after a crash)."""
        try:
            archived = {r.name for r in self.archive.list() if r.committed}
        except ArchiveUnavailableError:
            archived = set()
        self._replicator.status.mark_archived(*archived)
        hot = [r for r in self.hot.list() if r.committed and r.manifest.run_id == self.run_id]
        newest = max(hot, key=lambda r: r.order, default=None)
        if newest is not None and newest.name not in archived:
            self._replicator.submit(newest.name, newest.manifest)

    def _on_archived(self, name: str) -> None:
        self._apply_hot_retention()
        if self.ctx.rank == 0 and self.archive is not None:
            self._check_archive_fence()
            for doomed in archive_deletions(self._own(self.archive.list()), self.keep_archive):
                self.archive.delete(doomed)

    def _apply_hot_retention(self) -> None:
        archived = self._replicator.status.archived if self._replicator else set()
        self._check_hot_fence()
        for doomed in hot_deletions(self._own(self.hot.list()), archived, self.keep_hot, self.archive is not None):
            self.hot.delete(doomed)

    def _own(self, refs: list[Ref]) -> list[Ref]:
        return [r for r in refs if r.manifest is None or r.manifest.run_id == self.run_id]

    # ---- restoring ---------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """Newest committed step on this node's hot tier or the archive (no verification)."""
        refs = self._own(self.hot.list())
        if self.archive is not None:
            try:
                refs += self._own(self.archive.list())
            except ArchiveUnavailableError:
                pass
        steps = [r.step for r in refs if r.committed]
        return max(steps) if steps else None

    def restore(self, state: dict[str, Any], *, step: int | None = None) -> int | None:
        """Load the newest checkpoint that verifies (or exactly `step`); returns its step, or None
        when there is none. Every rank returns the same step."""
        result = self.restore_details(state, step=step)
        return result.step if result else None

    def restore_details(self, state: dict[str, Any], *, step: int | None = None) -> RestoreResult | None:
        from .restore import restore_newest

        self._check_open()
        self.wait_for_saves()
        result = restore_newest(self, state, step)
        if result is not None:
            self._saved.add(result.step)
        return result

    # ---- lifecycle ---------------------------------------------------------------------------

    def wait_for_saves(self) -> None:
        self._await_inflight()
        self._raise_background_errors()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the in-flight save is committed and uploads are done (or `timeout_s` passes:
        ArchiveUnavailableError, training state stays safe on the hot tier)."""
        self.wait_for_saves()
        error: CheckpointError | None = None
        if self._replicator is not None and not self._replicator.wait(timeout_s):
            status = self._replicator.status
            error = ArchiveUnavailableError(f"upload of {status.pending} to {self.archive.url} not finished after "
                                            f"{timeout_s:.0f}s ({status.attempts} failed attempts; last: "
                                            f"{status.last_error or 'none'}); it is safe on the hot tier {self.hot.root}")
        if error is None:
            try:
                self._raise_background_errors()
            except CheckpointError as exc:
                error = exc
        self.ctx.barrier()  # on every rank, even where this node's upload failed: the barriers must pair up
        if error is not None:
            raise error

    def status(self) -> dict[str, Any]:
        rep = self._replicator.status if self._replicator else None
        saving = bool(self._inflight and not self._inflight.done())
        return {"run_id": self.run_id, "generation": self.generation, "saving": saving,
                "uploading": rep.pending if rep else None, "upload_failures": rep.attempts if rep else 0,
                "last_upload_error": rep.last_error if rep else "", "archived_step": rep.newest_step if rep else None}

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
            self.ctx.release()  # our gloo group, so no pending work outlives the interpreter

    def _at_exit(self) -> None:
        """Never exit silently with a save unwritten or an error unreported (close() was not called)."""
        if self._closed:
            return
        try:
            self.wait_for_saves()
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

    def install_preemption_handler(self, deadline_s: float = 100.0, exit_code: int | None = 143,
                                   signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        """On SIGTERM (spot gives ~2 minutes) make `should_save` true; the next `save` is synchronous,
        then waits for its upload until `deadline_s` after the signal, closes, and exits with
        `exit_code` (None: return and let the loop stop on `preempted`)."""
        self._preempt = {"signalled": False, "at": None, "deadline_s": deadline_s, "exit_code": exit_code}

        def handler(signum: int, _frame: Any) -> None:
            self._preempt["signalled"] = True
            self._preempt["at"] = time.monotonic()
            log.warning("signal %d: checkpointing at the next step, then stopping", signum)

        for sig in signals:
            signal.signal(sig, handler)

    @property
    def preempted(self) -> bool:
        return bool(self._preempt and self._preempt["signalled"])

    def _finish_preemption(self) -> None:
        started = self._preempt["at"] or time.monotonic()
        remaining = max(1.0, self._preempt["deadline_s"] - (time.monotonic() - started))
        try:
            self.close(timeout_s=remaining)
        except ArchiveUnavailableError as exc:
            log.error("preemption: %s", exc)
        if self._preempt["exit_code"] is not None:
            sys.exit(self._preempt["exit_code"])

