"""--lora-dropout: what dropout on the adapters saves and moves, where each stack puts it (PEFT, Megatron-Bridge:
on the adapter's input; NeMo AutoModel: on its output), and the usage errors."""

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan import efficiency as eff
from trainready.plan.activations import (
    layer_bytes_per_token,
    lora_dropout_elements,
    tp_replicated_bytes_per_token,
)
from trainready.plan.job import JobSpec
from trainready.plan.lora_targets import check_dropout
from trainready.plan.memory import estimate_memory
from trainready.plan.performance import _adapter_time, estimate_step
from trainready.plan.presets import preset
from trainready.plan.recipes import recipe_for
from trainready.plan.setup import resolve

LLAMA = preset("llama-3-8b")
D, Q, KV, F = 4096, 4096, 1024, 14336  # Llama 3 8B: hidden, q, k/v and MLP widths
INPUTS = 3 * D + Q + 2 * D + F  # q, k, v, o, gate, up, down: each adapter's input, one per module
OUTPUTS = Q + 2 * KV + D + 2 * F + D


def lora(catalog, **kw):
    # DDP: PEFT's fp32 adapters keep their copies (FSDP and DeepSpeed gather or cast them in bf16)
    base = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, method="lora", micro_batch=1, global_batch=32,
                seq_len=4096, precision="bf16", activation_checkpointing="none", strategy="ddp")
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


def test_elements_follow_the_position_the_targets_and_fused_modules():
    assert lora_dropout_elements(LLAMA, None, "pre") == INPUTS
    assert lora_dropout_elements(LLAMA, None, "post") == OUTPUTS
    # Megatron-Core: linear_qkv and linear_fc1 each drop their one input once
    assert lora_dropout_elements(LLAMA, None, "pre", fused_modules=True) == D + Q + D + F
    assert lora_dropout_elements(LLAMA, ("q", "v"), "pre") == 2 * D
    assert lora_dropout_elements(LLAMA, ("q", "v"), "pre", fused_modules=True) == D
    assert lora_dropout_elements(LLAMA, ("q", "v"), "post") == Q + KV
    # whole on every TP rank without sequence parallelism: the column-parallel adapters' inputs (q, k, v, gate, up),
    # the row-parallel ones' outputs (o, down)
    assert lora_dropout_elements(LLAMA, None, "pre", whole_only=True) == 5 * D
    assert lora_dropout_elements(LLAMA, None, "post", whole_only=True) == 2 * D
    dsv3 = preset("deepseek-v3")  # latent attention: q_b and kv_b read the latents, whole on every rank too
    a = dsv3.mla
    assert lora_dropout_elements(dsv3, ("q_b", "kv_b", "o"), "pre", whole_only=True) == a.q_lora_rank + a.kv_lora_rank


@pytest.mark.parametrize("at, fp32_adapters, fused, per_token", [
    ("pre", True, False, 1 * INPUTS),  # PEFT: the dropped fp32 copy replaces the one lora_A saved; + its mask
    ("pre", False, False, 3 * INPUTS),  # adapters in bf16: a dropped copy of their own (2 bytes) and the mask
    ("pre", False, True, 3 * (D + Q + D) + F),  # Megatron: once per fused module; linear_fc2's copy replaces the
    # activation output only its adapter kept (TE saves no input for a frozen weight): its mask alone
    ("post", False, False, 1 * OUTPUTS),  # AutoModel: the mask on the adapter's output
])
def test_saved_bytes_per_token(at, fp32_adapters, fused, per_token):
    kw = dict(kernels="eager", residual_bytes=2, act_bytes=2, method="lora", fp32_adapters=fp32_adapters,
              lora_fused_modules=fused)
    assert layer_bytes_per_token(LLAMA, **kw, lora_dropout=at) - layer_bytes_per_token(LLAMA, **kw) == per_token
    full = dict(kw, method="full")  # full training has no adapters, so no adapter dropout
    assert layer_bytes_per_token(LLAMA, **full, lora_dropout=at) == layer_bytes_per_token(LLAMA, **full)


def test_tp_without_sequence_parallelism_keeps_the_hidden_inputs_masks_whole():
    kw = dict(kernels="eager", residual_bytes=2, act_bytes=2, method="lora", fp32_adapters=True)
    pre = tp_replicated_bytes_per_token(LLAMA, **kw, lora_dropout="pre") - tp_replicated_bytes_per_token(LLAMA, **kw)
    assert pre == 5 * D  # q, k, v, gate, up read the hidden size: their masks on every TP rank
    post = tp_replicated_bytes_per_token(LLAMA, **kw, lora_dropout="post") - tp_replicated_bytes_per_token(LLAMA, **kw)
    assert post == 2 * D  # o and down: row-parallel, their adapters' outputs whole rows


@pytest.mark.parametrize("stack, at", [(None, "pre"), ("megatron", "pre"), ("automodel", "post")])
def test_each_stack_puts_dropout_where_its_framework_does(catalog, stack, at):
    s = lora(catalog, stack=stack, lora_dropout=0.05)
    assert s.lora_dropout_at == at
    none = lora(catalog, stack=stack)
    assert none.lora_dropout_at is None and lora(catalog, stack=stack, lora_dropout=0.0).lora_dropout_at is None
    assert estimate_memory(s).activations > estimate_memory(none).activations
    assert estimate_step(s).step_s > estimate_step(none).step_s


