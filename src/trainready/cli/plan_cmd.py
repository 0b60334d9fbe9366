"""`trainready plan`: search the catalog and rank setups by cost or time."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from trainready.catalog import load_catalog
from trainready.plan.fit import GPU_MARGIN
from trainready.plan.job import JobSpec, save_job
from trainready.plan.recipes import CHOICES
from trainready.plan.search import PlanRequest, job_for_row
from trainready.plan.search import plan as run_plan
from trainready.report.calibration import resolve_calibration

from . import options as o
from .account_cmd import live_plan
from .console import emit_json, err, out
from .render import render_plan, say_calibration
from .render_account import render_live

HELP = """Which instance, how many nodes, which strategy: ranked by total cost (or time).

Example: trainready plan --model llama-2-13b --method full --tokens 2e9

Exit codes: 0 at least one setup fits, 1 nothing fits the constraints, 2 usage error, 3 internal error."""

C = "Constraints"


class RankBy(str, Enum):
    cost = "cost"
    time = "time"


# the choices of PlanRequest.framework (trainready.plan.recipes.CHOICES); NAME in -h, listed in the help
Framework = o.labelled(Enum("Framework", {c.replace("-", "_"): c for c in CHOICES}, type=str), "NAME")


def plan(
    job_path: o.JobPath = None,
    model: o.ModelName = None,
    model_config: o.ModelConfig = None,
    params: o.Params = None,
    method: o.MethodOpt = None,
    lora_rank: o.LoraRank = None,
    lora_targets: o.LoraTargets = None,
    lora_dropout: o.LoraDropout = None,
    autocast: o.AutocastOpt = None,
    tokens: o.Tokens = None,
    seq_len: o.SeqLen = None,
    doc_len: o.DocLen = None,
    global_batch: o.GlobalBatch = None,
    precision: o.PrecisionOpt = None,
    optimizer_dtype: o.OptimDType = None,
    kernels: o.KernelsOpt = None,
    attention_kernel: o.AttentionOpt = None,
    stack: o.StackOpt = None,
    expert_load_imbalance: o.LoadImbalance = None,
    ep_dispatcher: o.EpDispatcher = None,
    ep_overlap: o.EpOverlap = None,
    fp8_dispatch: o.Fp8Dispatch = None,
    tp_overlap: o.TpOverlap = None,
    torch_compile: o.TorchCompile = None,
    cuda_graphs: o.CudaGraphs = None,
    moe_routing: o.MoeRouting = None,
    fp8_recipe: o.Fp8RecipeOpt = None,
    fp8_param_gather: o.Fp8ParamGather = None,
    power_limit: o.PowerLimit = None,
    capacity_factor: o.CapacityFactor = None,
    by: Annotated[RankBy, typer.Option("--by", help="Rank by total cost or by time.", rich_help_panel=C)] = RankBy.cost,
    framework: Annotated[Optional[Framework], typer.Option("--framework", show_choices=False, help="Recommend only rows this framework runs as planned: torchtitan, deepspeed, megatron or hf-tp; auto: each row in the first that runs it. [default: the --job file's framework, else auto]", rich_help_panel=C)] = None,
    top: Annotated[int, typer.Option("--top", parser=o.number_for(PlanRequest, "top", "5"), help="Rows to show, 1 to 100.", rich_help_panel=C)] = 5,
    max_usd: Annotated[Optional[float], typer.Option("--max-usd", parser=o.number_for(PlanRequest, "max_usd", "5000"), help="Budget for the whole run.", rich_help_panel=C)] = None,
    deadline_hours: Annotated[Optional[float], typer.Option("--deadline-hours", parser=o.number_for(PlanRequest, "deadline_hours", "48"), help="Wall-clock limit.", rich_help_panel=C)] = None,
    clouds: Annotated[Optional[str], typer.Option("--clouds", help="Comma-separated: aws,gcp,azure,lambda.", rich_help_panel=C)] = None,
    instances: Annotated[Optional[str], typer.Option("--instances", help="Comma-separated instance types to consider.", rich_help_panel=C)] = None,
    max_nodes: Annotated[int, typer.Option("--max-nodes", parser=o.number_for(PlanRequest, "max_nodes", "16"), help="Most nodes per job, 1 to 1024.", rich_help_panel=C)] = 16,
    min_gpu_mem: Annotated[Optional[float], typer.Option("--min-gpu-mem", parser=o.number_for(PlanRequest, "min_gpu_mem_gib", "80"), help="Least GPU memory, GiB.", rich_help_panel=C)] = None,
    optimistic: Annotated[bool, typer.Option("--optimistic", help="Rank GPUs whose efficiency is assumed (B200, L4/L40S, V100) by their point estimate, not the pessimistic end of their range.", rich_help_panel=C)] = False,
    memory_margin: Annotated[Optional[float], typer.Option("--memory-margin", parser=o.number_for(JobSpec, "memory_margin", "0.1"), help="Fraction of GPU memory kept free, 0 to 0.5. [default: the --job file's, else 0.1]", rich_help_panel=C)] = None,
    spot: o.Spot = None,
    region: o.Region = None,
    usd_per_hour: o.UsdPerHour = None,
    spot_mtbf_hours: o.SpotMtbf = None,
    catalog_file: o.CatalogFile = None,
    save: o.Save = None,
    calibrate: o.Calibrate = None,
    calibration: o.CalibrationRef = None,
    json_out: o.Json = False,
    html: Annotated[Optional[Path], typer.Option("--html", metavar="FILE", help="Also write every candidate (cost vs time, Pareto front), the rows, the excluded instances and the best row's memory per GPU as one self-contained HTML page (needs trainready[report]).", rich_help_panel=o.OUT)] = None,
    force: Annotated[bool, typer.Option("--force", help="With --html: replace FILE even when it is not a page trainready wrote.", rich_help_panel=o.OUT)] = False,
    live: Annotated[bool, typer.Option("--live", help="Check each row against your AWS account now: quota, offering, permissions, live prices; rows that cannot launch are excluded (docs/account.md).", rich_help_panel="Live")] = False,
    regions: Annotated[Optional[str], typer.Option("--regions", metavar="REGIONS", help="With --live: regions to try, comma-separated, or all. [default: each row's price region]", rich_help_panel="Live")] = None,
    data: Annotated[Optional[str], typer.Option("--data", metavar="S3URL", help="With --live: the dataset, s3://bucket/prefix; other regions pay to move it.", rich_help_panel="Live")] = None,
    max_age: Annotated[str, typer.Option("--max-age", metavar="AGE", help="With --live: reuse cached answers younger than this: 1h, 30m, 0.", rich_help_panel="Live")] = "1h",
    live_deadline: Annotated[Optional[float], typer.Option("--live-deadline", metavar="SECONDS", parser=o.number("60", hi=24 * 3600), help="With --live: all AWS calls together end within this; what has no answer by then is unknown. [default: 60, or TRAINREADY_LIVE_DEADLINE_S]", rich_help_panel="Live")] = None,
) -> None:
    job = o.build_job(job_path, model=model, model_config_path=model_config, params=params, method=method,
                      lora_rank=lora_rank, lora_targets=o.module_list(lora_targets),
                      lora_dropout=lora_dropout, autocast=autocast, tokens=tokens, seq_len=seq_len, doc_len=doc_len,
                      global_batch=global_batch, precision=precision, optimizer_dtype=optimizer_dtype, kernels=kernels,
                      attention_kernel=attention_kernel, stack=stack, expert_load_imbalance=expert_load_imbalance,
                      ep_dispatcher=ep_dispatcher, ep_overlap=ep_overlap, fp8_dispatch=fp8_dispatch,
                      tp_overlap=tp_overlap, torch_compile=torch_compile, cuda_graphs=cuda_graphs,
                      moe_routing=moe_routing, capacity_factor=capacity_factor,
                      fp8_recipe=fp8_recipe, fp8_param_gather=fp8_param_gather, power_limit_w=power_limit,
                      memory_margin=memory_margin, spot=spot, region=region, usd_per_hour=usd_per_hour)
    file_cap = job.power_limit_w if power_limit is None else None  # a --job file's watts were for its own GPU
    if file_cap is not None:
        job = job.model_copy(update={"power_limit_w": None})
    memory_margin = GPU_MARGIN if job.memory_margin is None else job.memory_margin
    catalog = load_catalog(catalog_file)
    cal, cal_line = resolve_calibration(calibrate, calibration, catalog, None)
    split = lambda v: [x.strip() for x in v.split(",") if x.strip()] if v else None  # noqa: E731
    req = PlanRequest(job=job, by=by.value, top=top, max_usd=max_usd, deadline_hours=deadline_hours,
                      clouds=split(clouds), instances=split(instances), max_nodes=max_nodes,
                      min_gpu_mem_gib=min_gpu_mem, memory_margin=memory_margin, optimistic=optimistic, spot_mtbf_h=spot_mtbf_hours,
                      calibration=cal, **({"framework": framework.value} if framework is not None else {}))
    result = run_plan(req, catalog)
    if file_cap is not None:
        result.notes.append(f"the --job file's power limit ({file_cap:.10g} W) was for its own GPU: not applied to "
                            f"the search (give --power-limit to cap every GPU searched)")
    if live or regions or data or live_deadline is not None:  # --regions/--data/--live-deadline alone mean --live
        result = live_plan(result, catalog, regions=regions, data=data, max_age=max_age, spot=bool(job.spot),
                           spot_mtbf_h=spot_mtbf_hours, deadline_s=live_deadline)
    if save is not None and result.rows:
        save_job(job_for_row(job, result.rows[0], req.framework), save)
    if html is not None:
        from .render_html import plan_html

        plan_html(result, html, console=err if json_out else out, force=force)
    if json_out:
        emit_json(result)
    else:
        render_plan(out, result)
        render_live(out, result)
        if save is not None and result.rows:
            out.print(f"\nsaved the best row as a job spec: {save}  (next: trainready estimate --job {save})")
    say_calibration(cal_line, json_out)
    if not result.rows:
        raise typer.Exit(1)
