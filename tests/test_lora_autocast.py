"""PEFT's fp32 LoRA adapters under torch.autocast (the Trainer's bf16=True): each adapter still copies its input to
fp32, but autocast casts that copy back to bf16 for the adapter's matmul, and the bf16 cast is what autograd saves
(Setup.autocast, Setup.lora_copy_bytes). Measured here through transformers, PEFT and torch's own autocast on CPU,
whose casting policy for linear layers is the CUDA one (lower precision)."""

from __future__ import annotations

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan import efficiency as eff
from trainready.plan.activations import layer_bytes_per_token
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.model_spec import ModelSpec
from trainready.plan.performance import _adapter_time
from trainready.plan.setup import resolve


@pytest.mark.parametrize("targets, ours", [(["q_proj", "v_proj"], ["q", "v"]), ("all-linear", None)])
def test_autocast_saves_the_bf16_cast_of_each_adapter_copy(targets, ours):
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from lora_fsdp_probe import F, H, LAYERS, RANK, peft_llama, per_token_layer

    model = peft_llama(targets)
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    measured = per_token_layer(model, False) - per_token_layer(model, True)
    spec = ModelSpec(name="tiny", vocab_size=128, hidden_size=H, num_layers=LAYERS, num_heads=8, num_kv_heads=2,
                     ffn_hidden_size=F)
    kw = dict(kernels="eager", residual_bytes=2, act_bytes=2, method="lora", lora_targets=ours)
    modelled = (layer_bytes_per_token(spec, **kw, adapter_copy_bytes=4)
                - layer_bytes_per_token(spec, **kw, adapter_copy_bytes=2))
    # the model leaves out the rank-r intermediates (lora_B's input: 2 bytes more per rank element without autocast)
    adapters = len(ours) if ours else 7
    assert measured == pytest.approx(modelled + 2 * RANK * adapters, rel=1e-9)
    assert modelled == 2 * sum(din for din, _ in spec.linear_layer_dims(ours))


def test_fsdp_mixed_precision_gathers_the_adapters_in_bf16_so_they_copy_nothing():
    """Under FSDP2 with param_dtype bf16 (accelerate's FSDP plugin, the Trainer's default version) PEFT's fp32
    adapters are gathered in bf16 for the forward, so they read the model's own tensors, autocast or not: measured in
    a process of its own (tests/lora_fsdp_probe.py, one gloo rank on CPU), against the copies of a plain model."""
    for module in ("torch", "peft", "transformers"):
        pytest.importorskip(module)
    import subprocess
    import sys
    from pathlib import Path
    probe = Path(__file__).with_name("lora_fsdp_probe.py")
    r = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    spec = ModelSpec(name="tiny", vocab_size=128, hidden_size=got["hidden"], num_layers=2, num_heads=8, num_kv_heads=2,
                     ffn_hidden_size=got["ffn"])
    kw = dict(kernels="eager", residual_bytes=2, act_bytes=2, method="lora")
    fp32, cast, none = (layer_bytes_per_token(spec, **kw, fp32_adapters=c > 0, adapter_copy_bytes=c) for c in (4, 2, 0))
    plain_fp32, plain_autocast = got["plain"]
    fsdp_fp32, fsdp_autocast = got["fsdp"]
    assert fsdp_fp32 == fsdp_autocast  # gathered in bf16: autocast has nothing left to cast
    assert plain_autocast - fsdp_autocast == pytest.approx(cast - none, rel=1e-12)
    # without autocast lora_B's input is fp32 too: 2 bytes more per rank element, which the model leaves out
    assert plain_fp32 - fsdp_fp32 == pytest.approx(fp32 - none + 2 * got["rank"] * 7, rel=1e-12)


def test_fsdp_rows_count_no_copies_and_say_the_flag_changes_nothing(catalog):
    for strategy in ("zero2", "zero3"):  # FSDP's two sharding forms, outside DeepSpeed
        s = _lora(catalog, strategy=strategy)
        assert s.on_fsdp and s.lora_copy_bytes == 0 and s.autocast_ignored is None
        asked = _lora(catalog, strategy=strategy, autocast=False)
        assert asked.lora_copy_bytes == 0 and "--no-autocast changes nothing here: FSDP" in asked.autocast_ignored
    assert _lora(catalog, strategy="ddp").lora_copy_bytes == 2  # DDP keeps the parameters as they are
    assert _lora(catalog, strategy="zero2").with_(runs_on="deepspeed").lora_copy_bytes == 0  # DeepSpeed's cast
    # torchtitan's own LoRA (components/lora.py) runs lora_b(lora_a(input)) on the base input, under FSDP2's policy
    assert _lora(catalog, stack="torchtitan", strategy="ddp").lora_copy_bytes == 0


