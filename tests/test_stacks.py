"""Stacks by name, op-level selective checkpointing, QLoRA dequantization and CPU-Adam offload."""

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan.activations import op_sac_bytes_per_token, op_sac_matmuls
from trainready.plan.estimate import estimate_setup
from trainready.plan.job import JobSpec, load_job, save_job
from trainready.plan.memory import estimate_memory
from trainready.plan.model_spec import ModelSpec
from trainready.plan.performance import cpu_adam_s, estimate_step, host_cpu_cores
from trainready.plan.presets import preset
from trainready.plan.setup import resolve
from trainready.plan.stacks import DEFAULT_STACK, STACKS, checkpointing_kind, get_stack, resolve_stack


def cli(*args, cwd=None):
    proc = cli_run(*args, cwd=cwd)  # in this process
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return proc


def job(**kw) -> JobSpec:
    base = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, strategy="fsdp", micro_batch=2, global_batch=16,
                seq_len=8192)
    return JobSpec(**{**base, **kw})


# --- presets and resolution -------------------------------------------------------------
def test_every_preset_is_complete_and_sourced():
    assert {"torchtitan", "megatron", "deepspeed", "hf-trainer", "llm-foundry-2023"} <= set(STACKS)
    for st in STACKS.values():
        assert st.kernels in ("eager", "fused") and st.attention_kernel in ("sdpa", "flash2", "flash1")
        assert st.reduce_dtype in ("fp32", "bf16") and st.selective in ("op", "attention", None)
        assert len(st.source) > 40 and st.description
    assert STACKS["torchtitan"].selective == "op" and STACKS["megatron"].selective == "attention"


def test_default_stack_is_the_planner_defaults_before_stacks(catalog):
    st = get_stack(None)
    assert st.name == DEFAULT_STACK == "hf-trainer"
    assert (st.kernels, st.attention_kernel, st.reduce_dtype) == ("eager", "sdpa", "fp32")
    s = resolve(job(), catalog)
    assert (s.stack, s.stack_named, s.kernels, s.attention_kernel, s.reduce_dtype) == \
        ("hf-trainer", False, "eager", "sdpa", "fp32")
    # the same numbers as the flags spelled out
    spelled = resolve(job(kernels="eager", attention_kernel="sdpa", reduce_dtype="fp32"), catalog)
    assert estimate_step(s).step_s == estimate_step(spelled).step_s


def test_stack_sets_values_and_explicit_flags_win(catalog):
    s = resolve(job(stack="megatron"), catalog)
    assert (s.kernels, s.reduce_dtype, s.stack, s.stack_named) == ("fused", "fp32", "megatron", True)
    s = resolve(job(stack="deepspeed"), catalog)
    assert s.reduce_dtype == "bf16"
    s = resolve(job(stack="megatron", kernels="eager", reduce_dtype="bf16"), catalog)
    assert (s.kernels, s.reduce_dtype) == ("eager", "bf16")
    r = resolve_stack("megatron", kernels="eager")
    assert r.overridden == ("kernels",) and "set explicitly" in r.describe(named=True)
    assert "the default" in resolve_stack(None).describe(named=False)


def test_selective_means_the_stacks_kind(catalog):
    assert resolve(job(stack="torchtitan", activation_checkpointing="selective"), catalog).checkpointing \
        == "selective-op"
    assert resolve(job(stack="megatron", activation_checkpointing="selective"), catalog).checkpointing \
        == "selective-attn"
    assert resolve(job(stack="torchtitan", activation_checkpointing="selective-attn"), catalog).checkpointing \
        == "selective-attn"
    assert resolve(job(activation_checkpointing="selective"), catalog).checkpointing == "selective-op"
    with pytest.raises(UsageError, match="no selective activation checkpointing.*selective-op"):
        checkpointing_kind("selective", get_stack("llm-foundry-2023"))
    assert checkpointing_kind("full", get_stack("llm-foundry-2023")) == "full"


def test_unknown_stack_names_the_nearest(catalog):
    with pytest.raises(UsageError, match="Did you mean: torchtitan"):
        resolve(job(stack="torchtitn"), catalog)


# --- op-level selective checkpointing ----------------------------------------------------
def test_op_policy_saves_every_other_unbiased_matmul():
    llama = preset("llama-3-8b")  # q, k, v, o, gate, up, down
    assert [keep for *_, keep, _ in op_sac_matmuls(llama)] == [True, False, True, False, True, False, True]
    # a biased linear is aten.addmm: neither saved nor counted (Qwen2: q, k, v carry a bias)
    qwen = llama.model_copy(update={"qkv_bias": True})
    assert [keep for *_, keep, _ in op_sac_matmuls(qwen)] == [False, False, False, True, False, True, False]
    # GPT-2's attention is one fused qkv linear
    gpt = ModelSpec(name="g", family="gpt", vocab_size=50257, hidden_size=1024, num_layers=2, num_heads=16,
                    num_kv_heads=16, ffn_hidden_size=4096, mlp="gelu", norm="layernorm", position="learned",
                    max_seq_len=1024)
    assert [(o, keep) for _, o, keep, _ in op_sac_matmuls(gpt)] == [(3072, True), (1024, False), (4096, True),
                                                                    (1024, False)]
    # LoRA adds two matmuls after each adapted linear, and they count
    lora = op_sac_matmuls(llama, "lora", 16)
    assert len(lora) == 21 and sum(a for *_, a in lora) == 14


def test_op_saved_bytes_llama_3_8b():
    # input (2d) + q, v, gate, down outputs (2(q + kv + f + d)) + attention output and log-sum-exp
    m = preset("llama-3-8b")
    d, q, kv, f = 4096, 4096, 1024, 14336
    assert op_sac_bytes_per_token(m, residual_bytes=2, act_bytes=2) == 2 * d + 2 * (q + kv + f + d) + 2 * q + 4 * 32


