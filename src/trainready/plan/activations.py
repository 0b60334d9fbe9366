"""Activation memory: bytes saved for backward per token and layer, by implementation.

Counted tensor by tensor (what autograd saves), after Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", Sec. 4.1: 34sbh + 5as^2b per layer
with dropout and without FlashAttention), adapted to what today's stacks run:

* FlashAttention keeps Q, K, V, the output and a log-sum-exp, never the s x s scores;
* no dropout (LLM fine-tuning and most pre-training use none) -> no masks;
* GQA: K and V are num_kv_heads / num_heads of Q; multi-head latent attention (DeepSeek-V3):
  Q and K of qk_head_dim per head, V and the output of v_head_dim, and the q/kv latents;
* SwiGLU saves gate, silu(gate), up and their product (4 x ffn) instead of GELU's 2 x ffn;
  the tanh GELU that Hugging Face writes out as elementwise ops (`gelu_new`, GPT-2) saves
  3 x ffn more in eager mode;
* "eager" (Hugging Face style PyTorch modules) RMSNorm upcasts to fp32 and saves the fp32
  input and the normalized value, and the attention output is copied once more (transpose +
  contiguous) before the output projection; "fused" kernels (Megatron, llm-foundry, TE)
  save only the norm input and output.
* LoRA: frozen base linears save nothing for their weight gradient; under PEFT each adapted
  linear saves its own copy of its input in the adapter dtype (PEFT keeps adapters in fp32), or
  under autocast the bf16 cast autocast makes of that copy for the matmul (`adapter_copy_bytes` 2);
  stacks with adapters in the model's dtype (Megatron-Bridge, NeMo AutoModel) feed the adapter
  the base linear's own input, saved once as in full fine-tuning (`fp32_adapters` False; the
  rank-r intermediates, r x 2 bytes per linear, are left out).
* LoRA dropout (`lora_dropout` "pre" or "post", Stack.lora_dropout_position): dropout saves a 1-byte mask per
  element it drops from. "pre" (PEFT, Megatron-Bridge, torchtune: lora_A(dropout(x))) drops each adapter's
  input: under PEFT the dropped fp32 copy replaces the copy lora_A saved anyway (+1 byte), in the model's dtype
  it is a copy of its own the base input cannot stand for (+act_bytes + 1), once per fused module under
  Megatron-Core (linear_qkv, linear_fc1; on linear_fc2 the copy replaces the activation output only its adapter
  kept, Transformer Engine saving no input for a frozen weight: +1); "post" (AutoModel) drops the adapter's
  output, whose mask is all it keeps (+1 byte per output element). Not counted: under Megatron with TP > 1 the
  linear_qkv and linear_fc1 adapters read the sequence-parallel input gathered whole
  (return_layernorm_output_gathered), as the adapters' own gathers are not counted without dropout either.
* fused SwiGLU (Megatron-Core's bias_swiglu, a compiled graph) saves only its input (gate and up,
  2 x ffn) and the down projection its own input (1 x ffn): 3 x ffn, where eager modules keep 4.
* FP8 under Transformer Engine (`fp8_saved`): each linear saves its input as the FP8 tensor it cast
  for the forward GEMM, 1 byte per element (TE's Linear/LayerNormLinear save the quantized input for
  the weight-gradient GEMM), beside what the norm, attention and activation kernels keep in bf16;
  torchao's float8 training keeps bf16 inputs (its measured peaks equal bf16's), so it passes False.

`korthikanti_layer_bytes` reproduces the paper's formula exactly (dropout, no Flash) and is
what the benchmark holds this module to.
"""

from __future__ import annotations

from collections.abc import Collection

from .model_spec import ModelSpec

ADAPTER_BYTES = 4  # PEFT casts adapter inputs to the adapter dtype, fp32 by default


