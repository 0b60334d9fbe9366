"""Issue 24: gpt-oss presets with their sliding-window blocks and attention sinks, checked against transformers'
own model (parameter counts, saved activations) and against what each stack's attention runs."""

from __future__ import annotations

import json

import pytest

from trainready.catalog import load_catalog
from trainready.errors import UsageError
from trainready.plan.activations import layer_bytes_per_token
from trainready.plan.attention import FLASH_TILE, attention_path, layer_attention, useful_keys
from trainready.plan.estimate import estimate_setup
from trainready.plan.hf_config import from_dict
from trainready.plan.job import JobSpec
from trainready.plan.performance import flops_per_token
from trainready.plan.presets import preset
from trainready.plan.setup import resolve
from trainready.plan.stacks import STACKS

torch = pytest.importorskip("torch")


def hf_gpt_oss():
    """transformers' gpt-oss code (a dev dependency), imported by the tests that use it: its 1.5 s of import would
    otherwise be paid by every xdist worker while collecting."""
    return pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")


def GptOssConfig(**kwargs):  # noqa: N802  (transformers' class, reached lazily)
    return hf_gpt_oss().GptOssConfig(**kwargs)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.mark.parametrize("name,layers,experts", [("gpt-oss-120b", 36, 128), ("gpt-oss-20b", 24, 32)])
def test_presets_count_what_transformers_builds(name, layers, experts):
    config = GptOssConfig(num_hidden_layers=layers, num_local_experts=experts)
    with torch.device("meta"):
        built = hf_gpt_oss().GptOssForCausalLM(config)
    m = preset(name)
    assert m.param_count() == sum(p.numel() for p in built.parameters())
    # the model card (arXiv 2508.10925, Table 1) counts active parameters without the input embedding
    card_active = {"gpt-oss-120b": 5.13e9, "gpt-oss-20b": 3.61e9}[name]
    assert abs(m.active_param_count() - m.vocab_size * m.hidden_size - card_active) / card_active < 0.005
    local = [i for i in range(layers) if m.is_local_layer(i)]
    assert [config.layer_types[i] == "sliding_attention" for i in range(layers)] == [
        i in local for i in range(layers)]
    # and the config.json reader builds the same shape
    read = from_dict(json.loads(json.dumps(config.to_dict())))
    assert (read.param_count(), read.sliding_window, read.full_attention_every, read.attention_sinks) == (
        m.param_count(), 128, 2, True)


def test_layer_types_the_model_cannot_express_are_refused():
    base = GptOssConfig(num_hidden_layers=4).to_dict()
    all_full = from_dict({**base, "layer_types": ["full_attention"] * 4})
    assert all_full.sliding_window is None and all_full.num_local_layers == 0
    with pytest.raises(UsageError, match="layers \\[0, 3\\]"):
        from_dict({**base, "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
                                           "full_attention"]})
    with pytest.raises(UsageError, match="each of the 4 layers"):
        from_dict({**base, "layer_types": ["sliding_attention"] * 3})


@pytest.mark.parametrize("seq,window", [(16, None), (300, 128), (128, 128), (100, 128), (1000, 7)])
def test_useful_keys_count_transformers_mask(seq, window):
    q = torch.arange(seq).view(-1, 1)
    kv = torch.arange(seq).view(1, -1)
    mask = kv <= q  # transformers masking_utils: causal, and kv_idx > q_idx - window when windowed
    if window is not None:
        mask &= kv > q - window
    counted = mask.sum().item() / seq
    # the planner's full-causal convention is seq/2 (counted: (seq + 1)/2)
    expected = counted - (0.5 if window is None or seq <= window else 0.0)
    assert useful_keys(seq, window) == pytest.approx(expected)


def test_windows_cut_flops_only_where_the_kernel_skips_tiles():
    m = preset("gpt-oss-120b")
    full = m.model_copy(update={"sliding_window": None, "full_attention_every": None})
    seq = 32768
    assert flops_per_token(m, seq) < flops_per_token(full, seq)
    tiles, masks = layer_attention(m, seq, "tiles"), layer_attention(m, seq, "masks")
    assert tiles.span == masks.span  # what MFU counts does not depend on the kernel
    assert tiles.executed == pytest.approx((seq + 2 * (128 + FLASH_TILE)) / 2)  # half the blocks windowed
    assert masks.executed == pytest.approx((seq + 2 * seq) / 2)  # a masked SDPA call computes every key
    assert layer_attention(m, seq, "eager").executed == 2 * seq


def test_each_stack_runs_the_attention_it_has(catalog):
    m = preset("gpt-oss-20b")
    assert attention_path(m, STACKS["hf-trainer"], "sdpa") == "eager"  # _supports_sdpa = False
    assert attention_path(m, STACKS["deepspeed"], "sdpa") == "eager"
    assert attention_path(m, STACKS["hf-trainer"], "flash2") == "tiles"  # a named kernel takes the sinks
    assert attention_path(m, STACKS["megatron"], STACKS["megatron"].attention_kernel) == "tiles"
    assert attention_path(m, STACKS["torchtitan"], "sdpa") == "tiles"  # FlexAttention's block mask
    windowed = preset("llama-3-8b").model_copy(update={"sliding_window": 4096})
    assert attention_path(windowed, STACKS["hf-trainer"], "sdpa") == "masks"

    def est(**kw):
        return estimate_setup(resolve(JobSpec(model="gpt-oss-20b", gpu="h100-80gb", gpus=8, seq_len=4096,
                                              micro_batch=1, **kw), catalog))
    eager, named = est(), est(attention_kernel="flash2")
    assert eager.throughput.tokens_per_s < named.throughput.tokens_per_s
    assert eager.memory.per_gpu_gib.activations > named.memory.per_gpu_gib.activations
    assert any("learned sinks" in a and "eager" in a for a in eager.assumptions)
    assert not any("learned sinks" in a for a in named.assumptions)


