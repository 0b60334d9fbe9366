"""`estimate`: one fully specified setup in, memory, speed, time and cost out (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from trainready.catalog import Price
from trainready.catalog.prices import planning_rate

from . import efficiency as eff
from . import moe
from . import reliability as rel
from .attention import attention_note
from .batch_advice import batch_advice
from .confidence import ConfidenceInfo, confidence_info, summary
from .dispatch import deepep_assumption, deepep_warning
from .fit import GPU_MARGIN, fit_of
from .memory import GiB, MemoryResult, estimate_memory, qlora_moe_note
from .performance import StepResult, estimate_step, host_copy_bps, host_copy_note, host_cpu_cores
from .recipes import framework_for
from .recompute import DEFAULT_MODULES, modules_text
from .setup import Setup
from .stacks import compile_assumption, get_stack, resolve_stack
from .storage import StoragePlan, storage_plan
from .memory_record import MemoryRecord, memory_record, projected_peak_gib
from .memory_record import CALIBRATED_NOTE as MEMORY_CALIBRATED_NOTE
from .memory_record import calibrated as memory_calibrated
from .memory_record import unchecked as memory_unchecked
from .memory_record import warning as memory_record_warning
from .track_record import committed_rows
from .track_record import text as track_record_text
from .track_record import wide as track_record_wide

ESTIMATE_SCHEMA_VERSION = 1
SPOT_ASSUMPTION = (f"spot: one interruption per node per {rel.SPOT_NODE_MTBF_H:g} h assumed "
                   f"(no public per-type rate; override with --spot-mtbf-hours), "
                   f"{rel.RESTART_S['spot'] / 60:g} min to resume")


class ModelInfo(BaseModel):
    name: str
    params: int
    active_params: int = Field(description="parameters each token uses (MoE: top-k routed experts); = params if dense")
    derived: str | None = None
    source: str = ""


class SetupInfo(BaseModel):
    instance: str | None
    gpu: str
    nodes: int
    gpus_per_node: int
    gpus: int
    dp: int
    tp: int
    pp: int
    pp_virtual: int = Field(1, description="interleaved (virtual) pipeline stages per rank; 1: plain 1F1B")
    cp: int = Field(1, description="context-parallel size: each sequence split over cp GPUs (ring attention)")
    fp8_recipe: str | None = Field(None, description="FP8 scaling recipe (precision fp8); None: not fp8")
    fp8_param_gather: bool = Field(False, description="linear weights all-gathered in FP8 over data parallelism "
                                                      "(--fp8-gather, or the stack's recipe)")
    power_limit_w: float | None = Field(None, description="the GPUs' power limit below their rated power "
                                                          "(--power-limit); None: rated power")
    power_scale: float = Field(1.0, description="fraction of rated compute (GEMMs, attention) the GPUs keep under "
                                                "power_limit_w (efficiency.power_scale); 1.0 at rated power")
    capacity_factor: float | None = Field(None, description="MoE token-drop routing at this capacity factor (expert "
                                                            "buffers padded to it); None: dropless, or a dense model")
    tp_overlap: bool = Field(False, description="tensor-parallel communication pipelined with the GEMMs (--tp-overlap; "
                                                "only with tp > 1)")
    cuda_graphs: bool = Field(False, description="the layers captured in CUDA graphs (--cuda-graphs): no host launch "
                                                 "floor for what is captured")
    torch_compile: bool = Field(False, description="the model and its loss compiled with torch.compile (--compile): "
                                                   "the loss's memory as the compiled graph keeps it")
    ep: int = Field(1, description="expert-parallel size (MoE); ep x etp divides the tp x dp GPUs of a stage")
    etp: int = Field(1, description="expert tensor-parallel size (MoE): ranks each routed expert is split over "
                                    "(= tp for a dense model); etp != tp folds the expert grid over the attention "
                                    "grid (MoE parallel folding)")
    strategy: str
    micro_batch: int
    grad_accum: int
    pp_local_batch: int | None = Field(None, description="with pp > 1 on torch.distributed.pipelining: sequences per "
                                                         "data-parallel rank per pipeline schedule call, as the job "
                                                         "gave it; None: the step's whole share in one call")
    pp_schedule_calls: int = Field(1, description="pipeline schedule calls per optimizer step, each filling and "
                                                  "draining the pipeline (1 without pipeline stages)")
    global_batch: int
    seq_len: int
    doc_len: int | None = Field(None, description="packed documents' mean length, attention masked to each "
                                                   "(--doc-len); None: attention spans the whole sequence")
    tokens_per_step: int
    precision: str
    optimizer_dtype: str
    activation_checkpointing: str
    recompute_modules: list[str] | None = Field(
        None, description="with activation_checkpointing selective-attn (Megatron's selective recompute): the modules "
                          "recomputed (plan/recompute.py); None otherwise")
    ep_dispatcher: str | None = Field(None, description="MoE with ep > 1: how tokens reach their experts, alltoall "
                                                        "(a row per routed expert) or deepep (DeepEP/HybridEP); "
                                                        "None otherwise")
    ep_overlap: bool = Field(False, description="MoE with ep > 1: the all-to-alls overlapped with another "
                                                "micro-batch's compute")
    fp8_dispatch: bool = Field(False, description="MoE with ep > 1 under FP8: tokens dispatched in FP8 (combines "
                                                  "stay BF16)")
    offload: str
    method: str
    lora_rank: int | None
    lora_targets: list[str] | None = Field(None, description="LoRA/QLoRA where the job named them (--lora-targets): "
                                           "the linear layers of a block that carry adapters, by the planner's names "
                                           "(q, k, v, o, gate, up, down; latent attention q_a, q_b, kv_a, kv_b: "
                                           "plan/lora_targets.py); None: every linear layer, or full training")
    lora_dropout: float | None = Field(None, description="LoRA/QLoRA with dropout on the adapters (--lora-dropout): "
                                       "its probability; None: none, or full training")
    lora_dropout_position: Literal["pre", "post"] | None = Field(
        None, description="where that dropout sits: 'pre' on each adapter's input (PEFT, Megatron-Bridge), 'post' on "
                          "its output (NeMo AutoModel); None without dropout")
    autocast: bool | None = Field(None, description="LoRA/QLoRA with PEFT's fp32 adapters: the forward runs under "
                                                    "torch.autocast (--autocast, or the stack's; never where "
                                                    "DeepSpeed runs the row); None: full training, or adapters in "
                                                    "the model's dtype")
    lora_input_copy_bytes: int | None = Field(
        None, description="LoRA/QLoRA: bytes per element of the copy of its input each adapter saves: 4 (PEFT's fp32 "
                          "adapters), 2 (their bf16 cast under autocast), 0 (the adapters read the model's own "
                          "tensor); None: full training")
    kernels: str
    attention_kernel: str
    stack: str = Field(description="training stack preset whose defaults apply (plan/stacks.py; hf-trainer unless named)")
    framework: str | None = Field(None, description="the framework that runs the setup, whose memory was counted "
                                                     "(the job's, or the first that runs it, as plan's auto); None: "
                                                     "none runs it as estimated")
    inter_node_gbps: float | None
    spot: bool

    def recompute_text(self) -> str:
        """The checkpointing as outputs name it: Megatron's module list where it is not the attention core alone."""
        return modules_text(tuple(self.recompute_modules)) if self.recompute_modules else self.activation_checkpointing

    def method_text(self) -> str:
        """The method as outputs name it: "lora r=8 on q, k, v, dropout 0.05" (the rank for LoRA/QLoRA, the targets
        where named, the dropout where there is one)."""
        return (self.method + (f" r={self.lora_rank}" if self.lora_rank else "")
                + (f" on {', '.join(self.lora_targets)}" if self.lora_targets else "")
                + (f", dropout {self.lora_dropout!r}" if self.lora_dropout else ""))

    def dispatch_text(self) -> str:
        """", DeepEP + a2a overlap" where a MoE row uses either (the collective all-to-all says nothing)."""
        parts = (["DeepEP"] if self.ep_dispatcher == "deepep" else []) + (["a2a overlap"] if self.ep_overlap else [])
        return ", " + " + ".join(parts) if parts else ""


