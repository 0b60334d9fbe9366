"""The memory record (plan/memory_record.py): the memory model's errors on published peaks, quoted only within the
setup's kind, stack and MoE dispatcher, and a warning where runs like it would not have fit."""

from __future__ import annotations

import json
from pathlib import Path

from bench_modules import bench_module
from cloud_stubs import cli_run
from trainready.catalog import load_catalog
from trainready.plan import memory_record as mr
from trainready.plan import track_record as tr
from trainready.plan.estimate import estimate_setup
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.setup import resolve

ROOT = Path(__file__).resolve().parents[1]
CATALOG = load_catalog()
# NousResearch/torchtitan PR #19's runs (published_2024_2026.csv nous19-*): Qwen3-30B-A3B, 16 nodes of B200, DeepEP
NOUS = dict(model="qwen3-30b-a3b", gpu="b200", gpus=128, gpus_per_node=8, inter_node_gbps=3200.0, strategy="zero3",
            ep=8, etp=1, seq_len=4096, precision="bf16", activation_checkpointing="full", stack="torchtitan",
            expert_load_imbalance=1.0, ep_dispatcher="deepep", torch_compile=True)




def _row(id_: str, mem: float, ratio: float, kind="dense", stack="torchtitan", dispatcher="none") -> tr.RecordRow:
    return tr.RecordRow(id=id_, source="test", signed_error_pct=0.0, memory_signed_error_pct=mem,
                        memory_transient_ratio=ratio,
                        regime=tr.Regime(kind=kind, context="standard", precision="16-bit", arch="hopper",
                                         stack=stack, dispatcher=dispatcher))


def test_runs_that_ran_out_of_memory_are_warned_and_runs_that_ran_are_not():
    bench = bench_module("plan_accuracy_2024")
    ooms = bench.known_oom()
    assert len(ooms) == 2
    for x in ooms:  # the model alone calls both a fit; the record of their own stack says they would not be
        assert x["peak_gib"] < x["gpu_gib"] and x["warned"] and x["at_record_gib"] > x["gpu_gib"], x["id"]
    counted, repeats, _ = bench.evaluated_all()
    ran = counted + repeats + bench.moe_csv_results()  # every run that ran, a configuration's repeats too
    assert len(ran) >= 80
    assert not [x["row"]["id"] for x in ran if bench._record_warns(x["setup"])]


def test_the_record_never_crosses_a_stack_or_a_dispatcher():
    deepep = mr.memory_record(resolve(JobSpec(**NOUS, micro_batch=8, global_batch=1024), CATALOG))
    # its 1-16 node runs of local batch 8 are one configuration, counted once (bench/plan_accuracy_2024.py)
    assert deepep is not None and deepep.runs == 2 and deepep.few and "DeepEP" in deepep.regime
    assert deepep.signed_median_pct < -50 and deepep.transient_over_model > 3
    # the same model on all-to-all dispatch, or under Megatron: none of those peaks, so none quoted
    for kw in (dict(ep_dispatcher="alltoall"), dict(stack="megatron", torch_compile=False)):
        s = resolve(JobSpec(**{**NOUS, **kw}, micro_batch=8, global_batch=1024), CATALOG)
        assert mr.memory_record(s) is None
        assert "unchecked" in mr.unchecked(s)
    dense = mr.memory_record(resolve(JobSpec(model="llama-3.1-8b", gpu="h100-80gb", gpus=8), CATALOG))
    assert dense is not None and not dense.few and "hf-trainer" in dense.regime and dense.runs >= tr.MIN_RUNS


def test_the_narrowest_regime_with_enough_peaks_is_quoted_else_the_few_of_the_kind():
    s = resolve(JobSpec(model="llama-3.1-8b", gpu="h100-80gb", gpus=8, stack="torchtitan"), CATALOG)
    rows = tuple(_row(f"r{i}", -10.0, 1.2) for i in range(tr.MIN_RUNS))
    rec = mr.memory_record(s, rows)
    assert rec.runs == tr.MIN_RUNS and not rec.few and "Hopper" in rec.regime
    few = mr.memory_record(s, rows[:3] + (_row("other", -90.0, 9.0, stack="megatron"),))
    assert few.runs == 3 and few.few and "Hopper" not in few.regime and "megatron" not in few.regime
    assert mr.memory_record(s, (_row("x", -5.0, 1.1, stack="megatron"),)) is None
    assert mr.memory_record(s, ()) is None


