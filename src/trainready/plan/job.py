"""The job spec: what a user wants to train, where and how. Written once (`plan --save`,
`estimate --save`) and read by later commands (`--job job.toml`).

File format (TOML, versioned): every field of `JobSpec` at top level, plus a `[model]`
table with the resolved shape, so the file is self-contained. See docs/job-spec.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainready.catalog.loader import read_toml
from trainready.catalog.textfile import read_user_text
from trainready.errors import UsageError, printable, pydantic_message
from trainready.limits import MAX_USD_PER_HOUR

from .model_spec import ModelSpec

JOB_SCHEMA_VERSION = 1
# Far beyond any real run, so a typo (an extra 0s, a float) is an error and not a silly answer.
MAX_GPUS = 1 << 20
MAX_BATCH = 1 << 24  # sequences
MAX_SEQ_LEN = 1 << 24  # tokens

Strategy = Literal["ddp", "zero1", "zero2", "zero3", "fsdp"]
Precision = Literal["bf16", "fp16", "fp32", "fp8"]
Checkpointing = Literal["none", "selective", "selective-op", "selective-attn", "full"]  # selective: the stack's kind
Offload = Literal["none", "optimizer", "optimizer+params"]
Method = Literal["full", "lora", "qlora"]


class JobSpec(BaseModel):
    """A training job. Unset (None) fields are chosen by `plan` or defaulted by `estimate`."""

    # strict: `gpus = true` or `tp = "2"` in a job file is an error, not 1 or 2
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    model: str | None = Field(None, description="preset name (see `trainready catalog models`)")
    model_config_path: str | None = Field(None, description="Hugging Face config.json read offline")
    params: float | None = Field(None, gt=0, description="generic dense decoder of this many parameters")
    model_spec: ModelSpec | None = Field(None, description="resolved shape (written by --save)")
    method: Method = "full"
    lora_rank: int = Field(16, gt=0, le=65536)
    lora_targets: list[str] | None = Field(None, max_length=64, description="LoRA/QLoRA: the linear layers adapted, "
                                           "by the planner's names (q, k, v, o, gate, up, down; latent attention "
                                           "q_a, q_b, kv_a, kv_b), Hugging Face PEFT's (q_proj, ...), Megatron's "
                                           "(linear_qkv, linear_proj, linear_fc1, linear_fc2) or a group "
                                           "(attention, mlp, all-linear) (plan/lora_targets.py); None: every "
                                           "linear layer")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA/QLoRA: the adapters' dropout probability "
                                "(PEFT's lora_dropout, Megatron-Bridge's and AutoModel's dropout), on each adapter's "
                                "input or output as the stack puts it (Stack.lora_dropout_position); 0: none")
    autocast: bool | None = Field(None, description="LoRA/QLoRA: the forward runs under torch.autocast (the Trainer's "
                                  "bf16=True), so PEFT's fp32 adapters save the bf16 cast of their input copy and "
                                  "matmul in bf16 (QLoRA's 4-bit layers copy nothing); False: a loop without autocast "
                                  "(fp32 copies and matmuls); None: the stack's (hf-trainer: on; DeepSpeed: off)")
    instance: str | None = None
    gpu: str | None = None
    gpus: int | None = Field(None, gt=0, le=MAX_GPUS, description="total GPUs")
    gpus_per_node: int | None = Field(None, gt=0, le=1024)
    inter_node_gbps: float | None = Field(None, gt=0)
    strategy: Strategy = "fsdp"
    tp: int = Field(1, gt=0, le=1024)
    pp: int = Field(1, gt=0, le=1024)
    ep: int = Field(1, gt=0, le=1024, description="expert-parallel size (mixture-of-experts models): EP x etp "
                                                  "divides the tp x dp GPUs of a pipeline stage (Megatron's "
                                                  "expert grid; EP may span TP ranks: MoE parallel folding)")
    etp: int | None = Field(None, gt=0, le=1024, description="expert tensor-parallel size (MoE): each routed expert "
                                                            "split etp ways; None: the stack's convention "
                                                            "(stacks.default_etp: tp, or 1 when ep > 1)")
    cp: int = Field(1, gt=0, le=1024, description="context-parallel size: each sequence split over cp GPUs "
                                                  "(ring attention: Megatron's --context-parallel-size, "
                                                  "torchtitan's context_parallel_degree)")
    pp_virtual: int | None = Field(None, gt=0, le=128, description="interleaved (virtual) pipeline stages per "
                                                                  "rank (Megatron's interleaved 1F1B, torchtitan's "
                                                                  "Interleaved1F1B); None: 1, plain 1F1B")
    pp_local_batch: int | None = Field(None, gt=0, le=MAX_BATCH, description="with pipeline stages on "
                                       "torch.distributed.pipelining (torchtitan, automodel stacks): sequences per "
                                       "data-parallel rank in one call of the pipeline schedule (their "
                                       "local_batch_size); a step makes global / (dp x this) calls, each with its "
                                       "own fill and drain; None: the step's whole share in one call")
    micro_batch: int | None = Field(None, gt=0, le=MAX_BATCH, description="sequences per GPU per forward")
    global_batch: int | None = Field(None, gt=0, le=MAX_BATCH, description="sequences per optimizer step")
    seq_len: int | None = Field(None, gt=0, le=MAX_SEQ_LEN)
    doc_len: int | None = Field(None, gt=0, le=MAX_SEQ_LEN, description="packed sequences: the mean length of the "
                                "documents packed into each sequence, with attention masked to each document "
                                "(FlashAttention varlen, FlexAttention's block-causal mask, Transformer Engine's "
                                "THD); attention's FLOPs and kernel length follow it, every other cost the "
                                "sequence; None: attention spans the whole sequence")
    precision: Precision | None = None
    optimizer_dtype: Literal["fp32", "bf16"] | None = Field(None, description="master weights and Adam states: "
                                                                        "fp32, or bf16 (pure bf16); None: the "
                                                                        "stack's (fp32 but for automodel's bf16)")
    reduce_dtype: Literal["fp32", "bf16"] | None = Field(None, description="None: the stack's")
    gather_dtype: Literal["bf16", "fp32"] = "bf16"
    activation_checkpointing: Checkpointing = "none"
    recompute_modules: list[str] | None = Field(
        None, description="Megatron's --recompute-modules with activation_checkpointing selective "
                                         "(stack megatron; plan/recompute.py: core_attn, mla_up_proj, layernorm, "
                                         "mlp, moe_act, shared_experts, moe); None: core_attn, Megatron's default")
    offload: Offload = "none"
    kernels: Literal["eager", "fused"] | None = Field(None, description="None: the stack's")
    attention_kernel: Literal["sdpa", "flash2", "flash1"] | None = Field(None, description="None: the stack's")
    stack: str | None = Field(None, description="training stack preset (plan/stacks.py); None: the default, "
                                                "hf-trainer. Explicit kernels/attention_kernel/reduce_dtype win")
    framework: Literal["auto", "torchtitan", "deepspeed", "megatron", "hf-tp"] | None = Field(
        None, description="the framework that runs the job (plan/recipes; `plan --framework X --save` writes it, "
                          "`plan --job` plans on it): its memory is that framework's (DeepSpeed's ZeRO states for "
                          "deepspeed); None or auto: the first that runs it, as plan's --framework auto")
    expert_load_imbalance: float | None = Field(
        None, ge=1.0, le=64.0, description="MoE: routed tokens on the busiest expert-parallel rank over the mean; "
                                           "None: 1.15 assumed (dropless routing with a trained router); 1.0: "
                                           "balanced, as forced-balance benchmarks route")
    expert_routing: Literal["random", "contiguous"] | None = Field(
        None, description="MoE: how a token's experts spread over the expert-parallel ranks: random (a trained "
                          "router, or Megatron's forced balance, which draws random logits) or contiguous (token t "
                          "to experts t*k..t*k+k-1: NeMo Automodel's fake_balanced_gate); None: random")
    ep_dispatcher: Literal["alltoall", "deepep"] | None = Field(
        None, description="MoE token dispatch: alltoall (a row per routed expert) or deepep (DeepEP/HybridEP: once "
                          "per GPU and per node); None: the stack's")
    ep_overlap: bool | None = Field(None, description="MoE all-to-alls hidden behind another micro-batch's compute "
                                                      "(DualPipe, 1F1B A2A overlap); None: the stack's")
    cuda_graphs: bool | None = Field(None, description="the stack's per-layer CUDA graphs (Megatron's --cuda-graph-impl "
                                     "transformer_engine): the host launches a graph per captured layer and pass, not "
                                     "its kernels, so the per-block launch floor goes for what is captured; None: off")
    tp_overlap: bool | None = Field(None, description="tensor-parallel communication overlapped with the GEMMs (Megatron's "
                                                 "--tp-comm-overlap, torchtitan's async TP) where the stack has it; "
                                                 "None: off, as in both frameworks")
    torch_compile: bool | None = Field(None, description="the model and its loss compiled with torch.compile as the "
                                                         "stack's framework applies it (torchtitan --compile.enable, "
                                                         "the Trainer's --torch_compile): the cross-entropy fused, "
                                                         "its fp32 buffers never materialized (plan/activations.py); "
                                                         "speed as the stack's kernels; None: off")
    fp8_recipe: Literal["tensorwise", "delayed", "blockwise", "rowwise", "mxfp8"] | None = Field(
        None, description="FP8 scaling recipe with precision fp8 (plan/efficiency.py FP8_RECIPES); None: the "
                          "stack's (megatron: delayed, Megatron-Core's default; others: tensorwise)")
    fp8_param_gather: bool | None = Field(None, description="with precision fp8, linear weights kept in FP8 and "
                                          "all-gathered in FP8 over data parallelism (Megatron's --fp8-param-gather "
                                          "with the distributed optimizer, delayed or tensorwise; torchao's FSDP2 "
                                          "float8 all-gather under tensorwise scaling); None: the stack's recipe "
                                          "(megatron: on where it applies, as Megatron-Bridge's FP8 recipes; "
                                          "torchtitan, automodel: off)")
    power_limit_w: float | None = Field(None, gt=0, le=10000, description="the GPUs' power limit, W, where it is "
                                        "below their rated board power (nvidia-smi -q: Current Power Limit): their "
                                        "GEMMs and attention slow as efficiency.power_scale says (Hopper and "
                                        "Blackwell, down to the lower part of a published pair); None: rated power")
    memory_margin: float | None = Field(None, ge=0, le=0.5, description="fraction of GPU memory the fit rule keeps "
                                                                       "free (plan/fit.py); None: 0.10")
    moe_routing: Literal["dropless", "capacity"] | None = Field(
        None, description="MoE: dropless (every token reaches its k experts; the busiest rank sets the pace) or "
                          "capacity (token-drop: each expert's buffer padded to capacity_factor x its mean share, "
                          "Megatron's --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity); "
                          "None: the model's config (dropless unless it names a capacity factor)")
    capacity_factor: float | None = Field(None, ge=1.0, le=64, description="MoE capacity factor with moe_routing "
                                                                           "capacity, 1 to 64 (below 1 drops tokens "
                                                                           "even when balanced); None: the model's, "
                                                                           "else 1.0")
    fp8_dispatch: bool | None = Field(None, description="with precision fp8, dispatch in FP8 (combine stays BF16); "
                                                        "None: the stack's")
    tokens: float | None = Field(None, gt=0, description="training tokens")
    spot: bool = False
    region: str | None = None
    usd_per_hour: float | None = Field(None, gt=0, le=MAX_USD_PER_HOUR,
                                       description="price per node-hour, overrides the catalog")
    keep_hot: int = Field(2, ge=1, le=1000, description="checkpoints kept on the hot tier")


def save_job(job: JobSpec, path: str | Path) -> None:
    data: dict[str, Any] = {"schema_version": JOB_SCHEMA_VERSION, "kind": "trainready-job"}
    body = job.model_dump(exclude_none=True, exclude={"model_spec"})
    data.update(body)
    if job.model_spec is not None:
        data["model_spec"] = job.model_spec.model_dump(exclude_none=True, exclude_defaults=False)
    try:
        Path(path).write_text(tomli_w.dumps(data))
    except OSError as exc:
        raise UsageError(f"cannot write job file {printable(path)}: {exc.strerror or exc}") from None


def load_job(path: str | Path, *, regular_only: bool = False) -> JobSpec:
    """The job spec at `path`; `regular_only` when a file named it (a run.json's job), not the user."""
    p = Path(path)
    data = read_toml(read_user_text(p, "job file", regular_only=regular_only), printable(p))
    p = printable(p)  # named in the messages below
    expected = f"schema_version = {JOB_SCHEMA_VERSION}; `plan --save` and `estimate --save` write job files"
    if not data:
        raise UsageError(f"job file {p} is empty: a job spec starts with {expected}")
    if "schema_version" not in data:
        raise UsageError(f"job file {p} has no schema_version: a job spec starts with {expected}")
    version = data.pop("schema_version")
    if version != JOB_SCHEMA_VERSION:
        raise UsageError(f"job file {p}: schema_version {version!r} is not supported; this trainready reads "
                         f"schema_version = {JOB_SCHEMA_VERSION}")
    kind = data.pop("kind", "trainready-job")
    if kind != "trainready-job":
        raise UsageError(f"job file {p}: kind {kind!r} is not a job spec (expected kind = \"trainready-job\")")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        msgs = [f"{p}: field '{'.'.join(str(x) for x in e['loc'])}': {pydantic_message(e['msg'])}" for e in exc.errors()]
        raise UsageError("\n".join(msgs)) from None
