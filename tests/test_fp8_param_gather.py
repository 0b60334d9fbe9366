"""FP8 parameter all-gather (--fp8-gather): where each stack has it, what its recipes default to, the bytes the
data-parallel gathers move, the flags the Megatron recipe writes, and the usage errors where it cannot apply."""

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan import performance as perf
from trainready.plan.job import JobSpec
from trainready.plan.memory import param_counts
from trainready.plan.recipes import megatron
from trainready.plan.setup import resolve

MEGATRON = dict(model="llama-3.1-70b", instance="p5.48xlarge", gpus=32, strategy="zero1", tp=4, pp=2,
                precision="fp8", stack="megatron")
TITAN = dict(model="llama-3.1-8b", instance="p5.48xlarge", gpus=16, strategy="zero3", precision="fp8",
             stack="torchtitan")


def _setup(catalog, **kw):
    return resolve(JobSpec(**kw), catalog)


@pytest.mark.parametrize("recipe, gathered", [("delayed", True), ("tensorwise", True), ("blockwise", False)])
def test_megatron_gathers_fp8_where_its_recipes_do(catalog, recipe, gathered):
    s = _setup(catalog, **MEGATRON, fp8_recipe=recipe)
    assert s.fp8_param_gather is gathered
    flags = dict(megatron.args(s))
    assert ("--fp8-param-gather" in flags) is gathered
    assert _setup(catalog, **MEGATRON, fp8_recipe=recipe, fp8_param_gather=False).fp8_param_gather is False


def test_mxfp8_weights_travel_in_bf16(catalog):
    # Megatron gathers MXFP8 weights through the gradient buffer viewed as bf16 (param_and_grad_buffer.py)
    b200 = {**MEGATRON, "instance": "p6-b200.48xlarge"}
    s = _setup(catalog, **b200, fp8_recipe="mxfp8")
    assert not s.fp8_param_gather and "--fp8-param-gather" not in dict(megatron.args(s))
    with pytest.raises(UsageError, match="only under --fp8-recipe delayed or tensorwise, not mxfp8"):
        _setup(catalog, **b200, fp8_recipe="mxfp8", fp8_param_gather=True)


def test_torchtitan_gathers_fp8_only_when_asked(catalog):
    assert _setup(catalog, **TITAN).fp8_param_gather is False  # torchtitan's float8 config: off by default
    assert _setup(catalog, **TITAN, fp8_param_gather=True).fp8_param_gather is True


@pytest.mark.parametrize("kw, said", [
    (dict(TITAN, fp8_recipe="rowwise"), "only under --fp8-recipe tensorwise, not rowwise"),
    (dict(MEGATRON, strategy="zero3"), "needs --strategy zero1, not zero3"),
    (dict(MEGATRON, precision="bf16"), "needs --precision fp8"),
    (dict(MEGATRON, stack="deepspeed", precision="bf16"), "stack deepspeed has no FP8 parameter all-gather"),
    (dict(MEGATRON, offload="optimizer", fp8_recipe="tensorwise"), "only under --fp8-recipe delayed"),
    (dict(TITAN, offload="optimizer"), "not modelled with --offload"),
    (dict(TITAN, method="lora"), "applies to full training"),
])
def test_asked_where_it_cannot_apply_names_the_rule(catalog, kw, said):
    with pytest.raises(UsageError) as err:
        _setup(catalog, **kw, fp8_param_gather=True)
    assert said in str(err.value) and "--no-fp8-gather" in str(err.value)
    assert _setup(catalog, **kw).fp8_param_gather is False  # not asked: the stack's recipe, off here


REAL_COLLECTIVE_S = perf.collective_s


def _gathers(s, monkeypatch) -> list[float]:
    sizes = []
    real = REAL_COLLECTIVE_S

    def spy(kind, nbytes, *a, **k):
        if kind == "allgather":
            sizes.append(nbytes)
        return real(kind, nbytes, *a, **k)

    monkeypatch.setattr(perf, "collective_s", spy)
    perf.estimate_step(s)
    return sizes