def test_the_projection_scales_only_what_lies_beyond_the_persistent_states():
    s = resolve(JobSpec(**NOUS, micro_batch=8, global_batch=1024), CATALOG)
    mem = estimate_memory(s)
    rec = mr.summarize([_row("a", -50.0, 2.0, kind="moe", dispatcher="deepep")], "test")
    states = mr.states_bytes(mem)
    assert abs(mr.projected_peak_gib(rec, mem) * mr.GiB - (mem.peak + mem.reserved_peak - states)) < 1
    # a ratio of 1 changes nothing, however wrong the whole peak was
    assert abs(mr.projected_peak_gib(mr.summarize([_row("b", -50.0, 1.0)], "t"), mem) * mr.GiB - mem.peak) < 1
    signed, ratio = mr.compared(mem, 2 * mem.reserved_peak / mr.GiB, "reserved")
    assert abs(signed + 50) < 1e-6 and ratio > 2  # twice the peak is more than twice what lies beyond the states
    assert mr.compared(mem, 0.5 * states / mr.GiB, "reserved")[1] == 0.0  # under the states: nothing beyond them


def test_estimate_carries_the_record_and_warns_where_the_run_would_not_have_fit():
    ran = estimate_setup(resolve(JobSpec(**NOUS, micro_batch=10, global_batch=1280), CATALOG))
    assert ran.memory.track_record is not None and ran.memory.peak_at_record_gib < ran.memory.gpu_gib
    assert not [w for w in ran.warnings if w.startswith("memory track record")]
    oom = estimate_setup(resolve(JobSpec(**NOUS, micro_batch=20, global_batch=2560), CATALOG))
    assert oom.memory.fits and oom.memory.peak_at_record_gib > oom.memory.gpu_gib
    said = [w for w in oom.warnings if w.startswith("memory track record")]
    assert len(said) == 1 and "not established" in said[0] and "DeepEP" in said[0]
    megatron = estimate_setup(resolve(JobSpec(model="llama-3.1-8b", gpu="h100-80gb", gpus=8, stack="megatron"),
                                      CATALOG))
    assert megatron.memory.track_record is None and megatron.memory.peak_at_record_gib is None
    assert any(a.startswith("memory figure unchecked") for a in megatron.assumptions)


def test_the_cli_prints_the_record_in_estimate_and_for_plans_first_row():
    out = json.loads(cli_run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8",
                             "--json").stdout)
    rec = out["memory"]["track_record"]
    assert rec["runs"] >= tr.MIN_RUNS and "hf-trainer" in rec["regime"] and out["memory"]["peak_at_record_gib"] > 0
    human = cli_run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8",
                    columns=80).stdout.replace("\n", " ")
    assert "memory track record: on 22 measured peaks" in human
    plan = cli_run("plan", "--model", "llama-3.1-8b", "--tokens", "1e9", "--instances", "p5.48xlarge",
                   columns=80).stdout.replace("\n", " ")
    assert "Memory track record (#1): on" in plan


def test_without_a_readable_track_record_nothing_is_said_of_memory(monkeypatch):
    monkeypatch.setattr(tr, "_rows", lambda: None)
    e = estimate_setup(resolve(JobSpec(model="llama-3.1-8b", gpu="h100-80gb", gpus=8, stack="megatron"), CATALOG))
    assert e.memory.track_record is None
    assert not any("memory figure unchecked" in a for a in e.assumptions)


def test_a_setup_inside_the_margin_still_hears_its_record():
    tight = estimate_setup(resolve(JobSpec(**NOUS, micro_batch=44, global_batch=5632), CATALOG))
    assert tight.memory.fits and not tight.memory.fits_with_margin  # the margin problem is a warning of its own
    assert any(w.startswith(mr.MEMORY_RECORD_WARNING) for w in tight.warnings)
    over = estimate_setup(resolve(JobSpec(**NOUS, micro_batch=60, global_batch=7680), CATALOG))
    assert not over.memory.fits and not any(w.startswith(mr.MEMORY_RECORD_WARNING) for w in over.warnings)
    one = mr.summarize([_row("a", 21.0, 0.77, kind="moe")], "MoE runs under torchtitan")
    assert mr.text(one).startswith("on 1 measured peak of") and "(only 1)" in mr.text(one)


def test_a_calibrated_allocator_slack_is_the_users_own_so_the_record_is_not_quoted():
    import dataclasses

    from trainready.plan import efficiency as eff

    s = resolve(JobSpec(**NOUS, micro_batch=20, global_batch=2560), CATALOG)
    own = dataclasses.replace(eff.arch_efficiency(s.gpu.arch), fragmentation_zero3=0.05, confidence="measured")
    mine = dataclasses.replace(s, efficiency=own)
    assert mr.calibrated(mine) and mr.memory_record(mine) is None
    e = estimate_setup(mine)
    assert e.memory.track_record is None and mr.CALIBRATED_NOTE in e.assumptions
    assert not any(w.startswith(mr.MEMORY_RECORD_WARNING) for w in e.warnings)
    speed_only = dataclasses.replace(s, efficiency=dataclasses.replace(own, fragmentation_zero3=None))
    assert not mr.calibrated(speed_only) and mr.memory_record(speed_only) is not None
