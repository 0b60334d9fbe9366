"""Training stacks by name: the kernels, attention kernel, gradient-reduction dtype and the
meaning of "selective" activation checkpointing that one framework's defaults amount to.

A stack replaces four flags (`--kernels`, `--attention-kernel`, `--reduce-dtype` and what
`--activation-checkpointing selective` recomputes); a flag given explicitly still wins over
the stack. Every preset names the file or document its values come from.

Selective checkpointing comes in two kinds:

* "op" (torchtitan `selective_ac_option = "op"`; PyTorch's selective activation checkpointing,
  `torch.utils.checkpoint.create_selective_checkpoint_contexts`): inside each checkpointed
  block, the outputs of every other matmul (`aten.mm`, counted in forward order) and of the
  scaled-dot-product-attention kernels are saved; norms, activations, RoPE, residual adds and
  the other matmuls are recomputed in backward.
* "attention" (Megatron-LM `--recompute-granularity selective`, Korthikanti et al. 2022): only
  the attention core is recomputed. With FlashAttention it saves nothing (the s x s scores are
  never stored) and costs the attention forward once more.

Attention kernels are efficiency classes (efficiency.py): "sdpa" is today's kernel for the
architecture (PyTorch SDPA, Transformer Engine / cuDNN fused attention: FlashAttention-2 on
Ampere, Hopper-native kernels on Hopper), "flash2" FlashAttention-2's Ampere kernels run as
they are, "flash1" FlashAttention-1 / Triton (2022-2023).

Which kernel PyTorch's SDPA runs on Hopper and Blackwell depends on the torch release: cuDNN's
attention became SDPA's first choice in torch 2.5, was made opt-in again after its bugs
(pytorch/pytorch#138522, #139298), and is preferred again only where the bundled cuDNN is newer
than 9.15 on sm90/sm100 (`check_prefer_cudnn_attention` in aten sdp_utils.cpp, in 2.10; the wheels
cross that threshold from torch 2.11: huggingface/transformers#48163). Before that SDPA runs
FlashAttention-2 there: 329 TFLOP/s against cuDNN's 631 on an H100 at 4,608 tokens, head dim 128
(pytorch/pytorch#142132, torch 2.6 nightly). Stacks whose attention goes through torch's SDPA
(`torch_sdpa`) therefore state that "sdpa" means torch >= 2.11 there (`attention_assumption`);
Transformer Engine calls cuDNN's fused attention itself, whatever the torch release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from trainready.errors import UnknownNameError, UsageError

SelectiveKind = Literal["op", "attention"]
EPDispatcher = Literal["alltoall", "deepep"]
ExpertTP = Literal["tp", "whole-under-ep"]
EP_DISPATCHERS = ("alltoall", "deepep")
CHECKPOINTING_KINDS = ("none", "selective", "selective-op", "selective-attn", "full")
"""What a job may ask for; "selective" means the stack's kind."""
SETUP_CHECKPOINTING = ("none", "selective-op", "selective-attn", "full")
"""What a resolved setup holds."""


