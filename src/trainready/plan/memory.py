"""Per-GPU memory at the training step's peak, and host RAM per node.

Model states (full fine-tuning, mixed precision): we count 16 bytes per parameter of
persistent state -- fp32 master weights 4, fp32 gradients 4, Adam m and v 8 -- which is
how PyTorch AMP, FSDP (reduce in fp32) and DeepSpeed's bf16 mode keep them (the ZeRO
paper's 16 = 2 + 2 + 12 assumes fp16 gradients instead). On top sits the 2-byte bf16
working copy of the weights that the matmuls read: in full for DDP and ZeRO-1/2 (the
autocast cache or DeepSpeed's bf16 params), per gathered unit for ZeRO-3/FSDP. DDP
therefore peaks at 18 bytes/param of states, DeepSpeed's estimator's figure.

The peak is the larger of two moments, both seen in the H200 measurements:
* start of backward: states + all saved activations + logits/loss buffers; gradients are
  not yet allocated when each step starts from `zero_grad(set_to_none=True)` and there is
  no accumulation;
* end of backward: states with all gradients + one layer's activations being
  (re)computed + the activation gradients in flight.
Then allocator fragmentation, the CUDA context and NCCL buffers (see efficiency.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import efficiency as eff
from . import moe
from .activations import (
    final_norm_bytes,
    layer_bytes_per_token,
    layer_input_bytes,
    loss_bytes_per_token,
    op_sac_bytes_per_token,
    tp_replicated_bytes_per_token,
)
from .attention import attention_path
from .model_spec import ModelSpec
from .recompute import DEFAULT_MODULES, freed_per_token
from .setup import MIXED, Setup, in_flight_micro_batches, pipeline_ranks
from .stacks import get_stack

GiB = 1024**3
NF4_BYTES = 0.5 + 0.127 / 8  # 4-bit weights + double-quantized block constants (QLoRA paper)
PROCESS_HOST_GIB = 3.0  # host RAM of one training process (CUDA/torch runtime, Python), assumed


@dataclass(frozen=True, slots=True)
class ParamCounts:
    local: float  # parameters held by this GPU before sharding (worst pipeline stage, 1/tp)
    block: float  # one transformer block, 1/tp
    embed: float  # embedding/head parameters on the worst stage, 1/tp
    largest_embedding: float  # the larger of input embedding and (untied) head, 1/tp: one FSDP unit
    trainable: float  # trainable parameters local to this GPU (adapters for LoRA)
    quantized: float  # of `local`, weights stored in NF4 (QLoRA)
    expert: float = 0.0  # of `local`, routed experts (1/(ep x etp) of them): ZeRO shards these over edp ranks


def param_counts(s: Setup) -> ParamCounts:
    """The parameter counts of `s`'s worst stage (memoised: the same for every micro-batch and strategy)."""
    return moe._memo(s.model, ("param_counts", s.tp, s.pp, s.pp_virtual, s.ep, s.expert_tp, s.method, s.lora_rank,
                                 s.lora_targets),
                     lambda: _param_counts(s))


def _param_counts(s: Setup) -> ParamCounts:
    m = s.model
    layers = s.stage_layers  # the largest pipeline stage (setup.pipeline_split)
    block = m.block_params() / s.tp if not m.is_moe else 0.0  # MoE: moe.stage_params below
    # the input embedding (+ learned positions) is at least as large as the head: with
    # pipeline stages it is the worst stage's share, and it is ZeRO-3's largest single unit
    e = m.embedding_dim or m.hidden_size
    largest = (m.vocab_size * e + (m.max_seq_len or 0) * m.hidden_size * (m.position == "learned")) / s.tp
    embed = (m.embedding_params() + (m.hidden_size if m.final_norm else 0)) / s.tp if s.pp == 1 else largest
    local = layers * block + embed
    expert = 0.0
    if m.is_moe:  # dense and MoE blocks differ; routed experts split ep x etp ways (plan/moe.py)
        blocks, expert, block = moe.stage_params(s)
        local = blocks + embed
    if s.method == "full":
        return ParamCounts(local, block, embed, largest, local, 0.0, expert)
    adapters = layers * m.lora_params_per_layer(s.lora_rank, s.lora_targets) / s.tp
    linear = layers * (m.attention_params() + m.mlp_params()) / s.tp
    if m.is_moe:  # bitsandbytes 4-bit replaces nn.Linear modules only: attention, dense and shared-expert MLPs
        # (transformers 5.23 integrations/bitsandbytes.py replace_with_bnb_linear); the routed experts are fused 3D
        # nn.Parameters (MixtralExperts, Qwen3MoeExperts, DeepseekV3Experts, GptOssExperts) and stay bf16, as do
        # the routers' weights (nn.Parameter too; their few parameters are left in the quantized count here)
        linear = local - embed - expert
    return ParamCounts(local, block, embed, largest, adapters, linear if s.method == "qlora" else 0.0, expert)