def test_op_selective_lies_between_none_and_full(catalog):
    runs = {c: resolve(job(stack="torchtitan", activation_checkpointing=c), catalog)
            for c in ("none", "selective-attn", "selective-op", "full")}
    mem = {c: estimate_memory(s).peak for c, s in runs.items()}
    step = {c: estimate_step(s).step_s for c, s in runs.items()}
    assert mem["full"] < mem["selective-op"] < mem["selective-attn"] <= mem["none"]
    assert step["none"] < step["selective-attn"] < step["selective-op"] < step["full"]
    # the op policy keeps under a third of what no recompute keeps for Llama 3 8B at 8k tokens
    assert mem["selective-op"] < 0.6 * mem["none"]
    hfu = {c: estimate_step(s).hfu_flops_per_token for c, s in runs.items()}
    assert hfu["none"] < hfu["selective-op"] < hfu["full"]


# --- QLoRA -------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama-2-7b", "llama-2-13b"])
def test_qlora_is_slower_than_lora_by_the_published_band(catalog, model):
    """LitGPT's resource tables (A100, micro-batch 1): QLoRA (bnb.nf4-dq) +62% (7B) and +105% (13B)
    over LoRA; the issue: commonly 30-60%. The qlora repo trains with micro-batch 1 and gradient
    checkpointing."""
    def step(method, mb, seq):
        j = JobSpec(model=model, gpu="a100-80gb", gpus=1, strategy="ddp", micro_batch=mb, global_batch=mb,
                    seq_len=seq, method=method, activation_checkpointing="full")
        return estimate_step(resolve(j, catalog)).step_s

    slow = step("qlora", 1, 512) / step("lora", 1, 512) - 1
    assert 0.30 <= slow <= 1.10
    # dequantization is per weight and micro-batch: many tokens per micro-batch amortize it
    assert step("qlora", 8, 2048) / step("lora", 8, 2048) - 1 < slow / 3


# --- CPU Adam ----------------------------------------------------------------------------
def test_cpu_adam_time_scales_with_vcpus(catalog):
    j = JobSpec(model="llama-2-70b", instance="p4d.24xlarge", tp=8, strategy="zero2", offload="optimizer",
                micro_batch=1)
    s = resolve(j, catalog)
    assert host_cpu_cores(s) == (48, True)
    twice = s.with_(instance=s.instance.model_copy(update={"vcpus": 192}))
    assert cpu_adam_s(twice, 69e9) == pytest.approx(cpu_adam_s(s, 69e9) / 2)
    assert estimate_step(twice).step_s < estimate_step(s).step_s
    note = [a for a in estimate_setup(s).assumptions if "CPU-Adam" in a]
    assert note and "96 vCPUs" in note[0] and "48 cores" in note[0]
    # no instance: the vCPU count is an assumption, and says so
    bare = resolve(JobSpec(model="llama-2-70b", gpu="a100-80gb", gpus=8, tp=8, strategy="zero2",
                           offload="optimizer", micro_batch=1), catalog)
    assert host_cpu_cores(bare)[1] is False
    assert any("assumed" in a and "CPU-Adam" in a for a in estimate_setup(bare).assumptions)


# --- the CLI and job files ------------------------------------------------------------------
def test_cli_states_the_stack_and_refuses_unknown_ones(tmp_path):
    out = cli("estimate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--micro-batch", "1",
              "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["setup"]["stack"] == "hf-trainer" and any("stack hf-trainer (the default" in a for a in r["assumptions"])
    text = cli("estimate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--micro-batch", "1",
               "--stack", "torchtitan", "--activation-checkpointing", "selective", "--save", tmp_path / "j.toml")
    assert text.returncode == 0, text.stderr
    assert "stack torchtitan" in text.stdout and "selective-op" in text.stdout
    saved = load_job(tmp_path / "j.toml")
    assert saved.stack == "torchtitan" and saved.kernels is None and saved.activation_checkpointing == "selective"
    for cmd in ("estimate", "plan"):
        bad = cli(cmd, "--model", "llama-3-8b", "--stack", "torchtitn")
        assert bad.returncode == 2 and "torchtitan" in bad.stderr + bad.stdout
    plan = cli("plan", "--model", "llama-3-8b", "--instances", "p5.48xlarge", "--max-nodes", "1", "--json")
    assert plan.returncode == 0, plan.stderr
    p = json.loads(plan.stdout)
    assert any(n.startswith("stack hf-trainer (the default") for n in p["notes"])
    assert all(row["estimate"]["setup"]["stack"] == "hf-trainer" for row in p["rows"])


def test_old_job_files_still_load_and_a_named_stack_replaces_their_flags(tmp_path, catalog):
    old = tmp_path / "old.toml"  # written before stacks: every flag spelled out
    old.write_text('schema_version = 1\nkind = "trainready-job"\nmodel = "llama-3-8b"\ngpu = "h100-80gb"\n'
                   'gpus = 8\nkernels = "eager"\nattention_kernel = "sdpa"\nreduce_dtype = "fp32"\n'
                   'activation_checkpointing = "selective"\n')
    j = load_job(old)
    assert j.stack is None and j.kernels == "eager"
    assert resolve(j, catalog).checkpointing == "selective-op"
    save_job(j, tmp_path / "again.toml")
    assert load_job(tmp_path / "again.toml") == j
    out = cli("estimate", "--job", old, "--stack", "megatron", "--micro-batch", "1", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["setup"]["stack"] == "megatron" and r["setup"]["kernels"] == "fused"
    assert r["setup"]["activation_checkpointing"] == "selective-attn"
