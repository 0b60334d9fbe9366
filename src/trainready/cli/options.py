"""Options shared by `estimate` and `plan`, and turning them (plus `--job`) into a JobSpec."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError

from trainready.errors import UsageError
from trainready.plan.job import JobSpec, load_job

JOB = "Job"
MODEL = "Model"
HW = "Hardware"
PAR = "Parallelism and batch"
NUM = "Numerics and memory"
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
    full = "full"


class Offload(str, Enum):
    none = "none"
    optimizer = "optimizer"
    optimizer_params = "optimizer+params"


class Method(str, Enum):
    full = "full"
    lora = "lora"
    qlora = "qlora"


class Kernels(str, Enum):
    eager = "eager"
    fused = "fused"


class Attention(str, Enum):
    sdpa = "sdpa"
    flash2 = "flash2"
    flash1 = "flash1"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


def positive(example: str) -> Callable[[Any], float | None]:
    """A callback for a float option: a finite number above 0 or a usage error naming it
    (Click's FLOAT accepts inf and nan, which would end in an internal error further on)."""

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise typer.BadParameter(f"{value:g} is not a finite number above 0, e.g. {example}")
        return value

    return check


JobPath = Annotated[Optional[Path], typer.Option("--job", help="Job spec written by `plan --save` or `estimate --save`; options given here override it.", rich_help_panel=JOB)]
Save = Annotated[Optional[Path], typer.Option("--save", help="Write the chosen setup as a job spec (TOML) for later commands.", rich_help_panel=JOB)]
CatalogFile = Annotated[Optional[Path], typer.Option("--catalog", help="Merge your own catalog file (negotiated prices, on-prem nodes).", rich_help_panel=JOB)]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output (schema in docs/).", rich_help_panel=OUT)]

ModelName = Annotated[Optional[str], typer.Option("--model", "-m", help="Model preset, e.g. llama-2-13b (`trainready catalog models`).", rich_help_panel=MODEL)]
ModelConfig = Annotated[Optional[Path], typer.Option("--model-config", help="Hugging Face config.json, read offline.", rich_help_panel=MODEL)]
Params = Annotated[Optional[float], typer.Option("--params", callback=positive("13e9"), help="Generic dense decoder of this many parameters, e.g. 13e9.", rich_help_panel=MODEL)]
MethodOpt = Annotated[Optional[Method], typer.Option("--method", help="Full fine-tuning/pre-training, LoRA or QLoRA.", rich_help_panel=MODEL)]
LoraRank = Annotated[Optional[int], typer.Option("--lora-rank", help="LoRA rank (adapters on every linear layer). [default: 16]", rich_help_panel=MODEL)]
Tokens = Annotated[Optional[float], typer.Option("--tokens", callback=positive("2e9"), help="Training tokens, e.g. 2e9.", rich_help_panel=MODEL)]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length. [default: the model's context, at most 4096]", rich_help_panel=PAR)]
GlobalBatch = Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per optimizer step. [default: ~1M tokens]", rich_help_panel=PAR)]
PrecisionOpt = Annotated[Optional[Precision], typer.Option("--precision", help="Compute precision. [default: bf16, fp16 on V100]", rich_help_panel=NUM)]
OptimDType = Annotated[Optional[DType], typer.Option("--optimizer-dtype", help="fp32: fp32 master weights and Adam states (mixed precision); bf16: pure bf16 training. [default: fp32]", rich_help_panel=NUM)]
ReduceDType = Annotated[Optional[DType], typer.Option("--reduce-dtype", help="Gradient reduction dtype. [default: fp32]", rich_help_panel=NUM)]
KernelsOpt = Annotated[Optional[Kernels], typer.Option("--kernels", help="eager: plain PyTorch modules (Hugging Face style); fused: fused norm/activation kernels (Megatron, torch.compile). [default: eager]", rich_help_panel=NUM)]
AttentionOpt = Annotated[Optional[Attention], typer.Option("--attention-kernel", help="Attention kernel generation. [default: sdpa]", rich_help_panel=NUM)]
Spot = Annotated[Optional[bool], typer.Option("--spot/--on-demand", help="Price on spot (with expected interruption rework) or on-demand.", rich_help_panel=COST)]
Region = Annotated[Optional[str], typer.Option("--region", help="Price region. [default: the catalog's]", rich_help_panel=COST)]
UsdPerHour = Annotated[Optional[float], typer.Option("--usd-per-hour", callback=positive("32.77"), help="Your price per node-hour (overrides the catalog).", rich_help_panel=COST)]
SpotMtbf = Annotated[Optional[float], typer.Option("--spot-mtbf-hours", callback=positive("24"), help="Mean hours between spot interruptions per node. [default: 24, an assumption]", rich_help_panel=COST)]


def build_job(job_path: Path | None, **opts: Any) -> JobSpec:
    """A JobSpec from `--job` (if any) with the options the user gave on top."""
    base: dict[str, Any] = {}
    if job_path is not None:
        base = load_job(job_path).model_dump(exclude_none=True)
    given = {k: (v.value if isinstance(v, Enum) else v) for k, v in opts.items() if v is not None}
    if isinstance(given.get("model_config_path"), Path):
        given["model_config_path"] = str(given["model_config_path"])
    if any(k in given for k in ("model", "model_config_path", "params")):
        for k in ("model", "model_config_path", "params", "model_spec"):
            base.pop(k, None)
    if "instance" in given:
        base.pop("gpu", None)
    if "gpu" in given:
        base.pop("instance", None)
    try:
        return JobSpec.model_validate({**base, **given})
    except ValidationError as exc:
        msgs = []
        for e in exc.errors():
            field = ".".join(str(p) for p in e["loc"])
            value = e.get("input")
            msgs.append(f"--{field.replace('_', '-')} {value!r}: {e['msg']}")
        raise UsageError("; ".join(msgs)) from None
