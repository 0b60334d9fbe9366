"""CheckpointManager in one process: commit, restore, async semantics, exact resume,
corruption fallback, a wiped hot tier, a full disk, fencing, retention."""

import json
import logging
import os

import ckpt_worker as job
import pytest
import torch

from trainready.store import CheckpointManager, CheckpointManagerOptions, Position, training_state
from trainready.store.errors import BadStateError, CheckpointError, FencedError, StorageFullError
from trainready.store.manifest import MANIFEST, checkpoint_name


def _state():
    model, optimizer, scheduler = job.build()
    position = Position()
    return model, optimizer, scheduler, position, training_state(model, optimizer, scheduler, position=position)


def _train(steps, mgr=None, state_tuple=None, start=0):
    model, optimizer, scheduler, position, state = state_tuple or _state()
    data = job.dataset()
    if start == 0:
        torch.manual_seed(99)
    for step in range(start + 1, steps + 1):
        job.train_step(model, optimizer, scheduler, position, data, 1)
        if mgr is not None:
            mgr.save(step, state)
    return model, optimizer, scheduler, position, state


def _names(path):
    return sorted(p for p in os.listdir(path) if p.startswith("step-"))


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path, async_save):
    reference = job.digest(*_train(10)[:2])
    with CheckpointManager(tmp_path / "hot", tmp_path / "archive",
                           options=CheckpointManagerOptions(async_save=async_save)) as mgr:
        _train(6, mgr)
    fresh = _state()
    with CheckpointManager(tmp_path / "hot", tmp_path / "archive",
                           options=CheckpointManagerOptions(async_save=async_save)) as mgr:
        assert mgr.restore(fresh[4]) == 6
        assert fresh[3].index == 6 * job.BATCH and fresh[2].last_epoch == 6
        _train(10, mgr, fresh, start=6)
    assert job.digest(fresh[0], fresh[1]) == reference


def test_async_save_holds_the_values_at_the_call(tmp_path):
    weights = {"w": torch.zeros(1000)}
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=True)) as mgr:
        mgr.save(1, {"model": weights})
        weights["w"].add_(1.0)  # the next optimizer step, at once
        mgr.wait()
        loaded = {"model": {"w": torch.empty(1000)}}
        assert mgr.restore(loaded) == 1
    assert torch.equal(loaded["model"]["w"], torch.zeros(1000))


def test_restore_on_empty_tiers_returns_none_and_resave_is_harmless(tmp_path):
    with CheckpointManager(tmp_path / "hot") as mgr:
        assert mgr.restore({"model": {"w": torch.zeros(2)}}) is None
        assert mgr.save(3, {"model": {"w": torch.ones(2)}}) is True
        assert mgr.save(3, {"model": {"w": torch.full((2,), 7.0)}}) is False  # step 3 is committed: kept
        mgr.wait()
        loaded = {"model": {"w": torch.zeros(2)}}
        assert mgr.restore(loaded) == 3 and torch.equal(loaded["model"]["w"], torch.ones(2))


@pytest.mark.parametrize("damage", ["bitflip", "truncate", "delete", "manifest"])
def test_corrupt_newest_falls_back_to_previous_with_a_warning(tmp_path, damage, caplog):
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(keep_hot=3, async_save=False)) as mgr:
        _train(3, mgr)
    newest = tmp_path / "hot" / checkpoint_name(3, 1)
    data = newest / "__0_0.distcp"
    if damage == "bitflip":
        with open(data, "r+b") as handle:
            handle.seek(os.path.getsize(data) // 2)
            byte = handle.read(1)
            handle.seek(-1, 1)
            handle.write(bytes([byte[0] ^ 0x10]))
    elif damage == "truncate":
        os.truncate(data, os.path.getsize(data) - 100)
    elif damage == "delete":
        os.remove(data)
    else:
        (newest / MANIFEST).write_text("{not json")
    fresh = _state()
    with caplog.at_level(logging.WARNING, "trainready.store"), CheckpointManager(tmp_path / "hot") as mgr:
        step = mgr.restore(fresh[4])
    assert step == 2
    assert job.digest(fresh[0], fresh[1]) == job.digest(*_train(2)[:2])
    if damage != "manifest":  # an unreadable manifest is simply not a committed checkpoint
        assert "__0_0.distcp" in caplog.text and checkpoint_name(3, 1) in caplog.text


def test_every_checkpoint_broken_is_an_error_not_a_fresh_start(tmp_path):
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, {"model": {"w": torch.ones(4)}})
    os.truncate(tmp_path / "hot" / checkpoint_name(1, 1) / "__0_0.distcp", 10)
    with CheckpointManager(tmp_path / "hot") as mgr, pytest.raises(CheckpointError, match="none restorable"):
        mgr.restore({"model": {"w": torch.zeros(4)}})


def test_wiped_hot_tier_restores_from_the_archive(tmp_path):
    with CheckpointManager(tmp_path / "hot", tmp_path / "archive") as mgr:
        _train(4, mgr)
    import shutil

    shutil.rmtree(tmp_path / "hot")  # a new node
    fresh = _state()
    with CheckpointManager(tmp_path / "hot", tmp_path / "archive") as mgr:
        result = mgr.restore_details(fresh[4])
    assert (result.step, result.tier) == (4, "archive")
    assert job.digest(fresh[0], fresh[1]) == job.digest(*_train(4)[:2])
    assert (tmp_path / "hot" / checkpoint_name(4, 1) / MANIFEST).exists()  # downloaded, then committed