_PEFT_LORA = "peft tuners/lora/layer.py: LoraLayer.forward casts x to lora_A's dtype, fp32 by default"
FSDP_CASTS = ("accelerate utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision: param_dtype is "
              "the run's mixed precision (bf16); under FSDP2, the Trainer's default (transformers 5.23 "
              "fsdp_config version 2), every parameter of a layer's group is gathered in it for the forward, PEFT's "
              "fp32 adapters too, so peft's _cast_input_dtype copies nothing (tests/lora_fsdp_probe.py measures "
              "it on CPU); FSDP1 with PEFT's per-adapter wrapping reads the adapters' fp32 dtype before their unit "
              "gathers and keeps the copies (not modelled)")


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    kernels: Literal["eager", "fused"]
    attention_kernel: Literal["sdpa", "flash2", "flash1"]
    reduce_dtype: Literal["fp32", "bf16"]
    selective: SelectiveKind | None
    """What `--activation-checkpointing selective` recomputes; None: the stack has no selective mode."""
    description: str
    source: str
    ep_dispatcher: EPDispatcher = "alltoall"
    """How MoE tokens reach their experts (plan/moe.py): "alltoall" sends one row per token and routed
    expert through a collective all-to-all; "deepep" (DeepEP's normal kernels, HybridEP) sends a token
    once per destination GPU over NVLink and once per destination node over the network, which
    forwards it inside that node."""
    ep_overlap: bool = False
    """Dispatch/combine run beside another micro-batch's compute (DeepSeek's DualPipe, Megatron-Core
    --overlap-moe-expert-parallel-comm, torchtitan's DualPipeV EP overlap) instead of in its path."""
    fp8_dispatch: bool = False
    """Under --precision fp8 the dispatch (and its backward mirror) sends FP8 activations; combines stay
    BF16 (DeepSeek-V3 technical report, Sec. 3.3.3)."""
    ep_source: str = ""
    """Where the three MoE communication values come from."""
    alltoall_caveat: str = ""
    """Said beside an estimate that takes this stack's all-to-all dispatch with EP: how the framework itself
    dispatches where that differs ("": it dispatches as estimated)."""
    expert_tp: ExpertTP = "whole-under-ep"
    """The expert tensor-parallel size (etp) of a job that gives none (default_etp): "tp" splits routed experts
    like the dense MLP (Megatron-Core's expert_tensor_parallel_size default); "whole-under-ep" keeps them whole
    (etp 1) when ep > 1, so the EP group folds over TP and data-parallel ranks, and splits them tp ways
    without EP (torchtitan 0.3, transformers, DeepSpeed AutoEP)."""
    etp_source: str = ""
    """Where expert_tp comes from."""
    torch_sdpa: bool = True
    """Attention runs through torch.nn.functional.scaled_dot_product_attention, whose kernel on Hopper and
    Blackwell depends on the torch release (module docstring); False: the stack calls its kernel itself
    (Transformer Engine's fused attention)."""
    fp8_recipe: str = "tensorwise"
    """The FP8 scaling recipe a job with --precision fp8 and no --fp8-recipe gets (efficiency.FP8_RECIPES)."""
    fp8_recipes: tuple[str, ...] = ()
    """The FP8 recipes the framework has (empty: not stated); another one is estimated with a warning."""
    fp8_tp_gather: tuple[str, ...] = ()
    """The FP8 recipes under which, with TP and sequence parallelism, a dense model's column-parallel inputs (forward)
    and row-parallel output gradients (backward) are cast to FP8 on their sequence shard and all-gathered in FP8
    (torchao's Float8ColwiseParallel / Float8RowwiseParallel); under other recipes the model gathers bf16 and casts
    the gathered tensor. Empty: not modelled for the stack (Transformer Engine's LayerNormLinear gathers its FP8
    norm output under sequence parallelism, which the megatron stack does not count yet)."""
    fp8_param_gather: tuple[str, ...] = ()
    """The FP8 recipes under which the framework can keep its linear weights in FP8 and all-gather them in FP8 over
    data parallelism with strategy `fp8_param_gather_strategy` (one byte a weight where bf16 moves two): Megatron's
    --fp8-param-gather with the distributed optimizer, torchao's FSDP2 float8 all-gather. Empty: not modelled."""
    fp8_param_gather_strategy: str | None = None
    fp8_param_gather_default: bool = False
    """Whether the framework's own recipes turn the FP8 parameter all-gather on where it applies."""
    fp8_param_gather_source: str = ""
    token_drop: bool = False
    """The framework can drop tokens at a capacity factor (--moe-routing capacity); False: dropless only."""
    tp_overlap: str | None = None
    """How the framework overlaps tensor-parallel communication with the GEMMs (--tp-overlap); None: it has no
    such mode (DeepSpeed AutoTP and transformers' TP plans run each collective after its GEMM)."""
    has_recipe: bool = True
    """trainready emits a launch for it (plan/recipes); False: `estimate` only."""
    lora_fp32_adapters: bool = True
    """LoRA adapters as PEFT keeps them: fp32 weights, each adapted linear casting its input to fp32 (a copy saved
    for backward) and running fp32 matmuls (plan/activations.py, performance._adapter_time); False: adapters in
    the model's dtype reading the very tensor the frozen linear reads (saved once, nothing copied)."""
    lora_source: str = _PEFT_LORA + "; under FSDP (ZeRO-2/3 outside DeepSpeed), " + FSDP_CASTS
    """Where the adapters' dtype comes from (Setup.lora_fp32_copies says when PEFT's fp32 adapters copy their input)."""
    autocast: bool = False
    """The framework runs the forward under torch.autocast (the Trainer's bf16=True: accelerate sets native_amp outside
    DeepSpeed; a job's --autocast/--no-autocast wins: Setup.autocast). PEFT's 4-bit QLoRA layers then hand their fp32
    adapters the bf16 input uncast (peft tuners/lora/bnb.py Linear4bit.forward: requires_conversion = not
    torch.is_autocast_enabled()), so under QLoRA the adapters copy nothing; its plain LoRA layers still copy their
    input to fp32, which autocast casts back to bf16 for the adapters' matmuls: that bf16 cast is what autograd
    saves (Setup.lora_copy_bytes), and the matmuls run in bf16."""
    lora_fused_modules: bool = False
    """LoRA adapts the framework's fused modules: Megatron-Core's linear_qkv (q, k and v) and linear_fc1 (gate and
    up) hold one adapter each, reading one input (what their dropout drops once); False: one per projection, as
    Hugging Face models have them."""
    lora_dropout_position: Literal["pre", "post"] = "pre"
    """Where LoRA dropout (--lora-dropout) sits: "pre" on each adapter's input, as PEFT (lora_B(lora_A(dropout(x))),
    one dropout per adapted module), Megatron-Bridge and NeMo 2 (LoRA.dropout_position 'pre') and torchtune do it;
    "post" on the adapter's output, NeMo AutoModel's default (PeftConfig.dropout_position 'post')."""
    param_dtype: Literal["fp32", "bf16"] = "fp32"
    """The dtype the framework builds parameters in for a bf16 job that gives no --optimizer-dtype: fp32 master
    weights under autocast or FSDP mixed precision, or bf16 parameters with bf16 Adam states (pure bf16)."""
    grads_in_reduce_dtype: bool = False
    """Full fine-tuning keeps its gradients in a buffer of the reduce dtype (bf16 when the job reduces in bf16);
    False: in fp32, as autocast's fp32 parameters and FSDP's fp32 shards have them."""
    param_gather_overlap: bool = False
    """ZeRO-1's all-gather of the updated parameters runs behind the next step's first forward (Megatron's
    --overlap-param-gather); False: it runs after the optimizer step, exposed."""
    torch_pipelining: bool = False
    """Pipeline stages run on torch.distributed.pipelining, whose Schedule1F1B refuses fewer micro-batches per step
    than stages and whose last stage keeps its output (the logits) until that micro-batch's backward."""
    pp_gathers_stage: bool = False
    """With pipeline stages, ZeRO-3/FSDP keeps the stage's parameters gathered from the first micro-batch's forward
    to the end of the step and accumulates unsharded gradients (in the reduce dtype) over the micro-batches,
    reducing them once (plan/memory.py); False: parameters are resharded after each use."""
    plain_unsharded_experts: bool = False
    """Routed experts that EP and PP alone already split (expert data-parallel size 1) are left out of FSDP: no
    gathered copy, gradients kept in the parameters' dtype; False: FSDP wraps them over a mesh of one."""
    tp_loss_parallel: bool = False
    """With TP the loss runs on vocabulary-sharded logits through torch's loss_parallel, whose log-softmax keeps
    its fp32 input and the shifted logits beside the output and whose backward builds the gradient in fresh fp32
    buffers: 16 bytes per logit at the peak instead of 12 (plan/activations.loss_bytes_per_token)."""
    attention_copy: bool = True
    """Eager modules copy the attention output before the output projection (SDPA's layout, transposed and made
    contiguous: saved twice); False: the kernel's output is read as a view (plan/activations.py)."""
    deepspeed_zero_memory: bool = False
    """DeepSpeed's ZeRO memory: ZeRO-3 keeps each rank's shard of the 16-bit parameters beside the fp32 masters (its
    partitioned ds_tensor: 18 bytes per parameter over the ranks); stages 0-2 keep 16-bit gradients beside fp32
    ones (ZeRO-2: 2 + 4 bytes over the ranks; ZeRO-1 the 16-bit ones whole; stage 0 both whole at the step); with
    the optimizer offloaded the gradients go to the host as they are reduced (runtime/zero/stage3.py and stage_1_and_2.py estimate_*_model_states_mem_needs);
    False: the 16-bit copy exists only while a unit is gathered (FSDP2's MixedPrecisionPolicy casts on gather). A row
    of a stack without a framework of its own (hf-trainer) that DeepSpeed runs counts them too (Setup.runs_on)."""
    sequence_parallel: bool = False
    """With TP the activations outside the split matmuls (norms, residual stream, the inputs of column-parallel
    linears) are split over the TP ranks along the sequence (Megatron's --sequence-parallel, torchtitan's
    enable_sequence_parallel, on by default); False: every TP rank holds them whole (DeepSpeed AutoTP,
    transformers' TP plans, NeMo AutoModel's FSDP2Config.sequence_parallel default), and the logits too
    (transformers' lm_head plan "colwise_gather_output", AutoTP's vocab_parallel_lm_head False)."""
    window_attention: Literal["tiles", "masks"] = "tiles"
    """A sliding-window block (gpt-oss, Gemma, Mistral v0.1): "tiles" where the kernel skips the key tiles the
    window masks (FlashAttention's window_size, FlexAttention's block mask, Transformer Engine's window);
    "masks" where the window reaches torch SDPA as an explicit mask, which computes every key (plan/attention.py)."""
    cuda_graphs: str | None = None
    """How the framework captures each layer in CUDA graphs (--cuda-graphs); None: not modelled for the stack, refused.
    A captured layer's kernels replay from the graph, so the host's per-block launch time (efficiency.CPU_S_PER_LAYER)
    goes; what stays eager (a dropless MoE layer's dispatch and experts, whose shapes change every step) keeps it."""
    cp_over_documents: bool = False
    """Context parallelism runs over packed, separately masked documents (--doc-len with --cp): each document split
    into 2 x cp zigzag chunks, two per rank (Megatron-Core utils.py _get_batch_on_this_cp_rank_per_document_balancing
    with Transformer Engine's thd_get_partitioned_indices; documents padded to a multiple of 2 x cp); False: not
    modelled for the stack (--cp with --doc-len refused, plan does not try it)."""
    transformers_attention: bool = False
    """Its attention is transformers' (the model classes' attn_implementation): under SDPA, packed documents reach the
    kernel as a dense mask built from position ids that restart per document (masking_utils.
    find_packed_sequence_indices), which computes every key (setup.check_doc_len)."""
    sink_attention: Literal["kernel", "eager"] = "kernel"
    """Attention with learned sinks (gpt-oss): "kernel" where the stack's kernel applies them; "eager" where the
    model class has no SDPA path and transformers runs its eager attention (plan/attention.py)."""
    torch_compile: str | None = None
    """How the framework compiles the model together with its loss (--compile); None: not modelled for it (its
    kernels are its own, or its compile leaves the loss out): --compile is refused."""
    tp_overlap_compiles: bool = False
    """Its TP overlap (--tp-overlap) runs only compiled, so a row with it is compiled with --compile or without
    (torchtitan's CompileConfig: async TP requires compile.enable, whose components default to model and loss)."""
    inplace_cross_entropy: bool = False
    """The loss is the framework's vocabulary-parallel cross entropy, which makes one fp32 copy of the logits and turns
    it into the softmax and then the gradient in place (Megatron-Core tensor_parallel/cross_entropy.py
    VocabParallelCrossEntropy and fusions/fused_cross_entropy.py: .float(), exp out=, div_, saved; backward -=,
    mul_ on the saved softmax): its peak is that fp32 buffer beside the logits (forward) or their low-precision
    gradient (backward), act_bytes + 4 per logit (plan/activations.loss_bytes_per_token); False: torch's. It is the
    path trainready's recipe runs (no --cross-entropy-loss-fusion); NeMo's performance recipes pick Transformer
    Engine's kernel (cross_entropy_fusion_impl "te"), which writes the gradient into the logits: less, not counted."""
    keeps_logits: bool = True
    """The train step holds the model's low-precision logits while the loss is differentiated (Hugging Face
    models return them in their output, which the training loop keeps); False: the loop drops them before
    backward, leaving the fp32 log-softmax and its gradients (plan/activations.loss_bytes_per_token)."""
    expert_output_saved: bool = True
    """A routed expert's output is kept for the combine's backward (the routing weights multiply it there); False: the
    experts apply the weights in their activation and the combine keeps nothing (Megatron-Core experts.py
    weighted_bias_swiglu_impl; token_dispatcher.py calls unpermute without probs)."""
    wgrad_accumulates: bool = False
    """The weight-gradient GEMMs add into the fp32 gradient buffer themselves (Megatron-Core's
    gradient_accumulation_fusion: Transformer Engine's fuse_wgrad_accumulation, grouped experts included), so a
    micro-batch adds no pass over the linear layers' gradients; only the embedding table's, through the DDP hook
    (plan/performance.py); False: each micro-batch after the first adds every local gradient to the accumulated
    ones."""
    fp8_saves_inputs: bool = False
    """Under --precision fp8 each linear saves its input for backward in FP8 (Transformer Engine's Linear and
    LayerNormLinear keep the quantized input they cast; plan/activations.py); False: bf16 inputs are kept
    (torchao float8, whose measured peak memory equals bf16's: torchao float8 README)."""