def _norm_bytes(model: ModelSpec, kernels: str, residual_bytes: int, act_bytes: int, fp8_saved: bool = False,
                frozen: bool = False) -> int:
    """Saved by one norm plus its output as the next linear's input (bytes per hidden unit). `frozen`: the
    norm's weight takes no gradient (LoRA), so `weight * normalized` keeps only the weight (autograd saves an
    operand only for the other operand's gradient)."""
    if fp8_saved:  # TE LayerNormLinear: the norm's input and the FP8 normalized input of the GEMM
        return residual_bytes + 1
    if kernels == "eager" and model.norm == "rmsnorm":
        if residual_bytes == 4:  # autocast: fp32 input, fp32 normalized, bf16 copy for the linear
            return 4 + 4 + act_bytes
        # fp32 upcast, normalized in bf16 (for the weight's gradient), weighted output
        return 4 + (0 if frozen else act_bytes) + act_bytes
    return residual_bytes + act_bytes


def attention_out_dim(model: ModelSpec) -> int:
    """Width of the attention output per token (the output projection's input): heads x head_dim,
    with MLA heads x v_head_dim."""
    return model.num_heads * model.mla.v_head_dim if model.mla else model.q_dim


def _attention_saved(model: ModelSpec) -> int:
    """Elements per token the attention saves before its output: Q, K, V as FlashAttention keeps them;
    with MLA, Q and K are heads x qk_head_dim, V heads x v_head_dim, and the low-rank latents (q_a and
    kv_a outputs) are each saved twice: as their RMSNorm's input and, normalized, as the up
    projection's input."""
    if model.mla is None:
        return model.q_dim + 2 * model.kv_dim
    a, h = model.mla, model.num_heads
    return 2 * h * a.qk_head_dim + h * a.v_head_dim + 2 * ((a.q_lora_rank or 0) + a.kv_lora_rank)


def layer_bytes_per_token(model: ModelSpec, *, kernels: str, residual_bytes: int, act_bytes: int,
                          method: str = "full", dropout: bool = False, flash: bool = True,
                          seq_len: int = 0, fp8_saved: bool = False, fp32_adapters: bool = True,
                          attention_copy: bool = True, lora_targets: Collection[str] | None = None,
                          lora_dropout: str | None = None, lora_fused_modules: bool = False,
                          adapter_copy_bytes: int = ADAPTER_BYTES) -> float:
    """Bytes of activations one transformer block saves per token (no recomputation). `lora_targets`: the linear
    layers LoRA adapts (None: every one; ModelSpec.linear_layers names them); `lora_dropout`: where their dropout
    sits, "pre" or "post" (None: none; lora_dropout_bytes), on fused modules where `lora_fused_modules`;
    `adapter_copy_bytes`: bytes per element of the input copy PEFT's fp32 adapters save (4; under autocast 2).
    `attention_copy`: eager
    modules copy the attention output (SDPA's batch x heads x seq layout, transposed and made contiguous) for the
    output projection; False where the kernel returns batch x seq x heads (flash-attn's flash_attn_func, as
    Hugging Face's flash_attention_2 calls it), which the projection reads as a view."""
    d, f = model.hidden_size, model.ffn_hidden_size
    a, out = act_bytes, attention_out_dim(model)
    fp8_saved = fp8_saved and method == "full"
    norm = _norm_bytes(model, kernels, residual_bytes, a, fp8_saved, frozen=method in ("lora", "qlora"))
    attn = a * _attention_saved(model) + a * out  # Q, K, V (MLA: and latents) and the output (saved by Flash)
    if kernels == "eager" and attention_copy:
        attn += a * out  # transpose + contiguous copy fed to the output projection
    if fp8_saved:
        attn += out  # the output projection's FP8 copy of its input
    if not flash:  # s x s scores per head: softmax output, plus dropout mask and output
        attn += (a + ((1 + a) if dropout else 0)) * model.num_heads * seq_len
        if model.mla is None:  # eager GQA matmuls save K and V repeated for every query head (repeat_kv)
            attn += a * 2 * (model.q_dim - model.kv_dim)
    total = model.norms_per_layer * norm * d + attn + mlp_bytes_per_token(model, f, kernels=kernels, act_bytes=a,
                                                                          fp8_saved=fp8_saved)
    if dropout:
        total += 2 * d  # masks after attention and after the MLP (1 byte each)
    if method in ("lora", "qlora"):
        total += _lora_delta(model, kernels, a, lora_targets, fp32_adapters, adapter_copy_bytes)
    if method in ("lora", "qlora") and lora_dropout:
        total += lora_dropout_bytes(model, lora_targets, lora_dropout, fp32_adapters, a, lora_fused_modules)
    return float(total)