class MemoryParts(BaseModel):
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    peak: float


class MemoryInfo(BaseModel):
    per_gpu_gib: MemoryParts
    gpu_gib: float
    fits: bool = Field(description="the modelled peak is within the GPU's memory (plan/fit.py)")
    headroom_gib: float
    margin: float = Field(description="fraction of GPU memory kept free by the fit rule (--memory-margin)")
    limit_gib: float = Field(description="GPU memory a setup may use: gpu_gib x (1 - margin)")
    fits_with_margin: bool = Field(description="peak <= limit_gib: what plan ranks")
    peak_phase: str = Field(description="backward-start or backward-end")
    states_gib: float = Field(description="weights + all gradients + optimizer, persistent")
    host_gib: float = Field(description="host RAM per node the job needs")
    host_ram_gib: float | None = Field(description="host RAM per node the instance has")
    host_margin: float = Field(description="fraction of host RAM left to the OS and page cache")
    host_limit_gib: float | None = Field(description="host RAM offloaded states may use; None: not known")
    host_fits: bool | None = Field(description="host_gib <= host_limit_gib; None: the instance's RAM is not known")
    track_record: MemoryRecord | None = Field(
        None, description="how far the memory model was off on measured peaks of runs of this setup's kind, stack "
                          "and MoE dispatcher (plan/memory_record.py); None: no such peak, or a calibrated allocator "
                          "slack (an assumption says which), or the record could not be read")
    peak_at_record_gib: float | None = Field(
        None, description="the peak with what it holds beyond the persistent states scaled by that record's median "
                          "ratio (what runs like it used for this figure); over gpu_gib: a warning that the fit is not "
                          "established")