DEEPSPEED_CASTS = ("deepspeed/runtime/engine.py _configure_distributed_model (0.19.6): with bf16 or fp16 enabled, "
                   "_cast_module_mixed_precision casts every floating-point parameter to it (module.bfloat16() before "
                   "0.19.2), PEFT's adapters too, so peft's _cast_input_dtype copies nothing, unless the model was built "
                   "under ZeRO-Init (is_zero_init_model: transformers builds a ZeRO-3 model partitioned, not a 4-bit "
                   "one), whose adapters PEFT adds afterwards stay fp32; accelerate's Accelerator sets native_amp "
                   "(autocast) only outside DeepSpeed")
_TRAINER_COMPILE = ("the Trainer's --torch_compile: the model's forward, which computes the loss from the labels "
                    "(transformers loss_utils.ForCausalLMLoss upcasts the logits inside it)")
_EP_ALLTOALL_ASSUMED = ("no EP-specific kernels in this stack: tokens assumed to travel by a collective all-to-all "
                        "in the activation dtype, in the compute path (as torchtitan's 'standard' dispatcher)")

# NeMo AutoModel has no collective all-to-all dispatcher: BackendConfig.dispatcher defaults to DeepEP where
# deep_ep is importable (NVIDIA's containers build it), else UCCL-EP, else "torch", which all-gathers every EP
# rank's tokens (bf16) and all-reduces the experts' fp32 output over the whole gathered batch: about 10 (ep - 1)
# bytes per token and hidden unit against an all-to-all's 4 k (ep - 1)/ep, 2.5 ep/k times as much (not modelled).
_AUTOMODEL_DISPATCH_SOURCE = ("; NVIDIA-NeMo/Automodel @36044ad3 (2026-08-22) components/models/common/utils.py "
                              "BackendConfig.dispatcher (deepep if deep_ep imports, else uccl_ep, else torch) and "
                              "components/moe/experts.py (torch: all_gather of x, fp32 all_reduce of y)")
