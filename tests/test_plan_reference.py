"""The published rows bench/plan_accuracy.py compares against: every row names its source,
and the MoE rows marked as counting meet the inclusion rule written in the script."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from trainready.plan.presets import preset

DATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "plan_reference"
FILES = ("mosaicml_llmfoundry.csv", "torchtune.csv", "megatron_table1.csv", "moe.csv")
MEASURED_GPUS = ("a100-40gb", "a100-80gb", "h100-80gb", "h200")  # rule 3: efficiency measured


def rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("name", FILES)
def test_every_row_names_its_source(name):
    found = rows(name)
    assert found, name
    for r in found:
        assert len(r["source"]) > 20, (name, r)


def test_mosaic_rows_are_consistent():
    for r in rows("mosaicml_llmfoundry.csv"):
        assert int(r["d_model"]) % int(r["heads"]) == 0, r
        assert r["sharding"] in ("FULL_SHARD", "SHARD_GRAD_OP"), r
        assert float(r["tok_per_s_per_gpu"]) > 0


def test_megatron_layout_adds_up():
    for r in rows("megatron_table1.csv"):
        assert int(r["tp"]) * int(r["pp"]) * int(r["dp"]) == int(r["num_gpus"]), r


def test_moe_excluded_rows_say_why_and_included_rows_meet_the_rule():
    found = rows("moe.csv")
    assert {r["included"] for r in found} <= {"yes", "no"}
    assert len({r["id"] for r in found}) == len(found), "duplicate ids"
    for r in found:
        if r["included"] == "no":
            assert r["exclusion"].startswith("rule "), r["id"]
            continue
        assert not r["exclusion"], r["id"]
        tp, pp, ep, dp, gpus = (int(r[k]) for k in ("tp", "pp", "ep", "dp", "num_gpus"))
        assert float(r["tok_s_gpu"]) > 0, r["id"]  # rule 1: a step-level throughput
        for k in ("micro_batch", "global_batch", "seq_len", "precision", "recompute"):  # rule 2
            assert r[k], (r["id"], k)
        assert r["gpu"] in MEASURED_GPUS, r["id"]  # rule 3
        assert tp * pp * dp == gpus, r["id"]  # rule 4: the layout adds up, EP x ETP inside TP x DP, no CP
        etp = int(r["etp"])  # published (rule 2)
        assert (tp * dp) % (ep * etp) == 0 and r["cp"] == "1", r["id"]
        assert int(r["vpp"] or 1) * pp <= preset(r["model"]).num_layers, r["id"]  # a layer per virtual stage
        assert int(r["global_batch"]) % (int(r["micro_batch"]) * dp) == 0, r["id"]
        assert preset(r["model"]).moe is not None, r["id"]  # rule 5


def test_moe_throughput_matches_step_time_where_both_are_published():
    for r in rows("moe.csv"):
        if r["tok_s_gpu"] and r["step_time_s"] and r["global_batch"]:
            derived = int(r["global_batch"]) * int(r["seq_len"]) / (float(r["step_time_s"]) * int(r["num_gpus"]))
            assert derived == pytest.approx(float(r["tok_s_gpu"]), rel=0.01), r["id"]


@pytest.mark.parametrize("name", ("moe.csv", "published_2024_2026.csv"))
def test_local_batches_are_torch_pipelinings_and_split_each_ranks_share(name):
    """pp_local_batch (sequences per data-parallel rank per pipeline schedule call) is given only where the source
    states it for a stack that calls the schedule once per local batch, and makes whole calls of whole
    micro-batches."""
    given = [r for r in rows(name) if r["pp_local_batch"]]
    assert given, name
    for r in given:
        local, micro, share = int(r["pp_local_batch"]), int(r["micro_batch"]), int(r["global_batch"]) // int(r["dp"])
        assert r["stack"] in ("torchtitan", "automodel") and int(r["pp"]) > 1, r["id"]
        assert local % micro == 0 and share % local == 0 and local // micro >= int(r["pp"]), r["id"]
        assert f"local batch {local}" in r["notes"].lower() or f"lbs {local}" in r["notes"].lower(), r["id"]


# What the 2024-2026 rows' prose says of the inputs bench/plan_accuracy_2024.py reads from columns: each column
# must agree with its row's own words, so a row added with a note but no value (or a value its note does not
# back) fails here, not silently in the accuracy figures.
_FORCED = re.compile(r"(\b(?:not|no|without)\s+)?(force-balanced?|forced[ -]balanced?|forced (?:load )?balance"
                     r"|force_load_balanc|fake_balanced_gate)")
_TORCH_BUILDS = {"1963fc8": "2.6", "38410cf9": "2.8"}  # the benchmark files' dates: Dec 2024, June 2025 nightlies
# Where a row's words match a pattern but say otherwise, the column holds what they say, and why is written here
# (a row whose pattern misses its phrase is fixed in the pattern instead).
_STATED_OTHERWISE = {
    ("nous19-standard-ep8-1node", "ep_dispatcher"): "the baseline of the DeepEP comparison: its framework column "
                                                    "says torchtitan's default all-to-all",
    ("torchtitan2392-qwen3-deepep-b200", "ep_dispatcher"): "its notes say the PR compares DeepEP with the standard "
                                                           "dispatcher; which one the row's figure is, is not stated",
}


def _said_columns(r: dict[str, str]) -> dict[str, str]:
    said = f"{r['framework']} {r['notes']}".lower()
    told = f"{said} {r['source']}".lower()
    fp8 = r["precision"] in ("fp8", "mxfp8")
    watts = re.search(r"(\d+) W power limit|power limit (\d+) W", f"{r['notes']} {r['unknowns']}")
    offload = re.search(r"cpu_offloading_num_layers|moe_paged_stash", r["notes"])
    release = re.search(r"torch (2\.\d+)", f"{r['source']} {r['notes']}")
    build = re.search(r"torch ([0-9a-f]{7,})", f"{r['source']} {r['notes']}")
    peft = r.get("method") in ("lora", "qlora")
    rank = re.search(r"LoRA dim (?:\(rank\) )?(\d+)|dim \(rank\) (\d+)|--lora_r (\d+)", r["notes"]) if peft else None
    dropout = re.search(r"LoRA dropout (\d+(?:\.\d+)?)", r["notes"]) if peft else None
    named = re.search(r"target_modules(?: = | )\['linear_qkv'\]|--lora_target_modules ([a-z_,]*[a-z])"
                      r"|all linear layers", r["notes"]) if peft else None
    gather = ("yes" if fp8 and any(k in told for k in ("with float8 all-gather", "fsdp float8 all-gather",
                                                       "(f8 all-gather)"))
              else "no" if fp8 and "bfloat16 all-gather" in told else "")
    return {
        "power_limit_w": (watts.group(1) or watts.group(2)) if watts else "",
        "host_offload": offload.group(0) if offload else "",
        "load_imbalance": "1.0" if any(not m.group(1) for m in _FORCED.finditer(said)) else "",
        "expert_routing": "contiguous" if "fake_balanced_gate" in said else "",
        "ep_dispatcher": "deepep" if int(r["ep"] or 1) > 1 and ("deepep" in said or "hybridep" in said) else "",
        "fp8_param_gather": gather,
        "lora_rank": next(g for g in rank.groups() if g) if rank else "",
        "lora_targets": ("" if not named else named.group(1) or ("all-linear" if "all linear" in named.group(0)
                                                                 else "linear_qkv")),
        "lora_dropout": dropout.group(1) if dropout else "",
        "torch": release.group(1) if release else _TORCH_BUILDS.get(build.group(1), "") if build else "",
        "gpu": "h100-96gb-hbm2e" if "96GB HBM2e" in r["notes"] else r["gpu"],
    }


@pytest.mark.parametrize("name", ("published_2024_2026.csv", "megatron_bridge.csv", "dgxc_benchmarking.csv"))
def test_the_2024_rows_columns_say_what_their_notes_say(name):
    checked = 0
    for r in rows(name):
        for column, said in _said_columns(r).items():
            if (r["id"], column) in _STATED_OTHERWISE:
                assert r[column] != said, f"{r['id']}: {column} agrees with its pattern now: drop the exception"
                continue
            assert r[column] == said, f"{r['id']}: {column} is {r[column]!r}, its notes say {said!r}"
            checked += bool(said)
    assert checked >= (60 if name.startswith("published") else 9)


def test_a_negated_or_missing_phrase_is_not_read_as_forced_balance():
    base = {"framework": "x", "notes": "", "source": "", "unknowns": "", "precision": "bf16", "ep": "8", "gpu": "b200"}
    for note, forced in (("forced load balance", True), ("moe_force_load_balance=true", True),
                         ("benchmarks force-balance tokens", True),
                         ("not forced-balanced", False), ("no forced balance", False), ("", False)):
        assert _said_columns({**base, "notes": note})["load_imbalance"] == ("1.0" if forced else ""), note


def test_each_configuration_counts_once_at_its_fewest_gpus():
    """bench/plan_accuracy_2024.py: a weak-scaling series, or a later release's re-measurement, of one layout is one
    configuration: the row at the fewest GPUs counts, the others are repeats that name it; any other estimate input
    (or another number of micro-batches per step) makes a configuration of its own."""
    from bench_modules import bench_module

    b = bench_module("plan_accuracy_2024")
    read = {r["id"]: dict(r, _file=name) for name in b.FILES
            for r in csv.DictReader((b.DATA / name).open(newline=""))}
    small, large = read["dgxc2505-nemotron4-15b-h100-fp8-16"], read["dgxc2504-nemotron4-15b-h100-fp8-2048"]
    configuration = lambda r: b.configuration(b.evaluate(r))  # noqa: E731
    assert configuration(small) == configuration(large)
    for change in ({"micro_batch": "1", "global_batch": "32"}, {"global_batch": "128"}, {"tp": "4"},
                   {"seq_len": "8192"}, {"precision": "bf16", "fp8_recipe": "", "fp8_param_gather": ""},
                   {"recompute": "full"}, {"tp_comm_overlap": "no"}, {"model": "nemotron-4-340b"},
                   {"_file": "other.csv"}):
        assert configuration(small) != configuration(dict(small, **change)), change
    counted, repeats, left_out = b.evaluated_all()
    ids = {x["row"]["id"] for x in counted}
    of = {x["row"]["id"]: x["repeat_of"] for x in repeats}
    assert small["id"] in ids and large["id"] not in ids and of[large["id"]] == small["id"]
    # torchtitan 2024-12 compiled its blocks only ("model"), which is no estimate input: the compiled runs repeat
    # the eager one
    assert of["titan24-8b-fsdp8-compile"] == of["titan24-8b-fsdp128-compile"] == "titan24-8b-fsdp8"
    assert not ids & set(of) and set(of.values()) <= ids  # a repeat names a counted row, never a left-out one
    for x in repeats:  # the same inputs but the scale, at no fewer GPUs, from the same file
        first = read[x["repeat_of"]]
        assert int(x["row"]["num_gpus"]) >= int(first["num_gpus"]) and x["row"]["_file"] == first["_file"]
        assert b.configuration(x) == configuration(first)
    assert len({b.configuration(x) for x in counted}) == len(counted)
