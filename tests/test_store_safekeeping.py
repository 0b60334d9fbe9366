"""Never lose the last good copy, never fill the disk, never die of a damaged small file:
retention during an archive outage, unreadable manifests, damaged leases, durable leases,
`ckpt prune` under the same rule as the manager, and private permissions."""

from __future__ import annotations

import logging
import os
import stat
import time

import pytest
import torch

from trainready.store import CheckpointManager, CheckpointManagerOptions, PreemptedError
from trainready.store.inspect import list_checkpoints, prune, verify_checkpoints
from trainready.store.manifest import LEASE, MANIFEST, checkpoint_name


def _state(v: float) -> dict:
    return {"model": {"w": torch.full((64,), v)}}


def _hot_names(path):
    return sorted(p.name for p in path.iterdir() if p.name.startswith("step-"))


def test_an_archive_outage_keeps_the_newest_archived_and_keep_hot_and_says_what_it_dropped(tmp_path, s3_bucket, moto,
                                                                                           monkeypatch, caplog):
    """Before: every unarchived checkpoint stayed until a newer one reached the archive, so a
    long outage filled the NVMe and training died of StorageFullError."""
    from s3server import TcpProxy

    proxy = TcpProxy(moto.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    try:
        with caplog.at_level(logging.WARNING, "trainready.store"):
            mgr = CheckpointManager(tmp_path / "hot", f"s3://{s3_bucket}/run",
                                    options=CheckpointManagerOptions(keep_hot=2, retry_initial_s=0.05, retry_max_s=0.2))
            mgr.save(1, _state(1))
            mgr.wait(timeout_s=30)
            proxy.down()
            for step in range(2, 9):
                mgr.save(step, _state(step))
                mgr.wait_for_saves()
            deadline = time.monotonic() + 20
            while len(_hot_names(tmp_path / "hot")) > 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            kept = _hot_names(tmp_path / "hot")
            # the newest archived (1), the one being uploaded, and the newest keep_hot=2 (7, 8)
            assert checkpoint_name(1, 1) in kept and {checkpoint_name(7, 1), checkpoint_name(8, 1)} <= set(kept)
            assert len(kept) <= 4
            dropped = list(mgr.status().dropped_unarchived)
            assert dropped and set(dropped).isdisjoint(kept) and checkpoint_name(3, 1) in dropped
            assert "before it reached the archive" in caplog.text
            proxy.up()
            mgr.wait(timeout_s=60)
            mgr.close()
    finally:
        proxy.close()


def _corrupt_manifest(path, data: bytes) -> None:
    (path / MANIFEST).write_bytes(data)


@pytest.mark.parametrize("damage", [b"{not json", b'{"schema_version": 99}', None])
def test_unreadable_manifests_are_kept_reported_and_never_deleted(tmp_path, damage):
    """Before: retention and `ckpt prune` deleted them as uncommitted debris."""
    hot = tmp_path / "hot"
    with CheckpointManager(hot, options=CheckpointManagerOptions(keep_hot=1, async_save=False)) as mgr:
        mgr.save(1, _state(1))
    victim = hot / checkpoint_name(1, 1)
    if damage is None:  # a manifest that names another step than its directory
        text = (victim / MANIFEST).read_text().replace('"step": 1', '"step": 7')
        _corrupt_manifest(victim, text.encode())
    else:
        _corrupt_manifest(victim, damage)
    with CheckpointManager(hot, options=CheckpointManagerOptions(keep_hot=1, async_save=False)) as mgr:
        for step in (2, 3, 4):
            mgr.save(step, _state(step))
        mgr.wait()
        time.sleep(0.2)  # retention runs off the save's path
    assert victim.exists(), "retention deleted a checkpoint whose manifest it could not read"
    assert prune(str(hot), keep=1).deleted == [] and victim.exists()
    listing = {c.name: c for c in list_checkpoints(str(hot)).checkpoints}
    assert listing[victim.name].status == "unreadable" and listing[victim.name].problem
    report = verify_checkpoints(str(hot))
    assert not report.ok and [c.name for c in report.checkpoints if not c.ok] == [victim.name]


@pytest.mark.parametrize("garbage", [b"", b"{\"run_id\": ", b"\x00\xff" * 20, b'{"run_id": "", "generation": 0}'])
def test_a_damaged_lease_is_rebuilt_from_the_newest_manifests_with_a_warning(tmp_path, garbage, caplog):
    """Before: every later run of the job ended in a pydantic traceback until someone deleted it."""
    hot, archive = tmp_path / "hot", tmp_path / "archive"
    with CheckpointManager(hot, str(archive), options=CheckpointManagerOptions(async_save=False), run_id="job-7") as mgr:
        mgr.save(3, _state(3))
    (hot / LEASE).write_bytes(garbage)
    (archive / LEASE).write_bytes(garbage)
    with caplog.at_level(logging.WARNING, "trainready.store"):
        with CheckpointManager(hot, str(archive), options=CheckpointManagerOptions(async_save=False)) as mgr:
            assert (mgr.run_id, mgr.generation) == ("job-7", 2)
            loaded = _state(0)
            assert mgr.restore(loaded) == 3 and float(loaded["model"]["w"][0]) == 3.0
            mgr.save(4, _state(4))
    assert "damaged" in caplog.text and "rebuilding" in caplog.text


def test_leases_are_written_durably(tmp_path, monkeypatch):
    """Before: writer.json was replaced without an fsync of the file's directory (and, on the
    archive's local path, of the file itself before the rename)."""
    synced = []
    real_fsync = os.fsync

    def record(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    CheckpointManager(tmp_path / "hot", str(tmp_path / "archive"), options=CheckpointManagerOptions(async_save=False)).close()
    for root in (tmp_path / "hot", tmp_path / "archive"):
        assert str(root) in synced, f"{root} (holding writer.json) was never fsynced"
        assert any(p.startswith(str(root / f".{LEASE}.")) for p in synced), "the new lease was not fsynced"


def test_prune_follows_the_managers_rule_own_run_only(tmp_path):
    """Before: prune deleted by its own rule, across runs. Now: the run the lease names (or
    --run-id), with the manager's retention rule."""
    hot = tmp_path / "hot"
    with CheckpointManager(tmp_path / "elsewhere", options=CheckpointManagerOptions(async_save=False), run_id="other") as mgr:
        mgr.save(1, _state(1))
    with CheckpointManager(hot, options=CheckpointManagerOptions(keep_hot=5, async_save=False), run_id="mine") as mgr:
        for step in (5, 6):
            mgr.save(step, _state(step))
    os.rename(tmp_path / "elsewhere" / checkpoint_name(1, 1), hot / checkpoint_name(1, 1))  # another run's, planted
    result = prune(str(hot), keep=1)
    assert result.run_id == "mine" and result.deleted == [checkpoint_name(5, 1)]
    assert checkpoint_name(1, 1) in result.untouched and (hot / checkpoint_name(1, 1)).exists()
    assert prune(str(hot), keep=1, run_id="other").deleted == []


def test_checkpoints_are_private_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINREADY_FILE_MODE", raising=False)
    with CheckpointManager(tmp_path / "hot", str(tmp_path / "archive"),
                           options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, _state(1))
    for root in (tmp_path / "hot", tmp_path / "archive"):
        ckpt = root / checkpoint_name(1, 1)
        assert stat.S_IMODE(os.stat(ckpt).st_mode) == 0o700, ckpt
        for path in [*ckpt.iterdir(), root / LEASE]:
            assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path


def test_group_readable_when_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINREADY_FILE_MODE", "group")
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, _state(1))
    ckpt = tmp_path / "hot" / checkpoint_name(1, 1)
    assert stat.S_IMODE(os.stat(ckpt).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(ckpt / MANIFEST).st_mode) == 0o640


# ---- found by attacking the change ----

def test_a_fenced_writer_never_takes_the_prefix_back_when_the_lease_goes_missing(tmp_path):
    hot = tmp_path / "hot"
    zombie = CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False, keep_hot=5))
    zombie.save(1, _state(1))
    live = CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False, keep_hot=5))
    live.save(3, _state(3))
    for damage in ("remove", "corrupt"):
        if damage == "remove":
            (hot / LEASE).unlink()
        else:
            (hot / LEASE).write_text("{")
        with pytest.raises(Exception, match="generation 2"):
            zombie.save(4 if damage == "remove" else 6, _state(4))
        live.save(5 if damage == "remove" else 7, _state(5))  # the newer writer goes on, and takes its lease back
    live.close()
    assert not (hot / checkpoint_name(4, 1)).exists()
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(_state(0)) == 7