def _lora(catalog, **kw):
    base = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, method="lora", micro_batch=1, global_batch=32,
                seq_len=4096, precision="bf16", activation_checkpointing="none", strategy="ddp")
    return resolve(JobSpec(**{**base, **kw}), catalog)


def test_who_autocasts_and_what_each_adapter_keeps(catalog):
    trainer = _lora(catalog)  # the default stack, hf-trainer: the Trainer's bf16=True
    assert trainer.autocast and trainer.lora_copy_bytes == 2
    assert not _lora(catalog, autocast=False).autocast and _lora(catalog, autocast=False).lora_copy_bytes == 4
    assert _lora(catalog, method="qlora").lora_copy_bytes == 0  # bitsandbytes hands the adapters the bf16 input
    assert _lora(catalog, method="qlora", autocast=False).lora_copy_bytes == 4
    assert not _lora(catalog, stack="deepspeed").autocast  # accelerate runs no autocast under DeepSpeed
    assert not trainer.with_(runs_on="deepspeed").autocast  # nor on the default stack's DeepSpeed rows
    assert _lora(catalog, stack="deepspeed").lora_copy_bytes == 0  # and its engine casts the adapters to bf16
    assert _lora(catalog, stack="deepspeed", strategy="zero3").lora_copy_bytes == 4  # ZeRO-Init leaves them fp32
    # asked on the default stack, autocast does not reach a row DeepSpeed runs, and the row says so
    asked = _lora(catalog, autocast=True, strategy="zero3").with_(runs_on="deepspeed")
    assert not asked.autocast and asked.lora_copy_bytes == 4 and "--autocast not applied" in asked.autocast_ignored
    assert _lora(catalog, autocast=True).autocast_ignored is None
    assert _lora(catalog, stack="megatron").lora_copy_bytes == 0  # adapters in the model's dtype
    assert not _lora(catalog, precision="fp32").autocast  # nothing lower to autocast to
    # the memory follows: 2 bytes less per element of every adapter's input, nothing else
    inputs = sum(din for din, _ in trainer.model.linear_layer_dims(None))
    delta = estimate_memory(_lora(catalog, autocast=False)).activations - estimate_memory(trainer).activations
    assert delta == pytest.approx(2 * inputs * trainer.model.num_layers * 4096, rel=1e-9)


@pytest.mark.parametrize("kw, said", [
    (dict(method="full", autocast=True), "for full training, mixed precision is --optimizer-dtype"),
    (dict(stack="megatron", autocast=False), "stack megatron keeps its LoRA adapters in the model's dtype"),
    (dict(stack="automodel", autocast=True), "stack automodel keeps its LoRA adapters in the model's dtype"),
    (dict(stack="torchtitan", autocast=True), "stack torchtitan keeps its LoRA adapters in the model's dtype"),
    (dict(stack="deepspeed", autocast=True), "DeepSpeed runs no autocast"),
    (dict(precision="fp32", autocast=True), "an fp32 job has no lower precision"),
])
def test_autocast_where_it_can_change_nothing_is_a_usage_error(catalog, kw, said):
    with pytest.raises(UsageError, match=said):
        _lora(catalog, **kw)


def test_without_sequence_parallelism_tp_ranks_keep_the_column_adapters_copies_whole(catalog):
    """hf-trainer's TP (no sequence parallelism) leaves the column-parallel adapters' inputs whole on every rank
    (activations.tp_replicated_bytes_per_token): their copies shrink by 2 bytes under autocast on every rank, the
    row-parallel ones' (o, down: split inputs) by 2 / tp."""
    from trainready.plan.activations import _adapter_inputs
    kw = dict(tp=2, gpus=8, strategy="ddp")
    on, off = _lora(catalog, **kw), _lora(catalog, **kw, autocast=False)
    m = on.model
    whole = sum(_adapter_inputs(m, None, whole_only=True).values())
    every = sum(_adapter_inputs(m, None).values())
    per_rank = 2 * (whole + (every - whole) / 2)
    delta = estimate_memory(off).activations - estimate_memory(on).activations
    assert delta == pytest.approx(per_rank * m.num_layers * 4096, rel=1e-9)


