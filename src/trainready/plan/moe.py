"""Mixture-of-experts physics: where expert weights live under expert parallelism (EP), what
routed tokens save for backward, and what the experts' grouped GEMMs and all-to-alls cost.
memory.py and performance.py call these for MoE models only; dense models never get here.

Layout, as Megatron-Core builds it (MoE parallel folding, Liu et al. 2025, arXiv 2504.14960;
parallel_state.initialize_model_parallel):
* attention, dense MLPs, shared experts and routers use the dense grid, rank order tp-cp-dp-pp
  (TP innermost, PP outermost); the routed experts use the expert grid over the very same ranks
  of each pipeline stage, order etp-ep-edp-pp: each expert split etp ways (etp consecutive ranks),
  E/ep experts per GPU, ep x etp ranks apart from the next EP rank's, and edp = tp x dp / (etp x ep)
  copies of each shard (expert data parallelism). With etp = tp (Megatron-Core's default) EP groups
  are carved out of the data-parallel ranks; with etp = 1 (Megatron-Bridge's Qwen3/DeepSeek recipes,
  torchtitan, transformers) they span TP ranks too, so ep may exceed dp: ep 32 with tp 2, dp 16.
  An EP group stays inside a node while etp x ep <= the stage's GPUs in it, and spans nodes beyond.
* with TP, sequence parallelism gives each rank tokens/tp: it routes those and sends them to their
  EP ranks; with etp > 1 the expert TP group all-gathers what its ranks received (Megatron's
  token_dispatcher.py dispatch_postprocess; without EP the allgather dispatcher gathers the hidden
  states instead) and reduce-scatters the expert outputs, so a rank's experts see etp/tp of a
  micro-batch's tokens x k, full width (N) / etp.
* ZeRO/FSDP shards the routed experts' states over the edp ranks holding the same shard
  (torchtitan's efsdp mesh, Megatron's expert data-parallel group); everything else over dp.
* Pipeline stages take contiguous layers, num_layers/pp each or, when pp does not divide them,
  one more on the earliest stages (setup.pipeline_split: DeepSeek-V3's 61 layers on 4 stages are
  16, 15, 15, 15); DeepSeek's dense first layers and qwen2_moe's interleaved dense layers make
  stages differ further: the worst stage sets memory and pace. With v interleaved (virtual)
  stages per rank a rank holds every pp-th of pp x v virtual stages (setup.pipeline_ranks).

Routing:
* dropless (capacity_factor None): every token reaches its k experts; the busiest EP rank
  receives LOAD_IMBALANCE x the mean (or the job's expert_load_imbalance; ep > 1; with ep = 1 a rank computes exactly k rows per
  token whatever the routing). That sets its expert GEMMs, its routed activations and the
  all-to-alls; FLOPs counted for MFU/HFU stay the mean.
* capacity factor c: every expert's buffer is padded to c x its mean share (Megatron
  --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity, GShard): c x k rows per
  token in compute, memory and all-to-all volume, and no imbalance beyond that.
* each MoE layer sends every token's hidden state to its k experts and back: dispatch and
  combine all-to-alls forward, their mirror images backward (4 per layer and micro-batch; 6
  with full recomputation, which reruns the forward's two). The stack (or the job) says how:
  a row per routed expert (collective all-to-all: torchtitan's and Megatron's alltoall
  dispatchers) or once per GPU and per node (DeepEP, HybridEP); in the compute path (their
  defaults) or overlapped with another micro-batch's compute (DualPipe, Megatron's 1F1B A2A
  overlap); BF16, or FP8 dispatch under fp8 (DeepSeek-V3; Megatron's DeepEP/HybridEP paths
  send BF16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from math import gcd

from . import efficiency as eff
from .activations import mlp_bytes_per_token, op_sac_bytes_per_token, op_sac_matmuls
from .model_spec import ModelSpec
from .setup import Setup, pipeline_ranks
from .stacks import get_stack

PERMUTE_BYTES_PER_ROW = 16
"""HBM bytes per routed row and hidden unit (bf16) of token permutation and the weighted combine:
gather into expert order (read + write) forward, scatter-add back backward, and the same for the
un-permute/combine: 8 x 2 bytes, counted from what each op reads and writes."""
ROUTER_BYTES_PER_EXPERT = 20
"""HBM bytes per token and expert of routing: logits written and read, fp32 scores, top-k, and
their backward."""

_MEMO: dict[tuple, tuple[ModelSpec, object]] = {}


def _memo(m: ModelSpec, key: tuple, compute: Callable[[], object]):
    """compute() for this very model (the entry holds it, so its id cannot be reused): `plan`
    asks the same shape questions tens of thousands of times."""
    hit = _MEMO.get((id(m), *key))
    if hit is not None and hit[0] is m:
        return hit[1]
    if len(_MEMO) > 512:
        _MEMO.clear()
    value = compute()
    _MEMO[(id(m), *key)] = (m, value)
    return value


# --- layers and pipeline stages ----------------------------------------------------------
def stage_mix(m: ModelSpec, pp: int, v: int = 1) -> list[tuple[int, int]]:
    """(dense layers, MoE layers) of each pipeline rank, all its virtual stages (setup.pipeline_ranks:
    contiguous stages, or v interleaved ones per rank)."""
    return _memo(m, ("mix", pp, v), lambda: _stage_mix(m, pp, v))


def _stage_mix(m: ModelSpec, pp: int, v: int) -> list[tuple[int, int]]:
    mix = []
    for layers in pipeline_ranks(m.num_layers, pp, v):
        n_moe = sum(1 for i in layers if m.is_moe_layer(i))
        mix.append((len(layers) - n_moe, n_moe))
    return mix


def worst_stage(m: ModelSpec, pp: int, dense_cost: float, moe_cost: float, v: int = 1) -> float:
    """The largest per-rank sum of a cost counted per dense and per MoE layer."""
    return max(nd * dense_cost + nm * moe_cost for nd, nm in stage_mix(m, pp, v))


def _layer_params(m: ModelSpec) -> tuple[int, int, int]:
    """(a dense layer, a MoE layer without its routed experts, a MoE layer's routed experts)."""
    return _memo(m, ("params",), lambda: _count_layer_params(m))


def _count_layer_params(m: ModelSpec) -> tuple[int, int, int]:
    experts = m.moe.num_experts * m.expert_params()
    moe_block = m.layer_params(next(i for i in range(m.num_layers) if m.is_moe_layer(i)))
    dense_block = moe_block - m.moe_mlp_params() + m.dense_mlp_params()  # same attention and norms
    return dense_block, moe_block - experts, experts


def stage_params(s: Setup) -> tuple[float, float, float]:
    """Per GPU before ZeRO sharding, on the worst pipeline stage: (blocks' parameters, of them routed
    experts, the largest block: one FSDP unit). Routed experts 1/(ep x etp), the rest 1/tp."""
    return _memo(s.model, ("stage", s.tp, s.pp, s.ep, s.expert_tp, s.pp_virtual),
                 lambda: _stage_params(s.model, s.tp, s.pp, s.ep, s.expert_tp, s.pp_virtual))


def _stage_params(m: ModelSpec, tp: int, pp: int, ep: int, etp: int, v: int) -> tuple[float, float, float]:
    dense, moe_rest, experts = _layer_params(m)
    routed = experts / (ep * etp)
    moe_local = moe_rest / tp + routed
    worst = max(stage_mix(m, pp, v), key=lambda mix: mix[0] * dense / tp + mix[1] * moe_local)
    blocks = worst[0] * dense / tp + worst[1] * moe_local
    unit = max([moe_local] + ([dense / tp] if m.num_dense_layers else []))
    return blocks, worst[1] * routed, unit


def expert_shard_ratio(s: Setup) -> float:
    """dp / edp = ep x etp / tp: how many times more ranks a routed-expert parameter is spread over than
    the rest, with ZeRO/FSDP (1 for a dense model)."""
    return s.shard_dp / s.expert_dp if s.model.is_moe else 1.0


def load_imbalance(s: Setup) -> float:
    """The busiest EP rank's routed load over the mean: the job's figure, else the assumption."""
    return eff.LOAD_IMBALANCE if s.load_imbalance is None else s.load_imbalance


def busy_rows(s: Setup) -> float:
    """Routed rows per token on the busiest EP rank: k x capacity factor, or k x the load
    imbalance when tokens cross EP ranks dropless."""
    moe = s.model.moe
    if moe.capacity_factor is not None:
        return moe.experts_per_token * moe.capacity_factor
    return moe.experts_per_token * (load_imbalance(s) if s.ep > 1 else 1.0)


def mean_rows(s: Setup) -> float:
    """Routed rows per token on an average rank (what the FLOP counts use)."""
    moe = s.model.moe
    return moe.experts_per_token * (moe.capacity_factor or 1.0)


def padding_flops_per_token(s: Setup) -> float:
    """FLOPs per token the padded capacity rows add (token-drop routing pads every expert to capacity factor x
    its mean share): counted by HFU, which is the hardware's work, not by MFU. Forward and the input gradient,
    the weight gradient for full training, the forward again under full recompute."""
    m = s.model
    if m.moe is None or m.moe.capacity_factor is None or m.moe.capacity_factor <= 1.0:
        return 0.0
    passes = (3 if s.method == "full" else 2) + (1 if s.checkpointing == "full" else 0)
    extra_rows = m.moe.experts_per_token * (m.moe.capacity_factor - 1.0)
    return m.num_moe_layers * extra_rows * passes * 2 * m.expert_params()


# --- memory --------------------------------------------------------------------------------
def moe_layer_bytes_per_token(s: Setup, dense_layer_bytes: Callable[[ModelSpec], float], act_bytes: int,
                              fp8_saved: bool = False) -> float:
    """Activation bytes a MoE layer saves per token (before the 1/tp split), on the busiest rank.

    The MLP part is what a dense MLP of width rows x expert width + shared width saves
    (`dense_layer_bytes` on such a shape: the stack's own per-op count), plus the routing:
    router logits (activation dtype) and fp32 scores per expert, top-k weights (fp32) and
    indices (int64) per routed expert, and per routed row the dispatched input kept for the
    experts' weight gradient, the expert output kept for the combine's gradient and an int64
    permutation index, for the rows the expert TP group gathered: etp x this rank's (a rank's experts
    see etp/tp of the tokens, the 1/tp applied by the caller). A capacity factor sizes these buffers to
    capacity (busy_rows). Where the experts multiply by the routing weights in their activation (Megatron-Core:
    experts.py weighted_bias_swiglu_impl; token_dispatcher.py unpermutes without probs), the combine keeps no expert
    output, and under Transformer Engine FP8 (`fp8_saved`) the first expert GEMM keeps its input in FP8
    (Stack.expert_output_saved)."""
    return dense_layer_bytes(_moe_mlp_shape(s)) + moe_own_bytes_per_token(s, act_bytes, fp8_saved)


def _moe_mlp_shape(s: Setup) -> ModelSpec:
    """The dense stand-in for a MoE layer's MLP: width busy rows x expert width + the shared experts'."""
    m, moe = s.model, s.model.moe
    f = max(1, round(busy_rows(s) * moe.expert_ffn_hidden_size + moe.shared_width))
    return _memo(m, ("mlp", f), lambda: m.model_copy(update={"ffn_hidden_size": f}))


def moe_own_bytes_per_token(s: Setup, act_bytes: int, fp8_saved: bool) -> float:
    """Routing and routed-row bytes a MoE layer saves per token beyond its MLP (moe_layer_bytes_per_token)."""
    m, moe = s.model, s.model.moe
    routing = (act_bytes + 4) * moe.num_experts + 12 * moe.experts_per_token
    dispatched = 1 if fp8_saved else act_bytes
    output = act_bytes if get_stack(s.stack).expert_output_saved else 0
    return routing + busy_rows(s) * s.expert_tp * ((dispatched + output) * m.hidden_size + 8)


def moe_mlp_saved_per_token(s: Setup, kernels: str, act_bytes: int, fp8_saved: bool) -> float:
    """What `moe` recompute frees of one MoE layer per token: its MLP's insides, routing and routed rows."""
    width = _moe_mlp_shape(s).ffn_hidden_size
    return (mlp_bytes_per_token(s.model, width, kernels=kernels, act_bytes=act_bytes, fp8_saved=fp8_saved)
            + moe_own_bytes_per_token(s, act_bytes, fp8_saved))


# --- compute -------------------------------------------------------------------------------
def attention_dim(m: ModelSpec) -> float:
    """Per token and layer, causal attention costs 2 x seq x this FLOPs forward: q_dim for
    multi-head/grouped-query attention; for MLA the mean of the QK (heads x qk_head_dim) and
    PV (heads x v_head_dim) widths."""
    if m.mla is None:
        return m.q_dim
    return m.num_heads * (m.mla.qk_head_dim + m.mla.v_head_dim) / 2


def attention_gemms(s: Setup) -> list[tuple[int, int, int]]:
    """(K, N, count) of one block's attention matmuls per token, TP-split. MLA: the down
    projections (q_a, kv_a) are replicated across TP ranks (Megatron-Core), the up projections
    and o_proj split."""
    m, t = s.model, s.tp
    d = m.hidden_size
    if m.mla is None:
        return [(d, (m.q_dim + 2 * m.kv_dim) // t, 1), (m.q_dim // t, d, 1)]
    a, h = m.mla, m.num_heads
    if a.q_lora_rank:
        q = [(d, a.q_lora_rank, 1), (a.q_lora_rank, h * a.qk_head_dim // t, 1)]
    else:
        q = [(d, h * a.qk_head_dim // t, 1)]
    return q + [(d, a.kv_lora_rank + a.qk_rope_head_dim, 1),
                (a.kv_lora_rank, h * (a.qk_nope_head_dim + a.v_head_dim) // t, 1), (h * a.v_head_dim // t, d, 1)]


@dataclass(frozen=True, slots=True)
class _Gemm:
    flops: float  # forward FLOPs on the busiest rank (time)
    mean_flops: float  # forward FLOPs on an average rank (counted)
    k: float  # forward reduction dim
    n: float  # output features: the input gradient's reduction dim
    rows: float  # rows per GEMM problem: the weight gradient's reduction dim
    ramp: float = 1.0  # grouped GEMMs: rows / (rows + grouped_gemm_m0) on forward and input gradient
    op_recompute: bool = False  # recomputed under torchtitan's op policy whatever the mm count (router, routed)
    shared: bool = False  # a shared expert's (Megatron's shared_experts recompute)
    fp8: bool = True  # runs in FP8 under --precision fp8 (the router stays in its own dtype: Megatron's fp32)
    weights: float = 0.0  # weight elements on the rank: what the weight gradient writes (its memory floor)


def grouped_gemm_m0(s: Setup) -> float:
    """Rows per expert at which a grouped GEMM reaches half its large-row rate: FP8's (DeepGEMM) under
    --precision fp8, BF16's (torch._grouped_mm) otherwise (efficiency.GROUPED_GEMM_M0)."""
    return eff.FP8_GROUPED_GEMM_M0 if s.precision == "fp8" else eff.GROUPED_GEMM_M0


def _ffn(d: int, f: int, t: int, gated: bool, tokens: float) -> list[_Gemm]:
    up = (2 if gated else 1) * f
    return [_Gemm(2 * tokens * d * up / t, 2 * tokens * d * up / t, d, up / t, tokens, weights=d * up / t),
            _Gemm(2 * tokens * f / t * d, 2 * tokens * f / t * d, f / t, d, tokens, weights=f / t * d)]


def _mlp_gemms(s: Setup, tokens: int, moe_layer: bool) -> list[_Gemm]:
    m, t = s.model, s.tp
    d = m.hidden_size
    if not moe_layer:
        return _ffn(d, m.ffn_hidden_size, t, m.gated_mlp, tokens)
    moe = m.moe
    router = 2 * tokens * d * moe.num_experts / t  # sequence parallel: each TP rank routes tokens/tp
    gemms = [_Gemm(router, router, d, moe.num_experts, tokens / t, op_recompute=True, fp8=False,
                   weights=d * moe.num_experts)]
    if moe.shared_width:
        gemms += [replace(g, shared=True) for g in _ffn(d, moe.shared_width, t, m.gated_mlp, tokens)]
    # a rank's experts take etp/tp of the micro-batch's routed rows (its tokens/tp, gathered over the expert
    # TP group), each expert etp-split: FLOPs 1/tp as before, the GEMM shapes follow etp
    et = s.expert_tp
    busy, mean = tokens * busy_rows(s) * et / t, tokens * mean_rows(s) * et / t
    per_expert = mean * s.ep / moe.num_experts  # rows each local expert receives
    ramp = per_expert / (per_expert + grouped_gemm_m0(s))
    fe, up = moe.expert_ffn_hidden_size, (2 if m.gated_mlp else 1) * moe.expert_ffn_hidden_size
    local = moe.num_experts / s.ep  # the rank's experts, each etp-split
    gemms += [_Gemm(2 * busy * d * up / et, 2 * mean * d * up / et, d, up / et, per_expert, ramp, True,
                    weights=local * d * up / et),
              _Gemm(2 * busy * fe / et * d, 2 * mean * fe / et * d, fe / et, d, per_expert, ramp, True,
                    weights=local * fe / et * d)]
    return gemms


def _mlp_elementwise_bytes(s: Setup, tokens: int, moe_layer: bool, act_coef: float) -> float:
    """HBM bytes of an MLP's non-matmul kernels, forward + backward, on the busiest rank."""
    m = s.model
    if not moe_layer:
        total = act_coef * m.ffn_hidden_size * tokens
    else:
        moe = m.moe
        busy = tokens * busy_rows(s)
        total = act_coef * (busy * moe.expert_ffn_hidden_size + tokens * moe.shared_width)
        total += busy * PERMUTE_BYTES_PER_ROW * m.hidden_size + tokens * ROUTER_BYTES_PER_EXPERT * moe.num_experts
    return total * (2 if s.precision == "fp32" else 1) / s.tp


GemmTime = Callable[[float, float, float, eff.ArchEfficiency], float]


def wgrad_floor_s(s: Setup, e: eff.ArchEfficiency, weights: float, rows: float, k: float, n: float,
                  fp8_inputs: bool) -> float:
    """The least time a weight-gradient GEMM takes for its bytes: its inputs (rows x (k + n), 1 byte in FP8) and
    its output, `weights` elements of wgrad_bytes, at the GPU's streaming bandwidth (a GEMM's tiles load as a fused
    kernel's do, whatever the stack's elementwise kernels reach). With few rows per expert this, not the FLOPs,
    sets the time of a routed expert's weight gradient; at thousands of rows a GEMM stays compute-bound."""
    inputs = 1 if fp8_inputs else (4 if s.precision == "fp32" else 2)
    return (weights * wgrad_bytes(s) + rows * (k + n) * inputs) / (s.gpu.hbm_gbps * 1e9 * e.memory)


def wgrad_bytes(s: Setup) -> float:
    """HBM bytes per weight element a weight-gradient GEMM moves for its output: where it accumulates into the
    gradient buffer in its epilogue (Stack.wgrad_accumulates, full training, an unsharded buffer) a read and a write
    of the buffer's element every micro-batch (8 in fp32, 4 under a bf16 buffer); else the gradient written in the
    compute dtype (accumulation, if any, is a separate pass: performance.estimate_step)."""
    if s.wgrad_in_place:
        return 2.0 * s.gradient_bytes
    return 4.0 if s.precision == "fp32" else 2.0


def _mlp_time(s: Setup, e: eff.ArchEfficiency, tokens: int, peak: float, hbm_bps: float, gemm_time: GemmTime,
              act_coef: float, moe_layer: bool) -> tuple[float, float, float]:
    """(forward s, backward s with recomputation, FLOPs executed) of one layer's MLP."""
    frozen = s.method != "full"
    fwd = bwd = flops = fwd_flops = 0.0
    mods = s.recomputes  # Megatron's --recompute-modules (plan/recompute.py)
    again = again_flops = 0.0  # what they run again in backward
    cast = eff.FP8_RECIPES[s.fp8_recipe].cast_bytes
    for g in _mlp_gemms(s, tokens, moe_layer):
        g_fwd = gemm_time(g.flops, g.k, peak, e) / g.ramp
        casts = s.precision == "fp8" and g.fp8  # operand casts (Fp8Recipe.cast_bytes): rows x (K in, N out)
        rows = g.flops / (2 * g.k * g.n)
        cast_in = cast * rows * g.k / hbm_bps if casts else 0.0
        fwd += g_fwd
        if (("moe" in mods or g.shared and "shared_experts" in mods) if moe_layer else "mlp" in mods):
            again += g_fwd + cast_in
            again_flops += g.mean_flops
        bwd += gemm_time(g.flops, g.n, peak, e) / g.ramp  # input gradient
        flops += 2 * g.mean_flops
        fwd_flops += g.mean_flops
        if not frozen:  # weight gradient: K = rows, and never faster than its bytes move
            floor = wgrad_floor_s(s, e, g.weights, rows, g.k, g.n, casts)
            bwd += max(gemm_time(g.flops, g.rows, peak, e), floor)
            flops += g.mean_flops
        if casts:
            fwd += cast_in
            bwd += cast * rows * g.n / hbm_bps
    elem = _mlp_elementwise_bytes(s, tokens, moe_layer, act_coef) / hbm_bps
    fwd += 0.4 * elem
    bwd += 0.6 * elem
    if mods:
        if ("moe" in mods) if moe_layer else ("mlp" in mods):
            again += 0.4 * elem
        elif moe_layer and "moe_act" in mods:  # the experts' activation forward once more
            again += 0.4 * act_coef * tokens * busy_rows(s) * s.model.moe.expert_ffn_hidden_size / s.tp / hbm_bps
        if moe_layer and "layernorm" in mods:  # the pre-MLP norm: read the input, write the output
            again += 2 * (4 if s.precision == "fp32" else 2) * s.model.hidden_size * tokens / s.tp / hbm_bps
        return fwd, bwd + again, flops + again_flops
    if s.checkpointing == "full":
        return fwd, bwd + fwd, flops + fwd_flops
    if s.checkpointing == "selective-op":  # the MLP matmuls the op policy does not keep, its elementwise forward
        for i, o in _op_sac_mlp_unsaved(s, _mlp_width(s.model, moe_layer)):
            f = 2 * tokens * i * o / s.tp
            bwd += gemm_time(f, i, peak, e)
            flops += f
        for g in _mlp_gemms(s, tokens, moe_layer):
            if g.op_recompute:
                bwd += gemm_time(g.flops, g.k, peak, e) / g.ramp
                flops += g.mean_flops
        bwd += 0.4 * elem
    return fwd, bwd, flops


def _mlp_width(m: ModelSpec, moe_layer: bool) -> int:
    return m.moe.shared_width if moe_layer else m.ffn_hidden_size


def _op_sac_mlp_unsaved(s: Setup, ffn: int) -> list[tuple[int, int]]:
    """(in, out) of the MLP matmuls (dense or shared experts, `ffn` wide) that torchtitan's op policy
    recomputes in one block (activations.op_sac_matmuls: every other mm, counted from attention's)."""
    m = s.model
    n_attn = len(op_sac_matmuls(m, s.method, s.lora_rank, ffn=0, lora_targets=s.lora_targets))
    return [(i, o) for i, o, keep, adapter in op_sac_matmuls(m, s.method, s.lora_rank, ffn=ffn,
                                                             lora_targets=s.lora_targets)[n_attn:]
            if not (keep or adapter)]


def op_sac_recompute_flops_per_token(s: Setup) -> float:
    """FLOPs per token the op policy recomputes in the MLPs of all layers (counted like the MFU
    numerator): unsaved dense/shared matmuls, every router and the active routed experts."""
    m, moe = s.model, s.model.moe
    unsaved = lambda ffn: sum(i * o for i, o in _op_sac_mlp_unsaved(s, ffn))  # noqa: E731
    routed = mean_rows(s) * m.mlp_matrices * m.hidden_size * moe.expert_ffn_hidden_size
    per_moe = unsaved(moe.shared_width) + m.hidden_size * moe.num_experts + routed
    return 2 * (m.num_dense_layers * unsaved(m.ffn_hidden_size) + m.num_moe_layers * per_moe)


def op_sac_kept_per_token(s: Setup, residual_bytes: int, act_bytes: int) -> tuple[float, float]:
    """Bytes per token (before the 1/tp split) a dense and a MoE layer keep under torchtitan's op
    policy: input, kept matmul outputs and attention output (activations.op_sac_bytes_per_token);
    a MoE layer also the top-k scores (fp32) and indices (int64) and, with ep > 1, the outputs of
    its dispatch and combine all-to-alls (saved comm ops: all_to_all_single, deepep/hybridep
    dispatch and combine), rows of hidden size on the busiest rank."""
    m, moe = s.model, s.model.moe
    kw = dict(residual_bytes=residual_bytes, act_bytes=act_bytes, method=s.method, lora_rank=s.lora_rank,
              lora_targets=s.lora_targets,
              fp32_adapters=s.lora_fp32_copies, adapter_copy_bytes=s.lora_copy_bytes)
    dense = op_sac_bytes_per_token(m, ffn=m.ffn_hidden_size, **kw)
    sparse = op_sac_bytes_per_token(m, ffn=moe.shared_width, **kw) + moe.experts_per_token * (4 + 8)
    if s.ep > 1:
        sparse += 2 * busy_rows(s) * m.hidden_size * act_bytes
    return dense, sparse


def stage_time(s: Setup, e: eff.ArchEfficiency, tokens: int, peak: float, hbm_bps: float, gemm_time: GemmTime,
               act_coef: float, rest: tuple[float, float, float]) -> tuple[float, float, float]:
    """(forward s, backward s, FLOPs) of the slowest pipeline stage's blocks, one micro-batch: per
    layer `rest` (attention, norms: the same in every block) plus its MLP: dense layers' MLPs, MoE
    layers' routers, shared and routed experts (grouped GEMMs)."""
    dense = _mlp_time(s, e, tokens, peak, hbm_bps, gemm_time, act_coef, moe_layer=False)
    sparse = _mlp_time(s, e, tokens, peak, hbm_bps, gemm_time, act_coef, moe_layer=True)
    nd, nm = max(stage_mix(s.model, s.pp, s.pp_virtual), key=lambda mix: (mix[0] + mix[1]) * sum(rest[:2])
                 + mix[0] * sum(dense[:2]) + mix[1] * sum(sparse[:2]))
    return tuple((nd + nm) * r + nd * d + nm * x for r, d, x in zip(rest, dense, sparse, strict=True))


# --- communication -------------------------------------------------------------------------
def _a2a_intra_gbps(s: Setup, ring_intra_gbps: float, forward: bool = False) -> float:
    """All-to-all bandwidth over the node's links; `forward`: the NVLink leg of a hierarchical (deepep)
    dispatch across nodes (efficiency.A2A_FORWARD_NVLINK_EFFICIENCY)."""
    gpu = s.gpu
    topo = s.instance.topology if s.instance else ("nvswitch" if gpu.has_nvlink else "pcie")
    if topo in ("nvswitch", "nvlink-mesh") and gpu.nvlink_links and gpu.nvlink_link_gbps:
        fraction = eff.A2A_FORWARD_NVLINK_EFFICIENCY if forward else eff.A2A_NVLINK_EFFICIENCY
        return gpu.nvlink_links * gpu.nvlink_link_gbps * fraction
    return ring_intra_gbps  # PCIe: as the ring collectives


def _p_touched(experts: int, k: int, group: int) -> float:
    """Chance that k distinct experts, drawn uniformly from `experts`, include one of a given `group`
    of them (1 - C(experts - group, k) / C(experts, k))."""
    miss = 1.0
    for i in range(k):
        miss *= max(0.0, (experts - group - i) / (experts - i))
    return 1.0 - miss


def _groups_touched(s: Setup, group: int) -> float:
    """Expected number of distinct blocks of `group` consecutive experts (one GPU's, or one node's) that a
    token's k experts fall in. random: a trained, balanced router looks uniformly random to the dispatcher
    (Megatron's forced balance draws random logits: router.py apply_random_logits), E/group x _p_touched.
    contiguous: token t goes to experts t k .. t k + k - 1 (mod E), NeMo Automodel's FakeBalancedGate
    (`fake_balanced_gate`), averaged over the token positions."""
    e, k = s.model.moe.num_experts, s.model.moe.experts_per_token
    if s.expert_routing != "contiguous":
        return e / group * _p_touched(e, k, group)
    starts = range(0, e * k // gcd(e, k), k)  # t k mod E runs through these before repeating
    return sum(len({(x % e) // group for x in range(a, a + k)}) for a in starts) / len(starts)


def a2a_rows(s: Setup, local: int) -> tuple[float, float]:
    """(rows over NVLink, rows over the network) per token of this GPU's share in one dispatch (or
    combine), on the busiest rank; `local`: EP ranks in this GPU's node.

    alltoall: a row per routed expert, (ep - 1)/ep of them to other GPUs: k (local-1)/ep over NVLink,
    k (ep-local)/ep over the network (whatever the routing: destinations spread evenly). deepep (DeepEP
    normal kernels, HybridEP): a token goes once to each node holding one of its experts (network) and
    once to each GPU holding one (NVLink; a node's arrivals are forwarded to its GPUs). A token reaching
    g GPUs in n nodes (_groups_touched) sends n (nodes - 1)/nodes copies over the network and
    g (local - 1)/local over NVLink (the destinations are spread evenly over nodes and GPUs): uniformly
    random routing gives n = nodes p_node, g = ep p_gpu, the chance that a node (GPU) holds one of the k
    experts. Both scale with the load on the busiest rank (busy_rows / k)."""
    moe, ep = s.model.moe, s.ep
    rows = busy_rows(s)
    if s.ep_dispatcher != "deepep":
        return rows * (local - 1) / ep, rows * (ep - local) / ep
    per_gpu = moe.num_experts // ep
    load, nodes = rows / moe.experts_per_token, ep / local
    gpus_hit, nodes_hit = _groups_touched(s, per_gpu), _groups_touched(s, per_gpu * local)
    return load * gpus_hit * (local - 1) / local, load * nodes_hit * (nodes - 1) / nodes


FP8_DISPATCH_BYTES = 1 + 4 / 128
"""Bytes per element of an FP8 dispatch: e4m3 values plus one fp32 scale per 128 (DeepSeek-V3
report Sec. 3.3: 1x128 activation tiles; DeepEP's FP8 dispatch carries the same scales)."""


def ep_ranks_per_node(s: Setup, dp_ranks_per_node: int) -> int:
    """EP ranks inside a GPU's node: the expert grid puts EP ranks etp apart over the stage's GPUs in the
    node (dp_ranks_per_node x tp of them; performance.dp_layout): etp 1, ep 8 on 8-GPU nodes is one node
    whatever tp is."""
    return max(1, min(s.ep, dp_ranks_per_node * s.tp // s.expert_tp))


def a2a_call_s(s: Setup, tokens: int, dp_ranks_per_node: int, ring_intra_gbps: float, nbytes: float = 2.0) -> float:
    """One dispatch (or combine) all-to-all of one MoE layer and micro-batch, on the busiest rank.

    Each GPU sends its tokens' hidden states (tokens/tp of them: with TP, sequence parallelism
    gives each rank its share) to the GPUs holding their experts, `nbytes` per element
    (a2a_rows); the part bound for other nodes goes over this GPU's share of the node's network
    (EFA, InfiniBand), the rest over NVLink, the two at once."""
    m = s.model
    local = ep_ranks_per_node(s, dp_ranks_per_node)
    nvl_rows, net_rows = a2a_rows(s, local)
    row = tokens / s.tp * m.hidden_size * nbytes
    hierarchical = s.ep_dispatcher == "deepep" and net_rows > 0  # forwarded inside the destination node
    t = row * nvl_rows / (_a2a_intra_gbps(s, ring_intra_gbps, forward=hierarchical) * 1e9)
    if net_rows > 0:
        net = (s.inter_node_gbps or 0.0) / 8 / s.gpus_per_node * eff.A2A_NETWORK_EFFICIENCY
        t = max(t, row * net_rows / (net * 1e9)) if net > 0 else float("inf")
    return t + eff.COLLECTIVE_LATENCY_S + eff.RING_STEP_LATENCY_S * s.ep


def a2a_s(s: Setup, tokens: int, dp_ranks_per_node: int, ring_intra_gbps: float) -> float:
    """All-to-alls of one micro-batch on the worst stage, per MoE layer: dispatch and combine
    forward, their mirrors backward (the combine's gradient travels like a dispatch, the
    dispatch's like a combine), and the forward pair again under full recompute. FP8 dispatch
    (Setup.fp8_dispatch): the dispatch-like calls in FP8, the combine-like ones in BF16."""
    if s.ep <= 1:
        return 0.0
    a = 4.0 if s.precision == "fp32" else 2.0
    pairs = 2 + (1 if s.checkpointing == "full" or "moe" in s.recomputes else 0)
    dispatch = a2a_call_s(s, tokens, dp_ranks_per_node, ring_intra_gbps, FP8_DISPATCH_BYTES if s.fp8_dispatch else a)
    combine = a2a_call_s(s, tokens, dp_ranks_per_node, ring_intra_gbps, a) if s.fp8_dispatch else dispatch
    moe_layers = max(nm for _, nm in stage_mix(s.model, s.pp, s.pp_virtual))
    return moe_layers * pairs * (dispatch + combine)


def expert_tp_buffer_bytes(s: Setup, tokens: int) -> float:
    """Bytes one expert TP group gathers per MoE layer and micro-batch (the output of its all-gather, the
    input of the mirror reduce-scatter), on the busiest rank; 0 with etp 1. With EP, the routed rows its
    ranks received (Megatron's alltoall dispatcher all-gathers them over the expert TP group after the
    all-to-all: token_dispatcher.py dispatch_postprocess; DeepEP sends each row to the etp ranks instead,
    the same volume); without EP, the hidden states of etp/tp of the tokens (the allgather dispatcher
    gathers them over the tp x ep group before routing, as torchtitan's and transformers' TP plans
    gather a MoE layer's input)."""
    if s.expert_tp <= 1:
        return 0.0
    a = 4.0 if s.precision == "fp32" else 2.0
    rows = busy_rows(s) if s.ep > 1 else 1.0
    return tokens * s.expert_tp / s.tp * rows * s.model.hidden_size * a


def expert_dp_layout(s: Setup, dp_ranks_per_node: int, share: float) -> tuple[int, int, float]:
    """(ranks, ranks per node, share of the node's network) of the group that reduces one
    expert's gradients: the edp ranks holding the same expert shard, etp x ep apart in the
    expert grid (over the dp_ranks_per_node x tp GPUs of the stage in a node)."""
    per_node = max(1, dp_ranks_per_node * s.tp // (s.expert_tp * s.ep))
    return s.expert_dp, per_node, share * per_node / dp_ranks_per_node


def assumptions(s: Setup) -> list[str]:
    """What the estimate assumes about a MoE model, in words for the output."""
    m = s.model
    if m.moe is None:
        return []
    moe = m.moe
    stated = "given" if s.load_imbalance is not None else "assumed"
    routing = (f"capacity factor {moe.capacity_factor:g} (expert buffers padded to capacity)"
               if moe.capacity_factor is not None else
               f"dropless routing, busiest expert-parallel rank {load_imbalance(s):g}x the mean load ({stated})")
    spread = ("routing contiguous: token t to experts t*k..t*k+k-1, as fake_balanced_gate" if s.expert_routing ==
              "contiguous" else "routing taken as uniformly random")
    if s.ep == 1:
        dispatch, caveat = "no expert parallelism: no token leaves its GPU", ""
    else:
        dispatch = (f"DeepEP-style dispatch (a token once per GPU and per node holding its experts, {spread})"
                    if s.ep_dispatcher == "deepep" else "all-to-all dispatch (a row per routed expert)")
        dispatch += " in FP8, combine in BF16" if s.fp8_dispatch else ""
        dispatch += (", overlapped with another micro-batch's compute" if s.ep_overlap
                     else ", not overlapped with compute")
        caveat = get_stack(s.stack).alltoall_caveat if s.ep_dispatcher == "alltoall" else ""
    et = s.expert_tp
    grid = f"experts split ep {s.ep} x etp {et}, expert data-parallel {s.expert_dp}"
    if et != s.tp:
        grid += f"; attention tp {s.tp} x dp {s.dp}: expert grid folded over the same GPUs (MoE parallel folding)"
    return [f"MoE: {moe.experts_per_token} of {moe.num_experts} experts per token, {routing}; {grid}"
            + f"; grouped-GEMM efficiency rows/(rows+{grouped_gemm_m0(s):g}) per expert; {dispatch} "
            f"(stack {s.stack})" + (f"; {caveat}" if caveat else "")
            + ("; LoRA adapts attention and shared experts only" if s.method != "full" else "")]
