"""Megatron-LM on Megatron-Core: tensor, pipeline, expert and sequence parallelism, the
distributed optimizer (ZeRO-1), Megatron's selective or full recompute. Full training only.

The flags are Megatron-LM's `pretrain_gpt.py` arguments (megatron/training/arguments.py at
NVIDIA/Megatron-LM d98e8a6, 2026-08-22). Most are generated from Megatron-Core's
TransformerConfig fields (ArgumentGroupFactory: `--field-name`); FLAGS maps each flag to that
field, or to None for a flag arguments.py declares itself. The tests build TransformerConfig
from the fields, so Megatron-Core's own checks see every generated flag.
"""

from __future__ import annotations

from itertools import groupby

from ..recompute import DEFAULT_MODULES
from ..setup import Setup, megatron_ep_overlap_problem, pipeline_split
from .common import (
    Recipe,
    args_lines,
    batch_note,
    checkpointing,
    environment,
    schedule_calls_reason,
    torchrun,
    windowed_reason,
)

NAME = "megatron"
CORE_VERSION = "0.16.1"
ARGS_FILE = "megatron.args"

FLAGS: dict[str, str | None] = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
    "--num-attention-heads": "num_attention_heads", "--group-query-attention": None,
    "--num-query-groups": "num_query_groups", "--kv-channels": "kv_channels", "--seq-length": None,
    "--max-position-embeddings": None, "--position-embedding-type": None, "--rotary-base": None,
    "--normalization": "normalization", "--swiglu": None, "--untie-embeddings-and-output-weights": None,
    "--disable-bias-linear": "add_bias_linear", "--add-qkv-bias": "add_qkv_bias", "--qk-layernorm": "qk_layernorm",
    "--num-experts": None, "--moe-router-topk": "moe_router_topk", "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size", "--moe-layer-freq": None,
    "--moe-grouped-gemm": "moe_grouped_gemm", "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
    "--multi-latent-attention": "multi_latent_attention", "--q-lora-rank": "q_lora_rank",
    "--kv-lora-rank": "kv_lora_rank", "--qk-head-dim": "qk_head_dim", "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "--v-head-dim": "v_head_dim", "--moe-router-dtype": "moe_router_dtype",
    "--moe-router-enable-expert-bias": "moe_router_enable_expert_bias",
    "--moe-router-score-function": "moe_router_score_function", "--moe-shared-expert-gate": "moe_shared_expert_gate",
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--context-parallel-size": "context_parallel_size",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--num-virtual-stages-per-pipeline-rank": None, "--moe-flex-dispatcher-backend": "moe_flex_dispatcher_backend",
    "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
    "--expert-model-parallel-size": "expert_model_parallel_size", "--sequence-parallel": "sequence_parallel",
    "--tp-comm-overlap": "tp_comm_overlap",
    "--cuda-graph-impl": "cuda_graph_impl", "--cuda-graph-scope": "cuda_graph_scope",
    "--moe-expert-capacity-factor": "moe_expert_capacity_factor",
    "--moe-pad-expert-input-to-capacity": "moe_pad_expert_input_to_capacity",
    "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
    "--use-distributed-optimizer": None, "--optimizer-cpu-offload": None, "--optimizer-offload-fraction": None,
    "--use-precision-aware-optimizer": None,
    "--micro-batch-size": None, "--global-batch-size": None,
    "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers", "--recompute-modules": "recompute_modules",
    "--bf16": "bf16", "--fp16": "fp16", "--fp8-format": "fp8", "--fp8-recipe": "fp8_recipe", "--grad-reduce-in-bf16": None,
    "--fp8-param-gather": None,
    "--overlap-grad-reduce": None, "--overlap-param-gather": None,
    "--save": None, "--load": None, "--save-interval": None,
    "--rotary-percent": None, "--use-rope-scaling": None, "--rope-scaling-factor": None,
    "--rope-type": "rope_type", "--rotary-scaling-factor": "rotary_scaling_factor", "--mscale": "mscale",
    "--mscale-all-dim": "mscale_all_dim", "--attention-dropout": "attention_dropout",
    "--hidden-dropout": "hidden_dropout", "--squared-relu": None,
    "--apply-layernorm-1p": "layernorm_zero_centered_gamma",
}
"""Megatron-LM flags the recipe writes -> the TransformerConfig field each sets (None: read by pretrain_gpt.py's
model builder or training loop: --rotary-base, --rotary-percent and --use-rope-scaling/--rope-scaling-factor go to
GPTModel's RotaryEmbedding; with MLA, rotary_base and the yarn values are MLATransformerConfig fields)."""

