"""Two local "nodes" of two ranks each (gloo), every node with its own hot directory."""

import shutil

import ckpt_worker as job
from store_helpers import result, run_job


def test_two_nodes_commit_globally_restore_from_hot_then_archive_then_reshard(tmp_path):
    hot, archive = str(tmp_path / "node{node}"), str(tmp_path / "archive")
    args = ["--hot", hot, "--archive", archive]
    assert run_job([*args, "--steps", "3", "--out", str(tmp_path / "a.json")], nodes=2, per_node=2) == [0] * 4
    assert result(tmp_path / "a.json")["digest"] == job.reference_digest(3)
    for node in (0, 1):  # each node's hot tier holds its own ranks' files
        files = {p.name for p in (tmp_path / f"node{node}").glob("step-000000000003-*/*")}
        writers = {name.split("_")[2] for name in files if name.endswith(".distcp")}
        assert writers == {str(2 * node), str(2 * node + 1)}

    assert run_job([*args, "--steps", "5", "--out", str(tmp_path / "b.json")], nodes=2, per_node=2) == [0] * 4
    b = result(tmp_path / "b.json")
    assert (b["restored"], b["tier"]) == (3, "hot") and b["restored_digest"] == job.reference_digest(3)

    shutil.rmtree(tmp_path / "node1")  # node 1 replaced: only node 0 has step 5 on its hot tier
    assert run_job([*args, "--steps", "6", "--out", str(tmp_path / "c.json")], nodes=2, per_node=2) == [0] * 4
    c = result(tmp_path / "c.json")
    assert (c["restored"], c["tier"]) == (5, "archive") and c["restored_digest"] == job.reference_digest(5)

    # a different world size (one process) reads the same archive
    assert run_job(["--hot", str(tmp_path / "single"), "--archive", archive, "--steps", "7",
                    "--out", str(tmp_path / "d.json")]) == [0]
    d = result(tmp_path / "d.json")
    assert (d["restored"], d["tier"]) == (6, "archive") and d["digest"] == job.reference_digest(7)


def test_rank_killed_on_one_node_never_yields_a_partial_global_checkpoint(tmp_path):
    args = ["--hot", str(tmp_path / "node{node}"), "--archive", str(tmp_path / "archive"), "--sync"]
    codes = run_job([*args, "--steps", "4"], nodes=2, per_node=2, rank_env={2: {"TRAINREADY_FAULT": "hot.manifest_written#3"}})
    assert -9 in codes
    assert run_job([*args, "--steps", "5", "--out", str(tmp_path / "r.json")], nodes=2, per_node=2) == [0] * 4
    res = result(tmp_path / "r.json")
    assert res["restored"] in (1, 2) and res["restored_digest"] == job.reference_digest(res["restored"])
    assert res["digest"] == job.reference_digest(5)


def test_fsdp2_sharded_state_round_trips_and_reshards_to_one_process(tmp_path):
    archive = str(tmp_path / "archive")
    args = ["--fsdp", "--hot", str(tmp_path / "hot"), "--archive", archive]
    assert run_job([*args, "--steps", "3"], per_node=2) == [0, 0]
    assert run_job([*args, "--steps", "4", "--out", str(tmp_path / "a.json")], per_node=2) == [0, 0]
    a = result(tmp_path / "a.json")
    assert (a["restored"], a["tier"]) == (3, "hot")
    assert a["restored_digest"] == job.reference_digest(3) and a["digest"] == job.reference_digest(4)
    # DTensor shards written by two ranks, loaded whole by one plain process
    assert run_job(["--hot", str(tmp_path / "single"), "--archive", archive, "--steps", "5",
                    "--out", str(tmp_path / "b.json")]) == [0]
    b = result(tmp_path / "b.json")
    assert (b["restored"], b["tier"]) == (4, "archive") and b["digest"] == job.reference_digest(5)


def test_disk_full_on_one_rank_fails_every_rank_cleanly_instead_of_hanging(tmp_path):
    args = ["--hot", str(tmp_path / "hot"), "--sync", "--steps", "3"]
    codes = run_job(args, per_node=2, rank_env={1: {"TRAINREADY_FAULT": "hot.data_written:enospc#2"}}, timeout=60,
                    grace=15)
    # both ranks raised StorageFullError (the worker's exit 3); neither hung in a collective
    assert codes == [job.EXIT_STORAGE_FULL] * 2
    from trainready.store.manifest import checkpoint_name

    assert (tmp_path / "hot" / checkpoint_name(1, 1) / "manifest.json").exists()
    assert not (tmp_path / "hot" / checkpoint_name(2, 1)).exists()
