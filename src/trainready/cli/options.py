"""Options shared by `estimate` and `plan`, and turning them (plus `--job`) into a JobSpec."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from trainready.errors import UsageError, printable
from trainready.plan.job import JobSpec, load_job
from trainready.plan.stacks import DEFAULT_STACK, STACKS, get_stack

JOB = "Job"
MODEL = "Model"
HW = "Hardware"
PAR = "Parallelism and batch"
MOE = "Mixture of experts"
NUM = "Numerics"
MEM = "Memory"
# flag pairs (--x/--no-x) in a panel of their own: the pair's second column would narrow every other option's help
COMPILE = "Compile, overlap and autocast"
COST = "Cost"
OUT = "Output"


class Strategy(str, Enum):
    ddp = "ddp"
    zero1 = "zero1"
    zero2 = "zero2"
    zero3 = "zero3"
    fsdp = "fsdp"


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"
    fp8 = "fp8"


class Ckpt(str, Enum):
    none = "none"
    selective = "selective"
    selective_op = "selective-op"
    selective_attn = "selective-attn"
    full = "full"


class Offload(str, Enum):
    none = "none"
    optimizer = "optimizer"
    optimizer_params = "optimizer+params"


def labelled(choices: type[Enum], label: str) -> Any:
    """The same choices under the class name `label`: with show_choices=False, `-h` shows LABEL in
    the type column (the help text lists the choices) so a long choice list does not squeeze
    the option's name at 80 columns."""
    return Enum(label, {m.name: m.value for m in choices}, type=str)  # type: ignore[misc]


CkptMode = labelled(Ckpt, "MODE")
OffloadMode = labelled(Offload, "STATES")
StrategyMode = labelled(Strategy, "STRATEGY")  # ddp|zero1|... squeezed --expert-load-imbalance at 80 columns


class Method(str, Enum):
    full = "full"
    lora = "lora"
    qlora = "qlora"


class Kernels(str, Enum):
    eager = "eager"
    fused = "fused"


class Fp8RecipeMode(str, Enum):
    tensorwise = "tensorwise"
    delayed = "delayed"
    blockwise = "blockwise"
    rowwise = "rowwise"
    mxfp8 = "mxfp8"


Fp8RecipeLabel = labelled(Fp8RecipeMode, "RECIPE")


class MoeRoutingMode(str, Enum):
    dropless = "dropless"
    capacity = "capacity"


class EpDispatcherMode(str, Enum):
    alltoall = "alltoall"
    deepep = "deepep"


EpDispatcherLabel = labelled(EpDispatcherMode, "NAME")
MoeRoutingLabel = labelled(MoeRoutingMode, "MODE")


class Attention(str, Enum):
    sdpa = "sdpa"
    flash2 = "flash2"
    flash1 = "flash1"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