def qlora_moe_note(m: ModelSpec, method: str) -> str | None:
    """What QLoRA quantizes in a mixture-of-experts model, where it matters (None otherwise)."""
    if method != "qlora" or not m.is_moe:
        return None
    experts = m.expert_param_count()
    return (f"QLoRA of {m.name}: bitsandbytes 4-bit replaces nn.Linear layers only, and transformers 5 stores the "
            f"routed experts as fused 3D parameters, which stay bf16: {experts / 1e9:,.0f}B of "
            f"{m.param_count() / 1e9:,.0f}B parameters ({experts / m.param_count():.0%}) at 2 bytes "
            f"(transformers integrations/bitsandbytes.py replace_with_bnb_linear)")


@dataclass(frozen=True, slots=True)
class MemoryResult:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    peak: float  # bytes per GPU at the peak, as nvidia-smi would show
    allocated_peak: float  # torch.cuda.max_memory_allocated equivalent
    reserved_peak: float  # torch.cuda.max_memory_reserved equivalent
    phase: str  # "backward-start" | "backward-end"
    states_full: float  # weights + all gradients + optimizer (persistent)
    host_per_node: float  # host RAM per node the job needs
    host_offloaded_per_gpu: float
    checkpoint_bytes: float  # one checkpoint of the whole job (all ranks)


def _per_gpu(s: Setup, pc: ParamCounts, nbytes: float, shard: int) -> float:
    """Bytes per GPU of a state of `nbytes` per parameter, unsharded (shard 1) or sharded over
    the dp ranks by ZeRO/FSDP: routed experts then over the edp ranks that hold the same expert
    shard (Setup.expert_dp: dp x tp / (ep x etp); pc.local has 1/(ep x etp) of them), everything
    else over all dp ranks."""
    n = pc.local + (moe.expert_shard_ratio(s) - 1) * pc.expert if shard > 1 else pc.local
    return nbytes * n / shard