def _whole_on_tp_ranks(model: ModelSpec, name: str, din: int) -> bool:
    """A column-parallel linear whose input TP without sequence parallelism leaves whole on every rank: it reads the
    hidden size, or (latent attention) the latents; the row-parallel o and down read their TP rank's split."""
    return name not in ("o", "down") and (din == model.hidden_size or name in ("q_b", "kv_b"))


def _adapter_inputs(model: ModelSpec, targets: Collection[str] | None, fused_modules: bool = False,
                    whole_only: bool = False) -> dict[str, int]:
    """Elements per token and layer of each adapter's input, by module: one per fused module where
    `fused_modules` (q, k, v share linear_qkv's; gate, up linear_fc1's); `whole_only`: the inputs TP without
    sequence parallelism leaves whole on every rank."""
    groups = {"q": "qkv", "k": "qkv", "v": "qkv", "gate": "fc1", "up": "fc1"} if fused_modules else {}
    return {groups.get(n, n): i for n, i, _ in model.linear_layers()
            if (targets is None or n in targets) and (not whole_only or _whole_on_tp_ranks(model, n, i))}


def _dropped(model: ModelSpec, targets: Collection[str] | None, at: str, fused_modules: bool,
             whole_only: bool) -> dict[str, int]:
    """Elements per token and layer each adapter's dropout drops, by module (lora_dropout_elements)."""
    if at == "pre":
        return _adapter_inputs(model, targets, fused_modules, whole_only)
    # the adapter's output: the row-parallel o and down give whole rows on every TP rank
    return {n: o for n, _, o in model.linear_layers()
            if (targets is None or n in targets) and (not whole_only or n in ("o", "down"))}


def lora_dropout_elements(model: ModelSpec, targets: Collection[str] | None, at: str, fused_modules: bool = False,
                          whole_only: bool = False) -> int:
    """Elements per token and layer that dropout on the adapters of `targets` drops: at "pre" each adapter's
    input, at "post" its output. `fused_modules` (Stack.lora_fused_modules): one adapter per fused module, so q, k
    and v (linear_qkv), and gate and up (linear_fc1), drop one shared input. `whole_only`: those that TP without
    sequence parallelism leaves whole on every rank (the column-parallel adapters' inputs, the row-parallel ones'
    outputs)."""
    return sum(_dropped(model, targets, at, fused_modules, whole_only).values())


def lora_dropout_bytes(model: ModelSpec, targets: Collection[str] | None, at: str, fp32_adapters: bool,
                       act_bytes: int, fused_modules: bool = False, whole_only: bool = False) -> int:
    """Bytes per token and layer that dropout on the adapters of `targets` adds to what a block saves (module
    docstring): a mask byte per element dropped (lora_dropout_elements), and at "pre" the dropped copy where the
    adapters do not keep an fp32 copy of their input anyway, except on Megatron-Core's linear_fc2: Transformer
    Engine saves no input for a frozen weight, so the activation output only its adapter kept is replaced by the
    dropped copy."""
    copy = 0 if at == "post" or fp32_adapters else act_bytes
    return sum((1 + (0 if fused_modules and n == "down" else copy)) * k
               for n, k in _dropped(model, targets, at, fused_modules, whole_only).items())


def mlp_bytes_per_token(model: ModelSpec, ffn: int, *, kernels: str, act_bytes: int, fp8_saved: bool = False) -> int:
    """Bytes per token an MLP `ffn` wide saves inside (its input is the norm's output, counted with the norm)."""
    a = act_bytes
    if model.gated_mlp:
        # eager: gate, up, silu(gate) and the product; fused: the kernel's input (gate, up) and the product
        return 4 * a * ffn if kernels == "eager" else 2 * a * ffn + act_output_bytes(a, fp8_saved) * ffn
    mlp = 2 * a * ffn
    if model.activation == "gelu_tanh_composed" and kernels == "eager":
        mlp += 3 * a * ffn  # x^3's input, tanh output, (1 + tanh) and 0.5x saved by the ops
    return mlp