def _number_text(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def number(example: str, *, lo: float = 0, lo_open: bool = True, hi: float | None = None,
           whole: bool = False, hi_open: bool = False) -> Callable[[Any], float | int | None]:
    """A parser for a numeric option: the text the user typed becomes a finite number in
    [lo, hi] (above lo when `lo_open`, below hi when `hi_open`), or a usage error that names that text as typed
    ("1e309 is not a finite number", not "inf"), the range and an example. `whole`: an integer
    (1e3 is 1000; 2.5 and true are refused)."""
    if whole and lo_open:  # "a whole number from 1", not "above 0"
        lo, lo_open = math.floor(lo) + 1, False
    if whole and hi_open and hi is not None:
        hi, hi_open = math.ceil(hi) - 1, False
    kind = "a whole number" if whole else "a number"
    top = "" if hi is None else f", {'below' if hi_open else 'at most'} {_number_text(hi)}"
    if lo_open or hi_open:
        want = f"{kind} {'above' if lo_open else 'of at least'} {_number_text(lo)}{top}"
    elif hi is None:
        want = f"{kind} of at least {_number_text(lo)}"
    else:
        want = f"{kind} from {_number_text(lo)} to {_number_text(hi)}"

    def parse(value: Any) -> float | int | None:
        if value is None:
            return None
        raw = printable(value if isinstance(value, str) else repr(value)).strip()
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise PydanticCustomError("number", f"'{raw}' is not a number; give {want}, e.g. {example}") from None
        if not math.isfinite(x):
            raise PydanticCustomError("number", f"{raw} is not a finite number; give {want}, e.g. {example}")
        if whole and not x.is_integer():
            raise PydanticCustomError("number", f"{raw} is not a whole number; give {want}, e.g. {example}")
        if x < lo or (lo_open and x == lo) or (hi is not None and (x > hi or (hi_open and x == hi))):
            raise PydanticCustomError("number", f"{raw} is not {want}, e.g. {example}")
        if whole:
            return int(value) if isinstance(value, str) and value.strip().lstrip("+-").isdigit() else int(x)
        return x

    return parse


def bounds_of(model: type[BaseModel], field: str) -> dict[str, Any]:
    """The numeric bounds pydantic enforces on `model.field`, as number()'s keywords."""
    info = model.model_fields[field]
    out: dict[str, Any] = {"lo": None, "lo_open": False, "hi": None, "hi_open": False}
    for rule in info.metadata:
        for name, key, is_open in (("gt", "lo", True), ("ge", "lo", False), ("lt", "hi", True), ("le", "hi", False)):
            if getattr(rule, name, None) is not None:
                out[key], out[f"{key}_open"] = getattr(rule, name), is_open
    types = {t for t in (typing.get_args(info.annotation) or (info.annotation,)) if t is not type(None)}
    out["whole"] = types == {int}
    if out["lo"] is None:
        raise TypeError(f"{model.__name__}.{field} has no lower bound: give number() its own")
    return out


def number_for(model: type[BaseModel], field: str, example: str) -> Callable[[Any], float | int | None]:
    """number() with the bounds of `model.field`: one bound per option, the model's, so the CLI never accepts what
    the job file or the request then refuses, nor refuses what they take (--memory-margin was capped at 0.5 here
    and at 0.9 by PlanRequest)."""
    return number(example, **bounds_of(model, field))


JobPath = Annotated[Optional[Path], typer.Option("--job", help="Job spec written by `plan --save` or `estimate --save`; options given here override it.", rich_help_panel=JOB)]
Save = Annotated[Optional[Path], typer.Option("--save", help="Write the chosen setup as a job spec (TOML) for later commands.", rich_help_panel=JOB)]
CatalogFile = Annotated[Optional[Path], typer.Option("--catalog", help="Merge your own catalog file (negotiated prices, on-prem nodes).", rich_help_panel=JOB)]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output (schema in docs/).", rich_help_panel=OUT)]

ModelName = Annotated[Optional[str], typer.Option("--model", "-m", help="Model preset, e.g. llama-2-13b (`trainready catalog models`).", rich_help_panel=MODEL)]
ModelConfig = Annotated[Optional[Path], typer.Option("--model-config", help="Hugging Face config.json, read offline.", rich_help_panel=MODEL)]
Params = Annotated[Optional[float], typer.Option("--params", parser=number_for(JobSpec, "params", "13e9"), help="Generic dense decoder of this many parameters, e.g. 13e9.", rich_help_panel=MODEL)]
MethodOpt = Annotated[Optional[Method], typer.Option("--method", help="Full fine-tuning/pre-training, LoRA or QLoRA.", rich_help_panel=MODEL)]
LoraRank = Annotated[Optional[int], typer.Option("--lora-rank", parser=number_for(JobSpec, "lora_rank", "16"), help="LoRA rank. [default: 16]", rich_help_panel=MODEL)]
LoraTargets = Annotated[Optional[str], typer.Option("--lora-targets", metavar="NAMES", help="The linear layers LoRA adapts, comma-separated: q, k, v, o, gate, up, down (latent attention: q_a, q_b, kv_a, kv_b), Hugging Face PEFT names (q_proj, v_proj, ...), Megatron names (linear_qkv, linear_proj, linear_fc1, linear_fc2) or attention, mlp, all-linear. [default: all-linear]", rich_help_panel=MODEL)]
LoraDropout = Annotated[Optional[float], typer.Option("--lora-dropout", metavar="P", parser=number_for(JobSpec, "lora_dropout", "0.05"), help="LoRA dropout probability (PEFT's lora_dropout), on each adapter's input (PEFT, Megatron-Bridge) or output (automodel stack). [default: 0]", rich_help_panel=MODEL)]
AutocastOpt = Annotated[Optional[bool], typer.Option("--autocast/--no-autocast", help="LoRA/QLoRA: the forward runs under torch.autocast (the Trainer's bf16=True): PEFT's fp32 adapters then save a bf16 cast of their input and matmul in bf16, QLoRA's 4-bit layers copy nothing; --no-autocast: your own loop on a bf16 model without it (fp32 copies and matmuls). Not on rows DeepSpeed runs (trainready's LoRA recipe), whose engine runs none. [default: the stack's: hf-trainer on, deepspeed off]", rich_help_panel=COMPILE)]
Tokens = Annotated[Optional[float], typer.Option("--tokens", parser=number_for(JobSpec, "tokens", "2e9"), help="Training tokens, e.g. 2e9.", rich_help_panel=MODEL)]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", parser=number_for(JobSpec, "seq_len", "4096"), help="Sequence length. [default: the model's context, at most 4096]", rich_help_panel=PAR)]
DocLen = Annotated[Optional[int], typer.Option("--doc-len", metavar="TOKENS", parser=number_for(JobSpec, "doc_len", "1024"), help="Packed sequences whose attention is masked to each document (FlashAttention varlen, FlexAttention block-causal, TE THD): the documents' mean length. Attention's FLOPs and kernel follow it; all else the sequence. [default: attention spans the whole sequence]", rich_help_panel=PAR)]
GlobalBatch = Annotated[Optional[int], typer.Option("--global-batch", parser=number_for(JobSpec, "global_batch", "256"), help="Sequences per optimizer step. [default: ~1M tokens]", rich_help_panel=PAR)]
PrecisionOpt = Annotated[Optional[Precision], typer.Option("--precision", help="Compute precision. [default: bf16, fp16 on V100]", rich_help_panel=NUM)]
OptimDType = Annotated[Optional[DType], typer.Option("--optimizer-dtype", help="fp32: fp32 master weights and Adam states (mixed precision); bf16: pure bf16 training. [default: fp32; the automodel stack: bf16 for a bf16 job]", rich_help_panel=NUM)]
ReduceDType = Annotated[Optional[DType], typer.Option("--reduce-dtype", help="Gradient reduction dtype. [default: the stack's]", rich_help_panel=NUM)]
KernelsOpt = Annotated[Optional[Kernels], typer.Option("--kernels", help="eager: plain PyTorch modules (Hugging Face style); fused: fused norm/activation kernels (Megatron, torch.compile). [default: the stack's]", rich_help_panel=NUM)]
AttentionOpt = Annotated[Optional[Attention], typer.Option("--attention-kernel", help="Attention kernel generation. [default: the stack's]", rich_help_panel=NUM)]
StackOpt = Annotated[Optional[str], typer.Option("--stack", metavar="NAME", help=f"Training stack whose defaults set kernels, attention kernel, reduce dtype and what selective recompute means: {', '.join(STACKS)}. Explicit flags win. [default: {DEFAULT_STACK}]", rich_help_panel=NUM)]
TpOverlap = Annotated[Optional[bool], typer.Option("--tp-overlap/--no-tp-overlap", help="Tensor-parallel communication pipelined with the GEMMs (Megatron's --tp-comm-overlap, torchtitan's async TP): a quarter of it stays exposed; --no-tp-overlap overrides a --job file. [default: off, as in both frameworks]", rich_help_panel=COMPILE)]
CudaGraphs = Annotated[Optional[bool], typer.Option("--cuda-graphs/--no-cuda-graphs", help="Each layer captured in CUDA graphs as the stack's framework does it (Megatron's --cuda-graph-impl transformer_engine; stack megatron): no host launch floor for layers captured whole (dense, MoE padded to capacity); a dropless MoE layer, graphed in part, keeps it; the graphs' static buffers are not counted in memory. --no-cuda-graphs overrides a --job file. [default: off]", rich_help_panel=COMPILE)]
TorchCompile = Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="The model and its loss compiled with torch.compile as the stack's framework does it (torchtitan --compile.enable, the Trainer's --torch_compile): the cross-entropy fused, its fp32 buffers never held. Memory only; speed follows the stack's kernels. --no-compile overrides a --job file. [default: off]", rich_help_panel=COMPILE)]
PowerLimit = Annotated[Optional[float], typer.Option("--power-limit", metavar="WATTS", parser=number_for(JobSpec, "power_limit_w", "500"), help="The GPUs' power limit where it is below their rated board power (nvidia-smi -q: Current Power Limit; `check` flags it): GEMMs and attention slow by the published pair of the same chip at two powers (H100 NVL/SXM, B100/B200); memory and links keep their speed. Hopper and Blackwell only. [default: the rated power]", rich_help_panel=HW)]
Fp8ParamGather = Annotated[Optional[bool], typer.Option("--fp8-gather/--no-fp8-gather", help="With --precision fp8, linear weights kept in FP8 and all-gathered in FP8 over data parallelism, half of bf16's bytes: Megatron's fp8_param_gather with --strategy zero1 (delayed, tensorwise; MXFP8 weights travel in bf16), torchao's FSDP2 float8 all-gather with --stack torchtitan or automodel, --strategy zero3 (tensorwise). [default: the stack's recipe: megatron on where it applies, as Megatron-Bridge's FP8 recipes; torchtitan and automodel off]", rich_help_panel=COMPILE)]
Fp8RecipeOpt = Annotated[Optional[Fp8RecipeLabel], typer.Option("--fp8-recipe", show_choices=False, help="FP8 scaling with --precision fp8: tensorwise (current scaling), delayed, blockwise, rowwise (torchao) or mxfp8 (Blackwell). [default: the stack's: megatron delayed, else tensorwise]", rich_help_panel=NUM)]
MoeRouting = Annotated[Optional[MoeRoutingLabel], typer.Option("--moe-routing", show_choices=False, help="dropless (the busiest rank sets the pace) or capacity (token-drop, expert buffers padded to --capacity-factor x the mean). [default: the model's config, dropless unless it names a capacity factor]", rich_help_panel=MOE)]
CapacityFactor = Annotated[Optional[float], typer.Option("--capacity-factor", parser=number_for(JobSpec, "capacity_factor", "1.25"), help="Capacity factor for --moe-routing capacity, 1 to 64. [default: the model's, else 1.0]", rich_help_panel=MOE)]
LoadImbalance = Annotated[Optional[float], typer.Option("--expert-load-imbalance", parser=number_for(JobSpec, "expert_load_imbalance", "1.0"), help="Routed tokens on the busiest expert-parallel rank over the mean; 1.0 for forced-balance benchmarks. [default: 1.15, an assumption]", rich_help_panel=PAR)]
EpDispatcher = Annotated[Optional[EpDispatcherLabel], typer.Option("--ep-dispatcher", show_choices=False, help="With --ep 2+, how tokens reach their experts: alltoall (a collective all-to-all, a row per routed expert) or deepep (DeepEP/HybridEP: a token sent once per GPU and once per node; launched by --framework megatron; needs NVSwitch and, across nodes, InfiniBand). [default: the stack's, alltoall; plan tries deepep on megatron where it runs]", rich_help_panel=MOE)]
EpOverlap = Annotated[Optional[bool], typer.Option("--ep-overlap/--no-ep-overlap", help="All-to-alls run beside another micro-batch's compute (Megatron-Core's EP overlap, DeepSeek's DualPipe). On megatron: virtual stages with --pp 2+, no full recompute, no moe among --recompute-modules. With --ep 1 it changes nothing. [default: the stack's, off; plan tries it on megatron]", rich_help_panel=MOE)]
Fp8Dispatch = Annotated[Optional[bool], typer.Option("--fp8-dispatch/--no-fp8-dispatch", help="With --precision fp8, tokens dispatched in FP8, combined in BF16 (DeepSeek-V3). [default: the stack's, off]", rich_help_panel=MOE)]
Spot = Annotated[Optional[bool], typer.Option("--spot/--on-demand", help="Price on spot (with expected interruption rework) or on-demand.", rich_help_panel=COST)]
Region = Annotated[Optional[str], typer.Option("--region", help="Price region. [default: the catalog's]", rich_help_panel=COST)]
UsdPerHour = Annotated[Optional[float], typer.Option("--usd-per-hour", parser=number_for(JobSpec, "usd_per_hour", "32.77"), help="Your price per node-hour (overrides the catalog).", rich_help_panel=COST)]
SpotMtbf = Annotated[Optional[float], typer.Option("--spot-mtbf-hours", parser=number("24"), help="Mean hours between spot interruptions per node. [default: 24, an assumption]", rich_help_panel=COST)]
CAL = "Calibration"
Calibrate = Annotated[Optional[list[Path]], typer.Option("--calibrate", metavar="RUN_DIR|BUNDLE_DIR", help="Fit the efficiency factors to a run directory (`trainready run`) or a `check --deep` bundle, save them as a named calibration and use them; repeat to combine (docs/planner.md, Calibration).", rich_help_panel=CAL)]
CalibrationRef = Annotated[Optional[str], typer.Option("--calibration", metavar="NAME|FILE", help="Use a stored calibration (or a calibration file); with --calibrate: the name to save it under. [default with --calibrate: GPU-stack]", rich_help_panel=CAL)]


