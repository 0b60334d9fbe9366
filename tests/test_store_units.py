"""Pieces of the store on their own: the JSON codec, manifest path rules, retention rules,
the tensor-index unpickler."""

import math
import pickle

import pytest
import torch

from trainready.store import codec
from trainready.store.dcp_io import read_tensor_index
from trainready.store.errors import BadStateError, CheckpointError
from trainready.store.manifest import FileEntry, Manifest, checkpoint_name, confined, parse_name
from trainready.store.retention import archive_deletions, hot_deletions
from trainready.store.tiers import Ref, redact


def test_codec_round_trips_what_json_lacks():
    tree = {"betas": (0.9, 0.999), "by_int": {0: "a", 3: [1, 2]}, "nan": math.nan, "inf": -math.inf,
            "raw": b"\x00\xff", "none": None, "flag": True, "nested": [{"t": torch.arange(3)}]}
    tensors = {}
    skeleton = codec.split(tree, "x", tensors)
    assert list(tensors) == ["x/nested/0/t"]
    back = codec.join(skeleton, tensors)
    assert back["betas"] == (0.9, 0.999) and isinstance(back["betas"], tuple)
    assert back["by_int"] == {0: "a", 3: [1, 2]}
    assert math.isnan(back["nan"]) and back["inf"] == -math.inf
    assert back["raw"] == b"\x00\xff" and back["none"] is None and back["flag"] is True
    assert back["nested"][0]["t"] is tensors["x/nested/0/t"]
    assert codec.tensor_refs(skeleton) == ["x/nested/0/t"]


def test_codec_inline_tensors_are_exact():
    state = torch.get_rng_state()
    skeleton = codec.split({"s": state, "h": torch.tensor([1.5], dtype=torch.bfloat16)}, "r", {}, inline=True)
    back = codec.join(skeleton, {})
    assert torch.equal(back["s"], state) and back["h"].dtype == torch.bfloat16


def test_codec_refuses_objects_it_would_have_to_pickle():
    with pytest.raises(BadStateError, match="at 'opt/fn'.*function"):
        codec.split({"fn": lambda: 0}, "opt", {})


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../b", "", "a//b", "manifest.json", ".parts/x", "a\\b"])
def test_manifest_paths_stay_inside_the_checkpoint(bad):
    with pytest.raises(ValueError):
        confined(bad)
    with pytest.raises(ValueError):
        FileEntry(path=bad, size=1, sha256="0" * 64)


def test_manifest_rejects_other_schema_versions():
    manifest = Manifest(step=3, run_id="r", generation=1, world_size=1, nodes=1, created_unix=0, save_seconds=0,
                        versions={}, files=[], node_files={0: []})
    assert Manifest.from_bytes(manifest.to_bytes()) == manifest
    with pytest.raises(ValueError, match="schema_version 99"):
        Manifest.from_bytes(manifest.to_bytes().replace(b'"schema_version": 1', b'"schema_version": 99'))


def test_names_parse_and_order():
    assert parse_name(checkpoint_name(120, 3)) == (120, 3)
    assert parse_name("step-12") is None and parse_name(".tmp-step-000000000001-g0001") is None


def _ref(step, gen=1, committed=True):
    manifest = Manifest(step=step, run_id="r", generation=gen, world_size=1, nodes=1, created_unix=0, save_seconds=0,
                        versions={}, files=[], node_files={}) if committed else None
    return Ref(checkpoint_name(step, gen), step, gen, "hot", manifest)


def test_hot_retention_keeps_unarchived_until_a_newer_one_is_archived():
    hot = [_ref(s) for s in (1, 2, 3, 4)]
    names = {s: checkpoint_name(s, 1) for s in (1, 2, 3, 4)}
    # nothing archived: nothing beyond keep may go (it would be the only copy)
    assert hot_deletions(hot, set(), keep=2, has_archive=True) == []
    # step 2 archived: 1 may go (a newer one is archived), 2 stays (the newest archived)
    assert hot_deletions(hot, {names[2]}, keep=2, has_archive=True) == [names[1]]
    # no archive: plain keep
    assert hot_deletions(hot, set(), keep=2, has_archive=False) == [names[2], names[1]]


def test_retention_counts_only_committed_and_removes_old_debris():
    refs = [_ref(1), _ref(2, committed=False), _ref(3), _ref(5, committed=False)]
    doomed = archive_deletions(refs, keep=1)
    assert checkpoint_name(1, 1) in doomed and checkpoint_name(2, 1) in doomed  # older debris
    assert checkpoint_name(3, 1) not in doomed  # newest committed
    assert checkpoint_name(5, 1) not in doomed  # newer than any commit: may be in progress
    assert archive_deletions(refs, keep=None) == [checkpoint_name(2, 1)]
    assert archive_deletions([_ref(1)], keep=1) == []


class _Boom:
    def __reduce__(self):
        import os
        return (os.system, ("echo pwned > /dev/null",))


def test_tensor_index_never_unpickles_code(tmp_path):
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps({"state_dict_metadata": _Boom()}))
    with pytest.raises(CheckpointError, match="posix.system|os.system"):
        read_tensor_index(path)


def test_redact_hides_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3tvalue")
    assert "s3cr3t" not in redact("failed: key=s3cr3tvalue at s3://user:pw@bucket/x")
    assert "pw@" not in redact("s3://user:pw@bucket/x")