def test_the_memory_delta_is_the_masks_and_copies_of_the_micro_batch(catalog):
    for stack, per_token in ((None, INPUTS), ("automodel", OUTPUTS), ("megatron", 3 * (D + Q + D) + F)):
        with_, without = lora(catalog, stack=stack, lora_dropout=0.1), lora(catalog, stack=stack)
        delta = estimate_memory(with_).activations - estimate_memory(without).activations
        assert delta == pytest.approx(per_token * LLAMA.num_layers * 4096, rel=1e-9), stack


def test_the_time_is_the_dropped_bytes_both_ways(catalog):
    s, none = lora(catalog, lora_dropout=0.05), lora(catalog)
    e = eff.arch_efficiency(s.gpu.arch)
    peak = s.gpu.peak_tflops("bf16") * 1e12
    tokens = s.micro_batch * s.seq_len
    fwd, bwd, flops = _adapter_time(s, tokens, peak, e)
    fwd0, bwd0, flops0 = _adapter_time(none, tokens, peak, e)
    moved = tokens * (2 * 4 + 1) * INPUTS / (s.gpu.hbm_gbps * 1e9 * e.memory)  # PEFT drops its fp32 copy
    assert fwd - fwd0 == pytest.approx(moved) and bwd - bwd0 == pytest.approx(moved)
    assert flops == flops0  # dropout is no FLOP the MFU counts


def test_without_sequence_parallelism_the_time_follows_the_whole_inputs(catalog):
    s, none = lora(catalog, tp=4, lora_dropout=0.05), lora(catalog, tp=4)  # PEFT under TP: no sequence parallelism
    e = eff.arch_efficiency(s.gpu.arch)
    peak = s.gpu.peak_tflops("bf16") * 1e12
    tokens = s.micro_batch * s.seq_len
    per_rank = 5 * D + (INPUTS - 5 * D) / 4  # q, k, v, gate, up whole; o and down split
    moved = tokens * 9 * per_rank / (s.gpu.hbm_gbps * 1e9 * e.memory)
    assert _adapter_time(s, tokens, peak, e)[0] - _adapter_time(none, tokens, peak, e)[0] == pytest.approx(moved)


def test_dropout_with_full_training_is_refused_and_zero_is_none():
    with pytest.raises(UsageError, match="--method lora"):
        check_dropout(0.1, "full")
    assert check_dropout(0.0, "full") == 0.0
    assert check_dropout(0.05, "qlora") == 0.05


def test_peft_recipe_says_the_dropout(catalog):
    s = lora(catalog, strategy="zero3", lora_dropout=0.05, lora_targets=["q_proj", "v_proj"])
    assert "target_modules=['q_proj', 'v_proj'], lora_dropout=0.05, ...)" in " ".join(recipe_for(s, "deepspeed").notes)
    assert "lora_dropout" not in " ".join(recipe_for(lora(catalog, strategy="zero3"), "deepspeed").notes)
    close = lora(catalog, strategy="zero3", lora_dropout=0.9999999)  # said as given, never rounded to 1
    assert "lora_dropout=0.9999999," in " ".join(recipe_for(close, "deepspeed").notes)


ARGS = ("estimate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--method", "lora",
        "--global-batch", "32", "--seq-len", "4096")


def test_cli_json_table_and_job_round_trip(tmp_path):
    out = cli_run(*ARGS, "--lora-dropout", "0.05", "--json")
    assert out.returncode == 0, out.stderr
    setup = json.loads(out.stdout)["setup"]
    assert (setup["lora_dropout"], setup["lora_dropout_position"]) == (0.05, "pre")
    auto = json.loads(cli_run(*ARGS, "--lora-dropout", "0.1", "--stack", "automodel", "--json").stdout)["setup"]
    assert auto["lora_dropout_position"] == "post"
    plain = json.loads(cli_run(*ARGS, "--json").stdout)["setup"]
    assert plain["lora_dropout"] is None and plain["lora_dropout_position"] is None
    assert "lora r=16, dropout 0.05" in cli_run(*ARGS, "--lora-dropout", "0.05").stdout
    job = tmp_path / "job.toml"
    assert cli_run(*ARGS, "--lora-dropout", "0.05", "--save", job).returncode == 0
    assert json.loads(cli_run("estimate", "--job", job, "--json").stdout)["setup"]["lora_dropout"] == 0.05
    full = cli_run("estimate", "--job", job, "--method", "full", "--json")  # the file's dropout goes with its LoRA
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout)["setup"]["lora_dropout"] is None


@pytest.mark.parametrize("value, said", [("1", "below 1"), ("-0.1", "at least 0"), ("nan", "finite"),
                                         ("0.1 --method full", "--method lora")])
def test_cli_bad_dropout_exits_2(value, said):
    first, *rest = value.split()
    out = cli_run(*ARGS, "--lora-dropout", first, *rest)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
