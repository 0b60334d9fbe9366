"""Impossible setups are usage errors that name the rule they break."""

import pytest

from trainready.errors import UsageError
from trainready.plan.job import JobSpec, load_job, save_job
from trainready.plan.presets import preset
from trainready.plan.setup import resolve


def job(**kw):
    base = dict(model="llama-2-13b", instance="p4d.24xlarge")
    base.update(kw)
    return JobSpec(**base)


@pytest.mark.parametrize("kw,words", [
    (dict(tp=3), "divide the number of attention heads"),
    (dict(instance="p5.48xlarge", model="llama-2-70b", tp=16, gpus=16), "must stay inside a node"),
    (dict(pp=3), "must divide the number of layers"),
    (dict(gpus=12), "not a whole number of nodes"),
    (dict(gpus_per_node=16), "more than p4d.24xlarge has"),
    (dict(micro_batch=3, global_batch=100), "not divisible by micro-batch 3 x data-parallel size 8"),
    (dict(instance="p3.16xlarge", precision="bf16"), "not supported on v100-16gb"),
    (dict(strategy="ddp", offload="optimizer"), "needs a ZeRO stage"),
    (dict(strategy="zero2", offload="optimizer+params"), "needs --strategy zero3"),
    (dict(instance=None, gpu=None), "no hardware given"),
    (dict(model=None), "no model given"),
    (dict(instance="a2-highgpu-8g", gpus=16), "give --inter-node-gbps"),
    (dict(model="gpt3-125m", seq_len=4096), "learned position table"),
    (dict(gpu="a100-80gb", instance="p4d.24xlarge"), "contradicts"),
])
def test_rule_named(catalog, kw, words):
    with pytest.raises(UsageError) as exc:
        resolve(job(**kw), catalog)
    assert words in str(exc.value)


def test_global_batch_error_gives_nearest_valid(catalog):
    with pytest.raises(UsageError) as exc:
        resolve(job(micro_batch=2, global_batch=100), catalog)
    assert "96" in str(exc.value) and "112" in str(exc.value)


@pytest.mark.parametrize("field,value", [("tp", 0), ("micro_batch", -1), ("tokens", 0), ("gpus", -8)])
def test_non_positive_values_rejected(field, value):
    with pytest.raises(ValueError):
        job(**{field: value})


def test_defaults_and_derived_values(catalog):
    s = resolve(job(gpus=16, micro_batch=2), catalog)
    assert (s.nodes, s.dp, s.strategy, s.precision, s.seq_len) == (2, 16, "zero3", "bf16", 4096)
    assert s.global_batch * s.seq_len >= 1_000_000 and s.global_batch % (2 * 16) == 0
    assert s.inter_node_gbps == 400
    v100 = resolve(job(instance="p3dn.24xlarge"), catalog)
    assert v100.precision == "fp16"


def test_job_file_round_trip(tmp_path, catalog):
    original = job(tokens=2e9, micro_batch=2, model_spec=preset("llama-2-13b"))
    path = tmp_path / "job.toml"
    save_job(original, path)
    text = path.read_text()
    assert "schema_version = 1" in text and 'kind = "trainready-job"' in text
    loaded = load_job(path)
    assert loaded == original
    assert resolve(loaded, catalog).model.param_count() == 13_015_864_320


def test_job_file_errors(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('schema_version = 1\nmicro_batch = "two"\n')
    with pytest.raises(UsageError, match="micro_batch"):
        load_job(path)
    path.write_text('schema_version = 99\n')
    with pytest.raises(UsageError, match="schema_version 99"):
        load_job(path)
    with pytest.raises(UsageError, match="cannot read"):
        load_job(tmp_path / "none.toml")