# MLATransformerConfig's yarn values that Megatron-LM has no flag for (megatron-core 0.16 transformer_config.py)
MLA_YARN_FIXED = {"original_max_position": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
# megatron-core 0.16 rotary_pos_embedding.py RotaryEmbedding._apply_scaling: --use-rope-scaling takes only a factor
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position": 8192}


def rope_reason(m) -> str | None:
    """Why Megatron-LM's flags cannot build this model's rotary embedding (None: they can)."""
    if m.position != "rope":
        return None
    if m.rope_theta is None:
        return (f"{m.name} states no rope_theta (Megatron's --rotary-base defaults to 10,000, transformers to the "
                f"model class's own): give a config.json with rope_theta")
    if m.rope_theta != int(m.rope_theta):
        return f"Megatron-LM's --rotary-base is a whole number; {m.name} has rope_theta {m.rope_theta:g}"
    sc = m.rope_scaling
    if sc is None:
        return None
    if m.mla is not None:
        off = {k: getattr(sc, k) for k, v in MLA_YARN_FIXED.items() if getattr(sc, k) not in (None, v)}
        if sc.type == "yarn" and not off:
            return None
        return (f"{m.name}'s RoPE ({sc.type}, {', '.join(f'{k} {v:g}' for k, v in off.items()) or 'not yarn'}) "
                f"differs from what Megatron-LM's MLA flags reach (yarn with original 4096, beta_fast 32, "
                f"beta_slow 1: MLATransformerConfig defaults without a flag); use --framework deepspeed")
    if sc.type == "llama3" and all(getattr(sc, k) in (None, v) for k, v in LLAMA3_FIXED.items()):
        return None
    return (f"Megatron-LM scales RoPE only as Llama 3.1 does (--use-rope-scaling: low_freq_factor 1, high_freq_factor "
            f"4, original 8192, rotary_pos_embedding.py); {m.name} uses {sc.type} scaling (factor {sc.factor:g}): "
            f"use --framework deepspeed")


GRAPH_SCOPE_DROPLESS = ("attn", "moe_router", "moe_preprocess")
"""What Megatron captures of a dropless MoE layer (docs/user-guide/features/cuda_graph.md's MoE example)."""


def graphs_reason(s: Setup) -> str | None:
    """Why Megatron-Core refuses this setup's per-layer CUDA graphs (TransformerConfig.__post_init__ at 0.16.1)."""
    if not s.cuda_graphs:
        return None
    if checkpointing(s) == "full":
        return ("Megatron-Core runs full recompute only under a full-iteration CUDA graph (--cuda-graph-impl local), "
                "not per-layer graphs: --activation-checkpointing selective-attn or none, or --no-cuda-graphs")
    if not s.graphs_whole_layers and "moe" in s.recomputes:
        return ("Megatron-Core refuses moe recompute beside the graphed MoE router (--cuda-graph-impl "
                "transformer_engine): drop moe from --recompute-modules, or --no-cuda-graphs")
    return None


def reason(s: Setup) -> str | None:
    m = s.model
    why = windowed_reason(s, "Megatron", "Megatron-Bridge's gpt_oss provider sets window_size, "
                                        "window_attn_skip_freq and learnable softmax") or rope_reason(m) \
        or schedule_calls_reason(s, "Megatron (forward_backward_func)") or graphs_reason(s)
    if why:
        return why
    if m.activation == "relu":
        return f"Megatron-LM has no plain ReLU flag ({m.name}; --squared-relu is another function): use --framework deepspeed"
    if m.moe is not None and m.moe.capacity_factor is not None and s.ep > 1 and s.ep_dispatcher == "deepep":
        return ("Megatron's flex (DeepEP) dispatcher does not pad experts to capacity (TransformerConfig refuses "
                "moe_pad_expert_input_to_capacity with it): the alltoall dispatcher, or --moe-routing dropless")
    if s.precision == "fp8" and s.fp8_recipe == "rowwise":  # TransformerConfig.fp8_recipe's choices
        return ("Megatron-Core's FP8 recipes are tensorwise, delayed, blockwise and mxfp8; row-wise scaling is "
                "torchao's: --fp8-recipe blockwise (per-block scales) or tensorwise")
    if s.method != "full":
        return f"Megatron-LM trains all weights: no {s.method} (NeMo adds PEFT on top); use --framework deepspeed"
    if s.compiled:
        return ("Megatron-LM does not torch.compile the model with its loss (its fusions are Transformer Engine's); "
                "without --compile it runs this row; use --framework torchtitan or deepspeed")
    if s.strategy in ("zero2", "zero3"):
        return (f"Megatron's distributed optimizer shards optimizer states only (ZeRO-1); {s.strategy}: "
                f"--framework deepspeed or torchtitan")
    if s.offload == "optimizer+params":
        return "Megatron offloads the optimizer only (--optimizer-cpu-offload); parameters: --framework deepspeed"
    if s.optimizer_dtype == "bf16":
        return "Megatron keeps fp32 main parameters and Adam states; pure bf16: --framework torchtitan"
    if checkpointing(s) == "selective-op":
        return ("Megatron's selective recompute is the attention core (selective-attn), not op-level; "
                "use --framework torchtitan or --activation-checkpointing selective-attn")
    if m.position == "alibi":
        return f"Megatron-LM has no ALiBi positions ({m.name}); use --framework deepspeed"
    if m.family in ("falcon", "gpt_neox"):  # HF parallel_attn / use_parallel_residual (both default true)
        return (f"Megatron-LM's GPT blocks run attention then MLP; {m.name} ({m.family}) runs them in parallel "
                f"from one input: use --framework deepspeed")
    if m.mlp == "geglu":
        return f"Megatron-LM has no tanh-GeGLU flag ({m.name}: Gemma); use --framework deepspeed or hf-tp"
    if m.is_moe and s.expert_tp > 1 and (m.mlp_bias or m.out_bias):  # --disable-bias-linear is not emitted
        return (f"Megatron-Core supports linear biases in MoE only with expert TP 1 ('Bias in Moe is only supported "
                f"when ETP==1', transformer_config.py); {m.name} has biases: plan with --etp 1")
    late = [n for n in ("moe_act", "layernorm") if n in s.recomputes]
    if late and s.precision == "fp8" and s.fp8_recipe == "delayed":  # TransformerConfig.__post_init__
        return (f"Megatron-Core refuses {' and '.join(late)} recompute under delayed FP8 scaling ('Delayed "
                f"scaling does not support moe_act and layernorm recompute for fp8', transformer_config.py): "
                f"--fp8-recipe tensorwise, blockwise or mxfp8, or drop {late[0]}")
    if s.ep > 1 and s.fp8_dispatch:
        return ("Megatron-Core's flex dispatcher sends activations as they are (bf16 under FP8 compute; HybridEP "
                "'does not support fp8 dispatch now', moe/fused_a2a.py): --no-fp8-dispatch")
    if s.ep_overlap and (problem := megatron_ep_overlap_problem(s.ep, s.pp, s.pp_virtual, checkpointing(s),
                                                                s.recomputes)):
        return f"Megatron's --overlap-moe-expert-parallel-comm refuses this layout (transformer_config.py): {problem}"
    return None


def _layer_pattern(s: Setup) -> str | None:
    moe = s.model.moe
    if moe.first_dense_layers == 0 and moe.layer_freq == 1:
        return None
    flags = ("1" if s.model.is_moe_layer(i) else "0" for i in range(s.model.num_layers))
    runs = [f"[{flag}]*{len(list(run))}" for flag, run in groupby(flags)]
    return "(" + "+".join(runs) + ")"  # no quotes: $(cat FILE) would pass them on literally


def model_args(s: Setup) -> list[tuple[str, object]]:
    m = s.model
    a: list[tuple[str, object]] = [("--num-layers", m.num_layers), ("--hidden-size", m.hidden_size),
                                   ("--ffn-hidden-size", m.ffn_hidden_size), ("--num-attention-heads", m.num_heads)]
    if m.num_kv_heads != m.num_heads and m.mla is None:
        a += [("--group-query-attention", True), ("--num-query-groups", m.num_kv_heads)]
    if m.head_dim and m.mla is None and m.head_dim != m.hidden_size // m.num_heads:
        a.append(("--kv-channels", m.head_dim))
    a += [("--seq-length", s.seq_len), ("--max-position-embeddings", max(s.seq_len, m.max_seq_len or 0)),
          ("--position-embedding-type", "rope" if m.position == "rope" else "learned_absolute"),
          ("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")]
    if m.position == "rope":  # rope_reason has refused what these cannot say
        a.append(("--rotary-base", int(m.rope_theta)))
        if m.rotary_fraction != 1.0:
            a.append(("--rotary-percent", m.rotary_fraction))
        sc = m.rope_scaling
        if sc is not None and m.mla is not None:
            a += [("--rope-type", "yarn"), ("--rotary-scaling-factor", sc.factor),
                  ("--mscale", sc.mscale if sc.mscale is not None else 1.0),
                  ("--mscale-all-dim", sc.mscale_all_dim if sc.mscale_all_dim is not None else 0.0)]
        elif sc is not None:
            a += [("--use-rope-scaling", True), ("--rope-scaling-factor", sc.factor)]
    # the Hugging Face models train without dropout (attention_dropout 0.0); Megatron's default is 0.1
    a += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    if m.family == "nemotron":  # NemotronLayerNorm1P: the weight is stored as gamma - 1
        a.append(("--apply-layernorm-1p", True))
    if m.mlp == "swiglu":
        a.append(("--swiglu", True))
    elif m.activation == "squared_relu":
        a.append(("--squared-relu", True))
    if not m.tied_embeddings:
        a.append(("--untie-embeddings-and-output-weights", True))
    if not (m.mlp_bias or m.out_bias):
        a.append(("--disable-bias-linear", True))
        if m.qkv_bias:
            a.append(("--add-qkv-bias", True))
    if m.qk_norm:
        a.append(("--qk-layernorm", True))
    if m.mla is not None:
        a += [("--multi-latent-attention", True), ("--kv-lora-rank", m.mla.kv_lora_rank),
              ("--qk-head-dim", m.mla.qk_nope_head_dim), ("--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim),
              ("--v-head-dim", m.mla.v_head_dim)]
        if m.mla.q_lora_rank:
            a.append(("--q-lora-rank", m.mla.q_lora_rank))
    if m.moe is not None:
        deepep = s.ep > 1 and s.ep_dispatcher == "deepep"  # DeepEP through the flex dispatcher (moe/fused_a2a.py)
        # without EP the allgather dispatcher gathers the hidden states over the expert TP group, as the estimate
        # counts (moe.expert_tp_buffer_bytes); with EP, all-to-alls of the routed rows
        dispatcher = "flex" if deepep else "alltoall" if s.ep > 1 else "allgather"
        a += [("--num-experts", m.moe.num_experts), ("--moe-router-topk", m.moe.experts_per_token),
              ("--moe-ffn-hidden-size", m.moe.expert_ffn_hidden_size), ("--moe-grouped-gemm", True),
              ("--moe-token-dispatcher-type", dispatcher), ("--moe-router-dtype", "fp32")]
        if deepep:
            a.append(("--moe-flex-dispatcher-backend", "deepep"))
        if m.moe.router_bias:  # DeepSeek-V3: sigmoid scores with a bias that balances the experts
            a += [("--moe-router-score-function", "sigmoid"), ("--moe-router-enable-expert-bias", True)]
        if m.moe.num_shared_experts:
            a.append(("--moe-shared-expert-intermediate-size", m.moe.shared_width))
            if m.moe.shared_expert_gate:
                a.append(("--moe-shared-expert-gate", True))
        pattern = _layer_pattern(s)
        if pattern:
            a.append(("--moe-layer-freq", pattern))
    return a


def hf_id(m) -> str:
    """The Hugging Face repository a preset names (its first owner/name alias), or a placeholder."""
    return next((a for a in m.aliases if "/" in a), "<the model's Hugging Face id or local path>")


def weights_note(m) -> str:
    """How the Hugging Face weights come in and go out (Megatron-Bridge's converter, megatron-core checkpoints)."""
    src = hf_id(m)
    return (f"to start from the released weights: Megatron-Bridge's examples/conversion/convert_checkpoints.py "
            f"import --hf-model {src} --megatron-path ckpt/hf-import, and for the first run --load ckpt/hf-import "
            f"(in place of --load checkpoints) with --finetune (weights only, from iteration 0); back to Hugging Face: convert_checkpoints.py export --hf-model {src} "
            f"--megatron-path <--save dir>/iter_NNNNNNN --hf-path hf-out")


def pipeline_layout(num_layers: int, pp: int, v: int = 1) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for setup.pipeline_split's uneven stages: E the
    embedding, t a decoder layer, L the loss, | between stages, (..)*n a repeat: 61 layers on 4 stages
    are Et*16|(t*15|)*2t*15L. With v virtual stages per rank, pp x v stages, entry i on rank i % pp
    (PipelineParallelLayerLayout), as setup.pipeline_ranks assigns them."""
    n = pp * v
    split = pipeline_split(num_layers, n)
    stages = [("E" if j == 0 else "") + f"t*{k}" + ("L" if j == n - 1 else "") for j, k in enumerate(split)]
    out = ""
    for stage, run in groupby(stages):
        count = len(list(run))
        out += f"({stage}|)*{count}" if count > 1 else f"{stage}|"
    return out.rstrip("|")


def parallel_args(s: Setup) -> list[tuple[str, object]]:
    a: list[tuple[str, object]] = [("--tensor-model-parallel-size", s.tp), ("--pipeline-model-parallel-size", s.pp)]
    v = s.pp_virtual
    if s.model.num_layers % (s.pp * v):  # uneven stages: Megatron splits evenly unless told the layout
        a.append(("--pipeline-model-parallel-layout", pipeline_layout(s.model.num_layers, s.pp, v)))
    elif v > 1:  # interleaved 1F1B (validate_args sets virtual_pipeline_model_parallel_size from it)
        a.append(("--num-virtual-stages-per-pipeline-rank", v))
    if s.model.is_moe:  # the expert grid etp x ep x edp over the stage's tp x dp GPUs (MoE parallel folding)
        a += [("--expert-model-parallel-size", s.ep), ("--expert-tensor-parallel-size", s.expert_tp)]
        if s.model.moe.capacity_factor is not None:  # token-drop routing, buffers padded to capacity (moe.busy_rows)
            a += [("--moe-expert-capacity-factor", s.model.moe.capacity_factor),
                  ("--moe-pad-expert-input-to-capacity", True)]
        if s.ep > 1 and s.ep_overlap:  # dispatch/combine beside another micro-batch's compute
            a.append(("--overlap-moe-expert-parallel-comm", True))
    if s.cp > 1:  # ring attention over cp ranks (TE's p2p context parallelism)
        a.append(("--context-parallel-size", s.cp))
    if s.tp > 1:
        a.append(("--sequence-parallel", True))
        if s.tp_overlap:  # TE userbuffers: TP all-gathers/reduce-scatters pipelined with the GEMMs (needs SP)
            a.append(("--tp-comm-overlap", True))
    if s.strategy == "zero1":
        a.append(("--use-distributed-optimizer", True))
    if s.dp > 1:  # validate_args: --overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce
        a.append(("--overlap-grad-reduce", True))
        if s.strategy == "zero1":
            a.append(("--overlap-param-gather", True))
    if s.offload == "optimizer":  # validate_args: the CPU offload runs on the precision-aware optimizer's path
        a += [("--optimizer-cpu-offload", True), ("--optimizer-offload-fraction", 1.0),
              ("--use-precision-aware-optimizer", True)]
    a += [("--micro-batch-size", s.micro_batch), ("--global-batch-size", s.global_batch)]
    ck = checkpointing(s)
    if ck == "selective-attn":
        a.append(("--recompute-granularity", "selective"))
        if s.recomputes != DEFAULT_MODULES:  # a List[str] field: nargs '+' (argument_utils.py), a word each
            a.append(("--recompute-modules", " ".join(s.recomputes)))
    elif ck == "full":
        a += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    if s.precision in ("bf16", "fp8"):
        a.append(("--bf16", True))
    elif s.precision == "fp16":
        a.append(("--fp16", True))
    if s.precision == "fp8":
        a += [("--fp8-format", "hybrid"), ("--fp8-recipe", s.fp8_recipe)]
        if s.fp8_param_gather:  # as Megatron-Bridge's delayed and current-scaling recipes (Stack.fp8_param_gather)
            a.append(("--fp8-param-gather", True))
    if s.reduce_dtype == "bf16" and s.precision != "fp32":
        a.append(("--grad-reduce-in-bf16", True))
    if s.cuda_graphs:  # per-layer graphs (Stack.cuda_graphs); validate_args turns the TE RNG tracker on for them
        a.append(("--cuda-graph-impl", "transformer_engine"))
        if not s.graphs_whole_layers:  # dropless MoE: whole-layer capture "not working for MoE dynamic shapes"
            a.append(("--cuda-graph-scope", " ".join(GRAPH_SCOPE_DROPLESS)))
    a += [("--save", "checkpoints"), ("--load", "checkpoints"), ("--save-interval", 500)]
    return a


def args(s: Setup) -> list[tuple[str, object]]:
    return model_args(s) + parallel_args(s)


def recipe(s: Setup) -> Recipe:
    env, notes = environment(s)
    # Megatron-LM's examples: 1 overlaps TP comm with compute; EP A2A overlap wants more queues (arguments.py
    # warns against combining it with TP on Hopper and suggests 32 when it is prioritized)
    overlap = s.ep > 1 and s.ep_overlap and s.tp == 1
    env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32" if overlap else "1"
    notes.insert(0, f"Megatron-LM pretrain_gpt.py on Megatron-Core {CORE_VERSION} with Transformer Engine: save "
                    f"the config as {ARGS_FILE}; add --data-path, --tokenizer-type/--tokenizer-model, "
                    f"--train-iters and --lr (or --mock-data for a first run)")
    if s.strategy == "zero1":
        notes.append("--use-distributed-optimizer: optimizer states sharded over data-parallel ranks (ZeRO-1)")
    if s.pp > 1 and s.pp_virtual > 1:
        notes.append(f"pipeline {s.pp} x {s.pp_virtual} virtual stages per rank: {s.grad_accum} micro-batches per "
                     f"step through the interleaved 1F1B schedule (bubble (pp-1)/v of the 1F1B one)")
    elif s.pp > 1:
        notes.append(f"pipeline {s.pp}: {s.grad_accum} micro-batches per step through the 1F1B schedule")
    if s.model.is_moe and s.expert_tp != s.tp:
        notes.append(f"MoE parallel folding: attention on tp {s.tp} x dp {s.dp}, routed experts on etp {s.expert_tp} x "
                     f"ep {s.ep} x expert-dp {s.expert_dp} over the same GPUs of each pipeline stage")
    if s.model.is_moe and s.ep > 1 and s.ep_dispatcher == "deepep":
        notes.append("--moe-token-dispatcher-type flex needs DeepEP installed (github.com/deepseek-ai/DeepEP); "
                     "--moe-flex-dispatcher-backend hybridep selects NVIDIA's HybridEP instead")
    notes.append(weights_note(s.model))
    notes.append(batch_note(s))
    return Recipe(framework=NAME, torchrun=torchrun(s, f"pretrain_gpt.py $(cat {ARGS_FILE})"), env=env,
                  config_kind="megatron-args", config_file=ARGS_FILE, config=args_lines(args(s)), notes=notes)