_AUTOMODEL_DISPATCH = ("AutoModel itself dispatches with DeepEP where it is installed, as in NVIDIA's containers "
                       "(--ep-dispatcher deepep), else with UCCL-EP, else by all-gathering the tokens and "
                       "all-reducing the experts' fp32 output, about 2.5 x ep/top-k times an all-to-all's bytes "
                       "(not modelled)")

# transformers 5.23: sdpa_mask builds an explicit mask for sliding-window layers (only a plain causal mask is
# dropped for is_causal), and GptOssPreTrainedModel sets _supports_sdpa = False, so gpt-oss without an
# attn_implementation runs eager_attention_forward
_TRANSFORMERS_ATTENTION = {"window_attention": "masks", "sink_attention": "eager", "transformers_attention": True}

STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("hf-trainer", kernels="eager", attention_kernel="sdpa", reduce_dtype="fp32", selective="op",
          torch_compile=_TRAINER_COMPILE, autocast=True,
          description="Hugging Face Transformers Trainer: eager PyTorch modules, SDPA attention, DDP (or FSDP) "
                      "over fp32 parameters under autocast",
          source="transformers: attn_implementation defaults to 'sdpa' (modeling_utils); Trainer bf16=True runs "
                 "torch.autocast over fp32 parameters, so DDP all-reduces fp32 gradients (accelerate's FSDP "
                 "MixedPrecision reduces in the compute dtype: give --reduce-dtype bf16 for it); its "
                 "gradient_checkpointing recomputes whole layers, and gradient_checkpointing_kwargs={'context_fn': "
                 "...} passes PyTorch's selective (op-level) policy to torch.utils.checkpoint",
          ep_source=_EP_ALLTOALL_ASSUMED, expert_tp="whole-under-ep", **_TRANSFORMERS_ATTENTION,
          etp_source="transformers 5.23 distributed/configuration_utils.py DistributedConfig.efsdp_size: "
                     "'Experts are not tensor-parallel', efsdp = fsdp x tp / ep (ep a multiple of tp); without "
                     "ep_size the model's TP plan splits the experts"),
    Stack("deepspeed", kernels="eager", attention_kernel="sdpa", reduce_dtype="bf16", selective="op",
          torch_compile=_TRAINER_COMPILE,
          description="a Hugging Face model under DeepSpeed ZeRO with bf16 enabled",
          source="deepspeed/runtime/engine.py communication_data_type: bf16 when bf16 is enabled and "
                 "communication_data_type is unset; model code as hf-trainer (eager modules, SDPA)",
          ep_source=_EP_ALLTOALL_ASSUMED, expert_tp="whole-under-ep", **_TRANSFORMERS_ATTENTION,
          deepspeed_zero_memory=True,
          lora_source=_PEFT_LORA + "; " + DEEPSPEED_CASTS,
          etp_source="deepspeed 0.19 module_inject/auto_ep_config.py: expert_parallel.expert_tensor_parallel_size "
                     "defaults to 1 (AutoEP); AutoTP splits every linear layer without EP"),
    Stack("torchtitan", kernels="eager", attention_kernel="sdpa", reduce_dtype="fp32", selective="op",
          # torchtitan PR #1033 (2025-03-30, "refactor train_spec.loss_fn to build_loss_fn"): "Enable compiling the loss
          # function ... result in reduction of memory"; CompileConfig.components defaults to ["model", "loss"]
          torch_compile="--compile.enable (components model and loss, torchtitan's default since PR #1033, 2025-04; "
                        "earlier releases compiled the blocks only)", tp_overlap_compiles=True,
          description="torchtitan (FSDP2/TP/PP on DTensor) as its Llama 3 configs ship: no torch.compile",
          source="torchtitan/models/llama3/train_configs/llama3_8b.toml (compile = false, [activation_checkpoint] "
                 "mode = 'selective', selective_ac_option = 'op'); config: mixed_precision_reduce = 'float32'; "
                 "distributed/activation_checkpoint.py: op policy saves aten.mm outputs except every second one "
                 "and the SDPA outputs (_op_sac_save_list)",
          ep_source="torchtitan models/common/config_utils.py make_token_dispatcher_config: comm_backend "
                    "'standard' (PyTorch all-to-all of per-expert rows) unless deepep/hybridep is chosen; EP "
                    "overlap only with the DualPipeV schedule (pipeline_parallel_expert_parallel_overlap); "
                    "float8 MoE quantizes inside the grouped GEMMs, so tokens travel in bf16",
          expert_tp="whole-under-ep", tp_overlap="async TP (--compile.enable_async_tensor_parallel)",
          lora_fp32_adapters=False,
          lora_source="torchtitan 0.3 components/lora.py LoRALinear.forward: lora_b(lora_a(input)) on the base "
                      "layer's own input, no cast; parallelize.py always installs FSDP2's MixedPrecisionPolicy "
                      "(mixed_precision_param bf16), so the adapters compute in bf16",
          sequence_parallel=True,  # config/configs.py ParallelismConfig.enable_sequence_parallel = True
          fp8_recipes=("tensorwise", "rowwise", "mxfp8"),  # torchao Float8LinearConfig recipes, MX for Blackwell
          # parallelize.py: "float8 all-gather with TP is only supported for tensorwise float8 scaling recipes. For
          # rowwise recipes, we use regular TP and all-gather happens in high precision" (enable_float8_tensorwise_tp)
          fp8_tp_gather=("tensorwise",),
          fp8_param_gather=("tensorwise",), fp8_param_gather_strategy="zero3",
          fp8_param_gather_source="torchtitan's float8 converter config: enable_fsdp_float8_all_gather = False by "
                                  "default, 'recommended for tensorwise scaling'; the rowwise recipes gather bf16",
          # train.py (Dec 2024, 9dec370ad26b) and trainer.py (2026): "del pred" before loss.backward(); loss_fn
          # upcasts the logits with .float() in eager mode
          keeps_logits=False,
          # train.py enable_loss_parallel = not training.disable_loss_parallel (on with TP); torch
          # distributed/tensor/parallel/loss.py _log_softmax (x, shifted, exp(shifted), result in fp32) and
          # _nll_loss_and_log_softmax_backward (zeros_like(x), exp(x), their sum, the product)
          tp_loss_parallel=True,
          # parallelize_llama.py apply_fsdp (9dec370ad26b) and distributed/fsdp.py (2026): reshard_after_forward is
          # False when PP is enabled, "to avoid per-microbatch all-gathers"; the pipeline schedule turns gradient
          # sync off until the last micro-batch, so FSDP2 accumulates unsharded gradients in the reduce dtype
          pp_gathers_stage=True, torch_pipelining=True,
          etp_source="torchtitan 0.3.0 distributed/parallel_dims.py: the sparse mesh (pp, dp_replicate, efsdp, ep) "
                     "with efsdp = dp_shard x cp x tp / ep ('EP borrows ranks from FSDP and TP'); "
                     "models/common/moe_sharding.py shards routed experts on EP only, on TP when EP is off; 0.3 "
                     "has no expert_tensor_parallel_degree (earlier releases took 1 or tp)"),
    Stack("megatron", kernels="fused", attention_kernel="sdpa", reduce_dtype="fp32", selective="attention",
          description="Megatron-LM / Megatron-Core with Transformer Engine: fused norm and activation kernels, "
                      "TE fused attention",
          source="megatron/training/arguments.py: bf16 forces accumulate_allreduce_grads_in_fp32 (fp32 reduce); "
                 "--recompute-granularity selective recomputes the core attention (Korthikanti et al. 2022); "
                 "Transformer Engine fused LayerNorm/RMSNorm, bias-SwiGLU/GELU fusions and fused attention",
          ep_source="megatron/core/transformer/transformer_config.py: moe_token_dispatcher_type (trainready's "
                    "recipe sets alltoall), overlap_moe_expert_parallel_comm off by default; moe/fused_a2a.py: "
                    "the flex (DeepEP) dispatcher sends the activations as they are, bf16 under TE FP8, and "
                    "HybridEP 'does not support fp8 dispatch now'",
          expert_tp="tp", fp8_saves_inputs=True, expert_output_saved=False, torch_sdpa=False, lora_fp32_adapters=False,
          lora_fused_modules=True,
          sequence_parallel=True,  # trainready's megatron recipe passes --sequence-parallel with tp > 1
          tp_overlap="--tp-comm-overlap (Transformer Engine userbuffers)",
          fp8_recipe="delayed",  # Megatron-Core TransformerConfig.fp8_recipe default
          fp8_recipes=("tensorwise", "delayed", "blockwise", "mxfp8"), token_drop=True,
          lora_source="Megatron-Bridge peft/utils.py ParallelLinearAdapter: Megatron-Core parallel linears in the "
                      "model's bf16 (self.bfloat16()); lora_layers.py LoRALinear.forward passes the base linear's "
                      "own input (TE's layernorm output) to the adapter, no cast or copy",
          etp_source="megatron/training/arguments.py and ModelParallelConfig.__post_init__: "
                     "expert_tensor_parallel_size defaults to tensor_model_parallel_size; --expert-tensor-parallel-"
                     "size 1 with TP > 1 is MoE parallel folding (Liu et al. 2025, arXiv 2504.14960)",
          # megatron/core/distributed/distributed_data_parallel.py: grad_dtype = torch.float if
          # ddp_config.grad_reduce_in_fp32 else param.dtype (the contiguous grad buffer)
          grads_in_reduce_dtype=True,
          # Megatron-Bridge recipes/common.py DistributedDataParallelConfig(overlap_grad_reduce=True,
          # overlap_param_gather=True); trainready's megatron recipe passes --overlap-param-gather with dp > 1
          param_gather_overlap=True,
          # Megatron-LM arguments.py --no-gradient-accumulation-fusion (on unless given; trainready's recipe leaves
          # it on), Megatron-Bridge's model providers fusions.can_enable_gradient_accumulation_fusion (on where
          # apex's fused_weight_gradient_mlp_cuda imports, as in NVIDIA's containers); extensions/
          # transformer_engine.py passes it to TE Linear, LayerNormLinear and GroupedLinear as
          # fuse_wgrad_accumulation; distributed_data_parallel.py's hook adds the other grads (main_grad.add_)
          wgrad_accumulates=True,
          cp_over_documents=True,  # THD with per-document zigzag CP chunks (Stack.cp_over_documents)
          inplace_cross_entropy=True,  # VocabParallelCrossEntropy: one fp32 copy, softmax and gradient in place
          # Megatron-LM docs/user-guide/features/cuda_graph.md and arguments.py (--cuda-graph-impl, --cuda-graph-scope
          # at core_v0.16.1): TE make_graphed_callables per layer, the whole layer by default, "not working for MoE
          # dynamic shapes": attn moe_router moe_preprocess there; TransformerConfig refuses full recompute with it
          cuda_graphs="--cuda-graph-impl transformer_engine (Transformer Engine's make_graphed_callables, per layer)",
          fp8_param_gather=("delayed", "tensorwise"), fp8_param_gather_strategy="zero1",
          fp8_param_gather_default=True,
          fp8_param_gather_source="Megatron-Bridge training/mixed_precision.py: bf16_with_fp8_delayed_scaling_mixed "
                                  "and bf16_with_fp8_current_scaling_mixed set fp8_param_gather = True, the subchannel "
                                  "(blockwise) recipe False; NeMo 2.0's bf16_with_fp8_mixed likewise; Megatron-LM "
                                  "validate_args: --fp8-param-gather needs the distributed optimizer, and with "
                                  "--optimizer-cpu-offload the delayed recipe. MXFP8 weights (bf16_with_mxfp8_mixed "
                                  "sets it too) are gathered in bf16 through the gradient buffer "
                                  "(param_and_grad_buffer.py, reuse_grad_buf_for_mxfp8_param_ag), so not counted"),
    Stack("automodel", kernels="fused", attention_kernel="flash2", reduce_dtype="bf16", selective=None,
          description="NVIDIA NeMo AutoModel: Hugging Face model classes with Liger's fused kernels (or its own "
                      "models with Transformer Engine's) under FSDP2, FlashAttention-2, bf16 parameters, adapters in "
                      "the model's dtype",
          source="NVIDIA-NeMo/Automodel @2013a4dd: components/distributed/config.py FSDP2Config MixedPrecisionPolicy "
                 "(param and reduce bf16); _transformers/kernel_patches.py: attn_implementation flash_attention_2 "
                 "when flash-attn is installed (it is in NVIDIA's containers; its kernels are FlashAttention-2's on "
                 "Hopper too), and _patch_liger_kernel (use_liger_kernel=True by default) swaps a Hugging Face "
                 "model's RMSNorm, SwiGLU MLP and RoPE for Liger's fused kernels (liger-kernel is in the dev group "
                 "that docker/Dockerfile installs with uv sync --all-groups); its own models take rms_norm/linear "
                 "'te'; activation checkpointing wraps whole layers",
          ep_source=_EP_ALLTOALL_ASSUMED + _AUTOMODEL_DISPATCH_SOURCE, alltoall_caveat=_AUTOMODEL_DISPATCH,
          expert_tp="whole-under-ep", lora_fp32_adapters=False, lora_dropout_position="post",
          fp8_param_gather=("tensorwise",), fp8_param_gather_strategy="zero3",
          fp8_param_gather_source="NeMo AutoModel docs/guides/fp8-training.mdx: FP8Config "
                                  "enable_fsdp_float8_all_gather (torchao's FSDP2 float8 all-gather), False by default",
          has_recipe=False,
          # _transformers/auto_model.py: from_pretrained/from_config torch_dtype "auto" -> the checkpoint's dtype,
          # bf16 for a config; FSDP2 casts nothing up, so torch.optim.AdamW keeps its states in bf16 too
          param_dtype="bf16",
          # components/distributed/parallelizer.py (dense: reshard_after_forward = False with PP) and
          # components/moe/config.py (reshard_after_forward: False); PP through torch.distributed.pipelining
          pp_gathers_stage=True, torch_pipelining=True,
          # components/moe/parallelizer.py apply_fsdp (79d0ccfd, 2025-10): "If FSDP is disabled for grouped experts
          # because the parameters are already fully sharded by PP and EP ... remove the parameters from FSDP"
          plain_unsharded_experts=True,
          # transformers integrations/flash_attention.py returns flash_attn_func's batch x seq x heads output, which
          # the attention module reshapes (a view) for o_proj; sdpa_attention_forward transposes and copies
          attention_copy=False,
          transformers_attention=True,  # Hugging Face model classes: their attn_implementation (flash or sdpa)
          lora_source="Automodel components/_peft/lora.py: adapter dtype = lora_dtype or the base weight's dtype "
                      "(bf16); lora_B(lora_A(x)) on the base linear's own x",
          etp_source="assumed as torchtitan (FSDP2 + EP, experts whole under EP): not read in Automodel's source"),
    Stack("llm-foundry-2023", kernels="eager", attention_kernel="flash1", reduce_dtype="bf16", selective=None,
          description="MosaicML llm-foundry / Composer as in its 2023 throughput tables (torch 1.13)",
          source="llm-foundry scripts/train/benchmarking/README.md (tables predate torch 2.0 and "
                 "FlashAttention-2: Triton/FlashAttention-1 attention); Composer FSDP mixed precision DEFAULT "
                 "reduces in bf16; activation_checkpointing wraps whole blocks (no selective mode)",
          ep_source=_EP_ALLTOALL_ASSUMED, expert_tp="tp", torch_sdpa=False,
          etp_source="no expert parallelism in these tables: experts assumed split like the dense MLP"),
)}
DEFAULT_STACK = "hf-trainer"
"""The stack of a job that names none: eager kernels, SDPA, fp32 reduction (the planner's
defaults before stacks existed)."""