def _saved_bytes(model, seq: int) -> int:
    """Bytes autograd saves for backward over one forward of `seq` tokens, each storage once."""
    seen: dict[int, int] = {}

    def pack(t):
        if t.device.type == "cpu" and t.numel():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, model.config.vocab_size, (1, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids)
    return sum(seen.values())


def test_eager_attention_keeps_the_scores_transformers_keeps():
    """The seq x seq part of eager attention's saved activations, against transformers' own eager gpt-oss on a
    scaled model: the growth between two lengths beyond the linear part is the scores' share."""
    config = GptOssConfig(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, hidden_size=64,
                          intermediate_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                          vocab_size=128, sliding_window=8, attn_implementation="eager")
    torch.manual_seed(0)
    model = hf_gpt_oss().GptOssForCausalLM(config).to(torch.bfloat16).train()
    s1, s2, s3 = 128, 256, 512
    b1, b2, b3 = (_saved_bytes(model, s) for s in (s1, s2, s3))
    # bytes = linear * s + quadratic * s^2: the second difference isolates the quadratic term
    quadratic = ((b3 - b2) / (s3 - s2) - (b2 - b1) / (s2 - s1)) / (s3 - s1)
    m = from_dict(config.to_dict())

    def per_layer(seq: int, flash: bool) -> float:
        return seq * layer_bytes_per_token(m, kernels="eager", residual_bytes=2, act_bytes=2, seq_len=seq,
                                           flash=flash)
    model_quadratic = m.num_layers * (((per_layer(s3, False) - per_layer(s3, True)) / s3 ** 2))
    assert quadratic == pytest.approx(model_quadratic, rel=0.05)


@pytest.mark.parametrize("model_type,extra", [
    ("mixtral", {}),
    ("qwen2_moe", {"shared_expert_intermediate_size": 96, "moe_intermediate_size": 32}),
    ("deepseek_v3", {"first_k_dense_replace": 1, "n_routed_experts": 8, "moe_intermediate_size": 32,
                     "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                     "v_head_dim": 16, "n_group": 1, "topk_group": 1}),
    ("gpt_oss", {}),
])
def test_qlora_of_moe_quantizes_what_bitsandbytes_replaces(catalog, model_type, extra):
    """Issue 28: bitsandbytes 4-bit replaces nn.Linear modules (transformers' replace_with_bnb_linear); the
    routed experts of transformers 5's MoE classes are fused 3D parameters and stay bf16. The planner's
    quantized count is the nn.Linear weights of the decoder layers of transformers' own model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=4, num_local_experts=8, num_experts=8, num_experts_per_tok=2, head_dim=16)
    config = AutoConfig.for_model(model_type, **{**base, **extra})
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    linear = sum(mod.weight.numel() + (mod.bias.numel() if mod.bias is not None else 0)
                 for name, mod in built.named_modules()
                 if type(mod) is torch.nn.Linear and ".layers." in f".{name}")
    m = from_dict(json.loads(json.dumps(config.to_dict())))
    s = resolve(JobSpec(model_spec=m, gpu="h100-80gb", gpus=1, method="qlora", seq_len=64), catalog)
    from trainready.plan.memory import param_counts, qlora_moe_note
    pc = param_counts(s)
    # the planner leaves the routers' and norms' few parameters in its quantized count
    routers_and_norms = m.num_moe_layers * m.router_params() + m.num_layers * (
        m.norms_per_layer * m.hidden_size + m.attention_params() - m._attention_linear_params())
    assert pc.quantized - routers_and_norms == pytest.approx(linear, rel=1e-9)
    assert pc.expert == m.expert_param_count() and "stay bf16" in qlora_moe_note(m, "qlora")


def test_rope_is_read_where_transformers_reads_it():
    """Review of issue 28: transformers 5 fills rope_parameters' gaps from the top-level keys, keeps GPT-NeoX's
    partial_rotary_factor inside rope_parameters, and builds gpt-oss's yarn whatever the file says of theta; a
    401-digit rope_theta is a usage error, not an OverflowError."""
    base = GptOssConfig(num_hidden_layers=2).to_dict()
    mixed = {**base, "rope_parameters": {"rope_type": "yarn", "factor": 32.0}, "rope_theta": 777777}
    assert from_dict(mixed).rope_theta == 777777.0
    top_only = {k: v for k, v in base.items() if k != "rope_parameters"} | {"rope_theta": 150000.0}
    assert from_dict(top_only).rope_scaling.type == "yarn" and from_dict(top_only).rope_scaling.factor == 32.0
    neox = {"model_type": "gpt_neox", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 256, "rope_parameters": {"rope_theta": 10000.0,
                                                                                   "partial_rotary_factor": 0.5}}
    assert from_dict(neox).rotary_fraction == 0.5
    with pytest.raises(UsageError, match="rope_theta"):
        from_dict({**base, "rope_parameters": {"rope_theta": 10**400}})