def test_disk_full_is_a_clear_error_and_keeps_committed_checkpoints(tmp_path, monkeypatch):
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(1, {"model": {"w": torch.ones(4)}})
        monkeypatch.setenv("TRAINREADY_FAULT", "hot.data_written:enospc")
        with pytest.raises(StorageFullError, match="no space left.*committed checkpoints are intact"):
            mgr.save(2, {"model": {"w": torch.full((4,), 2.0)}})
    monkeypatch.delenv("TRAINREADY_FAULT")
    loaded = {"model": {"w": torch.zeros(4)}}
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(loaded) == 1
        assert torch.equal(loaded["model"]["w"], torch.ones(4))
        assert mgr.save(2, {"model": {"w": torch.full((4,), 2.0)}}) is True  # space freed: saving works again
        assert mgr.restore(loaded) == 2
    assert not [p for p in os.listdir(tmp_path / "hot") if p.startswith(".tmp-")]  # cleaned at start


def test_background_errors_surface_on_the_next_call(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=True))
    monkeypatch.setenv("TRAINREADY_FAULT", "hot.data_written:eio")
    mgr.save(1, {"model": {"w": torch.ones(4)}})
    with pytest.raises(CheckpointError, match="I/O error"):
        mgr.save(2, {"model": {"w": torch.ones(4)}})
    mgr.close()


def test_a_newer_writer_fences_the_older_one(tmp_path):
    old = CheckpointManager(tmp_path / "hot", tmp_path / "archive",
                            options=CheckpointManagerOptions(async_save=False))
    old.save(1, {"model": {"w": torch.ones(2)}})
    old.wait()
    new = CheckpointManager(tmp_path / "hot", tmp_path / "archive",
                            options=CheckpointManagerOptions(async_save=False))
    assert (new.run_id, new.generation) == (old.run_id, old.generation + 1)
    with pytest.raises(FencedError, match="generation 2"):
        old.save(2, {"model": {"w": torch.ones(2)}})
    assert not (tmp_path / "hot" / checkpoint_name(2, 1)).exists()
    new.save(2, {"model": {"w": torch.ones(2)}})
    new.close()
    old._closed = True  # an orphan: its resources are gone with it


def test_another_run_cannot_take_over_a_prefix(tmp_path):
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False), run_id="run-a") as mgr:
        mgr.save(1, {"model": {"w": torch.ones(2)}})
    with pytest.raises(FencedError, match="holds run 'run-a'"):
        CheckpointManager(tmp_path / "hot", run_id="run-b")
    assert (tmp_path / "hot" / checkpoint_name(1, 1) / MANIFEST).exists()


def test_retention_keeps_the_newest_per_tier(tmp_path):
    with CheckpointManager(tmp_path / "hot", tmp_path / "archive",
                           options=CheckpointManagerOptions(keep_hot=2, keep_archive=3, async_save=False)) as mgr:
        for step in range(1, 7):
            mgr.save(step, {"model": {"w": torch.full((2,), float(step))}})
            mgr.wait()
    assert _names(tmp_path / "hot") == [checkpoint_name(s, 1) for s in (5, 6)]
    assert _names(tmp_path / "archive") == [checkpoint_name(s, 1) for s in (4, 5, 6)]


def test_restore_a_given_step_and_clear_errors_for_bad_input(tmp_path):
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False, keep_hot=5)) as mgr:
        for step in (1, 2):
            mgr.save(step, {"model": {"w": torch.full((2,), float(step))}})
        loaded = {"model": {"w": torch.zeros(2)}}
        assert mgr.restore(loaded, step=1) == 1 and loaded["model"]["w"][0] == 1.0
        with pytest.raises(CheckpointError, match="no committed checkpoint at step 9"):
            mgr.restore(loaded, step=9)
        with pytest.raises(BadStateError, match="model/fn"):
            mgr.save(3, {"model": {"fn": print}})
        with pytest.raises(BadStateError, match="non-negative"):
            mgr.save(-1, loaded)
    with pytest.raises(BadStateError, match="keep_hot=0"):
        CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(keep_hot=0))


def test_when_busy_skip_never_piles_up(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINREADY_FAULT", "hot.data_written:hang#1")
    import trainready.store.faults as faults

    monkeypatch.setattr(faults, "HANG_S", 1.5)
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(when_busy="skip")) as mgr:
        assert mgr.save(1, {"model": {"w": torch.ones(2)}}) is True
        assert mgr.save(2, {"model": {"w": torch.ones(2)}}) is False  # first still writing
        mgr.wait()
        assert mgr.save(3, {"model": {"w": torch.ones(2)}}) is True


def test_manifest_records_what_was_written(tmp_path):
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False),
                           metadata={"model": "tiny"}) as mgr:
        mgr.save(5, {"model": {"w": torch.ones(2)}}, metadata={"loss": 1.25})
    manifest = json.loads((tmp_path / "hot" / checkpoint_name(5, 1) / MANIFEST).read_text())
    assert manifest["schema_version"] == 1 and manifest["step"] == 5 and manifest["world_size"] == 1
    assert manifest["metadata"] == {"model": "tiny", "loss": 1.25}
    paths = {f["path"] for f in manifest["files"]}
    assert {"tensors.json", ".metadata", "__0_0.distcp", "state.json", "rank-00000.json"} <= paths
    assert all(p.startswith("__0_") for p in paths - {"tensors.json", ".metadata", "state.json", "rank-00000.json"})
    assert manifest["versions"]["torch"] == torch.__version__