def act_output_bytes(act_bytes: int, fp8_saved: bool) -> int:
    """Bytes per element of an MLP's activation output as the down projection saves it (FP8 under TE)."""
    return 1 if fp8_saved else act_bytes


def norm_output_bytes(act_bytes: int, fp8_saved: bool) -> int:
    """Bytes per element of a fused norm's normalized output as the next linear saves it (FP8 under TE)."""
    return 1 if fp8_saved else act_bytes


def tp_replicated_bytes_per_token(model: ModelSpec, *, kernels: str, residual_bytes: int, act_bytes: int,
                                  method: str = "full", dropout: bool = False, fp8_saved: bool = False,
                                  fp32_adapters: bool = True, lora_targets: Collection[str] | None = None,
                                  lora_dropout: str | None = None, lora_fused_modules: bool = False,
                                  adapter_copy_bytes: int = ADAPTER_BYTES) -> float:
    """The part of layer_bytes_per_token that tensor parallelism without sequence parallelism leaves whole on
    every TP rank (Korthikanti et al. 2022, Sec. 4.2.2: the 10sbh of norms and dropout stay, the 24sbh/t of the
    attention and MLP insides split): the norms' inputs and outputs (the column-parallel linears' input) and
    the dropout masks; under PEFT, the fp32 input copies of the adapters on column-parallel linears (those that
    read the hidden size, or latent attention's latents) replace the normalized outputs only the frozen linears
    read; LoRA dropout's masks (and copies) on those adapters' inputs, and on the row-parallel adapters' outputs,
    stay whole too."""
    d, a = model.hidden_size, act_bytes
    fp8_saved = fp8_saved and method == "full"
    frozen = method in ("lora", "qlora")
    total = model.norms_per_layer * _norm_bytes(model, kernels, residual_bytes, a, fp8_saved, frozen=frozen) * d
    if dropout:
        total += 2 * d
    if frozen:  # the norm outputs no adapter reads (PEFT's fp32 adapters read copies of their own)
        total -= _unread_norms(model, () if fp32_adapters else _adapter_inputs(model, lora_targets)) * a * d
    if frozen and fp32_adapters:
        total += adapter_copy_bytes * sum(_adapter_inputs(model, lora_targets, whole_only=True).values())
    if frozen and lora_dropout:
        total += lora_dropout_bytes(model, lora_targets, lora_dropout, fp32_adapters, a, lora_fused_modules,
                                    whole_only=True)
    return float(total)


def _lora_delta(model: ModelSpec, kernels: str, a: int, targets: Collection[str] | None = None,
                fp32_adapters: bool = True, copy_bytes: int = ADAPTER_BYTES) -> int:
    """Change in saved bytes when the base linears are frozen and the linears named in `targets` (None: every one)
    have an adapter. Frozen linears save nothing for their weights, so what only they read goes (_frozen_only_bytes);
    PEFT's fp32 adapters (`fp32_adapters`) each save a copy of their input (`copy_bytes` per element: fp32, or its
    bf16 cast under autocast), where adapters in the model's dtype read the very tensors the frozen linears read,
    which stay saved as in full training."""
    if not fp32_adapters:
        return -_frozen_only_bytes(model, kernels, a, _adapter_inputs(model, targets))
    added = sum(copy_bytes * din for din, _ in model.linear_layer_dims(targets))
    return added - _frozen_only_bytes(model, kernels, a, ())


def _unread_norms(model: ModelSpec, adapted: Collection[str]) -> int:
    """How many of a block's norm outputs no adapter in `adapted` reads: the attention norm's where none of the
    attention linears reading the hidden size (q, k, v, qkv, q_a, kv_a) is adapted, the MLP norm's where neither gate
    nor up is; a block whose norms are not that pair keeps them all while any adapter reads the hidden size."""
    d = model.hidden_size
    readers = {n for n, i, _ in model.linear_layers() if i == d and n in adapted}
    count = int(bool(readers - {"gate", "up"})) + int(bool(readers & {"gate", "up"}))
    if model.norms_per_layer != 2:
        return 0 if count else model.norms_per_layer
    return 2 - count