class StepBreakdown(BaseModel):
    compute: float
    exposed_communication: float
    other: float


class ThroughputInfo(BaseModel):
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    step_time_s: float
    step_breakdown_s: StepBreakdown
    communication_s: float
    model_flops_per_token: float
    total_flops: float | None = Field(description="FLOPs executed by all GPUs for --tokens (causal attention, recompute)")
    bottleneck: str


class TimeInfo(BaseModel):
    compute_hours: float | None
    train_hours: float | None
    steps: int | None
    checkpoint_interval_s: float
    checkpoint_stall_s: float
    overhead_fraction: float


class PricingInfo(BaseModel):
    region: str | None = None
    model: str | None = None
    as_of: str | None = None
    suspect: bool = False
    note: str | None = None
    source: str | None = None


class CostInfo(BaseModel):
    usd_per_hour: float | None = Field(description="per node")
    usd_per_hour_total: float | None
    total_usd: float | None
    usd_per_billion_tokens: float | None
    spot_usd_per_hour: float | None
    spot_hours: float | None
    spot_total_usd: float | None
    spot_overhead_fraction: float | None
    pricing: PricingInfo
    spot_pricing: PricingInfo | None


class EstimateResult(BaseModel):
    schema_version: int = ESTIMATE_SCHEMA_VERSION
    model: ModelInfo
    setup: SetupInfo
    memory: MemoryInfo
    throughput: ThroughputInfo
    time: TimeInfo
    cost: CostInfo
    storage: StoragePlan
    confidence: ConfidenceInfo
    assumptions: list[str]
    warnings: list[str]


CUDA_GRAPHS_MEMORY = "the graphs' static input and output buffers and memory pool are not counted in {} (not known)"
"""What --cuda-graphs leaves out of memory, said by the estimate (the memory figure) and by plan (GiB/GPU)."""


def cuda_graphs_assumption(s: Setup) -> str:
    """What --cuda-graphs changes in the estimate, and what it leaves out."""
    what = ("every layer replays from its graph: no host launch floor" if s.graphs_whole_layers else
            "attention, router and preprocessing replay from graphs; the dispatch and experts, whose shapes change "
            "every step, stay eager and keep the host launch floor")
    return f"CUDA graphs ({get_stack(s.stack).cuda_graphs}): {what}; {CUDA_GRAPHS_MEMORY.format('the memory figure')}"


def lora_copy_assumption(s: Setup) -> str:
    """What PEFT's fp32 adapters were counted to save and run in (Setup.lora_copy_bytes), and how to say otherwise."""
    if s.autocast:
        return ("LoRA: PEFT's fp32 adapters under autocast (the Trainer's bf16=True): each saves a bf16 cast of its "
                "input and matmuls in bf16; --no-autocast for a loop without autocast (fp32 copies, 2 bytes an "
                "element more)")
    return ("LoRA: PEFT's fp32 adapters without autocast" + (" (DeepSpeed runs none)" if s.on_deepspeed else "")
            + ": each saves an fp32 copy of its input and matmuls in fp32"
            + ("" if s.on_deepspeed else "; --autocast if the loop runs under autocast (bf16 casts, half the bytes)"))