def test_autocast_adapters_matmul_in_bf16(catalog):
    s, fp32 = _lora(catalog), _lora(catalog, autocast=False)
    e = eff.arch_efficiency("hopper")
    peak = s.gpu.peak_tflops("bf16") * 1e12
    fwd, bwd, flops = _adapter_time(s, 4096, peak, e)
    dims = s.model.linear_layer_dims(None)
    ins, outs = sum(i for i, _ in dims), sum(o for _, o in dims)
    hbm = s.gpu.hbm_gbps * 1e9 * e.memory
    rate = peak * e.gemm * 0.5
    assert fwd == pytest.approx(flops / 3 / rate + 4096 * (12 * ins + 10 * outs) / hbm, rel=1e-12)
    assert bwd == pytest.approx(2 * flops / 3 / rate + 4096 * (18 * ins + 15 * outs) / hbm, rel=1e-12)
    assert sum(_adapter_time(fp32, 4096, peak, e)[:2]) > fwd + bwd  # fp32 matmuls at the fp32 peak are slower


def test_autocast_is_said_and_refused_where_it_means_nothing(catalog, tmp_path):
    # trainready's recipe runs LoRA through DeepSpeed (ZeRO-3 here: ZeRO-Init leaves PEFT's adapters fp32), with no
    # autocast, asked or not: a warning says so
    for asked in ((), ("--autocast",)):
        r = cli_run("estimate", "-m", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "1", "--method", "lora", *asked,
                    "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout)
        setup = out["setup"]
        assert setup["framework"] == "deepspeed" and setup["strategy"] == "zero3"
        assert setup["autocast"] is False and setup["lora_input_copy_bytes"] == 4
        assert any("--autocast not applied" in w for w in out["warnings"]) == bool(asked)
    # a loop no recipe of trainready's runs (DeepSpeed's takes no selective recompute) takes it, and the text says
    # what it assumed
    loop = ("estimate", "-m", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "1", "--method", "lora", "--stack",
             "hf-trainer", "--strategy", "ddp", "--activation-checkpointing", "selective")
    setup = json.loads(cli_run(*loop, "--autocast", "--json").stdout)["setup"]
    assert setup["framework"] is None and setup["autocast"] is True and setup["lora_input_copy_bytes"] == 2
    text = " ".join(cli_run(*loop, "--autocast").stdout.split())
    assert "PEFT's fp32 adapters under autocast" in text and "--no-autocast for a loop without autocast" in text
    text = " ".join(cli_run(*loop, "--no-autocast").stdout.split())
    assert "PEFT's fp32 adapters without autocast" in text and "--autocast if the loop runs under autocast" in text
    full = json.loads(cli_run("estimate", "-m", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--json").stdout)
    assert full["setup"]["autocast"] is None and full["setup"]["lora_input_copy_bytes"] is None
    for cmd in (("estimate", "--gpu", "h100-80gb", "--gpus", "8"), ("plan", "--tokens", "1e9")):
        r = cli_run(*cmd, "-m", "llama-3-8b", "--no-autocast")
        assert r.returncode == 2 and "--no-autocast" in r.stdout + r.stderr and "--method lora" in r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
    with pytest.raises(UsageError, match="--autocast"):
        _lora(catalog, method="full", autocast=True)
    # a job file's autocast belonged to its LoRA: --method full on top of it drops it
    job = tmp_path / "job.toml"
    r = cli_run(*loop, "--autocast", "--save", str(job))
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli_run("estimate", "--job", str(job), "--method", "full", "--json")
    assert "autocast" not in r.stderr and json.loads(r.stdout)["setup"]["autocast"] is None
    r = cli_run("estimate", "--job", str(job), "--json")
    assert json.loads(r.stdout)["setup"]["lora_input_copy_bytes"] == 2