def _states(s: Setup, pc: ParamCounts) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, host-offloaded) bytes per GPU for the model states."""
    dp = s.shard_dp  # ZeRO/FSDP shard over the data- and context-parallel ranks
    z3 = s.strategy == "zero3"
    # ZeRO-3 keeps two gathered blocks (current + prefetched) and one embedding unit (the
    # recipe wraps the input embedding and the output head as their own FSDP units: at the
    # peak only one is gathered) in their storage dtype: bf16, or NF4 for QLoRA's linears
    block_bytes = 2.0 * pc.block
    if s.method == "qlora":
        linear_per_block = pc.quantized / s.stage_layers
        block_bytes = NF4_BYTES * linear_per_block + 2.0 * (pc.block - linear_per_block)
    units = (2 * block_bytes + 2.0 * pc.largest_embedding) if z3 else 0.0
    stage_gathered = s.pp_stage_gathered
    stack = get_stack(s.stack)
    # routed experts outside FSDP (Stack.plain_unsharded_experts): never gathered, gradients in their own dtype
    plain_experts = pc.expert if (s.expert_dp == 1 and stack.plain_unsharded_experts) else 0.0
    if stage_gathered:  # the whole stage stays gathered through the step (Stack.pp_gathers_stage)
        gathered = pc.local - plain_experts
        units = block_bytes * gathered / pc.block if s.method == "qlora" and pc.block else 2.0 * gathered
    if s.method != "full":
        base_linear_bytes = NF4_BYTES if s.method == "qlora" else 2.0
        base = pc.quantized * base_linear_bytes + (pc.local - pc.quantized) * 2.0
        if z3:
            base = (base / dp if not pc.expert else base * _per_gpu(s, pc, 1.0, dp) / pc.local) + units
        a = pc.trainable  # adapters: fp32 weights, grads, Adam (tiny, replicated)
        return base + 4 * a, 4 * a, 8 * a, 0.0
    pure = s.optimizer_dtype == "bf16"
    mixed = s.precision in MIXED
    w_b, o_b = (2, 4) if pure else (4, 8)  # master/param, Adam states
    g_b = s.gradient_bytes  # a bf16 buffer beside fp32 masters where the stack keeps one
    working = 2.0 * pc.local if (mixed and not pure and not z3) else 0.0
    shard_opt = dp if s.strategy != "ddp" else 1
    shard_grad = dp if s.strategy in ("zero2", "zero3") else 1
    shard_w = dp if s.strategy != "ddp" and not pure else (dp if z3 else 1)
    weights = _per_gpu(s, pc, w_b, shard_w) + working + units
    ds = s.on_deepspeed  # DeepSpeed's ZeRO model states
    if z3 and ds and not pure and s.offload == "none":
        weights += _per_gpu(s, pc, 2.0, dp)  # the partitioned 16-bit parameters (Stack.deepspeed_zero_memory)
    grads = _per_gpu(s, pc, g_b, shard_grad)
    if ds and mixed and not pure and not z3 and s.offload == "none":
        # DeepSpeed keeps 16-bit gradients (its grad_accum_dtype defaults to the model's) and fp32 ones for the
        # masters: ZeRO-2 both partitioned, 2 + 4 bytes over the ranks (runtime/zero/stage_1_and_2.py
        # estimate_zero2_model_states_mem_needs); ZeRO-1 the 16-bit ones whole until the step; stage 0's bf16/fp16
        # optimizer copies every gradient to fp32 at the step beside the 16-bit ones (fp16/unfused_optimizer.py)
        grads = _per_gpu(s, pc, 2.0, shard_grad) + _per_gpu(s, pc, 4.0, dp if s.strategy != "ddp" else 1)
    # unsharded gradients kept over the micro-batches, one as well (torch.distributed.pipelining turns gradient
    # sync off for every backward and reduces once after the last; FSDP2 keeps them in the reduce dtype): the
    # sharded ones exist only after that reduce-scatter, when these are freed
    accumulated = ((4.0 if s.reduce_dtype == "fp32" else 2.0) * (pc.local - plain_experts) + g_b * plain_experts
                   if stage_gathered else 0.0)
    grads = max(grads, accumulated)
    optim = _per_gpu(s, pc, o_b, shard_opt)
    if s.offload == "none":
        return weights, grads, optim, 0.0
    host = _per_gpu(s, pc, w_b + g_b + o_b, dp)  # master, fp32 grads and Adam live in host RAM
    if s.offload == "optimizer+params" and not pure:
        # and the 16-bit parameters the GPUs fetch from: DeepSpeed's estimate_zero3_model_states_mem_needs counts
        # 18 bytes/param on the host with offload_param (16 with the optimizer alone); pure bf16 keeps no other copy
        host += _per_gpu(s, pc, 2.0, dp)
    if s.offload == "optimizer":
        gpu_weights = (2.0 * pc.local if not z3 else _per_gpu(s, pc, 2.0, dp) + units)
        # DeepSpeed moves each gradient partition to the host as it is reduced (its estimators count no gradients
        # on the GPU with cpu_offload), but ZeRO-1 leaves the 16-bit gradients outside its partition in place until
        # the step (stage_1_and_2.py clears them only when partitioning gradients); Megatron's optimizer offload
        # keeps its gradient buffer on the GPU
        if ds:
            gpu_grads = _per_gpu(s, pc, 2.0, 1) if s.strategy in ("zero1", "ddp") else 0.0
        else:
            gpu_grads = _per_gpu(s, pc, 2.0, dp)
        return gpu_weights, max(gpu_grads, accumulated), 0.0, host
    return units, max(2.0 * pc.block, accumulated), 0.0, host  # optimizer+params: only gathered units stay


def _residual_bytes(s: Setup) -> int:
    if s.precision == "fp32":
        return 4
    # DDP runs autocast over fp32 parameters: the residual stream stays fp32.
    full_amp = s.strategy == "ddp" and s.method == "full" and s.optimizer_dtype == "fp32"
    return 4 if full_amp else 2


def activation_parts(s: Setup) -> tuple[float, float, float, float]:
    """(saved activations, one layer's activations, loss buffers, layer-input bytes) per
    micro-batch on the worst pipeline stage, bytes per GPU."""
    m = s.model
    a = 4 if s.precision == "fp32" else 2
    r = _residual_bytes(s)
    tokens = s.local_tokens  # context parallelism: each GPU holds its 1/cp of every sequence
    stack = get_stack(s.stack)
    fp8_saved = s.precision == "fp8" and stack.fp8_saves_inputs
    fp32_adapters, copy_bytes = s.lora_fp32_copies, s.lora_copy_bytes
    # the stack's layout (flash_attention_2's batch x seq x heads) only with the stack's own kernel; another
    # kernel goes through SDPA, whose output is transposed and copied
    attention_copy = stack.attention_copy or s.attention_kernel != stack.attention_kernel
    # eager attention keeps the s x s scores: only sink models take that path (plan/attention.py)
    flash = not m.attention_sinks or attention_path(m, stack, s.attention_kernel) != "eager"

    def per_token(shape: ModelSpec) -> float:  # the same for every micro-batch size the search tries: memoised
        return moe._memo(shape, ("layer_bytes", s.kernels, r, a, s.method, s.seq_len, fp8_saved, copy_bytes,
                                 attention_copy, flash, s.lora_targets, s.lora_dropout_at, stack.lora_fused_modules),
                        lambda: layer_bytes_per_token(shape, kernels=s.kernels, residual_bytes=r, act_bytes=a,
                                                      method=s.method, seq_len=s.seq_len, fp8_saved=fp8_saved,
                                                      fp32_adapters=fp32_adapters, lora_targets=s.lora_targets,
                                                      adapter_copy_bytes=copy_bytes, lora_dropout=s.lora_dropout_at,
                                                      lora_fused_modules=stack.lora_fused_modules,
                                                      attention_copy=attention_copy, flash=flash))

    # TP splits the attention and MLP insides; with sequence parallelism the rest too, else each TP rank keeps
    # the norms' tensors and the layer input whole (Stack.sequence_parallel)
    sp = stack.sequence_parallel or s.tp == 1
    replicated = 0.0 if sp else moe._memo(m, ("tp_replicated", s.kernels, r, a, s.method, fp8_saved, copy_bytes,
                                              s.lora_targets, s.lora_dropout_at, stack.lora_fused_modules),
                                          lambda: tp_replicated_bytes_per_token(
                                              m, kernels=s.kernels, residual_bytes=r, act_bytes=a, method=s.method,
                                              fp8_saved=fp8_saved, fp32_adapters=fp32_adapters,
                                              adapter_copy_bytes=copy_bytes,
                                              lora_targets=s.lora_targets, lora_dropout=s.lora_dropout_at,
                                              lora_fused_modules=stack.lora_fused_modules))

    def on_rank(per_tok: float, whole: float = replicated) -> float:  # bytes per token on one TP rank
        return per_tok / s.tp if sp else whole + (per_tok - whole) / s.tp

    layer = on_rank(per_token(m)) * tokens
    stage = s.stage_layers * layer  # one micro-batch's saved activations on the worst stage
    full_fp8 = fp8_saved and s.method == "full"  # frozen linears save no FP8 inputs (as layer_bytes_per_token)
    moe_per_token = moe.moe_layer_bytes_per_token(s, per_token, a, full_fp8) if m.is_moe else 0.0
    if m.is_moe:  # MoE layers save routed tokens' activations (plan/moe.py)
        moe_layer = tokens * on_rank(moe_per_token)
        stage = moe.worst_stage(m, s.pp, layer, moe_layer, s.pp_virtual)
        layer = max(layer, moe_layer)
    # 1F1B: the first stage holds pp micro-batches; interleaved, pp (1 + (pp - 1)/(pp v)) (setup.py)
    in_flight = in_flight_micro_batches(s.pp, s.pp_virtual, s.schedule_microbatches)  # one schedule call's
    layers = s.stage_layers * in_flight
    kept = None  # what one layer keeps per micro-batch under recompute (None: all it saves)
    kept_stage = None  # what the worst stage's layers keep per micro-batch
    block_input = layer_input_bytes(m, r)  # whole on every TP rank without sequence parallelism
    if s.checkpointing == "full":
        kept = tokens * on_rank(block_input, block_input)
    elif s.checkpointing == "selective-op" and m.is_moe:  # dense and MoE layers keep different things
        kd, km = (on_rank(k, block_input) for k in moe.op_sac_kept_per_token(s, r, a))
        kept, kept_stage = tokens * max(kd, km), tokens * moe.worst_stage(m, s.pp, kd, km, s.pp_virtual)
    elif s.checkpointing == "selective-op":  # input, every other matmul output, attention output
        kept = tokens * on_rank(op_sac_bytes_per_token(m, residual_bytes=r, act_bytes=a, method=s.method,
                                                       lora_rank=s.lora_rank, fp32_adapters=fp32_adapters,
                                                       lora_targets=s.lora_targets, adapter_copy_bytes=copy_bytes),
                                block_input)
    elif s.recomputes not in ((), DEFAULT_MODULES):  # Megatron's modules: each layer less what they free
        kd, km = _modules_kept_per_token(s, per_token(m), moe_per_token, a, full_fp8)
        kd, km = on_rank(kd), on_rank(km)
        kept = tokens * (max(kd, km) if m.is_moe else kd)
        kept_stage = tokens * (moe.worst_stage(m, s.pp, kd, km, s.pp_virtual) if m.is_moe else s.stage_layers * kd)
    if kept is not None:
        kept_stage = kept_stage if kept_stage is not None else s.stage_layers * kept
        saved = in_flight * kept_stage
    else:  # with FlashAttention, selective-attn recompute saves nothing more (no s x s scores)
        saved = layers * layer if not m.is_moe else in_flight * stage
    # torch.distributed.pipelining keeps the last stage's output (the logits) until that micro-batch's backward
    keeps_logits = stack.keeps_logits or (s.pp > 1 and stack.torch_pipelining)
    loss_bytes = loss_bytes_per_token(m, a, keeps_logits, stack.tp_loss_parallel and s.tp > 1, s.compiled,
                                      stack.inplace_cross_entropy)
    # vocabulary-parallel loss with sequence parallelism; without it the logits are gathered on every TP rank
    loss = tokens * (loss_bytes + final_norm_bytes(m, s.kernels, r, a, s.method)) / (s.tp if sp else 1)
    if s.pp > 1:  # the loss lives on the last rank, which holds one micro-batch (interleaved: (v-1) pp + 1 of v)
        n_last = len(pipeline_ranks(m.num_layers, s.pp, s.pp_virtual)[-1])  # uneven stages: the last may be smaller
        last_in_flight = in_flight_micro_batches(s.pp, s.pp_virtual, s.schedule_microbatches, rank=s.pp - 1)
        if kept is None:
            last = last_in_flight * (stage if m.is_moe else n_last * layer)
        else:
            last = last_in_flight * (kept_stage if m.is_moe else n_last * kept)
        saved, loss = max(saved, last + loss), 0.0 if saved > last + loss else loss
    return saved, layer, loss, layer_input_bytes(m, r) * tokens


def _modules_kept_per_token(s: Setup, dense_saved: float, moe_saved: float, a: int,
                            fp8_saved: bool) -> tuple[float, float]:
    """(dense layer, MoE layer) bytes per token kept under Megatron's --recompute-modules (plan/recompute.py), from
    what each saves without recompute, before the TP split; the MoE figure is 0 for a dense model."""
    m = s.model
    kw = dict(kernels=s.kernels, act_bytes=a, fp8_saved=fp8_saved)
    dense = dense_saved - freed_per_token(s.recomputes, m, moe_layer=False, **kw)
    if not m.is_moe:
        return dense, 0.0
    sparse = moe_saved - freed_per_token(s.recomputes, m, moe_layer=True, routed_rows=moe.busy_rows(s),
                                     moe_saved=moe.moe_mlp_saved_per_token(s, **kw), **kw)
    return dense, sparse


def checkpoint_bytes(s: Setup) -> float:
    """One checkpoint: fp32 master weights + Adam states of the trainable parameters
    (adapters only for LoRA: the frozen base is not saved)."""
    m = s.model
    if s.method == "full":
        per = 8 if s.optimizer_dtype == "bf16" else 12
        return per * m.param_count()
    adapters = m.num_layers * m.lora_params_per_layer(s.lora_rank, s.lora_targets)
    return 12 * adapters


def estimate_memory(s: Setup) -> MemoryResult:
    pc = param_counts(s)
    weights, grads, optim, host_off = _states(s, pc)
    saved, layer, loss, _ = activation_parts(s)
    grad_bytes = 2 if (s.optimizer_dtype == "bf16" and s.method == "full") else 4
    head_grads = 0.0 if s.method != "full" else grad_bytes * pc.embed / (
        s.shard_dp if s.strategy in ("zero2", "zero3") else 1)
    grads_at_start = grads if s.grad_accum > 1 else head_grads
    start = weights + optim + grads_at_start + saved + loss
    # ZeRO-3: one unit's fp32 weight gradients, unsharded until reduce-scattered (a frozen
    # LoRA base has none)
    unit_grads = 4 * pc.block if (s.strategy == "zero3" and s.method == "full") else 0.0
    end_acts = 2 * layer + unit_grads  # one layer (re)computed + activation grads in flight
    end = weights + optim + grads + end_acts
    if start >= end:
        phase, acts, g_at_peak = "backward-start", saved + loss, grads_at_start
    else:
        phase, acts, g_at_peak = "backward-end", end_acts, grads
    allocated = max(start, end)
    frag = (s.efficiency or eff.arch_efficiency(s.gpu.arch)).fragmentation_of(s.strategy)  # calibrated or FRAGMENTATION
    reserved = allocated * (1 + frag)
    fixed = (eff.CUDA_CONTEXT_GIB + (eff.NCCL_BUFFERS_GIB if s.n_gpus > 1 else 0.0)) * GiB
    peak = reserved + fixed
    ckpt = checkpoint_bytes(s)
    # async save stages each rank's share in pinned host memory (offloaded states are there already)
    staging = ckpt / s.n_gpus if s.offload == "none" else 0.0
    pinned = 2 * 2 * pc.block if s.offload != "none" else 0.0
    host_per_gpu = host_off + staging + pinned + PROCESS_HOST_GIB * GiB
    return MemoryResult(weights=weights, gradients=g_at_peak, optimizer=optim, activations=acts,
                        other=peak - weights - g_at_peak - optim - acts, peak=peak,
                        allocated_peak=allocated, reserved_peak=reserved, phase=phase,
                        states_full=weights + grads + optim,
                        host_per_node=host_per_gpu * s.gpus_per_node, host_offloaded_per_gpu=host_off,
                        checkpoint_bytes=ckpt)