def doc_len_assumption(doc_len: int, seq_len: int) -> str:
    """What --doc-len changes, and what it assumes of the documents."""
    return (f"packed documents of {doc_len:,} tokens in each {seq_len:,}-token sequence, attention masked to each "
            f"(--doc-len): attention's FLOPs, the MFU numerator's included, and its kernel's efficiency at "
            f"{doc_len:,} tokens; GEMMs, memory and communication at the sequence's. Documents assumed all "
            f"{doc_len:,} long: a spread of lengths costs more attention (the mean of the squared lengths over the "
            f"mean length)")


def _price(s: Setup, model: str) -> Price | None:
    if s.instance is None:
        return None
    return s.instance.price_for(model, s.region)


def _pricing_info(p: Price | None) -> PricingInfo:
    if p is None:
        return PricingInfo()
    return PricingInfo(region=p.region, model=p.model, as_of=p.as_of, suspect=p.suspect, note=p.note,
                       source=p.source)


def _bottleneck(step: StepResult) -> str:
    parts = {"compute": step.compute_s, "communication": step.exposed_comm_s, "overheads": step.other_s}
    share = {k: v / step.step_s for k, v in parts.items()}
    if share["communication"] >= 0.2:
        return "communication"
    if share["overheads"] >= 0.2:
        return "overheads (pipeline bubble, CPU launch or offload)"
    return "compute"


def checkpoint_stall_s(s: Setup, checkpoint_bytes: float) -> float:
    """Blocked time per async checkpoint: copying this GPU's share to pinned host memory (all GPUs at once)."""
    return checkpoint_bytes / s.n_gpus / host_copy_bps(s)


@dataclass(frozen=True, slots=True)
class RunCost:
    """Time and money for `tokens` on one setup: what `estimate` shows and `plan` ranks by."""

    od: rel.Reliability
    sp: rel.Reliability
    od_price: Price | None
    spot_price: Price | None
    per_node_usd_h: float | None  # the price this run pays per node-hour (spot with --spot)
    compute_h: float
    train_h: float  # with on-demand checkpoint and failure overhead: the time shown
    spot_h: float  # with spot interruptions
    total_usd: float | None  # per_node x nodes x (spot_h with --spot, else train_h)


def run_cost(s: Setup, checkpoint_bytes: float, tokens_per_s: float, tokens: float, *,
             spot_mtbf_h: float | None = None) -> RunCost:
    stall = checkpoint_stall_s(s, checkpoint_bytes)
    od = rel.reliability(stall, rel.job_mtbf_h(s.nodes, s.gpus_per_node, False), spot=False)
    sp = rel.reliability(stall, rel.job_mtbf_h(s.nodes, s.gpus_per_node, True, spot_mtbf_h), spot=True)
    od_price, spot_price = _price(s, "on-demand"), _price(s, "spot")
    per_node = s.usd_per_hour or (od_price.usd_per_hour if od_price else None)
    if s.spot and not s.usd_per_hour:
        per_node = planning_rate(spot_price, od_price)[0] if spot_price else None
    compute_h = tokens / tokens_per_s / 3600
    train_h, spot_h = compute_h * (1 + od.overhead), compute_h * (1 + sp.overhead)
    total = per_node * s.nodes * (spot_h if s.spot else train_h) if per_node else None
    return RunCost(od=od, sp=sp, od_price=od_price, spot_price=spot_price, per_node_usd_h=per_node,
                   compute_h=compute_h, train_h=train_h, spot_h=spot_h, total_usd=total)


def on_its_framework(s: Setup) -> Setup:
    """`s` with the framework that runs it (Setup.runs_on), chosen as `plan` chooses: the job's framework, or the
    first that runs it; its memory is then that framework's (Setup.on_deepspeed)."""
    return s if s.runs_on is not None else s.with_(runs_on=framework_for(s, s.framework)[0])