def _frozen_only_bytes(model: ModelSpec, kernels: str, a: int, adapted: Collection[str]) -> int:
    """Bytes per token and layer of the tensors only frozen linears read, less those an adapter in `adapted` reads in
    the model's dtype: the norm outputs (_unread_norms), the eager copy before o_proj, down's input (the SwiGLU product
    or GELU output)."""
    unread = _unread_norms(model, adapted) * a * model.hidden_size
    unread += a * attention_out_dim(model) if kernels == "eager" and "o" not in adapted else 0
    return unread + (a * model.ffn_hidden_size if "down" not in adapted else 0)


def layer_input_bytes(model: ModelSpec, residual_bytes: int) -> int:
    """What full recomputation keeps per token and layer: the block's input."""
    return residual_bytes * model.hidden_size


def final_norm_bytes(model: ModelSpec, kernels: str, residual_bytes: int, act_bytes: int, method: str = "full") -> int:
    if not model.final_norm:
        return 0
    return _norm_bytes(model, kernels, residual_bytes, act_bytes, frozen=method in ("lora", "qlora")) * model.hidden_size


def loss_bytes_per_token(model: ModelSpec, act_bytes: int, keeps_logits: bool = True,
                         loss_parallel: bool = False, compiled: bool = False, inplace: bool = False) -> int:
    """Peak of the logits and cross-entropy buffers per token, reached as the loss is differentiated:
    the fp32 log-softmax saved for backward and two fp32 gradient buffers (12 bytes x vocab), plus the
    low-precision logits where the train step still holds them (measured on H200 with a Hugging Face
    model: 14 bytes x vocab with bf16). The forward's own peak, logits + fp32 copy + log-softmax
    (act_bytes + 8), is below either. torch's loss_parallel (vocabulary-sharded logits, per TP rank: the
    caller divides by tp) builds its backward in fresh fp32 buffers (zeros, exp of the log-softmax, their
    sum, the product): 16 bytes x vocab beside the saved log-softmax.

    Compiled with the model (`compiled`; torchtitan PR #1033 compiles the loss "for a reduction of memory", and moved
    the logits' fp32 upcast inside it, PR #551): Inductor fuses the upcast, the log-softmax and the NLL into
    reductions that keep only per-token statistics, and their backward into one kernel that writes the gradient in
    the logits' dtype. The graph saves the low-precision logits for backward, so the peak is those and their
    gradient: 2 x act_bytes x vocab, counted from what the compiled graph holds (not measured here). Under
    loss_parallel (DTensor, vocabulary-sharded) the eager figure is kept: not counted for a compiled graph.

    In place (`inplace`, Stack.inplace_cross_entropy: Megatron-Core's vocabulary-parallel cross entropy): one fp32
    copy of the logits becomes the softmax and then the gradient, beside the logits in forward or their gradient in
    backward: act_bytes + 4 x vocab."""
    if inplace:
        return (act_bytes + 4) * model.vocab_size
    if compiled and not loss_parallel:
        return 2 * act_bytes * model.vocab_size
    return ((act_bytes if keeps_logits else 0) + (16 if loss_parallel else 12)) * model.vocab_size


def korthikanti_layer_bytes(model: ModelSpec, seq_len: int) -> float:
    """sbh(34 + 5as/h) / (sb): the paper's per-token, per-layer figure (fp16, dropout, no Flash)."""
    return model.hidden_size * (34 + 5 * model.num_heads * seq_len / model.hidden_size)