def get_stack(name: str | None) -> Stack:
    """The preset `name` (None: the default), or a usage error naming the nearest ones."""
    if name is None:
        return STACKS[DEFAULT_STACK]
    found = STACKS.get(name.strip().lower())
    if found is None:
        raise UnknownNameError("stack", name, STACKS, hint="Use --stack NAME; see docs/planner.md (Stacks).")
    return found


def default_etp(stack: Stack, tp: int, ep: int) -> int:
    """The expert tensor-parallel size of a job that gives none, by the stack's convention (Stack.expert_tp)."""
    return 1 if stack.expert_tp == "whole-under-ep" and ep > 1 else tp


def checkpointing_kind(asked: str, stack: Stack) -> str:
    """The setup's checkpointing ("none", "selective-op", "selective-attn", "full") for what a
    job asks ("selective" is the stack's kind)."""
    if asked != "selective":
        return asked
    if stack.selective is None:
        raise UsageError(f"stack {stack.name} has no selective activation checkpointing "
                         f"({stack.description}); use --activation-checkpointing full, or name the kind: "
                         f"selective-op (torchtitan's op-level policy) or selective-attn (Megatron's "
                         f"attention recompute)")
    return "selective-op" if stack.selective == "op" else "selective-attn"


@dataclass(frozen=True, slots=True)
class Resolved:
    """A job's stack with its explicit flags applied."""

    stack: Stack
    kernels: str
    attention_kernel: str
    reduce_dtype: str
    overridden: tuple[str, ...]  # the flags that differ from the stack's values

    def describe(self, *, named: bool) -> str:
        """One line for outputs: which stack, whether it is the default, and its values."""
        s = self.stack
        head = f"stack {s.name}" + ("" if named else " (the default; --stack to change)")
        vals = (f"kernels {self.kernels}, attention {self.attention_kernel}, reduce {self.reduce_dtype}, "
                f"selective = {'op-level' if s.selective == 'op' else 'attention core' if s.selective else 'none'}")
        over = f" ({', '.join(self.overridden)} set explicitly)" if self.overridden else ""
        return f"{head}: {vals}{over}"