def _archive_down_once(monkeypatch):
    from trainready.store.errors import ArchiveUnavailableError
    from trainready.store.tiers import ArchiveTier

    real = ArchiveTier.read_lease
    calls = []

    def flaky(self):
        calls.append(1)
        if len(calls) == 1:
            raise ArchiveUnavailableError("archive: simulated outage at start")
        return real(self)

    monkeypatch.setattr(ArchiveTier, "read_lease", flaky)
    return calls


def test_a_fresh_node_waits_for_an_unreachable_archive_instead_of_starting_from_scratch(tmp_path, monkeypatch):
    archive = str(tmp_path / "archive")
    with CheckpointManager(tmp_path / "first-node", archive, options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, _state(1))
    _archive_down_once(monkeypatch)
    with CheckpointManager(tmp_path / "new-node", archive,
                           options=CheckpointManagerOptions(async_save=False, retry_initial_s=0.05)) as mgr:
        assert mgr.generation == 2 and mgr.restore(_state(0)) == 1  # it waited, then saw the run


def test_a_fresh_node_refuses_when_the_archive_stays_unreachable(tmp_path, monkeypatch):
    from trainready.store.errors import ArchiveUnavailableError
    from trainready.store.tiers import ArchiveTier

    def down(self):
        raise ArchiveUnavailableError("archive: down")

    monkeypatch.setattr(ArchiveTier, "read_lease", down)
    with pytest.raises(ArchiveUnavailableError, match="holds nothing of the run"):
        CheckpointManager(tmp_path / "new-node", str(tmp_path / "archive"),
                          options=CheckpointManagerOptions(claim_wait_s=0.3, retry_initial_s=0.05))


