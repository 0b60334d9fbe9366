"""`--ep-dispatcher`, `--ep-overlap` and `--fp8-dispatch` on `estimate` and `plan`: they reach the setup, a flag
wins over a --job file, and what the frameworks or the machine cannot run is refused or said (plan/dispatch.py)."""

import json

import pytest
from cloud_stubs import cli_run

MOE = ["--model", "qwen3-30b-a3b", "--stack", "megatron", "--global-batch", "64"]
ONE_NODE = [*MOE, "--instance", "p5.48xlarge", "--ep", "8", "--activation-checkpointing", "selective"]


def estimate(*args):
    r = cli_run("estimate", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def moe_line(out) -> str:
    """The estimate's MoE assumption (moe.assumptions)."""
    return next(a for a in out["assumptions"] if a.startswith("MoE:"))


def refused(*args) -> str:
    r = cli_run("estimate", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    return " ".join(r.stderr.split())


def test_the_flags_reach_the_setup_and_change_the_figure():
    plain = estimate(*ONE_NODE, "--ep-dispatcher", "alltoall", "--no-ep-overlap")
    both = estimate(*ONE_NODE, "--ep-dispatcher", "deepep", "--ep-overlap")
    assert plain["setup"]["ep_dispatcher"] == "alltoall" and not plain["setup"]["ep_overlap"]
    assert both["setup"]["ep_dispatcher"] == "deepep" and both["setup"]["ep_overlap"]
    assert both["throughput"]["tokens_per_s"] > plain["throughput"]["tokens_per_s"]
    assert not any("DeepEP" in w for w in both["warnings"])  # NVSwitch, EP inside the node: it runs


def test_a_flag_wins_over_the_job_file(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('schema_version = 1\nkind = "trainready-job"\nstack = "megatron"\nep_dispatcher = "deepep"\n'
                   'ep_overlap = true\n')
    args = [a for a in ONE_NODE if a not in ("--stack", "megatron")]
    from_file = estimate("--job", str(job), *args)
    assert from_file["setup"]["ep_dispatcher"] == "deepep" and from_file["setup"]["ep_overlap"]
    flagged = estimate("--job", str(job), *args, "--ep-dispatcher", "alltoall", "--no-ep-overlap")
    assert flagged["setup"]["ep_dispatcher"] == "alltoall" and not flagged["setup"]["ep_overlap"]


@pytest.mark.parametrize("flags", [["--ep-dispatcher", "deepep"], ["--ep-overlap"],
                                   ["--fp8-dispatch", "--precision", "fp8"]])
def test_a_dense_model_refuses_them(flags):
    said = refused("--model", "llama-3.1-8b", "--gpu", "h100-80gb", *flags)
    assert f"{flags[0]}" in said and "llama-3.1-8b is dense" in said


def test_fp8_dispatch_needs_fp8():
    assert "--fp8-dispatch needs --precision fp8" in refused(*ONE_NODE, "--fp8-dispatch")


def test_a_framework_without_deepep_says_which_has_it():
    said = refused("--model", "qwen3-30b-a3b", "--gpu", "h100-80gb", "--ep", "8", "--framework", "deepspeed",
                   "--ep-dispatcher", "deepep")
    assert "no DeepEP dispatcher" in said and "use --framework megatron" in said


@pytest.mark.parametrize("extra, fix", [
    (["--gpus", "16", "--pp", "2"], "--pp-virtual 2 or more with --pp 2"),
    (["--activation-checkpointing", "full"], "--activation-checkpointing selective"),
])
def test_megatron_refuses_an_overlap_it_cannot_run(extra, fix):
    args = [*MOE, "--gpu", "h100-80gb", *(["--ep", "8"] if "--ep" not in extra else []), *extra, "--ep-overlap"]
    said = refused(*args)
    assert "--overlap-moe-expert-parallel-comm refuses this layout" in said and fix in said
    assert "--no-ep-overlap" in said


def test_deepep_where_it_cannot_run_is_warned_and_where_unknown_assumed():
    efa = estimate(*MOE, "--instance", "p5.48xlarge", "--gpus", "16", "--ep", "16", "--ep-dispatcher", "deepep")
    assert any(w.startswith("DeepEP cannot run here") and "efa" in w for w in efa["warnings"]), efa["warnings"]
    ampere = estimate(*MOE, "--gpu", "a100-80gb", "--ep", "8", "--ep-dispatcher", "deepep")
    assert any("Hopper and Blackwell" in w for w in ampere["warnings"])
    bare = estimate(*MOE, "--gpu", "h100-80gb", "--ep", "8", "--ep-dispatcher", "deepep")
    assert not any("DeepEP" in w for w in bare["warnings"])
    assert any(a.startswith("DeepEP taken to run") for a in bare["assumptions"])


def test_without_expert_parallelism_the_overlap_changes_nothing_and_says_so():
    one = estimate(*MOE, "--gpu", "h100-80gb", "--ep-overlap")  # what plan --save writes for an ep-1 row
    assert any("--ep-overlap acts on expert parallelism" in w for w in one["warnings"])
    assert one["throughput"]["tokens_per_s"] == estimate(*MOE, "--gpu", "h100-80gb")["throughput"]["tokens_per_s"]


def test_without_expert_parallelism_deepep_changes_nothing_and_says_so():
    one = estimate("--model", "qwen3-30b-a3b", "--gpu", "h100-80gb", "--stack", "torchtitan", "--ep-dispatcher",
                   "deepep")
    assert any("with --ep 1 no token leaves its GPU" in w for w in one["warnings"])
    plain = estimate("--model", "qwen3-30b-a3b", "--gpu", "h100-80gb", "--stack", "torchtitan")
    assert one["throughput"]["tokens_per_s"] == plain["throughput"]["tokens_per_s"]


def test_plan_keeps_the_asked_dispatcher_only_where_it_runs():
    # one node of 40 GB A100s: nothing fits without expert parallelism, which DeepEP cannot run there
    a100 = cli_run("plan", *MOE, "--instances", "p4d.24xlarge", "--ep-dispatcher", "deepep", "--max-nodes", "1",
                   "--json")
    reason = json.loads(a100.stdout)["excluded"][0]["reason"]
    assert "not planned: --ep-dispatcher deepep with --ep" in reason and "Hopper and Blackwell" in reason
    r = cli_run("plan", *MOE, "--instances", "p5.48xlarge", "--ep-dispatcher", "deepep", "--max-nodes", "4",
                "--json")
    assert r.returncode == 0, r.stderr
    rows = [row["estimate"]["setup"] for row in json.loads(r.stdout)["rows"]]
    assert any(s["ep_dispatcher"] == "deepep" for s in rows)
    for s in rows:  # EFA: DeepEP only where the expert-parallel group stays inside a node
        assert s["ep_dispatcher"] in ("deepep", None) and (s["ep_dispatcher"] is None or s["ep"] <= 8), s


def test_automodel_all_to_all_says_how_automodel_itself_dispatches():
    """NeMo AutoModel has no collective all-to-all: an estimate that takes one on its stack says what it runs."""
    auto = [*MOE[:2], "--stack", "automodel", "--gpu", "h100-80gb", "--gpus", "8", "--ep", "8", "--global-batch", "64"]
    assert "AutoModel itself dispatches with DeepEP" in moe_line(estimate(*auto))
    assert "AutoModel itself" not in moe_line(estimate(*auto, "--ep-dispatcher", "deepep"))
    titan = [a if a != "automodel" else "torchtitan" for a in auto]
    assert "AutoModel itself" not in moe_line(estimate(*titan))


def test_a_dropped_overlap_is_said_and_saved_as_dropped(tmp_path):
    """200 sequences on 2 stages: 25 micro-batches per step, no virtual stages, so the pp-2 row runs without the
    overlap; the plan says so and its saved job reads back to the same figure."""
    saved = tmp_path / "plan.toml"
    r = cli_run("plan", "--model", "qwen3-30b-a3b", "--tokens", "1e9", "--stack", "megatron", "--instances",
                "p5.48xlarge", "--ep-overlap", "--global-batch", "200", "--save", str(saved), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    best = out["rows"][0]["estimate"]
    assert best["setup"]["pp"] > 1 and best["setup"]["ep"] > 1 and not best["setup"]["ep_overlap"], best["setup"]
    assert any(n.startswith("--ep-overlap does not apply to the best row") and "not a multiple of --pp" in n
               for n in out["notes"]), out["notes"]
    assert "ep_overlap = false" in saved.read_text()
    again = estimate("--job", str(saved))
    assert again["throughput"]["tokens_per_s"] == best["throughput"]["tokens_per_s"]


def test_an_ep1_best_row_says_the_dispatch_flags_change_nothing():
    r = cli_run("plan", "--model", "mixtral-8x7b", "--tokens", "1e9", "--instances", "p5.48xlarge", "--stack",
                "torchtitan", "--ep-overlap", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["rows"][0]["estimate"]["setup"]["ep"] == 1
    assert any(n.startswith("the best row has --ep 1: --ep-overlap acts on expert parallelism") for n in out["notes"])
    one = estimate(*MOE, "--gpu", "h100-80gb", "--ep-overlap", "--ep-dispatcher", "deepep")
    said = moe_line(one)
    assert "no token leaves its GPU" in said and "overlapped with" not in said and "DeepEP" not in said


def test_deepep_refusal_leads_where_it_removed_the_layouts_that_fit():
    """On EFA DeepEP cannot carry an EP group across nodes; the layouts it could run do not fit, and the reason says
    that rather than that the model cannot fit the instance (it does, with the all-to-all)."""
    r = cli_run("plan", "--model", "deepseek-v3", "--tokens", "1e10", "--stack", "megatron", "--max-nodes", "32",
                "--instances", "p5.48xlarge", "--ep-dispatcher", "deepep", "--json")
    (excluded,) = json.loads(r.stdout)["excluded"]
    assert excluded["reason"].startswith("not planned: --ep-dispatcher deepep with --ep"), excluded
    assert "the layouts DeepEP could run here do not fit" in excluded["reason"]
    assert "cannot hold them" not in excluded["reason"]


def test_fp8_dispatch_is_in_the_json():
    fp8 = [*ONE_NODE, "--precision", "fp8", "--strategy", "zero1"]
    assert estimate(*fp8, "--fp8-dispatch")["setup"]["fp8_dispatch"] is True
    assert estimate(*fp8)["setup"]["fp8_dispatch"] is False