SDPA_CUDNN_TORCH = "2.11"
"""The first torch release whose SDPA picks cuDNN's attention on Hopper and Blackwell (module docstring)."""


def attention_assumption(r: Resolved, arch: str) -> str | None:
    """What the attention figure assumes of the torch release, where it matters: the stack's own "sdpa"
    through torch's SDPA on Hopper or Blackwell (None elsewhere)."""
    if r.attention_kernel != "sdpa" or not r.stack.torch_sdpa or arch not in ("hopper", "blackwell"):
        return None
    return (f"attention on Hopper/Blackwell: PyTorch SDPA with cuDNN's kernels, its choice from torch "
            f"{SDPA_CUDNN_TORCH}; torch 2.4-2.10 (2.5.0 aside) run FlashAttention-2 there, about half the attention "
            f"speed (pytorch/pytorch#142132): give --attention-kernel flash2 for those")


def tp_overlap_of(asked: bool | None, stack: Stack, tp: int) -> tuple[bool, str | None]:
    """(whether TP communication is overlapped, a note when the job asked for it and does not get it)."""
    if not asked:
        return False, None
    if tp == 1:
        return False, "--tp-overlap has no effect with --tp 1"
    if stack.tp_overlap is None:
        return False, (f"--tp-overlap ignored: stack {stack.name} has no tensor-parallel communication overlap; "
                       f"megatron (--tp-comm-overlap) and torchtitan (async TP) have it (--stack)")
    return True, None