def test_a_node_that_knows_the_run_starts_during_an_outage_and_catches_up(tmp_path, monkeypatch):
    """It claimed from its hot tier; the archive's lease (of the dead writer before it) must not
    then fence its uploads forever."""
    archive = str(tmp_path / "archive")
    with CheckpointManager(tmp_path / "hot", archive, options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, _state(1))
    _archive_down_once(monkeypatch)
    with CheckpointManager(tmp_path / "hot", archive, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.generation == 2 and mgr.lease.fenced is None  # nothing known of the archive: nothing fenced
        assert mgr.restore(_state(0)) == 1
        mgr.save(2, _state(2))
        mgr.wait(timeout_s=30)
    names = {c.name for c in list_checkpoints(archive).checkpoints if c.status == "committed"}
    assert checkpoint_name(2, 2) in names


def test_one_unreadable_archive_entry_does_not_hide_the_others(tmp_path):
    archive = tmp_path / "archive"
    with CheckpointManager(tmp_path / "hot", str(archive), options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, _state(1))
    (archive / checkpoint_name(2, 1)).mkdir()
    (archive / checkpoint_name(2, 1) / MANIFEST).mkdir()
    statuses = {c.name: c.status for c in list_checkpoints(f"file://{archive}").checkpoints}
    assert statuses == {checkpoint_name(1, 1): "committed", checkpoint_name(2, 1): "unreadable"}
    with CheckpointManager(tmp_path / "fresh", f"file://{archive}",
                           options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(_state(0)) == 1


def test_preempted_is_what_the_ranks_agreed_not_what_one_rank_saw(tmp_path):
    """A signal that lands after save()'s agreement made `preempted` true on that rank alone: it
    left the loop and the other rank waited in the next collective forever."""
    import signal

    from trainready.dist import STOP

    try:
        with CheckpointManager(tmp_path / "hot",
                               options=CheckpointManagerOptions(async_save=False, save_interval_steps=100)) as mgr:
            mgr.install_preemption_handler()
            STOP.request(signal.SIGTERM)  # as the handler does when the signal arrives
            assert not mgr.preempted      # seen here, not yet agreed
            assert mgr.should_save(1)     # the agreement
            assert mgr.preempted
            assert not mgr.reached_preemption(1)  # agreed, not yet saved: the loop must not leave now
    finally:
        STOP.reset()


def test_the_preemption_save_returns_and_the_caller_decides_how_to_exit(tmp_path):
    """save() never exits the process (issue 25): after the stop's synchronous save it returns, the manager is
    closed and reached_preemption is true; a loop that goes on saves nothing more, and its next save raises
    PreemptedError (a quiet return would let a final save 'succeed' and the process exit 0 on an older step)."""
    import signal

    from trainready.dist import STOP

    try:
        mgr = CheckpointManager(tmp_path / "hot",
                                options=CheckpointManagerOptions(async_save=True, save_interval_steps=100))
        mgr.install_preemption_handler(deadline_s=5)
        STOP.request(signal.SIGTERM)
        assert mgr.should_save(7)
        assert mgr.save(7, {"model": {"w": torch.ones(3)}}) is True  # returned: no SystemExit
        assert mgr.reached_preemption(7) and mgr.preempted
        assert [c.name for c in list_checkpoints(str(tmp_path / "hot")).checkpoints if c.status == "committed"] == [
            checkpoint_name(7, mgr.generation)]
        assert not mgr.should_save(8)
        with pytest.raises(PreemptedError, match="stopped for preemption after step 7.*reached_preemption"):
            mgr.save(8, {"model": {"w": torch.ones(3)}})
        assert mgr.PREEMPTION_EXIT_CODE == 143
        old_style = CheckpointManager(tmp_path / "hot2", options=CheckpointManagerOptions(async_save=False))
        with pytest.warns(DeprecationWarning, match="no longer exits"):
            old_style.install_preemption_handler(exit_code=137)
        assert old_style.PREEMPTION_EXIT_CODE == 137
        old_style.close()
    finally:
        STOP.reset()


def test_status_is_a_typed_snapshot(tmp_path):
    """status() returns a frozen ManagerStatus (issue 25), with as_dict() for JSON."""
    import dataclasses

    from trainready.store import ManagerStatus

    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, {"model": {"w": torch.ones(2)}})
        st = mgr.status()
        assert isinstance(st, ManagerStatus) and st.saving is False and st.archived_step is None
        assert st.run_id == mgr.run_id and st.dropped_unarchived == () and st.unarchivable == ()
        with pytest.raises(dataclasses.FrozenInstanceError):
            st.saving = True
        assert st.as_dict()["dropped_unarchived"] == [] and set(st.as_dict()) == {
            f.name for f in dataclasses.fields(ManagerStatus)}