def estimate_setup(s: Setup, *, spot_mtbf_h: float | None = None, memory_margin: float = GPU_MARGIN) -> EstimateResult:
    s = on_its_framework(s)
    mem = estimate_memory(s)
    step = estimate_step(s)
    return assemble(s, mem, step, spot_mtbf_h=spot_mtbf_h, memory_margin=memory_margin)


def assemble(s: Setup, mem: MemoryResult, step: StepResult, *, spot_mtbf_h: float | None = None,
             memory_margin: float = GPU_MARGIN) -> EstimateResult:
    m = s.model
    gpu_gib = s.gpu.memory_gib
    tps = step.tokens_per_s
    rc = run_cost(s, mem.checkpoint_bytes, tps, s.tokens or 1e9, spot_mtbf_h=spot_mtbf_h)
    od, sp, od_price, spot_price, per_node = rc.od, rc.sp, rc.od_price, rc.spot_price, rc.per_node_usd_h
    compute_h = rc.compute_h if s.tokens else None
    train_h = rc.train_h if s.tokens else None
    spot_hours = rc.spot_h if s.tokens else None
    total = rc.total_usd if s.tokens else None
    steps = int(-(-s.tokens // s.tokens_per_step)) if s.tokens else None
    spot_rate, spot_rate_why = planning_rate(spot_price, od_price) if spot_price else (None, None)
    total_rate = per_node * s.nodes if per_node else None
    spot_total = spot_rate * s.nodes * spot_hours if (spot_rate and spot_hours is not None) else None
    # the same arithmetic as total_usd, for 1B tokens: plan ranks by it when --tokens is not given
    per_btok = run_cost(s, mem.checkpoint_bytes, tps, 1e9, spot_mtbf_h=spot_mtbf_h).total_usd
    interval = sp.interval_s if s.spot else od.interval_s
    warnings = list(s.notes)
    if s.power_limit_w is not None and s.efficiency is not None and s.power_scale < 1:
        warnings.append(f"--power-limit {s.power_limit_w:.10g} with calibrated factors: if the calibration was "
                        f"measured on GPUs already capped, the cap is counted twice (give one or the other)")
    advice = batch_advice(s)
    if advice:
        warnings.append(advice)
    if said := deepep_warning(s):
        warnings.append(said)
    if said := s.autocast_ignored:
        warnings.append(said)
    resolved = resolve_stack(s.stack, kernels=s.kernels, attention_kernel=s.attention_kernel,
                             reduce_dtype=s.reduce_dtype)
    assumptions = [
        resolved.describe(named=s.stack_named) + (f"; this job's --recompute-modules: {', '.join(s.recomputes)}"
                                                  if s.recomputes not in ((), DEFAULT_MODULES) else ""),
        *filter(None, [attention_note(s.model, resolved, s.gpu.arch), qlora_moe_note(s.model, s.method),
                       compile_assumption(resolved, s.compiled)]),
        (f"memory as {s.runs_on} holds it" + (" (DeepSpeed's ZeRO: 16-bit gradients beside the fp32 ones, ZeRO-3's "
                                              "16-bit shard)" if s.on_deepspeed else "")
         + ("" if s.framework != "auto" else ": the first framework that runs this setup (--framework to name one)")
         if s.runs_on else "memory as no framework holds it: " + str(framework_for(s, s.framework)[1])),
        f"efficiency factors: {s.efficiency.source}" if s.efficiency is not None else
        f"efficiency factors for {s.gpu.arch} (see docs/planner.md)",
        f"on-demand MTBF {rel.ON_DEMAND_GPU_MTBF_H:,.0f} GPU-hours (Llama 3 paper); checkpoint every "
        f"{interval / 60:.0f} min (Young/Daly)",
    ]
    if s.spot or spot_rate:
        assumptions.append(SPOT_ASSUMPTION)
    if s.offload != "none":
        cores, known = host_cpu_cores(s)
        host = (f"{s.instance.name}'s {s.instance.vcpus} vCPUs" if known else
                f"{eff.ASSUMED_HOST_VCPUS_PER_GPU} vCPUs per GPU assumed (no instance vCPU count)")
        assumptions.append(f"optimizer offload: DeepSpeed CPU-Adam at {eff.CPU_ADAM_PARAMS_PER_CORE_S / 1e6:g}M "
                           f"params/s per physical core x {cores} cores ({host} / 2), cores bound to ranks; "
                           f"{host_copy_note(s)}")
    if m.derived:
        assumptions.append(m.derived)
    if s.doc_len:
        assumptions.append(doc_len_assumption(s.doc_len, s.seq_len))
    if s.cuda_graphs:
        assumptions.append(cuda_graphs_assumption(s))
    if s.lora_fp32_copies:
        assumptions.append(lora_copy_assumption(s))
    assumptions += moe.assumptions(s)
    if said := deepep_assumption(s):
        assumptions.append(said)
    if s.instance is None:
        assumptions.append(f"no instance given: {s.gpus_per_node} x {s.gpu.name} per node, no price")
    for kind, p in (("on-demand", od_price), ("spot", spot_price)):
        if p and p.suspect:
            warnings.append(f"{kind} price of {s.instance.name} is marked suspect: "
                            f"{p.note or 'verify it before buying'}"
                            + (f"; {spot_rate_why}" if kind == "spot" and spot_rate_why else ""))
    if s.instance is not None and not s.spot and not s.usd_per_hour and (od_price is None or od_price.usd_per_hour is None):
        where = f" in {s.region}" if s.region else ""
        note = f" ({od_price.note})" if od_price is not None and od_price.note else ""
        warnings.append(f"no on-demand price for {s.instance.name}{where} in the catalog{note}; give --usd-per-hour")
    if s.spot and spot_price is None and s.instance is not None and not s.usd_per_hour:
        warnings.append(f"no spot price for {s.instance.name} in the catalog: the spot cost is unknown")
    ram = s.instance.ram_gib if s.instance else None
    host_gib = mem.host_per_node / GiB
    fit = fit_of(mem.peak / GiB, gpu_gib, host_gib, ram, memory_margin)
    problem = fit.problem()
    if problem:
        warnings.append(problem)
    mem_record = memory_record(s)
    if mem_record is not None:
        said = memory_record_warning(mem_record, mem, gpu_gib)
        if said and fit.fits:  # a peak already over the card needs no second reason
            warnings.append(said)
    elif memory_calibrated(s):
        assumptions.append(MEMORY_CALIBRATED_NOTE)
    elif committed_rows() is not None:
        assumptions.append(memory_unchecked(s))
    st = storage_plan(s, mem.checkpoint_bytes, interval, tps, train_hours=train_h)
    conf = confidence_info(s, tps, lambda t: _run_figures(s, mem.checkpoint_bytes, t, spot_mtbf_h))
    if summary(conf):
        warnings.append(summary(conf))
    if conf.track_record is not None and track_record_wide(conf.track_record):
        warnings.append(f"loose track record: {track_record_text(conf.track_record)}; read tokens/s, time and cost "
                        f"with that error in mind")
    if st.hot_tier_fits is False:
        warnings.append(f"hot tier too small: {st.hot_tier_need_gb_per_node:,.0f} GB per node needed for "
                        f"{s.keep_hot}+1 checkpoints, {st.hot_tier_have_gb_per_node:,.0f} GB of NVMe")
    total_flops = step.hardware_flops_per_token * s.tokens if s.tokens else None
    return EstimateResult(
        model=ModelInfo(name=m.name, params=m.param_count(), active_params=m.active_param_count(), derived=m.derived,
                        source=m.source),
        setup=SetupInfo(instance=s.instance.name if s.instance else None, gpu=s.gpu.name, nodes=s.nodes,
                        gpus_per_node=s.gpus_per_node, gpus=s.n_gpus, dp=s.dp, tp=s.tp, pp=s.pp, ep=s.ep,
                        etp=s.expert_tp,
                        pp_virtual=s.pp_virtual, cp=s.cp, tp_overlap=s.tp_overlap and s.tp > 1,
                        torch_compile=s.compiled, cuda_graphs=s.cuda_graphs,
                        capacity_factor=m.moe.capacity_factor if m.moe else None,
                        fp8_recipe=s.fp8_recipe if s.precision == "fp8" else None,
                        fp8_param_gather=s.fp8_param_gather,
                        power_limit_w=s.power_limit_w, power_scale=round(s.power_scale, 4),
                        strategy=s.strategy, micro_batch=s.micro_batch, grad_accum=s.grad_accum,
                        pp_local_batch=s.pp_local_batch, pp_schedule_calls=s.schedule_calls,
                        global_batch=s.global_batch, seq_len=s.seq_len, doc_len=s.doc_len,
                        tokens_per_step=s.tokens_per_step,
                        precision=s.precision, optimizer_dtype=s.optimizer_dtype,
                        activation_checkpointing=s.checkpointing, offload=s.offload, method=s.method,
                        recompute_modules=list(s.recomputes) or None,
                        ep_dispatcher=s.ep_dispatcher if s.ep > 1 else None, ep_overlap=s.ep > 1 and s.ep_overlap,
                        fp8_dispatch=s.ep > 1 and s.fp8_dispatch,
                        lora_rank=s.lora_rank if s.method != "full" else None,
                        lora_targets=list(s.lora_targets) if s.lora_targets else None,
                        lora_dropout=s.lora_dropout if s.lora_dropout_at else None,
                        lora_dropout_position=s.lora_dropout_at,
                        autocast=s.autocast if s.peft_lora else None,
                        lora_input_copy_bytes=s.lora_copy_bytes if s.method != "full" else None,
                        kernels=s.kernels, stack=s.stack,
                        framework=s.runs_on,
                        attention_kernel=s.attention_kernel, inter_node_gbps=s.inter_node_gbps if s.nodes > 1 else None,
                        spot=s.spot),
        memory=MemoryInfo(
            per_gpu_gib=MemoryParts(weights=mem.weights / GiB, gradients=mem.gradients / GiB,
                                    optimizer=mem.optimizer / GiB, activations=mem.activations / GiB,
                                    other=mem.other / GiB, peak=mem.peak / GiB),
            gpu_gib=gpu_gib, fits=fit.fits, headroom_gib=gpu_gib - mem.peak / GiB, margin=fit.margin,
            limit_gib=fit.gpu_limit_gib, fits_with_margin=fit.fits_with_margin, peak_phase=mem.phase,
            states_gib=mem.states_full / GiB, host_gib=host_gib, host_ram_gib=ram, host_margin=fit.host_margin,
            host_limit_gib=fit.host_limit_gib, host_fits=fit.host_fits, track_record=mem_record,
            peak_at_record_gib=projected_peak_gib(mem_record, mem) if mem_record else None),
        throughput=ThroughputInfo(
            tokens_per_s=tps, tokens_per_s_per_gpu=tps / s.n_gpus, mfu=step.mfu, hfu=step.hfu,
            step_time_s=step.step_s,
            step_breakdown_s=StepBreakdown(compute=step.compute_s, exposed_communication=step.exposed_comm_s,
                                           other=step.other_s),
            communication_s=step.comm_s, model_flops_per_token=step.model_flops_per_token,
            total_flops=total_flops, bottleneck=_bottleneck(step)),
        time=TimeInfo(compute_hours=compute_h, train_hours=train_h, steps=steps,
                      checkpoint_interval_s=interval, checkpoint_stall_s=od.stall_s,
                      overhead_fraction=sp.overhead if s.spot else od.overhead),
        cost=CostInfo(usd_per_hour=per_node, usd_per_hour_total=total_rate, total_usd=total,
                      usd_per_billion_tokens=per_btok, spot_usd_per_hour=spot_rate, spot_hours=spot_hours,
                      spot_total_usd=spot_total, spot_overhead_fraction=sp.overhead if spot_rate else None,
                      pricing=_pricing_info(spot_price if s.spot else od_price),
                      spot_pricing=_pricing_info(spot_price) if spot_price else None),
        storage=st, confidence=conf, assumptions=assumptions, warnings=warnings)


def _run_figures(s: Setup, checkpoint_bytes: float, tps: float, spot_mtbf_h: float | None):
    """(train hours, total usd, usd per 1B tokens) at `tps`, as the estimate computes them."""
    rc = run_cost(s, checkpoint_bytes, tps, s.tokens or 1e9, spot_mtbf_h=spot_mtbf_h)
    per_b = run_cost(s, checkpoint_bytes, tps, 1e9, spot_mtbf_h=spot_mtbf_h).total_usd
    return (rc.train_h if s.tokens else None), (rc.total_usd if s.tokens else None), per_b