def fp8_param_gather_problem(stack: Stack, *, precision: str, recipe: str, strategy: str, method: str,
                             offload: str) -> str | None:
    """Why the job cannot all-gather its linear weights in FP8 (Stack.fp8_param_gather); None: it can."""
    need = stack.fp8_param_gather_strategy
    if not stack.fp8_param_gather:
        return f"stack {stack.name} has no FP8 parameter all-gather"
    if precision != "fp8":
        return "it needs --precision fp8"
    if recipe not in stack.fp8_param_gather:
        return f"it gathers FP8 only under --fp8-recipe {' or '.join(stack.fp8_param_gather)}, not {recipe}"
    if method != "full":
        return "it applies to full training (frozen weights are not gathered)"
    if strategy != need:
        return f"it needs --strategy {need}, not {strategy}"
    if offload != "none" and stack.fp8_param_gather_strategy == "zero1" and recipe != "delayed":
        return "with --offload Megatron-LM allows it only under --fp8-recipe delayed"
    if offload != "none" and stack.fp8_param_gather_strategy != "zero1":
        return f"stack {stack.name}'s FP8 all-gather is not modelled with --offload (--offload none)"
    return None


def fp8_param_gather_of(asked: bool | None, stack: Stack, *, strict: bool = True, **job: str) -> bool:
    """Whether the job all-gathers its linear weights in FP8: the stack's default where it applies, off where it
    does not; asked for where it cannot apply, a usage error that names the rule and the stacks that have it
    (`strict`), or off (a searched strategy that cannot give it)."""
    if asked is False:
        return False
    problem = fp8_param_gather_problem(stack, **job)
    if problem is None:
        return bool(asked) or stack.fp8_param_gather_default
    if asked and strict:
        have = ", ".join(f"{s.name} (--strategy {s.fp8_param_gather_strategy}, --fp8-recipe "
                         f"{'/'.join(s.fp8_param_gather)})" for s in STACKS.values() if s.fp8_param_gather)
        raise UsageError(f"--fp8-gather: {problem}; stacks that have it: {have}; or --no-fp8-gather")
    return False


