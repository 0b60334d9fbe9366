"""--pp-local-batch: torch.distributed.pipelining stacks (torchtitan's Trainer.train_step, NeMo AutoModel's benchmark
loop) call the pipeline schedule once per local batch and accumulate gradients over the calls, so each call fills
and drains the pipeline and, where a stage is gathered once per call, gathers and reduces again."""

from __future__ import annotations

import json

import pytest
from cloud_stubs import cli_run

from trainready.catalog import load_catalog
from trainready.errors import UsageError
from trainready.plan.batch_advice import BUBBLE_FLAG, batch_advice, bubble_fraction
from trainready.plan.estimate import estimate_setup
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.performance import estimate_step
from trainready.plan.recipes import framework_for, recipe_for
from trainready.plan.setup import resolve

BASE = dict(model="llama-3.1-70b", gpu="h100-80gb", gpus=32, inter_node_gbps=3200, pp=4, stack="torchtitan",
            micro_batch=1, global_batch=64, seq_len=4096)  # dp 8: 8 sequences per data-parallel rank per step


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _setup(catalog, **kw):
    return resolve(JobSpec(**{**BASE, **kw}), catalog)


def test_calls_follow_the_local_batch(catalog):
    one, two = _setup(catalog), _setup(catalog, pp_local_batch=4)
    assert (one.schedule_calls, one.schedule_microbatches) == (1, 8)
    assert (two.schedule_calls, two.schedule_microbatches) == (2, 4)
    assert _setup(catalog, pp_local_batch=8).schedule_calls == 1  # the whole share: as if not given


def test_each_call_fills_and_drains_the_pipeline(catalog):
    one, two = (estimate_step(_setup(catalog, pp_local_batch=b)) for b in (8, 4))
    # the bubble is (pp - 1) micro-batch times per call: twice the calls, twice the idle time
    assert two.other_s == pytest.approx(2 * one.other_s, rel=0.02)
    assert two.step_s > one.step_s
    assert bubble_fraction(_setup(catalog, pp_local_batch=4)) == pytest.approx(3 / 4)
    assert bubble_fraction(_setup(catalog, pp_local_batch=8)) == pytest.approx(3 / 8)


def test_a_stage_gathered_once_per_call_gathers_and_reduces_per_call(catalog):
    c1, c2, c4 = (_setup(catalog, global_batch=128, pp_local_batch=b) for b in (16, 8, 4))
    assert c1.pp_stage_gathered  # torchtitan keeps the stage gathered through a schedule call
    comm = [estimate_step(s).comm_s for s in (c1, c2, c4)]
    # the activations' sends are per micro-batch, the same in all three; the gather and reduce-scatter per call
    assert comm[1] > comm[0]
    assert comm[2] - comm[1] == pytest.approx(2 * (comm[1] - comm[0]), rel=1e-6)


def test_activation_memory_is_one_calls(catalog):
    whole, split = (estimate_memory(_setup(catalog, pp_local_batch=b, pp_virtual=2, global_batch=128))
                    for b in (16, 4))
    assert split.activations < whole.activations  # a call of pp micro-batches warms up no deeper


@pytest.mark.parametrize(("kw", "message"), [
    (dict(pp=1, pp_local_batch=4), "needs pipeline stages"),
    (dict(stack="megatron", pp_local_batch=4), "stack megatron runs every micro-batch"),
    (dict(pp_local_batch=3), "a divisor of the 8 sequences each data-parallel rank takes per step .*nearest valid: 4, 8"),
    (dict(pp_local_batch=2), r"Schedule1F1B needs at least as many as stages; nearest valid: 4, 8"),
    (dict(pp_local_batch=6, global_batch=192, pp_virtual=2), "groups of --pp 4; nearest valid: 4, 8"),
    (dict(pp_local_batch=3, micro_batch=2, global_batch=128), "multiple of --micro-batch 2.*nearest valid: 8, 16"),
])
def test_invalid_local_batches_name_the_valid_ones(catalog, kw, message):
    with pytest.raises(UsageError, match=message):
        _setup(catalog, **kw)


def test_a_local_batch_need_not_be_a_multiple_of_pp_without_interleaving(catalog):
    s = _setup(catalog, pp_local_batch=6, global_batch=96)  # 12 per rank: 6 divides it, 6 >= 4 micro-batches
    assert (s.schedule_calls, s.schedule_microbatches) == (2, 6)


def test_advice_offers_the_whole_share_in_one_call(catalog):
    s = _setup(catalog, pp_local_batch=4, global_batch=512)
    advice = batch_advice(s)
    assert bubble_fraction(s) > BUBBLE_FLAG
    assert "--pp-local-batch 64 (the step's whole share in one call) brings it to 5%" in advice
    assert "--global-batch" not in advice  # the whole share alone is enough
    small = batch_advice(_setup(catalog, pp_local_batch=4))
    assert "--pp-local-batch 8" in small and "--global-batch 240 with --pp-local-batch 30" in small


