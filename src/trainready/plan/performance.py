"""Step time: FLOPs and bytes counted from the shapes, divided by achievable peaks.

Per micro-batch on one GPU:
* GEMMs: forward, input-gradient and weight-gradient matmul of every linear layer and the
  output head, each at `gemm * K / (K + k0)` of the dense peak (efficiency.py); frozen
  LoRA base weights skip the weight-gradient matmul.
* attention: causal FlashAttention, forward 2*s*q_dim FLOPs per token and layer, backward
  2.5x that (it recomputes the scores), at the measured attention efficiency.
* memory-bound kernels (norms, activations, residual adds, RoPE, loss): bytes moved over
  achievable HBM bandwidth, counted per operation for eager or fused kernels.
* recompute: full checkpointing runs each block's forward twice; selective-attn the attention
  forward; selective-op (torchtitan's op policy) the matmuls it does not keep and all
  elementwise forward kernels.
* a CPU floor: eager PyTorch cannot issue a block's kernels faster than a few ms.
Per step: micro-batches x the above, + optimizer (memory-bound), + exposed communication
(ring collectives, intra-node links vs the node's network, overlap with compute), + the
pipeline bubble.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from . import efficiency as eff
from . import moe
from .activations import lora_dropout_elements, op_sac_matmuls
from .attention import attention_path, layer_attention
from .memory import NF4_BYTES, param_counts
from .model_spec import ModelSpec
from .recompute import norm_modules, up_proj_params
from .setup import Setup
from .stacks import get_stack


@dataclass(frozen=True, slots=True)
class StepResult:
    step_s: float
    compute_s: float  # GPU compute per step (all micro-batches, incl. recompute, optimizer)
    exposed_comm_s: float
    other_s: float  # pipeline bubble, offload transfers, CPU-bound stalls
    comm_s: float  # total communication time (overlapped or not)
    hardware_flops_per_token: float  # all GPUs, FLOPs executed (causal attention, recompute, TP splits)
    model_flops_per_token: float  # MFU numerator per token (6N + attention, PaLM/MosaicML)
    hfu_flops_per_token: float  # MFU's count plus recomputation and padded expert rows (Korthikanti/MosaicML HFU)
    tokens_per_s: float
    mfu: float
    hfu: float
    optimizer_s: float = 0.0  # of compute_s: the optimizer step (GPU AdamW, or CPU-Adam and its copies with offload)


# --- counting --------------------------------------------------------------------------
def _gemms(s: Setup) -> list[tuple[int, int, int]]:
    """(K, N, count) of one block's forward matmuls per token (M = tokens), TP-split. MoE
    models: attention only (their MLPs differ by layer: moe.stage_time); MLA: its projections."""
    m, t = s.model, s.tp
    d, f = m.hidden_size, m.ffn_hidden_size
    up = 2 * f if m.gated_mlp else f
    return moe.attention_gemms(s) + ([] if m.is_moe else [(d, up // t, 1), (f // t, d, 1)])


def _module_gemm_indices(s: Setup) -> frozenset[int]:
    """Which of _gemms(s) Megatron's --recompute-modules run again in backward: MLA's up projections (K = a latent
    rank) under mla_up_proj, a dense model's MLP under mlp (a MoE model's MLPs: moe.stage_time)."""
    mods, m = s.recomputes, s.model
    if not mods:
        return frozenset()
    attn = moe.attention_gemms(s)
    out = set()
    if "mla_up_proj" in mods and m.mla is not None:  # without a q latent, the q projection (attn[0]) is inside too
        ranks = {m.mla.q_lora_rank, m.mla.kv_lora_rank} - {None}
        out |= {i for i, (k, _, _) in enumerate(attn) if k in ranks} | (set() if m.mla.q_lora_rank else {0})
    if "mlp" in mods and not m.is_moe:
        out |= {len(attn), len(attn) + 1}
    return frozenset(out)


def overlapped_share(s: Setup) -> float:
    """The share of a rank's micro-batch passes whose all-to-alls Megatron's EP overlap hides: only a forward paired
    with another micro-batch's backward overlaps. Without pipelining the first forward and the last backward run
    alone (schedules.py combined_1f1b_schedule_for_no_pipelining): (m - 1)/m. Interleaved, the first rank's warmup
    forwards, (pp - 1) x 2 + (v - 1) x pp of its m x v chunk passes (get_pp_rank_microbatches, micro-batch groups
    of pp), and as many cooldown backwards run unpaired: in every schedule call (Setup.schedule_calls)."""
    m = s.schedule_microbatches
    if s.pp == 1:
        return (m - 1) / m
    passes = m * s.pp_virtual
    warmup = (s.pp - 1) * 2 + (s.pp_virtual - 1) * s.pp
    return max(0.0, passes - warmup) / passes


def fp8_tp_gather(s: Setup) -> bool:
    """Whether the job's TP all-gathers move FP8 (Stack.fp8_tp_gather): a column-parallel linear's input forward and
    a row-parallel one's output gradient backward (torchao Float8ColwiseParallel / Float8RowwiseParallel, "all-gather
    in float8"). Dense GQA models only: torchtitan's MoE models run their TP with enable_float8_tensorwise_tp=False
    (DeepSeek-V3's parallelize raises "float8 tensorwise TP is not tested")."""
    stack, m = get_stack(s.stack), s.model
    return (s.precision == "fp8" and s.tp > 1 and stack.sequence_parallel and s.fp8_recipe in stack.fp8_tp_gather
            and not m.is_moe and m.mla is None)


def tp_allreduces(s: Setup) -> float:
    """A dense block's TP collectives per micro-batch, counted in all-reduces of its bf16 activations (one all-gather
    plus one reduce-scatter under sequence parallelism). Forward: two (attention, MLP); backward: two; full
    recompute runs the forward's again. The op policy (selective-op) saves reduce-scatter outputs but neither
    all-gathers nor all-reduces (torchtitan activation_checkpoint.py _op_sac_save_list), so recompute gathers (or,
    without sequence parallelism, all-reduces) again. An FP8 all-gather (fp8_tp_gather) moves half the bytes."""
    if get_stack(s.stack).sequence_parallel:
        gathers = 2 * 0.5 * (0.5 if fp8_tp_gather(s) else 1.0)  # forward inputs; backward output gradients alike
        fwd = bwd = gathers + 2 * 0.5
    else:
        gathers = fwd = bwd = 2.0
    again = {"full": fwd, "selective-op": gathers}.get(s.checkpointing, 0.0)
    return fwd + bwd + again


def _fp8_gathered(s: Setup) -> tuple[frozenset[int], frozenset[int]]:
    """Which of _gemms(s) gather an FP8 input forward (column-parallel: qkv, the MLP's up projection) and which an FP8
    output gradient backward (row-parallel: the attention output and down projections), under fp8_tp_gather."""
    if not fp8_tp_gather(s):
        return frozenset(), frozenset()
    return frozenset({0, 2}), frozenset({1, 3})  # dense GQA: [qkv, o, up, down]


def _gemm_time(flops: float, k: float, peak: float, e: eff.ArchEfficiency) -> float:
    return flops / (peak * e.gemm * k / (k + e.gemm_k0))


def model_flops_per_token(s: Setup) -> float:
    return flops_per_token(s.model, s.attention_len, s.method, s.lora_rank, s.lora_targets)


def flops_per_token(m: ModelSpec, seq_len: int, method: str = "full", lora_rank: int = 16,
                    lora_targets: Collection[str] | None = None) -> float:
    """6N + 12*L*q_dim*s (PaLM/MosaicML), N = weights used in matmuls (blocks + head), s the length attention spans
    (a packed document's where documents are masked apart: Setup.attention_len).
    For LoRA/QLoRA the frozen base needs no weight gradients: 4N + 6 x adapters (on `lora_targets`; None: every
    linear layer).
    The MFU numerator: what `trainready run` divides by the GPUs' peak."""
    attn = 12 * m.num_layers * moe.attention_dim(m) * layer_attention(m, seq_len).span
    n = m.matmul_params()  # MoE: active experts only
    if method == "full":
        return 6 * n + attn
    adapters = m.num_layers * m.lora_params_per_layer(lora_rank, lora_targets)
    return 4 * n + 6 * adapters + attn


def recompute_flops_per_token(s: Setup) -> float:
    """Extra FLOPs per token of recomputation, counted like the MFU numerator."""
    m = s.model
    attn_fwd = 4 * m.num_layers * moe.attention_dim(m) * layer_attention(m, s.attention_len).span
    if s.checkpointing == "full":
        if m.is_moe or m.mla is not None:  # the blocks' active matmul weights
            return 2 * (m.matmul_params() - m.vocab_size * (m.embedding_dim or m.hidden_size)) + attn_fwd
        return 2 * m.num_layers * (m.attention_params() + m.mlp_params()) + attn_fwd
    if s.checkpointing == "selective-attn":  # Megatron's modules (plan/recompute.py)
        return (attn_fwd if "core_attn" in s.recomputes else 0.0) + _modules_flops_per_token(s)
    if s.checkpointing == "selective-op":  # the matmuls the op policy does not keep (MoE: MLPs per layer kind)
        ffn = 0 if m.is_moe else None
        matmuls = op_sac_matmuls(m, s.method, s.lora_rank, ffn, s.lora_targets)
        attn_mlp = 2 * m.num_layers * sum(i * o for i, o, keep, adapter in matmuls if not (keep or adapter))
        return attn_mlp + (moe.op_sac_recompute_flops_per_token(s) if m.is_moe else 0.0)
    return 0.0


def _modules_flops_per_token(s: Setup) -> float:
    """FLOPs per token that Megatron's --recompute-modules other than core_attn run again (MFU-style count)."""
    m, mods = s.model, s.recomputes
    total = 0.0
    if "mla_up_proj" in mods and m.mla is not None:
        total += m.num_layers * up_proj_params(m)
    if "mlp" in mods:
        total += m.num_dense_layers * m.mlp_matrices * m.hidden_size * m.ffn_hidden_size
    if m.is_moe:
        moe_ = m.moe
        shared = m.mlp_matrices * m.hidden_size * moe_.shared_width
        if "moe" in mods:
            total += m.num_moe_layers * (shared + m.hidden_size * moe_.num_experts + moe.mean_rows(s) * m.mlp_matrices
                                         * m.hidden_size * moe_.expert_ffn_hidden_size)
        elif "shared_experts" in mods:
            total += m.num_moe_layers * shared
    return 2 * total


def host_cpu_cores(s: Setup) -> tuple[int, bool]:
    """(physical cores per node, known from the catalog): cloud vCPUs are hyperthreads, two per core."""
    vcpus = s.instance.vcpus if s.instance is not None else None
    if vcpus:
        return max(1, vcpus // 2), True
    return max(1, eff.ASSUMED_HOST_VCPUS_PER_GPU * s.gpus_per_node // 2), False


def cpu_adam_s(s: Setup, node_params: float) -> float:
    """DeepSpeed CPU-Adam over the parameters one node updates: compute-bound per core (efficiency.py)."""
    return node_params / (host_cpu_cores(s)[0] * eff.CPU_ADAM_PARAMS_PER_CORE_S)


def _op_sac_recompute(s: Setup, tokens: int, peak: float, e: eff.ArchEfficiency) -> tuple[float, float]:
    """(seconds, FLOPs) of one block's matmuls that the op policy recomputes, per micro-batch."""
    t = f = 0.0
    ffn = 0 if s.model.is_moe else None  # MoE models: the MLPs' recompute is per layer kind (moe.stage_time)
    for i, o, keep, adapter in op_sac_matmuls(s.model, s.method, s.lora_rank, ffn, s.lora_targets):
        if not (keep or adapter):  # adapters' rank-r matmuls: negligible
            flops = 2 * tokens * i * o / s.tp
            t += _gemm_time(flops, i, peak, e)
            f += flops
    return t, f


def _elementwise_bytes_per_token_layer(s: Setup) -> float:
    """HBM bytes moved by non-matmul kernels of one block, forward + backward."""
    m = s.model
    d, q, kv, f = m.hidden_size, m.q_dim, m.kv_dim, m.ffn_hidden_size
    eager = s.kernels == "eager"
    # norm: fused = read x, write y; backward read x, dy, write dx (10 bytes/elem at bf16).
    # eager HF RMSNorm: upcast, pow, mean, mul, downcast, weight mul, and their backward.
    norm = (100 if (eager and m.norm == "rmsnorm") else 10) * d
    residual = 2 * 12 * d  # two adds, forward and backward gradient accumulation
    act = _act_bytes(s, f) if not m.is_moe else 0  # MoE models: per layer kind in moe.stage_time
    rope = ((40 if eager else 8) * (q + kv)) if m.position == "rope" else 0
    copies = 8 * q if eager else 0  # attention output transpose+contiguous, fwd and bwd
    whole = m.norms_per_layer * norm + residual  # on the sequence: split over TP only with sequence parallelism
    sp = get_stack(s.stack).sequence_parallel
    total = (act + rope + copies) / s.tp + whole / (s.tp if sp else 1)
    return total * (2 if s.precision == "fp32" else 1)


def _act_bytes(s: Setup, f: float) -> float:
    """HBM bytes of an MLP's activation function per token, forward + backward, width f."""
    m, eager = s.model, s.kernels == "eager"
    if m.gated_mlp:
        return (26 if eager else 16) * f
    if m.activation == "gelu_tanh_composed" and eager:
        return 100 * f  # ~8 elementwise kernels forward (pow, mul, add, mul, tanh, add, mul, mul) and their backward
    return 10 * f


def _adapter_time(s: Setup, tokens: int, peak: float, e: eff.ArchEfficiency) -> tuple[float, float, float]:
    """LoRA adapters of one block: (forward s, backward s, FLOPs).

    Eager (PEFT): adapters are fp32, so each adapted linear casts its input to fp32, runs two
    fp32 matmuls (x A, then B) and adds the fp32 result to the bf16 base output before
    casting back: forward 6*in + 28*out bytes, backward 20*in + 24*out bytes per token
    (counted from PEFT's LoraLayer.forward and autograd), matmuls at the fp32 peak. Under autocast
    (Setup.autocast) the fp32 copy is cast back to bf16 for bf16 matmuls (read 4, write 2), and the
    output side is the model dtype's: forward 12*in + 10*out, backward 18*in + 15*out bytes (each cast's
    backward, 6 bytes an element, and the input gradient's accumulation, 6).
    Adapters that read the model's own input (Setup.lora_fp32_copies False: adapters in the model's dtype as
    Megatron-Bridge, NeMo AutoModel and DeepSpeed's cast have them, QLoRA's 4-bit layers under autocast): bf16
    matmuls, scale-and-add only, 10*out + 15*out bytes.
    Dropout (Setup.lora_dropout_at) reads and writes what it drops and writes a 1-byte mask, and its backward reads
    the gradient and the mask and writes the gradient: (2c + 1) bytes per element each way, on the adapters' inputs
    ("pre": c = 4 under PEFT, which drops its fp32 copy, else the activation bytes; once per fused module under
    Megatron-Core) or outputs ("post"): activations.lora_dropout_elements.
    """
    dims = s.model.linear_layer_dims(s.lora_targets)
    sum_in = sum(i for i, _ in dims) / s.tp
    sum_out = sum(o for _, o in dims) / s.tp
    flops_fwd = 2 * tokens * s.lora_rank * (sum_in + sum_out)
    hbm = s.gpu.hbm_gbps * 1e9 * e.memory  # large contiguous elementwise kernels
    rate = peak * e.gemm * 0.5  # skinny (rank-r) bf16 matmuls
    if s.lora_copy_bytes == 4:  # fp32 copies: fp32 matmuls
        rate = (s.gpu.peak_tflops("fp32") or peak / 1e12 / 16) * 1e12 * 0.9 * e.compute_scale
        fwd_bytes, bwd_bytes = 6 * sum_in + 28 * sum_out, 20 * sum_in + 24 * sum_out
    elif s.lora_copy_bytes == 2:  # autocast's bf16 casts of the fp32 copies
        fwd_bytes, bwd_bytes = 12 * sum_in + 10 * sum_out, 18 * sum_in + 15 * sum_out
    else:
        fwd_bytes, bwd_bytes = 10 * sum_out, 15 * sum_out
    if s.lora_dropout_at:
        stack = get_stack(s.stack)
        c = 4 if (s.lora_dropout_at == "pre" and s.lora_fp32_copies) or s.precision == "fp32" else 2
        n, whole = (lora_dropout_elements(s.model, s.lora_targets, s.lora_dropout_at, stack.lora_fused_modules, w)
                    for w in (False, True))
        whole = 0 if stack.sequence_parallel else whole  # without SP, as activation memory has it
        dropped = (2 * c + 1) * (whole + (n - whole) / s.tp)
        fwd_bytes, bwd_bytes = fwd_bytes + dropped, bwd_bytes + dropped
    fwd = flops_fwd / rate + tokens * fwd_bytes / hbm
    bwd = 2 * flops_fwd / rate + tokens * bwd_bytes / hbm
    return fwd, bwd, 3 * flops_fwd


def host_copy_bps(s: Setup) -> float:
    """Bytes/s each GPU moves to or from host memory while every GPU of the node copies at once (offloaded
    optimizer and parameters, checkpoint snapshots): its PCIe link at the copy efficiency, split among the GPUs
    behind one PCIe switch's uplink (Instance.gpus_per_pcie_switch; unknown: a link of its own)."""
    share = (s.instance.gpus_per_pcie_switch if s.instance is not None else None) or 1
    return (s.gpu.pcie_gbps_per_dir or 16.0) * 1e9 * eff.PCIE_COPY_EFFICIENCY / share


def host_copy_note(s: Setup) -> str:
    """What host_copy_bps assumed, for the row's assumptions."""
    share = s.instance.gpus_per_pcie_switch if s.instance is not None else None
    rate = f"{host_copy_bps(s) / 1e9:.1f} GB/s per GPU to host memory"
    if share is None:
        return f"{rate} (how GPUs share PCIe switches is not in the catalog: a link of its own assumed)"
    return rate + (f" ({share} GPUs share each PCIe switch's uplink on {s.instance.name})" if share > 1 else "")


def attention_efficiency(s: Setup, e: eff.ArchEfficiency, peak_flops: float, length: float | None = None) -> float:
    """Fraction of `peak_flops` the attention kernel reaches for this head dim and a causal call over `length`
    tokens (default: the sequence, or its context-parallel chunk)."""
    base, s0 = eff.attention_factors(e, s.gpu.arch, s.attention_kernel, peak_flops / 1e12)
    hd = e.attention_hd64 if s.model.hd <= 64 else 1.0
    n = s.attention_len / s.cp  # context parallelism: the kernel runs on chunks of the sequence (or a document)
    if length is not None:
        n = min(n, length)
    return base * hd * n / (n + s0)


# transformers 5.23 eager attention (gpt_oss eager_attention_forward): after the QK matmul writes the bf16
# scores, scaling (read, write), the mask add (scores, mask, write), the sink column cat (read, write), the
# row max (read), its subtraction (read, write) and the softmax (read, write) pass over every score: 26 bytes
# per score forward; their backward passes read and write as many
EAGER_SCORE_BYTES_FWD = 26
EAGER_SCORE_BYTES_BWD = 26


def _eager_attention_s(s: Setup, tokens: float, peak: float, hbm_bps: float,
                       e: eff.ArchEfficiency) -> tuple[float, float]:
    """(forward s, backward s) of one block's eager attention: both matmuls over every score at GEMM speed
    (QK^T reduces over the head dim, PV over the sequence), and the elementwise passes over the scores."""
    m = s.model
    heads, dim = m.num_heads / s.tp, moe.attention_dim(m) / s.tp
    mm = 2 * tokens * s.seq_len * dim  # one of the two matmuls, every key
    scores = tokens * s.seq_len * heads
    fwd = _gemm_time(mm, m.hd, peak, e) + _gemm_time(mm, s.seq_len, peak, e)
    fwd += EAGER_SCORE_BYTES_FWD * scores / hbm_bps
    # dS = dO V^T (K = head dim), dV = P^T dO, dQ = dS K, dK = dS^T Q (K = the sequence)
    bwd = _gemm_time(mm, m.hd, peak, e) + 3 * _gemm_time(mm, s.seq_len, peak, e)
    bwd += EAGER_SCORE_BYTES_BWD * scores / hbm_bps
    return fwd, bwd


@dataclass(frozen=True, slots=True)
class _MicroBatch:
    fwd_s: float  # one forward (no recompute)
    bwd_s: float  # backward (incl. recompute)
    hw_flops: float
    attn_fwd_s: float = 0.0  # one layer's attention forward (what ring attention's sends hide behind)


def _micro_batch_time(s: Setup, e: eff.ArchEfficiency) -> _MicroBatch:
    m, gpu = s.model, s.gpu
    prec = "fp16" if s.precision == "fp16" else ("fp32" if s.precision == "fp32" else "bf16")
    peak = (gpu.peak_tflops("tf32" if prec == "fp32" else prec) or 1.0) * 1e12
    fp8 = s.precision == "fp8"
    gemm_peak = (gpu.peak_tflops("fp8") or peak / 1e12) * 1e12 if fp8 else peak
    ge = eff.fp8_gemm(e, s.fp8_recipe) if fp8 else e  # the blocks' GEMMs (FP8 under fp8; the head stays bf16)
    cast = eff.FP8_RECIPES[s.fp8_recipe].cast_bytes
    tokens = s.local_tokens  # its 1/cp of each sequence; attention still spans the whole sequence
    layers = s.stage_layers  # the largest pipeline stage
    frozen = s.method != "full"
    mem_eff = e.eager_memory_efficiency() if s.kernels == "eager" else e.memory
    hbm_bps = gpu.hbm_gbps * 1e9 * mem_eff
    a = 4 if s.precision == "fp32" else 2  # bytes per activation element
    fwd = bwd = flops = 0.0
    module_gemms = _module_gemm_indices(s)  # the GEMMs Megatron's --recompute-modules run again
    module_fwd = module_flops = 0.0
    rescale = eff.FP8_RECIPES[s.fp8_recipe].grad_rescale_bytes if fp8 else 0.0
    # FP8 all-gathers under TP (_fp8_gathered): the operand is quantized on its 1/tp sequence shard and gathered in
    # FP8; only the transposed copy for the weight gradient (.t().contiguous(): a read and a write) is made whole
    gathered_in, gathered_grad = _fp8_gathered(s)
    shard_cast = min(cast, (cast - 1) / s.tp + 2)  # bytes per element of a gathered operand's cast
    for i, (k, n, count) in enumerate(_gemms(s)):
        f_flops = 2 * tokens * k * n * count
        g_fwd = _gemm_time(f_flops, k, gemm_peak, ge)
        # each GEMM's input cast forward, its output gradient backward (Fp8Recipe.cast_bytes per element)
        cast_in = (shard_cast if i in gathered_in else cast) * tokens * k * count / hbm_bps if fp8 else 0.0
        fwd += g_fwd
        if i in module_gemms:
            module_fwd += g_fwd + cast_in
            module_flops += f_flops
        bwd += _gemm_time(f_flops, n, gemm_peak, ge)  # input gradient: K = out features
        flops += 2 * f_flops
        if not frozen:  # weight gradient: K = tokens, and never faster than its bytes move
            floor = moe.wgrad_floor_s(s, ge, k * n * count, tokens * count, k, n, fp8)
            bwd += max(_gemm_time(f_flops, tokens, gemm_peak, ge), floor)
            flops += f_flops
        if fp8:
            fwd += cast_in
            bwd += (shard_cast if i in gathered_grad else cast) * tokens * n * count / hbm_bps
            # the input gradient (tokens x K) and the weight gradient (K x N) scaled in a pass of their own
            bwd += rescale * (tokens * k + (0 if frozen else k * n)) * count / hbm_bps
    if frozen:
        a_fwd, a_bwd, a_flops = _adapter_time(s, tokens, peak, e)
        fwd += a_fwd
        bwd += a_bwd
        flops += a_flops
    path = attention_path(m, get_stack(s.stack), s.attention_kernel)
    la = moe._memo(m, ("layer_attention", s.attention_len, path), lambda: layer_attention(m, s.attention_len, path))
    attn_fwd_flops = attn_fwd = 0.0
    for share, span, length in la.parts:  # full blocks and sliding-window ones (plan/attention.py)
        part = share * 2 * tokens * span * moe.attention_dim(m) / s.tp  # causal span: half of 4*s*q_dim
        attn_fwd_flops += part
        attn_fwd += part / (peak * attention_efficiency(s, e, peak, length))
    if la.path == "eager":
        attn_fwd, attn_bwd = _eager_attention_s(s, tokens, peak, hbm_bps, e)
        flops += 3 * attn_fwd_flops
    else:
        attn_bwd = 2.5 * attn_fwd  # FlashAttention's backward recomputes the scores
        flops += 3.5 * attn_fwd_flops
    fwd += attn_fwd
    bwd += attn_bwd
    elem = _elementwise_bytes_per_token_layer(s) * tokens / hbm_bps
    fwd += 0.4 * elem
    bwd += 0.6 * elem
    deq = 0.0
    if s.method == "qlora":  # bitsandbytes dequantizes NF4 -> bf16 before each use of a weight (efficiency.py)
        deq = param_counts(s).quantized / layers * (NF4_BYTES + 2) / (
            gpu.hbm_gbps * 1e9 * eff.NF4_DEQUANT_MEMORY_EFFICIENCY)
        fwd += deq
        bwd += deq
    recompute = {"full": fwd}.get(s.checkpointing, 0.0)
    recompute_flops = {"full": flops / 3 if not frozen else flops / 2}.get(s.checkpointing, 0.0)
    if s.checkpointing == "selective-attn":  # Megatron's modules (core_attn alone by default): plan/recompute.py
        core = "core_attn" in s.recomputes
        recompute = (attn_fwd if core else 0.0) + module_fwd
        recompute_flops = (attn_fwd_flops if core else 0.0) + module_flops
        if "layernorm" in s.recomputes:  # the norms that are modules of their own: read the input, write the output
            recompute += norm_modules(m, False) * 2 * a * m.hidden_size * tokens / s.tp / hbm_bps
        if "mlp" in s.recomputes and not m.is_moe:  # the activation's forward once more
            recompute += 0.4 * _act_bytes(s, m.ffn_hidden_size) * tokens / s.tp / hbm_bps
    if s.checkpointing == "selective-op":  # unsaved matmuls, elementwise forward, dequantization again
        recompute, recompute_flops = _op_sac_recompute(s, tokens, gemm_peak, ge)
        recompute += 0.4 * elem + deq
    if m.is_moe:  # dense layers' MLPs and MoE layers' routers and experts, on the slowest stage
        fwd_total, bwd_total, flops_total = moe.stage_time(s, ge, tokens, gemm_peak, hbm_bps,
                                                           _gemm_time, _act_bytes(s, 1),
                                                           (fwd, bwd + recompute, flops + recompute_flops))
    else:
        fwd_total, bwd_total, flops_total = layers * fwd, layers * (bwd + recompute), layers * (flops + recompute_flops)
    # output head and loss on the last stage (counted for every stage: the slowest sets the pace)
    head_flops = 2 * tokens * m.hidden_size * m.vocab_size / s.tp
    head_k = m.hidden_size
    fwd_total += _gemm_time(head_flops, head_k, peak, e)
    bwd_total += _gemm_time(head_flops, m.vocab_size / s.tp, peak, e)
    flops_total += 2 * head_flops
    if not frozen:
        bwd_total += _gemm_time(head_flops, tokens, peak, e)
        flops_total += head_flops
    loss = tokens * (a + 12 + 8) * m.vocab_size / s.tp / (gpu.hbm_gbps * 1e9 * e.memory)
    fwd_total += 0.4 * loss
    bwd_total += 0.6 * loss
    return _MicroBatch(fwd_total, bwd_total, flops_total, attn_fwd)


# --- communication ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Links:
    intra_gbps: float  # collective bandwidth per GPU inside a node, GB/s (one direction)
    node_net_gbps: float | None  # a node's network, GB/s achievable


def links(s: Setup, e: eff.ArchEfficiency | None = None) -> Links:
    """`e`'s calibrated intra_node/inter_node fractions where set, else the module's."""
    gpu = s.gpu
    topo = s.instance.topology if s.instance else ("nvswitch" if gpu.has_nvlink else "pcie")
    intra_f, net_f = (e.intra_node, e.inter_node) if e is not None else (None, None)
    if topo in ("nvswitch", "nvlink-mesh") and gpu.nvlink_links and gpu.nvlink_link_gbps:
        intra = gpu.nvlink_links * gpu.nvlink_link_gbps * (intra_f or eff.NVLINK_EFFICIENCY)
    else:
        intra = (gpu.pcie_gbps_per_dir or 16.0) * (intra_f or eff.PCIE_P2P_EFFICIENCY)
    net = s.inter_node_gbps / 8 * (net_f or eff.NETWORK_EFFICIENCY) if s.inter_node_gbps else None
    return Links(intra, net)


def collective_s(kind: str, nbytes: float, ranks: int, ranks_per_node: int, ln: Links,
                 net_share: float = 1.0) -> float:
    """Ring collective on a buffer of `nbytes` (the full, unsharded size) over `ranks`.

    Data each GPU moves over its links: (n-1)/n of the buffer; data each node moves over
    its network: (k-1)/k of it for k nodes (NCCL's hierarchical rings/trees). All-reduce
    is reduce-scatter + all-gather: twice either.
    """
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    per_node = max(1, min(ranks, ranks_per_node))
    nodes = -(-ranks // per_node)
    t = nbytes * (ranks - 1) / ranks / (ln.intra_gbps * 1e9)
    if nodes > 1 and ln.node_net_gbps:
        t = max(t, nbytes * (nodes - 1) / nodes / (ln.node_net_gbps * 1e9 * net_share))
    if kind == "allreduce":
        t *= 2
    return t + eff.COLLECTIVE_LATENCY_S + eff.RING_STEP_LATENCY_S * ranks


def fp8_gather_bytes(params: float, linear: float, other_bytes: float = 2.0) -> float:
    """Bytes a rank's parameter all-gather moves when its `linear` weights travel in FP8 (Setup.fp8_param_gather:
    Megatron's --fp8-param-gather, torchao's float8 all-gather) and the other `params - linear` (embeddings, output
    layer, routed experts) at `other_bytes` each."""
    return linear + other_bytes * (params - linear)


def chunked_reduce_exposed(reduce_s: float, bwd_s: float, chunks: int, group: int) -> float:
    """What outlasts the backward of a gradient reduction split over `chunks` model chunks, each reduced after its
    own last micro-batch's backward (bucket by bucket within that pass): Megatron's interleaved schedule launches a
    chunk's grad sync when is_last_microbatch_for_model_chunk (schedules.py backward_step_helper_postprocess), and
    torch.distributed.pipelining syncs each stage on its own last backward. The first chunk released leaves
    (chunks - 1) x `group` chunk passes of backward behind it (micro-batch groups of pp per chunk), the last only its
    own pass; chunks queue on one stream. One chunk: the last micro-batch's whole backward hides it."""
    if chunks <= 1:
        return max(0.0, reduce_s - bwd_s)
    return max(0.0, (reduce_s - bwd_s) / chunks, reduce_s - bwd_s * ((chunks - 1) * group + 1) / chunks)


def chunked_gather_exposed(gather_s: float, fwd_s: float, chunks: int, group: int) -> float:
    """The forward stalls of a parameter all-gather split over `chunks` model chunks under Megatron's
    --overlap-param-gather with an interleaved schedule (schedules.py): the first two chunks' gathers start with the
    step, chunk k + 1's with chunk k's first micro-batch forward, and its micro-batch group of `group` passes runs
    before the next chunk's. There Megatron aligns the gathers (align_param_gather) and start_param_sync sends a
    chunk's buckets in bucket order, which is the reverse of the layers' (buckets fill from the last parameter):
    a chunk's first layer waits for the whole chunk. One chunk: the forward pre-hooks prefetch bucket by bucket in
    the layers' order, so the first micro-batch's forward hides the gather."""
    if chunks <= 1:
        return max(0.0, gather_s - fwd_s)
    c, q = gather_s / chunks, fwd_s / chunks
    done = end = previous_start = 0.0  # gather stream, compute stream, when the previous chunk's group began
    for _ in range(chunks):
        done = max(done, previous_start) + c  # chunks 0 and 1: at the step's start
        previous_start = end
        end = max(end, done) + group * q
    return max(0.0, end - chunks * group * q)


def dp_layout(s: Setup) -> tuple[int, float]:
    """(data-parallel ranks per node, share of the node's network one DP group gets)."""
    gpus_per_stage_node = s.gpus_per_node // s.pp if s.pp > s.nodes else s.gpus_per_node
    per_node = max(1, min(s.shard_dp, max(1, gpus_per_stage_node) // s.tp))
    groups = max(1, s.gpus_per_node // per_node)
    return per_node, 1.0 / groups


def _moe_tp_s(s: Setup, tokens: int, ln: Links, routed_experts: bool = True) -> float:
    """Tensor-parallel collectives of one micro-batch on the worst stage of a MoE model, per pass (forward,
    backward, the forward again under full recompute), as all-reduces (an all-gather and a reduce-scatter
    under sequence parallelism): attention and dense MLPs of the tokens over tp, as a dense block; a MoE layer's
    shared experts likewise, its routed experts over the expert TP group (moe.expert_tp_buffer_bytes)."""
    m = s.model
    ar = collective_s("allreduce", tokens * m.hidden_size * 2, s.tp, s.tp, ln) if s.tp > 1 else 0.0
    etp = s.expert_tp
    routed = (collective_s("allreduce", moe.expert_tp_buffer_bytes(s, tokens), etp, etp, ln)
              if etp > 1 and routed_experts else 0.0)
    shared = ar if m.moe.shared_width else 0.0
    passes = 2 + (1 if s.checkpointing == "full" else 0)
    return passes * moe.worst_stage(m, s.pp, 2 * ar, ar + shared + routed, s.pp_virtual)


def _cp_s(s: Setup, tokens: int, ln: Links, attn_fwd_s: float) -> tuple[float, float]:
    """(exposed, total) seconds per micro-batch of context parallelism's ring attention on the worst stage.

    Each rank holds 1/cp of every sequence and passes its K and V chunk around the ring of cp ranks: cp - 1
    sends per layer forward, and in backward K, V and their gradients (twice the bytes) -- Megatron-Core's
    p2p ring (TE attention with cp_comm_type p2p), torchtitan's ring attention (its all-gather rotation moves
    the same (cp - 1)/cp of K and V). The sends run beside the attention of the chunk already there, so only
    what outlasts the layer's attention is exposed. Inside a node a rank sends over NVLink; a ring that spans
    nodes sends over the network, every GPU of the node at once."""
    if s.cp <= 1:
        return 0.0, 0.0
    m = s.model
    kv = tokens * 2 * m.kv_dim * 2 / min(s.tp, m.num_kv_heads)  # the local K and V, bf16, KV heads split by tp
    spans_nodes = s.cp * s.tp > s.gpus_per_node
    bw = ln.intra_gbps if not spans_nodes or not ln.node_net_gbps else min(ln.intra_gbps,
                                                                             ln.node_net_gbps / s.gpus_per_node)
    hop = kv / (bw * 1e9) + eff.COLLECTIVE_LATENCY_S
    fwd, bwd = (s.cp - 1) * hop, 2 * (s.cp - 1) * hop
    passes_fwd = 2 if s.checkpointing == "full" else 1  # the forward again under full recompute
    exposed = passes_fwd * max(0.0, fwd - attn_fwd_s) + max(0.0, bwd - 2.5 * attn_fwd_s)
    return s.stage_layers * exposed, s.stage_layers * (passes_fwd * fwd + bwd)


# --- the step ----------------------------------------------------------------------------
def estimate_step(s: Setup, efficiency: eff.ArchEfficiency | None = None) -> StepResult:
    """One training step of `s`; `efficiency` replaces its GPU's factors (the ends of an assumed range)."""
    m, gpu = s.model, s.gpu
    e = eff.power_capped(efficiency or s.efficiency or eff.arch_efficiency(gpu.arch), s.power_scale)
    hbm = gpu.hbm_gbps * 1e9 * e.memory
    mb = _micro_batch_time(s, e)
    pc = param_counts(s)
    ln = links(s, e)
    layers = s.stage_layers  # the largest pipeline stage
    full = s.method == "full"
    mixed_amp = s.strategy == "ddp" and full and s.precision != "fp32" and s.optimizer_dtype == "fp32"
    cast = 6 * pc.local / hbm if mixed_amp else 0.0  # autocast re-casts fp32 weights each forward
    tokens = s.local_tokens

    # tensor parallel: 2 all-reduces of the activations per block forward, 2 backward (tp_allreduces)
    tp_s = 0.0
    if s.tp > 1 and not m.is_moe:
        ar = collective_s("allreduce", tokens * m.hidden_size * 2, s.tp, s.tp, ln)
        tp_s = layers * tp_allreduces(s) * ar
    elif m.is_moe and (s.tp > 1 or s.expert_tp > 1):  # MoE layers: shared experts over tp, routed over etp
        tp_s = _moe_tp_s(s, tokens, ln)
    # pipelined with the GEMMs: the linear layers' collectives (a MoE model's routed experts' grouped GEMMs not)
    overlappable = (tp_s if not m.is_moe else _moe_tp_s(s, tokens, ln, routed_experts=False)) if s.tp_overlap else 0.0
    tp_hidden = overlappable * (1 - eff.TP_OVERLAP_EXPOSED)
    tp_s -= tp_hidden

    cp_exposed, cp_total = _cp_s(s, tokens, ln, mb.attn_fwd_s)
    tp_s += cp_exposed

    # data parallel (with context parallelism: over the dp x cp ranks that hold the same weights)
    per_node, share = dp_layout(s)
    a2a = moe.a2a_s(s, tokens, per_node, ln.intra_gbps) if m.is_moe else 0.0  # EP dispatch/combine per micro-batch
    dp = s.shard_dp
    g_bytes = 4 if s.reduce_dtype == "fp32" else 2
    train = pc.trainable
    base_bytes = (NF4_BYTES if s.method == "qlora" else 2.0)
    gather_bytes = (4.0 if s.gather_dtype == "fp32" else 2.0) * pc.local if full else base_bytes * pc.local
    # FP8 gathers (Setup.fp8_param_gather): the blocks' linear weights in FP8; embeddings, head and the routed experts'
    # grouped weights as before (torchao converts nn.Linear only; Megatron's grouped experts not read: conservative)
    expert_gather = None  # the routed experts' share of a parameter gather, where it is not their share of params
    fp8_linear = pc.local - pc.embed - pc.expert  # what an FP8 gather moves at a byte (full training only)
    if s.fp8_param_gather:
        other = 4.0 if s.gather_dtype == "fp32" else 2.0
        gather_bytes = fp8_gather_bytes(pc.local, fp8_linear, other)
        expert_gather = other * pc.expert
    e_train = pc.expert if full else 0.0  # routed experts (1/(ep x etp) of them): reduced and sharded over edp ranks
    ratio = moe.expert_shard_ratio(s)  # dp / edp
    split = e_train and (s.ep > 1 or s.expert_tp != s.tp)
    e_ranks, e_per_node, e_share = moe.expert_dp_layout(s, per_node, share) if split else (0, 0, 0.0)

    def coll(kind: str, nbytes: float, expert_nbytes: float | None = None) -> float:
        """One collective over the data-parallel ranks; with EP, the routed experts' bytes (`expert_nbytes`, by
        default their share of the parameters) over the expert data-parallel ranks."""
        if not split:
            return collective_s(kind, nbytes, dp, per_node, ln, share)
        ex = nbytes * e_train / pc.local if expert_nbytes is None else expert_nbytes
        return (collective_s(kind, nbytes - ex, dp, per_node, ln, share)
                + collective_s(kind, ex, e_ranks, e_per_node, ln, e_share))
    train_n = lambda shard: train + (ratio - 1) * e_train * (shard > 1)  # noqa: E731  (train_n(k) / k: a rank's share)
    exposed_mb = overlapped_mb = exposed_step = comm_total = 0.0
    if dp > 1:
        if s.strategy in ("ddp", "zero1"):
            # DDP all-reduces the gradients; ZeRO-1 reduce-scatters them to the optimizer shards and all-gathers the
            # updated 16-bit parameters: DP's volume (Rajbhandari et al. 2020, Sec. 7.2.1; Megatron's distributed
            # optimizer), reduced during the last micro-batch's backward
            # once per pipeline schedule call: torch.distributed.pipelining syncs on each call's last backward
            # (stage.py backward_maybe_with_nosync); one call a step elsewhere
            # With v virtual stages each model chunk reduces after its own last backward (chunked_reduce_exposed)
            ar = coll("allreduce" if s.strategy == "ddp" else "reducescatter", g_bytes * train)
            # micro-batch groups of pp per chunk: resolve and the search keep interleaved micro-batches a multiple of pp
            calls, v, group = s.schedule_calls, s.pp_virtual, s.pp
            comm_total += calls * ar
            ar_exposed = chunked_reduce_exposed(ar, mb.bwd_s, v, group)
            exposed_step += calls * (ar_exposed + ar / max(1, layers))
            overlapped_mb += calls * (ar - ar_exposed) / s.grad_accum
            if s.strategy == "zero1":
                ag = (coll("allgather", fp8_gather_bytes(train, fp8_linear), 2.0 * pc.expert)
                      if s.fp8_param_gather else coll("allgather", 2.0 * train))
                comm_total += ag
                if get_stack(s.stack).param_gather_overlap:  # behind the next step's first forwards
                    ag_exposed = chunked_gather_exposed(ag, mb.fwd_s, v, group)
                    exposed_step += ag_exposed + ag / max(1, layers)
                    overlapped_mb += (ag - ag_exposed) / s.grad_accum
                else:
                    exposed_step += ag
        elif s.strategy == "zero2":
            rs = coll("reducescatter", g_bytes * train)
            ag = coll("allgather", 2.0 * train)
            comm_total += s.grad_accum * rs + ag
            exposed_mb += max(0.0, rs - mb.bwd_s) + rs / max(1, layers)
            overlapped_mb += min(rs, mb.bwd_s)
            exposed_step += ag
        elif s.pp_stage_gathered:
            # the stage is gathered once, behind the first micro-batch's forward, and its gradients reduced once,
            # after the last backward (torch.distributed.pipelining's REDUCE_GRAD action, perform_reduce_grad):
            # nothing is left to hide that reduce-scatter behind. Once per schedule call: a step that accumulates
            # over several calls (pp_local_batch) gathers and reduces in each
            ag = coll("allgather", gather_bytes, expert_gather)
            rs = coll("reducescatter", g_bytes * train)
            calls = s.schedule_calls
            comm_total += calls * (ag + rs)
            exposed_step += calls * (max(0.0, ag - mb.fwd_s) + ag / max(1, layers) + rs)
            overlapped_mb += calls * min(ag, mb.fwd_s) / s.grad_accum
        else:  # zero3 / FSDP: gather before forward and backward, reduce-scatter grads
            ag = coll("allgather", gather_bytes, expert_gather)
            rs = coll("reducescatter", g_bytes * train)
            comm_total += s.grad_accum * (2 * ag + rs)
            exposed_mb += max(0.0, ag - mb.fwd_s) + max(0.0, ag + rs - mb.bwd_s)
            exposed_mb += (ag + rs) / max(1, layers)  # first gather, last reduce: nothing to hide behind
            overlapped_mb += min(ag, mb.fwd_s) + min(ag + rs, mb.bwd_s)
    # EP all-to-alls: in the compute path, exposed like TP's all-reduces; or run beside another micro-batch's
    # compute (DualPipe, 1F1B A2A overlap), where only what outlasts that compute stays exposed
    a2a_hidden = min(a2a, mb.fwd_s + mb.bwd_s) * overlapped_share(s) if s.ep_overlap else 0.0
    overlapped_mb += a2a_hidden
    tp_s += a2a - a2a_hidden
    # pipeline: activations to the next stage and gradients back, per micro-batch; interleaved, once per
    # virtual stage (v sends and v receives per rank and micro-batch: Narayanan et al. 2021, Sec. 2.2.2).
    # Across nodes every GPU of a stage sends at once, each over its share of the node's network. The
    # interleaved schedule's sends run beside compute (Megatron-LM's overlap_p2p_comm, on unless
    # --no-overlap-p2p-communication; torch.distributed.pipelining posts them asynchronously).
    p2p = p2p_hidden = 0.0
    if s.pp > 1:
        senders = max(1, min(s.gpus_per_node, s.n_gpus // s.pp))  # one stage's GPUs in a node
        hop = ln.intra_gbps if s.nodes == 1 else min(ln.intra_gbps, (ln.node_net_gbps or ln.intra_gbps) / senders)
        p2p = s.pp_virtual * 2 * tokens * m.hidden_size * 2 / s.tp / (hop * 1e9)
        if s.pp_virtual > 1:
            p2p_hidden = min(p2p, mb.fwd_s + mb.bwd_s)
            p2p -= p2p_hidden
            overlapped_mb += p2p_hidden
    overlapped_mb += tp_hidden
    contention = e.overlap_contention() * overlapped_mb

    compute_mb = mb.fwd_s + mb.bwd_s + cast + contention
    # the host's kernel launches; layers replayed from CUDA graphs launch a graph instead (counted as nothing)
    cpu_mb = 0.0 if s.graphs_whole_layers else (
        layers * eff.CPU_S_PER_LAYER[s.kernels] * (1.33 if s.checkpointing in ("full", "selective-op") else 1.0))
    cpu_stall_mb = max(0.0, cpu_mb - compute_mb)

    # optimizer and gradient accumulation (memory-bound), or the CPU optimizer with offload
    shard = dp if (s.strategy != "ddp") else 1
    opt_bytes = 16 if s.optimizer_dtype == "bf16" and full else 32
    optimizer = train_n(shard) / shard * opt_bytes / hbm
    g_shard = shard if s.strategy in ("zero2", "zero3") else 1
    # each micro-batch after the first adds its gradients to the accumulated ones (read both, write one: 3 x the
    # element, 12 bytes in fp32); where the weight-gradient GEMMs accumulate into the unsharded buffer in place
    # (Stack.wgrad_accumulates) only the input embedding table's gradients are added, the largest unit the GEMMs
    # leave out (norms and routers: too few to count)
    adds = pc.largest_embedding if s.wgrad_in_place else train_n(g_shard) / g_shard
    elem = s.gradient_bytes if full else 4
    accum_adds = (s.grad_accum - 1) * adds * 3 * elem / hbm
    offload_s = 0.0
    if s.offload != "none":
        pcie = host_copy_bps(s)  # every GPU of the node copies at once
        node_params = train_n(dp) / dp * s.gpus_per_node
        optimizer = cpu_adam_s(s, node_params) + (4 + 2) * train_n(dp) / dp / pcie
        if s.offload == "optimizer+params":
            local_n = pc.local + (ratio - 1) * pc.expert * (dp > 1)
            fetch = (2 * 2 * local_n / dp + 4 * train_n(dp) / dp) / pcie
            offload_s = s.grad_accum * max(0.0, fetch - 0.5 * compute_mb)

    compute = s.grad_accum * compute_mb + optimizer + accum_adds
    exposed = s.grad_accum * (exposed_mb + tp_s + p2p) + exposed_step
    # 1F1B: pp - 1 micro-batch times idle per schedule call; interleaved with v virtual stages per rank, (pp - 1)/v
    # (bubble fraction (p - 1)/(v m), Narayanan et al. 2021, Sec. 2.2.2, Megatron's interleaved 1F1B). A step of
    # several schedule calls (torchtitan, NeMo AutoModel: one per local batch) fills and drains in each
    bubble = s.schedule_calls * (s.pp - 1) / s.pp_virtual * (compute_mb + exposed_mb + tp_s + p2p)
    other = bubble + s.grad_accum * cpu_stall_mb + offload_s
    step = compute + exposed + other
    tokens_step = s.global_batch * s.seq_len
    tps = tokens_step / step
    prec = {"fp32": "tf32"}.get(s.precision, s.precision)
    peak = (gpu.peak_tflops(prec) or gpu.peak_tflops("bf16") or gpu.peak_tflops("fp16")) * 1e12
    mfpt = model_flops_per_token(s)
    hfpt = mfpt + recompute_flops_per_token(s) + moe.padding_flops_per_token(s)
    hw_per_token = mb.hw_flops * s.grad_accum * s.n_gpus / tokens_step
    return StepResult(step_s=step, compute_s=compute, exposed_comm_s=exposed, other_s=other,
                      comm_s=comm_total + s.grad_accum * (tp_s + tp_hidden - cp_exposed + cp_total + p2p + p2p_hidden
                                                          + a2a_hidden),
                      hardware_flops_per_token=hw_per_token,
                      model_flops_per_token=mfpt, hfu_flops_per_token=hfpt, tokens_per_s=tps,
                      mfu=mfpt * tps / (s.n_gpus * peak), hfu=hfpt * tps / (s.n_gpus * peak),
                      optimizer_s=optimizer + accum_adds)