# --- op-level selective checkpointing (torchtitan selective_ac_option = "op") ---------------
# torchtitan/distributed/activation_checkpoint.py with its _op_sac_save_list: inside each
# checkpointed block the policy saves the output of every aten.mm except every second one
# (counted in forward order), and the outputs of the scaled-dot-product-attention kernels
# (output + fp32 log-sum-exp per head); everything else (norms, RoPE, activations, residual
# adds, the unsaved matmuls) is recomputed in backward. A linear with a bias runs as
# aten.addmm: neither saved nor counted. Hugging Face GPT-2 (c_attn), MPT (Wqkv), GPT-NeoX,
# Bloom and Falcon (query_key_value) project q, k and v with one fused linear (ModelSpec.linear_layers). LoRA adds two
# unbiased matmuls after each adapted linear (PEFT: base, lora_A, lora_B). A MoE layer's
# matmuls here are its attention and shared experts (`ffn`: their width); its router is
# recomputed and not counted (SelectiveAC force_recompute_mm_shapes_by_fqns "moe.router.gate"),
# its routed experts' grouped GEMMs (aten._grouped_mm, not a saved op) recomputed, and what it
# does save (top-k, the all-to-alls' outputs) is in plan/moe.py.
LSE_BYTES = 4  # FlashAttention's log-sum-exp: fp32, one per head and token


def op_sac_matmuls(model: ModelSpec, method: str = "full", lora_rank: int = 16,
                   ffn: int | None = None,
                   lora_targets: Collection[str] | None = None) -> list[tuple[int, int, bool, bool]]:
    """One block's forward matmuls in order: (in, out, saved by the op policy, is an adapter).
    `ffn`: the width of this block's MLP (a MoE model's dense layers: ffn_hidden_size; its MoE
    layers: the shared experts', 0 for none); None: the dense MLP, or a MoE model's shared experts.
    `lora_targets`: the linears that carry adapters (None: every one; ModelSpec.linear_layers names them)."""
    layers = model.linear_layers()
    names, dims = [n for n, _, _ in layers], [(i, o) for _, i, o in layers]
    n_attn = len(dims) - (model.mlp_matrices if (model.moe is None or model.moe.shared_width) else 0)
    if ffn is not None:
        d = model.hidden_size
        mlp = ([] if not ffn else [("gate", d, ffn), ("up", d, ffn), ("down", ffn, d)] if model.gated_mlp
               else [("up", d, ffn), ("down", ffn, d)])
        names, dims = names[:n_attn] + [n for n, _, _ in mlp], dims[:n_attn] + [(i, o) for _, i, o in mlp]
    adapted = [method in ("lora", "qlora") and (lora_targets is None or n in lora_targets) for n in names]
    # q, k and v (one fused linear, or three) carry the QKV bias; latent attention's projections none
    bias = [model.mla is None and model.qkv_bias] * (n_attn - 1) + [model.out_bias]
    bias += [model.mlp_bias] * (len(dims) - n_attn)
    out: list[tuple[int, int, bool, bool]] = []
    count = 0

    def mm(din: int, dout: int, biased: bool, adapter: bool) -> None:
        nonlocal count
        if not biased:
            count += 1
        out.append((din, dout, not biased and count % 2 == 1, adapter))

    for (din, dout), biased, adapter in zip(dims, bias, adapted, strict=True):
        mm(din, dout, biased, False)
        if adapter:
            mm(din, lora_rank, False, True)
            mm(lora_rank, dout, False, True)
    return out


def op_sac_bytes_per_token(model: ModelSpec, *, residual_bytes: int, act_bytes: int, method: str = "full",
                           lora_rank: int = 16, ffn: int | None = None, fp32_adapters: bool = True,
                           lora_targets: Collection[str] | None = None,
                           adapter_copy_bytes: int = ADAPTER_BYTES) -> float:
    """Bytes one block keeps per token between forward and backward under the op policy: its
    input (what torch.utils.checkpoint keeps), the saved matmul outputs and the attention output
    with its log-sum-exp (`ffn`: as op_sac_matmuls). PEFT's fp32 adapters' matmuls write their outputs in the dtype
    they ran in, their input copy's (`adapter_copy_bytes`: fp32, or bf16 under autocast)."""
    adapter_bytes = adapter_copy_bytes if fp32_adapters else act_bytes
    saved = sum(dout * (adapter_bytes if adapter else act_bytes)
                for _, dout, keep, adapter in op_sac_matmuls(model, method, lora_rank, ffn, lora_targets) if keep)
    return float(residual_bytes * model.hidden_size + saved + act_bytes * attention_out_dim(model)
                 + LSE_BYTES * model.num_heads)
