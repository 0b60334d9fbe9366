"""`trainready estimate`: memory, speed, time and cost of one fully specified setup."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from trainready.catalog import load_catalog
from trainready.errors import UsageError
from trainready.plan.estimate import estimate_setup
from trainready.plan.fit import GPU_MARGIN
from trainready.plan.job import JobSpec, save_job
from trainready.plan.recipes import CHOICES, framework_for
from trainready.plan.search import largest_fitting_micro_batch
from trainready.plan.setup import resolve, resolve_model
from trainready.report.calibration import applied, resolve_calibration

from . import options as o
from .console import emit_json, out
from .render import render_estimate, say_calibration

HELP = """Memory per GPU, tokens/s, MFU, training time and cost of one setup.

Example: trainready estimate --model llama-2-13b --instance p4d.24xlarge --strategy fsdp --tokens 2e9

Exit codes: 0 ok (also when the setup does not fit: see memory.fits and memory.fits_with_margin), 2 usage error, 3 internal error."""

HW = o.HW
PAR = o.PAR
# the frameworks a job can name (JobSpec.framework, trainready.plan.recipes.CHOICES: auto too); NAME in -h
RunsOn = o.labelled(Enum("RunsOn", {c.replace("-", "_"): c for c in CHOICES}, type=str), "NAME")


def estimate(
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
    instance: Annotated[Optional[str], typer.Option("--instance", "-i", help="Instance type, e.g. p4d.24xlarge.", rich_help_panel=HW)] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU when no instance is given: a100-40gb, a100-80gb, h100-80gb, h200, b200, gb200, v100-16gb, v100-32gb, a10g, l4, l40s.", rich_help_panel=HW)] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", parser=o.number_for(JobSpec, "gpus", "16"), help="Total GPUs (whole nodes). [default: one node]", rich_help_panel=HW)] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", parser=o.number_for(JobSpec, "gpus_per_node", "8"), help="[default: 8 or the instance's]", rich_help_panel=HW)] = None,
    inter_node_gbps: Annotated[Optional[float], typer.Option("--inter-node-gbps", parser=o.number_for(JobSpec, "inter_node_gbps", "400"), help="Network per node, Gbit/s (overrides the catalog).", rich_help_panel=HW)] = None,
    strategy: Annotated[Optional[o.StrategyMode], typer.Option("--strategy", show_choices=False, help="Data parallelism: ddp, zero1, zero2, zero3 (= fsdp). [default: fsdp]", rich_help_panel=PAR)] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", parser=o.number_for(JobSpec, "tp", "2"), help="Tensor-parallel size. [default: 1]", rich_help_panel=PAR)] = None,
    pp: Annotated[Optional[int], typer.Option("--pp", parser=o.number_for(JobSpec, "pp", "2"), help="Pipeline stages. [default: 1]", rich_help_panel=PAR)] = None,
    pp_virtual: Annotated[Optional[int], typer.Option("--pp-virtual", parser=o.number_for(JobSpec, "pp_virtual", "4"), help="Interleaved pipeline: virtual stages per pipeline rank (Megatron's interleaved 1F1B, torchtitan's Interleaved1F1B); shrinks the bubble v-fold. Needs --pp 2+ and micro-batches per step a multiple of --pp. [default: 1]", rich_help_panel=PAR)] = None,
    pp_local_batch: Annotated[Optional[int], typer.Option("--pp-local-batch", parser=o.number_for(JobSpec, "pp_local_batch", "8"), help="Sequences per data-parallel rank in one call of the pipeline schedule (torchtitan's and NeMo AutoModel's local_batch_size with --pp): each call fills and drains the pipeline, so a step of global / (dp x this) calls idles that many times. Stacks torchtitan and automodel. [default: the step's whole share in one call]", rich_help_panel=PAR)] = None,
    cp: Annotated[Optional[int], typer.Option("--cp", parser=o.number_for(JobSpec, "cp", "2"), help="Context-parallel size: each sequence split over cp GPUs (ring attention: Megatron's --context-parallel-size, torchtitan's context_parallel_degree), for long sequences; 2 x cp must divide --seq-len. [default: 1]", rich_help_panel=PAR)] = None,
    ep: Annotated[Optional[int], typer.Option("--ep", parser=o.number_for(JobSpec, "ep", "8"), help="Expert-parallel size (mixture-of-experts models): divides the experts; --ep x --etp divides the tp x dp GPUs of a pipeline stage. [default: 1]", rich_help_panel=PAR)] = None,
    etp: Annotated[Optional[int], typer.Option("--etp", parser=o.number_for(JobSpec, "etp", "1"), help="Expert tensor-parallel size (MoE): GPUs each routed expert is split over; 1 with --tp 2+ folds EP over TP and data-parallel ranks (Megatron's MoE parallel folding). [default: the stack's convention: 1 with --ep 2+, else tp; --stack megatron: tp]", rich_help_panel=PAR)] = None,
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
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", parser=o.number_for(JobSpec, "micro_batch", "4"), help="Sequences per GPU per forward. [default: the largest that fits]", rich_help_panel=PAR)] = None,
    global_batch: o.GlobalBatch = None,
    seq_len: o.SeqLen = None,
    doc_len: o.DocLen = None,
    precision: o.PrecisionOpt = None,
    activation_checkpointing: Annotated[Optional[o.CkptMode], typer.Option("--activation-checkpointing", show_choices=False, help="Recompute activations in backward: none, selective or full. selective is the stack's kind; selective-op (torchtitan's op-level policy) or selective-attn (Megatron's attention core) names one. [default: none]", rich_help_panel=o.MEM)] = None,
    recompute_modules: Annotated[Optional[str], typer.Option("--recompute-modules", metavar="NAMES", help="With --activation-checkpointing selective on stack megatron: Megatron's --recompute-modules, comma-separated: core_attn, mla_up_proj, layernorm, mlp, moe_act, shared_experts, moe. [default: core_attn]", rich_help_panel=o.MEM)] = None,
    offload: Annotated[Optional[o.OffloadMode], typer.Option("--offload", show_choices=False, help="Move to host RAM: none, optimizer (the optimizer states) or optimizer+params (and the parameters). [default: none]", rich_help_panel=o.MEM)] = None,
    optimizer_dtype: o.OptimDType = None,
    reduce_dtype: o.ReduceDType = None,
    kernels: o.KernelsOpt = None,
    attention_kernel: o.AttentionOpt = None,
    stack: o.StackOpt = None,
    framework: Annotated[Optional[RunsOn], typer.Option("--framework", show_choices=False, help="The framework that runs the job: torchtitan, deepspeed, megatron or hf-tp; its memory is that framework's (DeepSpeed's ZeRO states); auto: the first that runs it. [default: the --job file's (plan --framework X --save writes it), else auto]", rich_help_panel=PAR)] = None,
    spot: o.Spot = None,
    region: o.Region = None,
    usd_per_hour: o.UsdPerHour = None,
    spot_mtbf_hours: o.SpotMtbf = None,
    catalog_file: o.CatalogFile = None,
    save: o.Save = None,
    calibrate: o.Calibrate = None,
    calibration: o.CalibrationRef = None,
    memory_margin: Annotated[Optional[float], typer.Option("--memory-margin", parser=o.number_for(JobSpec, "memory_margin", "0.1"), help="Fraction of GPU memory kept free by the fit rule (the same rule and default as plan), 0 to 0.5. [default: the --job file's, else 0.1]", rich_help_panel=o.MEM)] = None,
    json_out: o.Json = False,
) -> None:
    job = o.build_job(job_path, model=model, model_config_path=model_config, params=params, method=method,
                      lora_rank=lora_rank, lora_targets=o.module_list(lora_targets),
                      lora_dropout=lora_dropout, autocast=autocast, tokens=tokens, instance=instance, gpu=gpu,
                      gpus=gpus,
                      gpus_per_node=gpus_per_node, inter_node_gbps=inter_node_gbps, strategy=strategy, tp=tp,
                      pp=pp, pp_virtual=pp_virtual, pp_local_batch=pp_local_batch, cp=cp, ep=ep, etp=etp, expert_load_imbalance=expert_load_imbalance,
                      ep_dispatcher=ep_dispatcher, ep_overlap=ep_overlap, fp8_dispatch=fp8_dispatch,
                      tp_overlap=tp_overlap, torch_compile=torch_compile, cuda_graphs=cuda_graphs,
                      moe_routing=moe_routing, capacity_factor=capacity_factor,
                      fp8_recipe=fp8_recipe, fp8_param_gather=fp8_param_gather, power_limit_w=power_limit,
                      memory_margin=memory_margin,
                      micro_batch=micro_batch,
                      global_batch=global_batch, seq_len=seq_len, doc_len=doc_len,
                      precision=precision, activation_checkpointing=activation_checkpointing,
                      recompute_modules=o.module_list(recompute_modules), offload=offload,
                      optimizer_dtype=optimizer_dtype, reduce_dtype=reduce_dtype, kernels=kernels,
                      attention_kernel=attention_kernel, stack=stack, spot=spot, region=region, usd_per_hour=usd_per_hour)
    if framework is not None:  # auto sets aside the job file's framework
        job = job.model_copy(update={"framework": None if framework.value == "auto" else framework.value})
    catalog = load_catalog(catalog_file)
    spec = resolve_model(job)
    setup = resolve(job, catalog, model=spec)
    cal, cal_line = resolve_calibration(calibrate, calibration, catalog, setup if job.micro_batch else None)
    if cal is not None:
        setup = applied(cal, setup)
    memory_margin = GPU_MARGIN if job.memory_margin is None else job.memory_margin
    chosen_note = None
    if job.micro_batch is None:
        setup, chosen_note = largest_fitting_micro_batch(setup, memory_margin)
    if setup.framework != "auto":  # one named (here or in the job file) must run it, as plan refuses otherwise
        runs_on, why = framework_for(setup, setup.framework)
        if runs_on is None:
            named = (f"--framework {setup.framework}" if framework is not None
                     else f'{job_path}: framework = "{setup.framework}"')
            raise UsageError(f"{named} cannot run this job: {why} (--framework auto: the first that runs it)")
    result = estimate_setup(setup, spot_mtbf_h=spot_mtbf_hours, memory_margin=memory_margin)
    if chosen_note:
        result.assumptions.insert(0, chosen_note)
    if save is not None:
        saved = job.model_copy(update={"model_spec": spec, "micro_batch": setup.micro_batch,
                                       "global_batch": setup.global_batch, "seq_len": setup.seq_len,
                                       "precision": setup.precision, "gpus": setup.n_gpus,
                                       "gpus_per_node": setup.gpus_per_node})
        save_job(saved, save)
    if json_out:
        emit_json(result)
    else:
        render_estimate(out, result)
        if save is not None:
            out.print(f"\nsaved job spec: {save}")
    say_calibration(cal_line, json_out)
