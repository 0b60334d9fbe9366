"""Mixture-of-experts physics: where expert weights live under expert parallelism (EP), what
routed tokens save for backward, and what the experts' grouped GEMMs and all-to-alls cost.
memory.py and performance.py call these for MoE models only; dense models never get here.

Layout, as torchtitan and Megatron-Core build it:
* EP groups are carved out of the data-parallel ranks; rank order is TP innermost, then EP,
  then the rest of DP, then PP (Megatron's tp-cp-ep-dp-pp). An EP group therefore stays
  inside a node while ep <= GPUs per node / tp, and spans nodes beyond that.
* Routed experts are split ep ways (E/ep per GPU) and, like the dense MLP, tp ways
  (Megatron-Core's default expert_tensor_parallel_size = tensor_model_parallel_size; with TP
  and EP it requires sequence parallelism, so each TP rank routes its share of the tokens).
  ZeRO/FSDP then shards their states over the dp/ep ranks that hold the same experts
  (torchtitan's dp_mod_ep mesh). Attention, dense MLPs, shared experts and routers are
  replicated across the EP ranks and sharded over all dp ranks as in a dense model.
* Pipeline stages take num_layers/pp contiguous layers; DeepSeek's dense first layers and
  qwen2_moe's interleaved dense layers make stages differ: the worst stage sets memory and pace.

Routing:
* dropless (capacity_factor None): every token reaches its k experts; the busiest EP rank
  receives LOAD_IMBALANCE x the mean (ep > 1; with ep = 1 a rank computes exactly k rows per
  token whatever the routing). That sets its expert GEMMs, its routed activations and the
  all-to-alls; FLOPs counted for MFU/HFU stay the mean.
* capacity factor c: every expert's buffer is padded to c x its mean share (Megatron
  --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity, GShard): c x k rows per
  token in compute, memory and all-to-all volume, and no imbalance beyond that.
* each MoE layer sends every token's hidden state to its k experts and back: dispatch and
  combine all-to-alls forward, their mirror images backward (4 per layer and micro-batch; 6
  with full recomputation, which reruns the forward's two). Not overlapped with compute
  (torchtitan's and Megatron's alltoall dispatcher by default; DeepSeek's DualPipe hides them,
  which is not credited here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import efficiency as eff
from .model_spec import ModelSpec
from .setup import Setup

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
def stage_mix(m: ModelSpec, pp: int) -> list[tuple[int, int]]:
    """(dense layers, MoE layers) of each pipeline stage (num_layers/pp contiguous layers each)."""
    return _memo(m, ("mix", pp), lambda: _stage_mix(m, pp))


def _stage_mix(m: ModelSpec, pp: int) -> list[tuple[int, int]]:
    first, freq = m.moe.first_dense_layers, m.moe.layer_freq
    per = m.num_layers // pp
    mix = []
    for j in range(pp):
        a, b = j * per, (j + 1) * per
        # layer i is MoE when i >= first and (i + 1) % freq == 0 (ModelSpec.is_moe_layer)
        n_moe = b // freq - max(a, first) // freq if b > first else 0
        mix.append((per - n_moe, n_moe))
    return mix


def worst_stage(m: ModelSpec, pp: int, dense_cost: float, moe_cost: float) -> float:
    """The largest per-stage sum of a cost counted per dense and per MoE layer."""
    return max(nd * dense_cost + nm * moe_cost for nd, nm in stage_mix(m, pp))


def _layer_params(m: ModelSpec) -> tuple[int, int, int]:
    """(a dense layer, a MoE layer without its routed experts, a MoE layer's routed experts)."""
    return _memo(m, ("params",), lambda: _count_layer_params(m))


def _count_layer_params(m: ModelSpec) -> tuple[int, int, int]:
    experts = m.moe.num_experts * m.expert_params()
    moe_block = m.layer_params(next(i for i in range(m.num_layers) if m.is_moe_layer(i)))
    dense_block = moe_block - m.moe_mlp_params() + m.dense_mlp_params()  # same attention and norms
    return dense_block, moe_block - experts, experts


def stage_params(s: Setup) -> tuple[float, float, float]:
    """Per GPU before ZeRO sharding, on the worst pipeline stage, 1/tp: (blocks' parameters,
    of them routed experts, the largest block: one FSDP unit)."""
    return _memo(s.model, ("stage", s.tp, s.pp, s.ep), lambda: _stage_params(s.model, s.tp, s.pp, s.ep))


def _stage_params(m: ModelSpec, tp: int, pp: int, ep: int) -> tuple[float, float, float]:
    dense, moe_rest, experts = _layer_params(m)
    moe_local = moe_rest + experts / ep
    worst = max(stage_mix(m, pp), key=lambda mix: mix[0] * dense + mix[1] * moe_local)
    blocks = (worst[0] * dense + worst[1] * moe_local) / tp
    unit = max([moe_local] + ([dense] if m.num_dense_layers else [])) / tp
    return blocks, worst[1] * experts / ep / tp, unit


def busy_rows(s: Setup) -> float:
    """Routed rows per token on the busiest EP rank: k x capacity factor, or k x the load
    imbalance when tokens cross EP ranks dropless."""
    moe = s.model.moe
    if moe.capacity_factor is not None:
        return moe.experts_per_token * moe.capacity_factor
    return moe.experts_per_token * (eff.LOAD_IMBALANCE if s.ep > 1 else 1.0)


def mean_rows(s: Setup) -> float:
    """Routed rows per token on an average rank (what the FLOP counts use)."""
    moe = s.model.moe
    return moe.experts_per_token * (moe.capacity_factor or 1.0)


# --- memory --------------------------------------------------------------------------------
def moe_layer_bytes_per_token(s: Setup, dense_layer_bytes: Callable[[ModelSpec], float], act_bytes: int) -> float:
    """Activation bytes a MoE layer saves per token (before the 1/tp split), on the busiest rank.

    The MLP part is what a dense MLP of width rows x expert width + shared width saves
    (`dense_layer_bytes` on such a shape: the stack's own per-op count), plus the routing:
    router logits (activation dtype) and fp32 scores per expert, top-k weights (fp32) and
    indices (int64) per routed expert, and per routed row the dispatched input kept for the
    experts' weight gradient, the expert output kept for the combine's gradient and an int64
    permutation index. A capacity factor sizes these buffers to capacity (busy_rows)."""
    m, moe = s.model, s.model.moe
    rows = busy_rows(s)
    width = rows * moe.expert_ffn_hidden_size + moe.shared_width
    f = max(1, round(width))
    mlp_shape = _memo(m, ("mlp", f), lambda: m.model_copy(update={"ffn_hidden_size": f}))
    routing = (act_bytes + 4) * moe.num_experts + 12 * moe.experts_per_token
    routed = rows * (2 * act_bytes * m.hidden_size + 8)
    return dense_layer_bytes(mlp_shape) + routing + routed


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
    ramp: float = 1.0  # grouped GEMMs: rows / (rows + GROUPED_GEMM_M0) on forward and input gradient


def _ffn(d: int, f: int, t: int, gated: bool, tokens: float) -> list[_Gemm]:
    up = (2 if gated else 1) * f
    return [_Gemm(2 * tokens * d * up / t, 2 * tokens * d * up / t, d, up / t, tokens),
            _Gemm(2 * tokens * f / t * d, 2 * tokens * f / t * d, f / t, d, tokens)]


def _mlp_gemms(s: Setup, tokens: int, moe_layer: bool) -> list[_Gemm]:
    m, t = s.model, s.tp
    d = m.hidden_size
    if not moe_layer:
        return _ffn(d, m.ffn_hidden_size, t, m.gated_mlp, tokens)
    moe = m.moe
    router = 2 * tokens * d * moe.num_experts / t  # sequence parallel: each TP rank routes tokens/tp
    gemms = [_Gemm(router, router, d, moe.num_experts, tokens / t)]
    if moe.shared_width:
        gemms += _ffn(d, moe.shared_width, t, m.gated_mlp, tokens)
    busy, mean = tokens * busy_rows(s), tokens * mean_rows(s)
    per_expert = mean * s.ep / moe.num_experts  # rows each local expert receives
    ramp = per_expert / (per_expert + eff.GROUPED_GEMM_M0)
    fe, up = moe.expert_ffn_hidden_size, (2 if m.gated_mlp else 1) * moe.expert_ffn_hidden_size
    gemms += [_Gemm(2 * busy * d * up / t, 2 * mean * d * up / t, d, up / t, per_expert, ramp),
              _Gemm(2 * busy * fe / t * d, 2 * mean * fe / t * d, fe / t, d, per_expert, ramp)]
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


def _mlp_time(s: Setup, e: eff.ArchEfficiency, tokens: int, peak: float, hbm_bps: float, gemm_time: GemmTime,
              act_coef: float, moe_layer: bool) -> tuple[float, float, float]:
    """(forward s, backward s with recomputation, FLOPs executed) of one layer's MLP."""
    frozen = s.method != "full"
    fwd = bwd = flops = fwd_flops = 0.0
    for g in _mlp_gemms(s, tokens, moe_layer):
        fwd += gemm_time(g.flops, g.k, peak, e) / g.ramp
        bwd += gemm_time(g.flops, g.n, peak, e) / g.ramp  # input gradient
        flops += 2 * g.mean_flops
        fwd_flops += g.mean_flops
        if not frozen:
            bwd += gemm_time(g.flops, g.rows, peak, e)  # weight gradient: K = rows
            flops += g.mean_flops
    elem = _mlp_elementwise_bytes(s, tokens, moe_layer, act_coef) / hbm_bps
    fwd += 0.4 * elem
    bwd += 0.6 * elem
    if s.checkpointing == "full":
        return fwd, bwd + fwd, flops + fwd_flops
    return fwd, bwd, flops


def mlp_stage_time(s: Setup, e: eff.ArchEfficiency, tokens: int, peak: float, hbm_bps: float, gemm_time: GemmTime,
                   act_coef: float) -> tuple[float, float, float]:
    """(forward s, backward s, FLOPs) of the MLPs of the slowest pipeline stage, one micro-batch:
    dense layers' MLPs and MoE layers' routers, shared and routed experts (grouped GEMMs)."""
    dense = _mlp_time(s, e, tokens, peak, hbm_bps, gemm_time, act_coef, moe_layer=False)
    sparse = _mlp_time(s, e, tokens, peak, hbm_bps, gemm_time, act_coef, moe_layer=True)
    nd, nm = max(stage_mix(s.model, s.pp), key=lambda mix: mix[0] * sum(dense[:2]) + mix[1] * sum(sparse[:2]))
    return nd * dense[0] + nm * sparse[0], nd * dense[1] + nm * sparse[1], nd * dense[2] + nm * sparse[2]


# --- communication -------------------------------------------------------------------------
def _a2a_intra_gbps(s: Setup, ring_intra_gbps: float) -> float:
    gpu = s.gpu
    topo = s.instance.topology if s.instance else ("nvswitch" if gpu.has_nvlink else "pcie")
    if topo in ("nvswitch", "nvlink-mesh") and gpu.nvlink_links and gpu.nvlink_link_gbps:
        return gpu.nvlink_links * gpu.nvlink_link_gbps * eff.A2A_NVLINK_EFFICIENCY
    return ring_intra_gbps  # PCIe: as the ring collectives


def a2a_call_s(s: Setup, tokens: int, dp_ranks_per_node: int, ring_intra_gbps: float) -> float:
    """One dispatch (or combine) all-to-all of one MoE layer and micro-batch, on the busiest rank.

    Each GPU sends its tokens' hidden states to their k experts: tokens/tp x rows x hidden x
    bytes, of which (ep-1)/ep leave the GPU; the part bound for EP ranks on other nodes goes
    over this GPU's share of the node's network (EFA, InfiniBand), the rest over NVLink."""
    m = s.model
    a = 4 if s.precision == "fp32" else 2
    volume = tokens / s.tp * busy_rows(s) * m.hidden_size * a
    ep = s.ep
    local = max(1, min(ep, dp_ranks_per_node))  # EP ranks inside this GPU's node
    t = volume * (local - 1) / ep / (_a2a_intra_gbps(s, ring_intra_gbps) * 1e9)
    if ep > local:
        net = (s.inter_node_gbps or 0.0) / 8 / s.gpus_per_node * eff.A2A_NETWORK_EFFICIENCY
        t = max(t, volume * (ep - local) / ep / (net * 1e9)) if net > 0 else float("inf")
    return t + eff.COLLECTIVE_LATENCY_S + eff.RING_STEP_LATENCY_S * ep


def a2a_s(s: Setup, tokens: int, dp_ranks_per_node: int, ring_intra_gbps: float) -> float:
    """All-to-alls of one micro-batch on the worst stage: 4 per MoE layer, 6 with full recompute."""
    if s.ep <= 1:
        return 0.0
    calls = 4 + (2 if s.checkpointing == "full" else 0)
    moe_layers = max(nm for _, nm in stage_mix(s.model, s.pp))
    return moe_layers * calls * a2a_call_s(s, tokens, dp_ranks_per_node, ring_intra_gbps)


def expert_dp_layout(s: Setup, dp_ranks_per_node: int, share: float) -> tuple[int, int, float]:
    """(ranks, ranks per node, share of the node's network) of the group that reduces one
    expert's gradients: the dp/ep ranks holding the same experts, ep apart."""
    per_node = max(1, dp_ranks_per_node // s.ep)
    return s.dp // s.ep, per_node, share * per_node / dp_ranks_per_node


def assumptions(s: Setup) -> list[str]:
    """What the estimate assumes about a MoE model, in words for the output."""
    m = s.model
    if m.moe is None:
        return []
    moe = m.moe
    routing = (f"capacity factor {moe.capacity_factor:g} (expert buffers padded to capacity)"
               if moe.capacity_factor is not None else
               f"dropless routing, busiest expert-parallel rank {eff.LOAD_IMBALANCE:g}x the mean load (assumed)")
    return [f"MoE: {moe.experts_per_token} of {moe.num_experts} experts per token, {routing}; experts split "
            f"ep {s.ep} x tp {s.tp} (expert TP = TP, Megatron-Core's default); grouped-GEMM efficiency "
            f"rows/(rows+{eff.GROUPED_GEMM_M0:g}) per expert; dispatch/combine all-to-alls not overlapped with "
            f"compute; LoRA adapts attention and shared experts only"]
