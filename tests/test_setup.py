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
    (dict(pp=41), "is more than the 40 layers"),
    (dict(gpus=12), "not a whole number of nodes"),
    (dict(gpus_per_node=16), "more than p4d.24xlarge has"),
    (dict(micro_batch=3, global_batch=100), "not divisible by micro-batch 3 x data-parallel size 8"),
    (dict(instance="p3.16xlarge", precision="bf16"), "not supported on v100-16gb"),
    (dict(strategy="ddp", offload="optimizer"), "needs a ZeRO stage"),
    (dict(strategy="zero2", offload="optimizer+params"), "needs --strategy zero3"),
    (dict(instance=None, gpu=None), "no hardware given"),
    (dict(model=None), "no model given"),
    (dict(instance="gpu_8x_h100_sxm5", gpus=16), "give --inter-node-gbps"),
    (dict(model="gpt3-125m", seq_len=4096), "learned position table"),
    (dict(gpu="a100-80gb", instance="p4d.24xlarge"), "contradicts"),
])
def test_rule_named(catalog, kw, words):
    with pytest.raises(UsageError) as exc:
        resolve(job(**kw), catalog)
    assert words in str(exc.value)


@pytest.mark.parametrize("micro,batch,nearest", [
    (2, 100, "nearest valid: 96 or 112"),
    (1, 3, "nearest valid: 8"),  # below the smallest valid batch: one suggestion, not "8 or 8"
    (1, 30, "nearest valid: 24 or 32"),
])
def test_global_batch_error_gives_the_distinct_nearest_valid_values(catalog, micro, batch, nearest):
    with pytest.raises(UsageError) as exc:
        resolve(job(micro_batch=micro, global_batch=batch), catalog)
    assert str(exc.value).endswith(nearest)


@pytest.mark.parametrize("field,value", [
    ("tp", 0), ("micro_batch", -1), ("tokens", 0), ("gpus", -8),
    ("tokens", float("inf")), ("tokens", float("nan")), ("params", float("inf")), ("usd_per_hour", float("nan")),
    ("inter_node_gbps", float("inf")), ("seq_len", 10**20), ("global_batch", 2**40), ("gpus", 10**12),
])
def test_values_no_run_can_have_are_rejected(field, value):
    with pytest.raises(ValueError):
        job(**{field: value})


@pytest.mark.parametrize("text,words", [
    ("", "is empty: a job spec starts with schema_version = 1"),
    ("\n# just a comment\n", "is empty: a job spec starts with schema_version = 1"),
    ('model = "llama-2-7b"\n', "has no schema_version: a job spec starts with schema_version = 1"),
    ('schema_version = 1\nkind = "trainready-run"\n', "kind 'trainready-run' is not a job spec"),
    ("schema_version = 1\ntokens = inf\n", "field 'tokens': Input should be a finite number"),
    ("schema_version = 1\ntokens = nan\n", "field 'tokens': Input should be a finite number"),
    ("schema_version = 1\ngpus = true\n", "field 'gpus': Input should be a valid integer"),  # not 1 GPU
    ('schema_version = 1\ntp = "2"\n', "field 'tp': Input should be a valid integer"),
    ("schema_version = 1\nusd_per_hour = 1e300\n", "field 'usd_per_hour': Input should be less than or equal to 10000"),
    ('schema_version = 1\n[model_spec]\nname = "x"\nvocab_size = 32000\nhidden_size = 4096\nnum_layers = true\n'
     'num_heads = 32\nnum_kv_heads = 32\nffn_hidden_size = 11008\n',
     "field 'model_spec.num_layers': Input should be a valid integer"),
    ('schema_version = 1\n[model_spec]\nname = "x\\u001b[2J"\nvocab_size = 32000\nhidden_size = 4096\nnum_layers = 32\n'
     'num_heads = 32\nnum_kv_heads = 32\nffn_hidden_size = 11008\n',
     "field 'model_spec.name': 'x\\x1b[2J' holds a control"),
])
def test_job_file_that_is_not_a_job_says_what_is_missing(tmp_path, text, words):
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as exc:
        load_job(path)
    assert str(path) in str(exc.value) and words in str(exc.value)
    assert "None" not in str(exc.value)


@pytest.mark.parametrize("content,words", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\xd0\xff", "is not a text file (byte 10 is not UTF-8): is it the right file?"),
    (b"\x89PNG\r\n\x1a\n", "is not a text file (byte 0 is not UTF-8): is it the right file?"),
])
def test_binary_job_file_is_refused_naming_it(tmp_path, content, words):
    path = tmp_path / "job.toml"
    path.write_bytes(content)
    with pytest.raises(UsageError) as exc:
        load_job(path)
    assert str(exc.value) == f"job file {path} {words}"


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