def module_list(text: str | None) -> list[str] | None:
    """`--recompute-modules mla_up_proj,mlp` or `--lora-targets q_proj,v_proj` (commas or spaces) as a list; None
    when not given."""
    if text is None:
        return None
    return [w for w in text.replace(",", " ").split() if w]


def _gpu_of(fields: dict[str, Any]) -> str | None:
    """The shipped catalog's GPU of a job's `gpu` or `instance` (None: neither, or a name it does not know)."""
    from trainready.catalog import load_catalog
    from trainready.errors import UnknownNameError

    catalog = load_catalog()
    try:
        if fields.get("gpu"):
            return catalog.gpu(fields["gpu"]).name
        if fields.get("instance"):
            return catalog.gpu_of(catalog.instance(fields["instance"])).name
    except UnknownNameError:
        return None
    return None


def build_job(job_path: Path | None, **opts: Any) -> JobSpec:
    """A JobSpec from `--job` (if any) with the options the user gave on top."""
    base: dict[str, Any] = {}
    if job_path is not None:
        base = load_job(job_path).model_dump(exclude_none=True)
    given = {k: (v.value if isinstance(v, Enum) else v) for k, v in opts.items() if v is not None}
    if isinstance(given.get("model_config_path"), Path):
        given["model_config_path"] = str(given["model_config_path"])
    if any(k in given for k in ("model", "model_config_path", "params")):
        for k in ("model", "model_config_path", "params", "model_spec", "moe_routing", "capacity_factor"):
            base.pop(k, None)
    if "moe_routing" in given:  # the file's capacity factor belonged to the file's routing
        base.pop("capacity_factor", None)
    if given.get("precision") not in (None, "fp8"):  # a recipe only means something under fp8
        base.pop("fp8_recipe", None)
        base.pop("fp8_param_gather", None)
    # the file's FP8 gather belonged to its strategy, recipe, method and offload: restating one differently drops it
    if "fp8_param_gather" not in given and any(
            k in given and given[k] != base.get(k) for k in ("strategy", "fp8_recipe", "method", "offload")):
        base.pop("fp8_param_gather", None)
    # the file's power limit was in its GPU's watts: an instance or GPU named here keeps it only on the same GPU
    if "power_limit_w" not in given and "power_limit_w" in base and ("instance" in given or "gpu" in given):
        named = _gpu_of(given)
        if named is None or named != _gpu_of(base):
            base.pop("power_limit_w", None)
    if "instance" in given:
        base.pop("gpu", None)
    if "gpu" in given:
        base.pop("instance", None)
    if "stack" in given:  # a stack named here replaces the file's stack-controlled choices (restated: kept)
        get_stack(given["stack"])  # unknown: exit 2 with the nearest names
        if given["stack"] != base.get("stack"):
            for k in ("kernels", "attention_kernel", "reduce_dtype", "ep_dispatcher", "ep_overlap", "fp8_dispatch",
                      "fp8_param_gather"):
                base.pop(k, None)
    # the file's local batch belonged to its pipeline and stack: a different --pp or --stack here drops it
    if any(k in given and given[k] != base.get(k) for k in ("pp", "stack")) and "pp_local_batch" not in given:
        base.pop("pp_local_batch", None)
    # the file's LoRA targets and dropout mean nothing for full training: --method full here drops them
    if given.get("method") == "full":
        base.pop("lora_targets", None)
        base.pop("lora_dropout", None)
        base.pop("autocast", None)
    # the file's module list belonged to the file's stack and checkpointing: kept where those are restated unchanged
    if any(k in given and given[k] != base.get(k) for k in ("stack", "activation_checkpointing")):
        base.pop("recompute_modules", None)
    try:
        return JobSpec.model_validate({**base, **given})
    except ValidationError as exc:
        msgs = []
        for e in exc.errors():
            field = ".".join(str(p) for p in e["loc"])
            value = repr(e.get("input"))
            value = value if len(value) <= 80 else value[:77] + "..."  # a 2,000-name list is not repeated back
            msgs.append(f"--{field.replace('_', '-')} {value}: {e['msg']}")
        raise UsageError("; ".join(msgs)) from None
