"""Background replication of committed hot checkpoints to the archive.

One thread per node (on its first local rank). It uploads the newest committed checkpoint not
yet archived (older pending ones are superseded), retrying with exponential backoff while the
archive is unreachable; training never waits for it except in `wait`/`close`. On several nodes
each node uploads its own files and a part marker; rank 0 writes the manifest once every part
is there. The manifest is always the last object written, create-only.

Nothing here stops training except a FencedError (a newer writer owns the archive). An archive
that is down, or an object that does not match what was sent, is retried with backoff; a
checkpoint whose hot copy changed or vanished (retention dropped it) is given up on, reported in
the status, and the next one is uploaded."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from trainready.io import redact

from .errors import ArchiveUnavailableError, FencedError
from .faults import fault_point
from .manifest import MANIFEST, PARTS_DIR, Manifest, parse_name
from .tiers import ArchiveTier, HotTier, LocalCopyChangedError

log = logging.getLogger("trainready.store")


@dataclass
class ReplicationStatus:
    archived: set[str] = field(default_factory=set)
    newest_step: int | None = None  # of `archived`, kept as names are added: read every training step
    pending: str | None = None
    attempts: int = 0
    last_error: str = ""
    fatal: BaseException | None = None
    unarchivable: list[str] = field(default_factory=list)  # given up on (hot copy changed), newest last
    checked: str = ""  # how the last upload was proven: "sha256" (object checksums) or "size"

    def mark_archived(self, *names: str) -> None:
        self.archived.update(names)
        steps = [parsed[0] for name in names if (parsed := parse_name(name))]
        if steps:
            self.newest_step = max(steps if self.newest_step is None else [self.newest_step, *steps])


class _Superseded(Exception):
    """A newer checkpoint is queued: stop waiting on this one (other nodes may have skipped it)."""


class Replicator:
    def __init__(self, hot: HotTier, archive: ArchiveTier, node: int, nodes: int, is_rank0: bool,
                 on_archived: Callable[[str], None], check_fence: Callable[[], None],
                 retry_initial_s: float = 0.5, retry_max_s: float = 30.0, part_wait_s: float = 600.0):
        self.hot, self.archive, self.node, self.nodes, self.is_rank0 = hot, archive, node, nodes, is_rank0
        self.on_archived, self.check_fence = on_archived, check_fence
        self.retry_initial_s, self.retry_max_s, self.part_wait_s = retry_initial_s, retry_max_s, part_wait_s
        self.status = ReplicationStatus()
        self.local_error_attempts = 3
        self.upload_streams = 4
        self._queue: list[tuple[str, Manifest]] = []
        self._cv = threading.Condition()
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="trainready-replicator", daemon=True)
        self._thread.start()

    def submit(self, name: str, manifest: Manifest) -> None:
        with self._cv:
            self._queue.append((name, manifest))
            self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._queue and not self._busy

    def wait(self, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while (self._queue or self._busy) and self.status.fatal is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cv.wait(timeout=remaining if remaining is not None else 1.0)
        return True

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                # newest first: an older pending checkpoint is superseded by a newer one
                self._queue.sort(key=lambda item: (item[1].step, item[1].generation))
                name, manifest = self._queue[-1]
                self._queue.clear()
                self._busy = True
                self.status.pending = name
            self._replicate_with_retries(name, manifest)
            with self._cv:
                self._busy = False
                self.status.pending = None
                self._cv.notify_all()

    def _replicate_with_retries(self, name: str, manifest: Manifest) -> None:
        delay = self.retry_initial_s
        while not self._stop:
            try:
                self._replicate(name, manifest)
            except FencedError as exc:
                self.status.fatal = exc
                return
            except _Superseded:
                return
            except Exception as exc:  # archive down, network, a mismatching object: retry; never kill training
                self.status.attempts += 1
                self.status.last_error = redact(f"{type(exc).__name__}: {exc}")
                if not (self.hot.path(name) / MANIFEST).exists():
                    log.warning("upload of %s stopped: its hot copy is gone (dropped by retention)", name)
                    return
                # a local problem (the hot copy changed, or keeps failing) will not heal by waiting
                if isinstance(exc, LocalCopyChangedError) or (not isinstance(exc, ArchiveUnavailableError)
                                                              and self.status.attempts >= self.local_error_attempts):
                    self.status.unarchivable.append(name)
                    log.error("giving up on archiving %s to %s after %d attempts: %s; the next checkpoint will be "
                              "uploaded", name, self.archive.url, self.status.attempts, self.status.last_error)
                    return
                log.warning("upload of %s to %s failed (attempt %d, retry in %.1fs): %s", name, self.archive.url,
                            self.status.attempts, delay, self.status.last_error)
                with self._cv:
                    if self._newer_queued(manifest):
                        return  # superseded while failing: go straight to the newer one
                    self._cv.wait(timeout=delay)
                delay = min(delay * 2, self.retry_max_s)
                continue
            self.status.mark_archived(name)
            self.status.attempts, self.status.last_error = 0, ""
            self._after_archived(name)
            return

    def _after_archived(self, name: str) -> None:
        """Retention once a checkpoint is archived; its failure is reported, not retried (the upload is done)."""
        try:
            self.on_archived(name)
        except FencedError as exc:
            self.status.fatal = exc
        except Exception as exc:
            self.status.last_error = redact(f"retention after archiving {name}: {type(exc).__name__}: {exc}")
            log.error("%s", self.status.last_error)

    def _newer_queued(self, manifest: Manifest) -> bool:
        return any((m.step, m.generation) > (manifest.step, manifest.generation) for _, m in self._queue)

    def _replicate(self, name: str, manifest: Manifest) -> None:
        ours = {e.path: e for e in manifest.node_files.get(self.node, [])}
        uploads = [e for e in manifest.files if ours.get(e.path) == e]
        if self.archive.exists(name, MANIFEST):
            return  # already committed there (e.g. by an earlier run)
        # a retried or resumed upload skips only objects proven identical by content, never by size
        missing = [e for e in uploads if not self.archive.holds(self.hot.path(name) / e.path, name, e)]
        if missing:  # the largest first, a few at a time: one stream rarely fills the link
            missing.sort(key=lambda e: -e.size)
            with ThreadPoolExecutor(max_workers=self.upload_streams, thread_name_prefix="trainready-upload") as pool:
                done = [pool.submit(self.archive.upload, self.hot.path(name) / e.path, name, e) for e in missing]
                for n, future in enumerate(as_completed(done)):
                    self.status.checked = future.result()
                    if n == 0:
                        fault_point("archive.file_uploaded")
        if self.nodes > 1:
            part = f"{PARTS_DIR}/node-{self.node:05d}.json"
            self.archive.put_bytes(name, part, ("[" + ",".join(e.model_dump_json() for e in uploads) + "]").encode())
            if not self.is_rank0:
                self._wait_for(lambda: self.archive.exists(name, MANIFEST), f"the manifest of {name}", manifest)
                return
            self._wait_for(lambda: len(self.archive.parts(name)) >= self.nodes, f"all {self.nodes} nodes' parts of {name}",
                           manifest)
        problems = self.archive.verify(name, manifest.files, checksums=False)
        if problems:
            raise ArchiveUnavailableError(f"archive copy of {name} incomplete: {'; '.join(problems[:3])}")
        fault_point("archive.data_uploaded")
        self.check_fence()
        self.archive.commit(name, manifest)
        fault_point("archive.committed")

    def _wait_for(self, done: Callable[[], bool], what: str, manifest: Manifest) -> None:
        deadline = time.monotonic() + self.part_wait_s
        while not done():
            with self._cv:
                if self._newer_queued(manifest) or self._stop:
                    raise _Superseded(what)
            if time.monotonic() > deadline:
                raise ArchiveUnavailableError(f"gave up waiting {self.part_wait_s:.0f}s for {what}")
            time.sleep(0.2)
