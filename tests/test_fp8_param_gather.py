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
    assert "--reuse-grad-buf-for-mxfp8-param-ag" not in flags
    assert _setup(catalog, **MEGATRON, fp8_recipe=recipe, fp8_param_gather=False).fp8_param_gather is False


def test_mxfp8_gathers_with_its_buffer_reuse(catalog):
    s = _setup(catalog, **{**MEGATRON, "instance": "p6-b200.48xlarge"}, fp8_recipe="mxfp8")
    flags = dict(megatron.args(s))
    assert s.fp8_param_gather and "--fp8-param-gather" in flags and "--reuse-grad-buf-for-mxfp8-param-ag" in flags


def test_torchtitan_gathers_fp8_only_when_asked(catalog):
    assert _setup(catalog, **TITAN).fp8_param_gather is False  # torchtitan's float8 config: off by default
    assert _setup(catalog, **TITAN, fp8_param_gather=True).fp8_param_gather is True


@pytest.mark.parametrize("kw, said", [
    (dict(TITAN, fp8_recipe="rowwise"), "only under --fp8-recipe tensorwise, not rowwise"),
    (dict(MEGATRON, strategy="zero3"), "needs --strategy zero1, not zero3"),
    (dict(MEGATRON, precision="bf16"), "needs --precision fp8"),
    (dict(MEGATRON, stack="deepspeed", precision="bf16"), "stack deepspeed has no FP8 parameter all-gather"),
    (dict(MEGATRON, offload="optimizer", fp8_recipe="tensorwise"), "only under --fp8-recipe delayed"),
])
def test_asked_where_it_cannot_apply_names_the_rule(catalog, kw, said):
    with pytest.raises(UsageError) as err:
        _setup(catalog, **kw, fp8_param_gather=True)
    assert said in str(err.value) and "--no-fp8-gather" in str(err.value)
    assert _setup(catalog, **kw).fp8_param_gather is False  # not asked: the stack's recipe, off here


def _gathers(s, monkeypatch) -> list[float]:
    sizes = []
    real = perf.collective_s

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
        linear = params - pc.embed
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
