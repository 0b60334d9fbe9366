"""Pieces of the store on their own: the JSON codec, manifest path rules, retention and fencing rules."""

import math

import pytest
import torch

from trainready.io import redact
from trainready.store import codec, retention
from trainready.store.errors import BadStateError
from trainready.store.manifest import FileEntry, Manifest, checkpoint_name, confined, parse_name
from trainready.store.tiers import Ref


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


def _ref(step, gen=1, committed=True, unreadable=False, run="r"):
    manifest = Manifest(step=step, run_id=run, generation=gen, world_size=1, nodes=1, created_unix=0, save_seconds=0,
                        versions={}, files=[], node_files={}) if committed else None
    return Ref(checkpoint_name(step, gen), step, gen, "hot", manifest, "manifest unreadable: x" if unreadable else "",
               unreadable=unreadable)


def _names(*steps):
    return [checkpoint_name(s, 1) for s in steps]


def test_hot_retention_keeps_the_newest_archived_and_the_newest_keep():
    hot = [_ref(s) for s in (1, 2, 3, 4)]
    # step 2 archived: it stays (what a new node restores from), 3 and 4 are the newest two, 1 goes
    decided = retention.plan(hot, 2, archived=set(_names(2)))
    assert decided.delete == _names(1) and decided.dropped_unarchived == _names(1)
    # everything archived: plain keep
    assert retention.plan(hot, 2, archived=set(_names(1, 2, 3, 4))).delete == _names(1, 2)
    # no archive: plain keep, nothing is "dropped unarchived"
    assert retention.plan(hot, 2) == retention.Plan(_names(1, 2), [])


def test_an_archive_outage_never_fills_the_disk():
    """Before: every unarchived checkpoint was kept until a newer one reached the archive, so a
    long outage filled the NVMe. Now: the newest archived one plus the newest keep_hot."""
    hot = [_ref(s) for s in range(1, 21)]
    decided = retention.plan(hot, 2, archived=set(_names(1)))
    assert set(_names(*range(1, 21))) - set(decided.delete) == set(_names(1, 19, 20))
    assert decided.dropped_unarchived == _names(*range(2, 19))


def test_retention_never_deletes_what_it_must_keep():
    hot = [_ref(s) for s in (1, 2, 3, 4)] + [_ref(5, unreadable=True, committed=False), _ref(0, committed=False)]
    hot[2].fenced = True
    decided = retention.plan(hot, 1, protect=_names(1))
    # 1 is being uploaded, 3 is fenced, 5 is unreadable: none of them goes; 2 goes (4 is the newest); debris 0 goes
    assert decided.delete == [checkpoint_name(0, 1), *_names(2)]


def test_retention_counts_only_committed_and_removes_old_debris():
    refs = [_ref(1), _ref(2, committed=False), _ref(3), _ref(5, committed=False)]
    doomed = retention.plan(refs, 1).delete
    assert checkpoint_name(1, 1) in doomed and checkpoint_name(2, 1) in doomed  # older debris
    assert checkpoint_name(3, 1) not in doomed  # newest committed
    assert checkpoint_name(5, 1) not in doomed  # newer than any commit: may be in progress
    assert retention.plan(refs, None).delete == [checkpoint_name(2, 1)]
    assert retention.plan([_ref(1)], 1).delete == []


def test_retention_only_considers_its_own_run():
    refs = [_ref(1, run="a"), _ref(2, run="b"), _ref(3, run="a"), _ref(4, committed=False)]
    own = retention.owned(refs, "a")
    assert [r.name for r in own] == _names(1, 3, 4)
    assert retention.plan(own, 1).delete == _names(1)


def test_a_lease_fences_what_older_writers_committed_after_it():
    from trainready.store.manifest import Lease

    lease = Lease(run_id="r", generation=5, fenced={3: 100, 4: 120})
    assert not lease.fences(100, 3) and lease.fences(101, 3)  # gen 3 committed 101 after gen 5 took over
    assert not lease.fences(120, 4) and lease.fences(121, 4)
    assert lease.fences(1, 2)  # gen 2 had nothing committed when gen 5 claimed
    assert not lease.fences(500, 5) and not lease.fences(500, 6)  # its own and newer generations
    assert not Lease(run_id="r", generation=5).fences(1, 2)  # an old lease without the map: unknown, not fenced


def test_redact_hides_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3tvalue")
    assert "s3cr3t" not in redact("failed: key=s3cr3tvalue at s3://user:pw@bucket/x")
    assert "pw@" not in redact("s3://user:pw@bucket/x")