def test_torchtitan_runs_the_calls_and_one_schedule_frameworks_refuse(catalog):
    s = _setup(catalog, pp_local_batch=4)
    fw, why = framework_for(s)
    assert fw == "torchtitan", why
    assert "--training.local_batch_size 4" in recipe_for(s, "torchtitan").config
    for name in ("megatron", "deepspeed"):
        fw, why = framework_for(s.with_(stack="automodel"), name)
        assert fw is None and "drop --pp-local-batch" in why and "--stack torchtitan" in why, (name, why)
    whole = _setup(catalog)
    assert "--training.local_batch_size 8" in recipe_for(whole, "torchtitan").config


def test_estimate_reports_the_calls(catalog):
    e = estimate_setup(_setup(catalog, pp_local_batch=4))
    assert (e.setup.pp_local_batch, e.setup.pp_schedule_calls) == (4, 2)
    assert estimate_setup(_setup(catalog)).setup.pp_schedule_calls == 1


def test_cli_flag():
    args = ["estimate", "--model", "llama-3.1-70b", "--gpu", "h100-80gb", "--gpus", "32", "--inter-node-gbps",
            "3200", "--pp", "4", "--stack", "torchtitan", "--micro-batch", "1", "--global-batch", "64",
            "--seq-len", "4096"]
    out = cli_run(*args, "--pp-local-batch", "4", "--json")
    assert out.returncode == 0, out.stderr
    setup = json.loads(out.stdout)["setup"]
    assert (setup["pp_local_batch"], setup["pp_schedule_calls"]) == (4, 2)
    text = cli_run(*args, "--pp-local-batch", "4")
    assert "2 pipeline schedule calls per step of local batch 4" in text.stdout
    bad = cli_run(*args, "--pp-local-batch", "5")
    assert bad.returncode == 2 and "nearest valid: 4, 8" in bad.stderr


def test_the_chosen_micro_batch_keeps_the_local_batch_runnable():
    """Without --micro-batch, estimate picks the largest that fits: only one that divides the local batch and
    leaves pp micro-batches a call (the review found micro-batch 8 for a local batch of 4: a division by zero)."""
    args = ["estimate", "--model", "llama-3.2-1b", "--gpu", "h100-80gb", "--gpus", "16", "--inter-node-gbps", "3200",
            "--pp", "4", "--stack", "torchtitan", "--global-batch", "128", "--seq-len", "1024", "--json"]
    for local in (4, 8):
        out = cli_run(*args, "--pp-local-batch", str(local))
        assert out.returncode == 0, out.stderr
        setup = json.loads(out.stdout)["setup"]
        assert local // setup["micro_batch"] >= 4 and local % setup["micro_batch"] == 0, setup
    free = json.loads(cli_run(*args).stdout)["setup"]
    assert free["micro_batch"] > 1  # without a local batch the same job takes a larger one


def test_micro_batch_allowed_is_what_resolve_accepts(catalog):
    for kw in (dict(pp_local_batch=4), dict(pp_local_batch=8, pp_virtual=2, global_batch=128), dict()):
        s = _setup(catalog, **kw)
        for mb in range(1, 9):
            try:
                _setup(catalog, **{**kw, "micro_batch": mb})
                accepted = True
            except UsageError:
                accepted = False
            assert s.micro_batch_allowed(mb) == accepted, (kw, mb)


def test_ddp_stages_all_reduce_once_per_call(catalog):
    c1, c2, c4 = (_setup(catalog, strategy="ddp", model="llama-3.1-8b", global_batch=128, pp_local_batch=b)
                  for b in (16, 8, 4))
    comm = [estimate_step(s).comm_s for s in (c1, c2, c4)]
    assert comm[2] - comm[1] == pytest.approx(2 * (comm[1] - comm[0]), rel=1e-6) and comm[1] > comm[0]


def test_a_saved_plan_does_not_carry_a_job_files_local_batch(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('schema_version = 1\nmodel = "llama-3.1-8b"\nstack = "torchtitan"\npp = 4\nglobal_batch = 64\n'
                   'pp_local_batch = 4\ntokens = 1e9\n')
    saved = tmp_path / "saved.toml"
    out = cli_run("plan", "--job", job, "--instances", "p5.48xlarge", "--max-nodes", "1", "--top", "1",
                  "--save", saved)
    assert out.returncode == 0, out.stderr
    assert "pp_local_batch" not in saved.read_text()
    assert cli_run("estimate", "--job", saved, "--json").returncode == 0


def test_another_pp_or_stack_on_the_command_line_drops_the_files_local_batch(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('schema_version = 1\nmodel = "llama-3.1-70b"\ngpu = "h100-80gb"\ngpus = 32\n'
                   'inter_node_gbps = 3200\nstack = "torchtitan"\npp = 4\nmicro_batch = 1\nglobal_batch = 64\n'
                   'seq_len = 4096\npp_local_batch = 4\n')
    kept = json.loads(cli_run("estimate", "--job", job, "--json").stdout)["setup"]
    assert kept["pp_schedule_calls"] == 2
    for extra in (("--pp", "2"), ("--stack", "megatron"), ("--pp", "1")):
        out = cli_run("estimate", "--job", job, *extra, "--json")
        assert out.returncode == 0, (extra, out.stderr)
        assert json.loads(out.stdout)["setup"]["pp_local_batch"] is None