def test_the_gathers_move_one_byte_a_linear_weight(catalog, monkeypatch):
    for kw in (dict(MEGATRON, fp8_recipe="tensorwise"), dict(TITAN, fp8_param_gather=True)):
        on = _setup(catalog, **kw)
        off = _setup(catalog, **{**kw, "fp8_param_gather": False})
        pc = param_counts(on)
        params = pc.trainable if on.strategy == "zero1" else pc.local
        linear = params - pc.embed - pc.expert
        assert sorted(set(_gathers(on, monkeypatch))) == [pytest.approx(linear + 2 * (params - linear))]
        assert sorted(set(_gathers(off, monkeypatch))) == [pytest.approx(2 * params)]
        assert perf.estimate_step(on).comm_s < perf.estimate_step(off).comm_s


def test_estimate_reports_it_and_refuses_it_with_exit_2():
    args = ["estimate", "--model", "llama-3.1-8b", "--instance", "p5.48xlarge", "--strategy", "zero3",
            "--precision", "fp8", "--stack", "torchtitan"]
    out = json.loads(cli_run(*args, "--fp8-gather", "--json").stdout)
    assert out["setup"]["fp8_param_gather"] is True
    assert json.loads(cli_run(*args, "--json").stdout)["setup"]["fp8_param_gather"] is False
    human = cli_run(*args, "--fp8-gather")
    assert human.returncode == 0 and "weights gathered in FP8" in human.stdout
    bad = cli_run(*args, "--fp8-gather", "--fp8-recipe", "rowwise")
    assert bad.returncode == 2 and "--fp8-recipe tensorwise" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr


def test_moe_experts_keep_their_bytes(catalog, monkeypatch):
    kw = dict(model="mixtral-8x7b", instance="p5.48xlarge", gpus=32, ep=8, strategy="zero3", precision="fp8",
              stack="torchtitan")
    on = _setup(catalog, **kw, fp8_param_gather=True)
    pc = param_counts(on)
    assert pc.expert > 0.5 * pc.local  # torchao converts nn.Linear only: the grouped experts stay bf16
    on_sizes, off_sizes = _gathers(on, monkeypatch), _gathers(_setup(catalog, **kw), monkeypatch)
    assert len(on_sizes) == len(off_sizes) == 2  # the dense share over dp, the experts' over expert-dp
    assert on_sizes[1] == pytest.approx(off_sizes[1]) == pytest.approx(2 * pc.expert)
    assert off_sizes[0] - on_sizes[0] == pytest.approx(pc.local - pc.embed - pc.expert)  # a byte saved a weight


def test_plan_refuses_it_where_no_searched_strategy_gives_it(tmp_path):
    base = ["plan", "--model", "llama-3.1-8b", "--tokens", "2e9", "--instances", "p5.48xlarge"]
    for extra, said in ((["--fp8-gather"], "stack hf-trainer has no FP8 parameter all-gather"),
                        (["--fp8-gather", "--stack", "megatron"], "needs --precision fp8"),
                        (["--fp8-gather", "--precision", "fp8", "--stack", "megatron", "--fp8-recipe", "blockwise"],
                         "not blockwise")):
        r = cli_run(*base, *extra)
        assert r.returncode == 2 and said in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr


def test_a_job_files_gather_gives_way_to_a_restated_strategy(tmp_path):
    job = tmp_path / "j.toml"
    job.write_text('schema_version = 1\nmodel = "llama-3.1-70b"\ninstance = "p5.48xlarge"\ngpus = 32\n'
                   'strategy = "zero1"\ntp = 4\npp = 2\nprecision = "fp8"\nstack = "megatron"\n'
                   'fp8_param_gather = true\n')
    ok = cli_run("estimate", "--job", str(job), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["setup"]["fp8_param_gather"] is True
    moved = cli_run("estimate", "--job", str(job), "--strategy", "zero3", "--json")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert json.loads(moved.stdout)["setup"]["fp8_param_gather"] is False
    asked = cli_run("estimate", "--job", str(job), "--strategy", "zero3", "--fp8-gather")
    assert asked.returncode == 2 and "needs --strategy zero1" in asked.stdout + asked.stderr