def _asked_and_modelled(asked: bool | None, stack: Stack, feature: str, refusal: Callable[[str], str]) -> bool:
    """Whether the job asked for the stack's `feature` (a Stack field naming how its framework does it): a usage
    error, `refusal` of the stacks that have it, where this stack's is not modelled (the field is None)."""
    if not asked:
        return False
    if getattr(stack, feature) is None:
        raise UsageError(refusal(", ".join(s.name for s in STACKS.values() if getattr(s, feature))))
    return True


def cuda_graphs_of(asked: bool | None, stack: Stack) -> bool:
    """Whether the layers run as CUDA graphs (Stack.cuda_graphs)."""
    return _asked_and_modelled(asked, stack, "cuda_graphs", lambda have: (
        f"--cuda-graphs: stack {stack.name}'s CUDA graphs are not modelled; stacks whose are: {have} (--stack), or "
        f"--no-cuda-graphs"))


def torch_compile_of(asked: bool | None, stack: Stack) -> bool:
    """Whether the model and its loss are compiled (Stack.torch_compile)."""
    return _asked_and_modelled(asked, stack, "torch_compile", lambda have: (
        f"--compile: stack {stack.name} has no torch.compile of the model with its loss ({stack.description}); "
        f"stacks that have it: {have} (--stack), or --no-compile"))


TITAN_EAGER_TPS, TITAN_COMPILED_TPS = 5762, 6667
"""torchtitan's own measurement of torch.compile on Llama 3.1 8B, FSDP on 8 of Meta's 500 W H100s (benchmarks/
llama3_h100_202412_torchtitan.md Table 1), tokens/s/GPU eager and compiled. Said, not applied: the planner's
eager class matches that table's eager rows, but treating compiled blocks as fused kernels overshoots its compiled
rows by about 25% (bench/plan_accuracy_2024.py, 2026-12-07), so what Inductor's fusion saves is not modelled."""
_TITAN_COMPILE_MEASURED = (f"torchtitan measured torch.compile {TITAN_COMPILED_TPS / TITAN_EAGER_TPS - 1:.0%} faster "
                           f"than eager (Llama 3.1 8B, FSDP on 8 of Meta's 500 W H100s: {TITAN_COMPILED_TPS:,} against "
                           f"{TITAN_EAGER_TPS:,} tokens/s/GPU, benchmarks/llama3_h100_202412_torchtitan.md)")


def compile_assumption(resolved: Resolved, compiled: bool) -> str | None:
    """What the speed figure assumes of torch.compile, where it matters: torchtitan's eager class is checked against
    its published runs, eager and compiled; any other stack keeps its kernel class (or the one --kernels names)
    whether compiled or not."""
    stack = resolved.stack
    if stack.name == "torchtitan":
        if compiled:
            return ("torch.compile (model and loss): the loss's memory as compiled; speed as the stack's eager kernel "
                    "class, checked against torchtitan's published runs (bench/plan_accuracy_2024.py): Inductor's "
                    f"fusion is not modelled, and {_TITAN_COMPILE_MEASURED}: a compiled run may beat this figure")
        return ("torchtitan's speed factors (its eager kernel class) are checked against its published runs, eager "
                f"and compiled (bench/plan_accuracy_2024.py); {_TITAN_COMPILE_MEASURED}: give --compile if you "
                "compile (it counts the compiled loss's memory; the speed figure stays)")
    if compiled:
        return (f"torch.compile (model and loss): the loss's memory as compiled; speed keeps the "
                f"{resolved.kernels} kernels (what compiling the blocks gains is not modelled)")
    return None


def optimizer_dtype_of(asked: str | None, stack: Stack, precision: str) -> str:
    """The master-weight and Adam dtype: the job's, else the stack's for bf16 jobs (pure bf16 has no FP8 or
    fp16 variant: their runs keep fp32 masters)."""
    if asked is not None:
        return asked
    return stack.param_dtype if precision == "bf16" else "fp32"


def stack_warnings(stack: Stack, *, fp8_recipe: str | None, token_drop: bool) -> list[str]:
    """What the job asks that the stack's framework cannot run: estimated as asked, said as a warning."""
    out = []
    if fp8_recipe and stack.fp8_recipes and fp8_recipe not in stack.fp8_recipes:
        out.append(f"stack {stack.name} has no {fp8_recipe} FP8 recipe ({', '.join(stack.fp8_recipes)}): "
                   f"estimated as asked")
    if token_drop and not stack.token_drop:
        out.append(f"stack {stack.name} routes dropless (no capacity factor): token-drop routing estimated as asked; "
                   f"Megatron runs it (--stack megatron)")
    return out


def resolve_stack(name: str | None, *, kernels: str | None = None, attention_kernel: str | None = None,
                  reduce_dtype: str | None = None) -> Resolved:
    """The stack `name` (None: the default) with explicit values taking precedence."""
    st = get_stack(name)
    chosen = {"kernels": kernels or st.kernels, "attention_kernel": attention_kernel or st.attention_kernel,
              "reduce_dtype": reduce_dtype or st.reduce_dtype}
    over = tuple(k for k, v in chosen.items() if v != getattr(st, k))
    return Resolved(st, chosen["kernels"], chosen["attention_kernel"], chosen["reduce_dtype"], over)
