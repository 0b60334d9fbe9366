"""`plan`: search instance types x node counts x strategies x micro-batch x checkpointing,
drop what does not fit (with a safety margin) or breaks a constraint, rank what is left.

The search is pure: the catalog and the request in, ranked rows and exclusions out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from trainready.catalog import Catalog, Instance
from trainready.errors import UsageError, closest, printable

from .attention import attention_note
from .batch_advice import batch_advice
from .calibration_file import CalibrationFile, check_stack, efficiency_for
from .confidence import is_assumed, ranking_tokens_per_s
from .dispatch import deepep_reason, dispatch_note, ep_spans_nodes
from .efficiency import POWER_PAIRS
from .estimate import CUDA_GRAPHS_MEMORY, EstimateResult, assemble, doc_len_assumption, on_its_framework, run_cost
from .fit import GPU_MARGIN, fit_of, gpu_limit_gib
from .job import JobSpec
from .live_info import LivePlan, LiveRow
from .lora_targets import check_autocast, check_dropout, check_targets
from .memory import GiB, estimate_memory, qlora_moe_note
from .performance import estimate_step
from .recipes import Recipe, framework_for, recipe_for
from .recompute import DEFAULT_MODULES, modules_text
from .setup import (
    Setup,
    check_doc_len,
    check_fp8_recipe_precision,
    chosen_fp8_recipe,
    default_precision,
    default_seq_len,
    fp8_recipe_problem,
    job_stack,
    layout_text,
    moe_comm,
    nearest_multiples,
    power_problem,
    resolve_model,
    tp_splits_heads,
)
from .stacks import (
    STACKS,
    compile_assumption,
    cuda_graphs_of,
    default_etp,
    fp8_param_gather_of,
    fp8_param_gather_problem,
    get_stack,
    optimizer_dtype_of,
    torch_compile_of,
    tp_overlap_of,
)
from .units import count_text, hours_text, usd_text

PLAN_SCHEMA_VERSION = 1
NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # up to --max-nodes (default 16)
STRATEGIES: tuple[tuple[str, str], ...] = (
    ("ddp", "none"), ("zero1", "none"), ("zero2", "none"), ("zero3", "none"),
    ("zero2", "optimizer"), ("zero3", "optimizer"), ("zero3", "optimizer+params"))
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
TP_MIN_PARAMS = 10e9  # tensor parallelism considered from this size up
PP_MIN_PARAMS = 30e9  # pipeline parallelism likewise
TIE = 0.005  # within 0.5%, the simpler configuration (earlier in the search order) wins
COMPLEXITY = 0.10
"""Robustness: TP/PP/EP, offload or an interleaved schedule must beat the plain data-parallel setup by more than
10% (each, by the tool's own figures) to be chosen. The model's speed error is about 5% median and 12% p90
(bench/plan_accuracy.py), so a smaller lead is within its error, while the extra machinery (Megatron-style
code, host RAM and a CPU optimizer) is a certain cost; the winner's `why` says when a faster or cheaper
configuration was passed over for this."""


class PlanRequest(BaseModel):
    """What to plan for: the job (model, method, tokens, batch) and the constraints."""

    model_config = ConfigDict(allow_inf_nan=False)

    job: JobSpec
    by: Literal["cost", "time"] = "cost"
    top: int = Field(5, ge=1, le=100)
    max_usd: float | None = Field(None, gt=0)
    deadline_hours: float | None = Field(None, gt=0)
    clouds: list[str] | None = None
    instances: list[str] | None = None
    max_nodes: int = Field(16, ge=1, le=1024)
    min_gpu_mem_gib: float | None = Field(None, gt=0)
    memory_margin: float = Field(GPU_MARGIN, ge=0, le=0.5, description="fraction of GPU memory kept free (plan/fit.py); "
                                 "the bounds of JobSpec.memory_margin")
    spot_mtbf_h: float | None = Field(None, gt=0)
    optimistic: bool = Field(False, description="rank GPUs whose efficiency is assumed by their point estimate, "
                                                "not the pessimistic end of their range")
    framework: Literal["auto", "torchtitan", "deepspeed", "megatron", "hf-tp"] = Field(
        "auto", description="recommend only rows this framework runs as planned (recipes/); auto: any, "
                            "each row in the first that runs it")
    calibration: CalibrationFile | None = Field(None, description="calibrated factors for the rows on its GPU "
                                                                  "(plan/calibration_file.py)")

    _framework_from_job: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _the_jobs_framework(self) -> "PlanRequest":
        """A job that names its framework (JobSpec.framework) is planned on it unless the request names one (auto
        included: `plan --job J --framework auto` plans every framework again)."""
        if "framework" not in self.model_fields_set and self.job.framework not in (None, "auto"):
            self.framework = self.job.framework
            self._framework_from_job = True
        return self


class PlanRow(BaseModel):
    rank: int
    why: str
    framework: str = Field(description="the framework that runs this row as planned (its recipe's)")
    estimate: EstimateResult
    live: LiveRow | None = Field(None, description="plan --live: can it launch now, live price, worst case")


def _power_ranges(catalog: Catalog, excluded: list[Exclusion]) -> str:
    """The power-limit range the model covers on each GPU of the excluded instances, from the catalog's rated power
    ("" where none has a range): " (h100-80gb 400-700 W, b200 700-1000 W)"."""
    ranges = []
    for name in sorted({catalog.instance(e.instance).gpu for e in excluded}):
        gpu = catalog.gpus[name]
        pair = POWER_PAIRS.get(gpu.arch)
        if pair is not None and gpu.power_w:
            ranges.append(f"{gpu.name} {pair.low_fraction * gpu.power_w:.0f}-{gpu.power_w:.0f} W")
    return f" ({', '.join(ranges)})" if ranges else ""


class Exclusion(BaseModel):
    instance: str
    reason: str


class Alternative(BaseModel):
    instance: str
    nodes: int
    total_usd: float | None = Field(description="point estimate, as the rows show theirs")
    train_hours: float | None = Field(description="point estimate, as the rows show theirs")
    tokens_per_s: float
    assumed: bool = Field(False, description="its GPU's efficiency factors are assumed: the figures are the point of a "
                                             "range, and it is ranked by the pessimistic end (marked ~ in text)")


class Candidate(BaseModel):
    """A point of plan --html's cost-vs-time chart: the best configuration of one instance at one node count."""

    instance: str
    nodes: int
    gpus: int
    strategy: str
    total_usd: float | None = Field(description="for --tokens, else per 1B tokens; None: no price")
    train_hours: float = Field(description="for --tokens, else per 1B tokens")
    tokens_per_s: float
    row: int | None = Field(description="its rank among the shown rows; None: not shown")


class PlanResult(BaseModel):
    schema_version: int = PLAN_SCHEMA_VERSION
    model: str
    params: int
    method: str
    tokens: float | None
    ranked_by: str
    global_batch: int
    seq_len: int
    rows: list[PlanRow]
    excluded: list[Exclusion]
    others: list[Alternative] = Field(description="instances that fit but rank below the shown rows (their best)")
    framework: str = Field("auto", description="the framework asked for (--framework)")
    recipe: Recipe | None = Field(description="the best row's launch, in its framework")
    searched: int = Field(description="configurations evaluated")
    notes: list[str]
    live: LivePlan | None = Field(None, description="plan --live: where the live figures came from")
    candidates: list[Candidate] = Field(default_factory=list, description="the best configuration per instance and "
                                        "node count that fits within the limits, shown or not (plan --html)")

    def method_text(self) -> str:
        """The method as the header names it: the best row's, with its LoRA rank and targets (SetupInfo.method_text)."""
        return self.rows[0].estimate.setup.method_text() if self.rows else self.method


@dataclass
class _Best:
    setup: Setup
    mem: object
    step: object
    score: float
    usd: float | None = None
    hours: float = 0.0


@dataclass
class _InstanceLog:
    fitted: int = 0
    smallest_peak_gib: float = float("inf")
    smallest_at: str = ""
    smallest_parts: str = ""
    host: str = ""  # why an offloaded configuration that fit the GPU was dropped
    network: str = ""
    batch: str = ""
    price: str = ""
    over_limits: list[_Best] = field(default_factory=list)  # fit, but beyond --max-usd or --deadline-hours
    framework: str = ""  # why --framework cannot run a configuration (the first such reason)
    dispatch: str = ""  # why the job's --ep-dispatcher deepep cannot run a configuration (the first such reason)
    nodes_needed: int | None = None  # where nothing fit: the nodes ZeRO-3 would need (_exclusion_reason)


def _global_batch(job: JobSpec, seq_len: int) -> int:
    if job.global_batch:
        return job.global_batch
    target = max(1, round(1_048_576 / seq_len))
    return 1 << (target.bit_length() - 1) if target & (target - 1) else target  # power of two


def _base_setup(job: JobSpec, catalog: Catalog, inst: Instance, model, seq_len: int,
                calibration: CalibrationFile | None = None, framework: str = "auto") -> Setup | None:
    gpu = catalog.gpu_of(inst)
    if power_problem(job, gpu):
        return None  # excluded by the search's loop, with the reason
    precision = job.precision or default_precision(gpu)
    if not gpu.peak_tflops(precision) and precision != "fp32":
        return None
    st = job_stack(job)
    fp8_recipe = chosen_fp8_recipe(job, st.stack)
    if precision == "fp8" and fp8_recipe_problem(fp8_recipe, gpu):
        return None  # a Blackwell-only recipe on another GPU: _evaluate_instance says why
    check_fp8_recipe_precision(job, precision)
    if job.fp8_param_gather:  # refused where no strategy of the search could give it (the strategy is searched)
        fp8_param_gather_of(True, st.stack, precision=precision, recipe=fp8_recipe, method=job.method, offload="none",
                            strategy=st.stack.fp8_param_gather_strategy or "zero1")
    setup = Setup(model=model, gpu=gpu, instance=inst, nodes=1, gpus_per_node=inst.gpu_count, dp=inst.gpu_count,
                 tp=1, pp=1, strategy="zero3", micro_batch=1, grad_accum=1, seq_len=seq_len,
                 precision=precision, optimizer_dtype=optimizer_dtype_of(job.optimizer_dtype, st.stack, precision),
                 reduce_dtype=st.reduce_dtype,
                 gather_dtype=job.gather_dtype, checkpointing="none", offload="none", method=job.method,
                 lora_rank=job.lora_rank, lora_targets=check_targets(job.lora_targets, model, job.method),
                 lora_dropout=check_dropout(job.lora_dropout, job.method),
                 autocast_asked=check_autocast(job.autocast, job.method, st.stack, precision),
                 kernels=st.kernels, attention_kernel=st.attention_kernel,
                 inter_node_gbps=job.inter_node_gbps or inst.network_gbps, tokens=job.tokens, spot=job.spot,
                 region=job.region, usd_per_hour=job.usd_per_hour, keep_hot=job.keep_hot,
                 stack=st.stack.name, stack_named=job.stack is not None, framework=framework,
                 tp_overlap=bool(job.tp_overlap) and st.stack.tp_overlap is not None,
                 torch_compile=torch_compile_of(job.torch_compile, st.stack),
                 cuda_graphs=cuda_graphs_of(job.cuda_graphs, st.stack),
                 fp8_recipe=fp8_recipe, fp8_param_gather_asked=job.fp8_param_gather,
                 power_limit_w=job.power_limit_w, doc_len=job.doc_len, **moe_comm(job, model, st.stack, precision))
    check_doc_len(job.doc_len, seq_len, 1, model, st)
    return setup.with_(efficiency=efficiency_for(calibration, setup)) if calibration is not None else setup


def _ep_options(experts: int, ranks: int, ranks_per_node: int) -> list[int]:
    """Expert-parallel degrees to try (powers of two dividing the experts and `ranks`, the stage's GPUs / etp):
    1, the largest inside a node (NVLink; smaller ones keep more expert states per GPU for a similar
    all-to-all), across nodes in steps of 4x, and the largest."""
    valid = [1 << i for i in range(11) if experts % (1 << i) == 0 and ranks % (1 << i) == 0]
    local = max(e for e in valid if e <= max(1, ranks_per_node))
    return [1] + [e for e in valid if e > 1 and (e == local or e == valid[-1]
                                                 or (e > local and (e // local).bit_length() % 2 == 1))]


def _expert_layouts(experts: int, tp: int, dp: int, stage_per_node: int, etp_first: int) -> list[tuple[int, int]]:
    """(ep, etp) to try at one tp x dp: without EP, experts split like the dense MLP (etp = tp); with EP, the
    stack's convention (`etp_first`) at _ep_options' degrees and, when tp > 1, the other of expert TP = TP (EP
    out of the data-parallel ranks, Megatron-Core's default) and etp 1 (MoE parallel folding: EP over TP and
    data-parallel ranks, as torchtitan, transformers and Megatron-Bridge's recipes lay it out) at its largest
    degree only, where the two differ most (the search grows by one layout per tp > 1). Which of them a
    framework runs is framework_reason's to say."""
    out = [(1, tp)]
    for etp in dict.fromkeys((etp_first, tp, 1)):
        eps = [e for e in _ep_options(experts, tp * dp // etp, stage_per_node // etp) if e > 1]
        out += [(e, etp) for e in (eps if etp == etp_first else eps[-1:])]
    return out


CP_MIN_SEQ_LEN = 16384
"""Context parallelism is tried from this sequence length up: the published long-context recipes (torchtitan's
32k-256k Llama 3.1 runs, NeMo's 16k-128k long-context table) use it there; shorter sequences fit without it."""
CP_SIZES = (2, 4, 8)


def _cp_options(s: Setup, nodes: int) -> list[int]:
    """Context-parallel sizes to try: 1, and for long sequences the sizes that split them evenly (over packed,
    separately masked documents only where the stack splits each document: Stack.cp_over_documents)."""
    if s.seq_len < CP_MIN_SEQ_LEN or (s.doc_len and not get_stack(s.stack).cp_over_documents):
        return [1]
    return [1] + [c for c in CP_SIZES if s.seq_len % (2 * c) == 0 and (nodes * s.gpus_per_node) % c == 0
                  and (s.doc_len or s.seq_len) >= 2 * c]


def _parallel_options(s: Setup, nodes: int) -> list[tuple[int, int, int, int, int]]:
    """(tp, pp, cp, ep, etp) to try; ep > 1 (and etp != tp) for MoE models only, cp > 1 for long sequences."""
    m = s.model
    n = m.param_count()
    # tp divides a node's GPUs (setup._check_parallel): tp 4 on 6-GPU nodes would span two nodes
    tps = [t for t in (1, 2, 4, 8) if s.gpus_per_node % t == 0 and (t == 1 or n >= TP_MIN_PARAMS)
           and tp_splits_heads(m, t)]
    # stages that divide the layers, and uneven ones (setup.pipeline_split, the extra layers on the first stages)
    # beyond the largest even one: Llama 3.1 405B's 126 layers split evenly only in 2, too few to hold it on
    # 16 nodes under Megatron's ZeRO-1; DeepSeek-V3's 61 in none
    even = [p for p in (2, 4, 8) if m.num_layers % p == 0]
    pps = [1] + [p for p in (2, 4, 8) if p <= m.num_layers and (p in even or p > max(even, default=1))
                 and n >= PP_MIN_PARAMS]
    gpus = nodes * s.gpus_per_node
    stack = get_stack(s.stack)
    experts = lambda t, p: (_expert_layouts(m.moe.num_experts, t, gpus // (t * p), s.gpus_per_node,  # noqa: E731
                                            default_etp(stack, t, 2)) if m.moe else [(1, t)])
    return [(t, p, c, e, et) for c in _cp_options(s, nodes) for t in tps for p in pps if gpus % (t * p * c) == 0
            for e, et in experts(t, p)]  # experts fold over the context-parallel ranks too (setup._check_ep)


VIRTUAL_STAGES = (2, 4)
"""Interleaved (virtual) pipeline stages per rank `plan` tries on a pipelined row: Narayanan et al. 2021 show
the bubble (pp - 1)/(v m) falling with v at the cost of v x the stage-boundary sends; 2 and 4 are what
Megatron-LM's and torchtitan's published recipes use."""


def _interleaved(s: Setup, mem, step, limit_gib: float, framework: str):
    """A pipelined row with the interleaved schedule instead of plain 1F1B where that is faster, fits, and the
    framework runs it: v virtual stages per rank (VIRTUAL_STAGES), a layer or more each (an uneven split where the
    framework lays it out: Megatron's --pipeline-model-parallel-layout; framework_for says where not) with
    micro-batches in whole groups of pp (setup._check_virtual).
    Like TP/PP, it is more to run, so it must be COMPLEXITY faster; a 1F1B bubble, (pp - 1)/m of the
    compute, smaller than that cannot pay for it and is not tried (this keeps the search's time)."""
    if s.pp == 1 or s.grad_accum % s.pp or (s.pp - 1) / s.grad_accum < COMPLEXITY:
        return s, mem, step
    best = (s, mem, step)
    for v in VIRTUAL_STAGES:
        if s.model.num_layers < s.pp * v:  # a layer per virtual stage; uneven splits where the recipe lays them out
            continue
        tried = _runnable(s.with_(pp_virtual=v), limit_gib, framework)
        if tried is not None and _pays(tried, best, step):
            best = tried
    return best


def _runnable(cand: Setup, limit_gib: float, framework: str):
    """(cand on its framework, its memory, its step) where a framework runs it and it fits, else None: a variant of a
    fitting row that the search tries (_interleaved, _moe_dispatch)."""
    runs_on, why_not = framework_for(cand, framework)
    if why_not:
        return None
    cand = cand.with_(runs_on=runs_on)
    ok, mem = _fits(cand, limit_gib)
    return (cand, mem, estimate_step(cand)) if ok else None


def _pays(tried, best, step) -> bool:
    """A variant is more to run: it replaces the best so far when faster and COMPLEXITY faster than the row's `step`."""
    tps = tried[2].tokens_per_s
    return tps > best[2].tokens_per_s and tps >= step.tokens_per_s * (1 + COMPLEXITY)


def checkpointing_options(base: Setup) -> list[tuple[str, tuple[str, ...]]]:
    """(checkpointing, Megatron's recompute modules) the search tries: none and full, and for a MoE model on the
    megatron stack the modules NVIDIA's published MoE recipes recompute (plan/recompute.py): mla_up_proj and mlp
    with MLA (Megatron-MoE-ModelZoo best_practice/DeepSeekV3/run.sh, H100), else layernorm and moe_act
    (best_practice/qwen3, H100), which Megatron-Core refuses under delayed FP8 scaling."""
    out: list[tuple[str, tuple[str, ...]]] = [("none", ()), ("full", ())]
    m = base.model
    if base.stack != "megatron" or not m.is_moe or base.method != "full":
        return out
    if m.mla is not None:
        return out + [("selective-attn", ("mla_up_proj", "mlp"))]
    if base.precision == "fp8" and base.fp8_recipe == "delayed":
        return out
    return out + [("selective-attn", ("layernorm", "moe_act"))]


def _moe_dispatch(job: JobSpec, s: Setup, mem, step, limit_gib: float, framework: str, overlap_asked: bool = False):
    """A Megatron MoE row with what NVIDIA's published MoE recipes on H100 run instead of Megatron-Core's defaults
    (Megatron-MoE-ModelZoo best_practice/DeepSeekV3 and qwen3, 'Enable DeepEP', 'Enable EP A2A overlapping'): DeepEP
    (the flex dispatcher: a token sent once per node, forwarded over NVLink) where its expert-parallel group spans
    nodes and deepep_reason allows it, and the EP all-to-all overlapped with another micro-batch where Megatron-Core
    allows it (pp 1, or virtual stages under pp > 1, tried with them; not under full recompute). Each is more to
    run (DeepEP one more library), so a variant must be COMPLEXITY faster, as interleaving must. A dispatcher or
    overlap the job names is kept; `overlap_asked`: the job asked for the overlap, which this row could not run
    without virtual stages: the best overlapped variant that fits is taken without the margin."""
    if s.stack != "megatron" or not s.model.is_moe or s.ep <= 1:
        return s, mem, step
    dispatchers = [job.ep_dispatcher] if job.ep_dispatcher else ["alltoall"] + (
        ["deepep"] if ep_spans_nodes(s) and deepep_reason(s.with_(ep_dispatcher="deepep")) is None else [])
    virtual = [s.pp_virtual]
    if s.pp > 1 and s.pp_virtual == 1 and s.grad_accum % s.pp == 0:  # the overlap needs virtual stages there
        virtual += [v for v in VIRTUAL_STAGES if s.model.num_layers >= s.pp * v]
    overlaps = [] if job.ep_overlap is False or s.checkpointing == "full" else [v for v in virtual
                                                                             if s.pp == 1 or v > 1]
    tries = [s.with_(ep_dispatcher=d, ep_overlap=False) for d in dispatchers]
    tries += [s.with_(ep_dispatcher=d, ep_overlap=True, pp_virtual=v) for d in dispatchers for v in overlaps]
    best, taken = (s, mem, step), False
    for cand in tries:
        if (cand.ep_dispatcher, cand.ep_overlap, cand.pp_virtual) == (s.ep_dispatcher, s.ep_overlap, s.pp_virtual):
            continue
        tried = _runnable(cand, limit_gib, framework)
        if tried is None:
            continue
        if overlap_asked and cand.ep_overlap:
            if not (taken and tried[2].tokens_per_s <= best[2].tokens_per_s):
                best, taken = tried, True
        elif not taken and _pays(tried, best, step):
            best = tried
    return best


def _limit_gib(req: PlanRequest, gpu) -> float:
    """GPU memory a setup may use: the card less the safety margin."""
    return gpu_limit_gib(gpu.memory_gib, req.memory_margin)


def _fits(s: Setup, limit_gib: float) -> tuple[bool, object]:
    mem = estimate_memory(s)
    return mem.peak / GiB <= limit_gib, mem


def _largest_fitting(s: Setup, per_dp: int, limit_gib: float):
    """Largest micro-batch dividing the per-rank batch that fits (memory grows with it)."""
    options = [mb for mb in MICRO_BATCHES if per_dp % mb == 0]
    best = None
    lo, hi = 0, len(options) - 1
    smallest = None
    while lo <= hi:
        mid = (lo + hi) // 2
        cand = s.with_(micro_batch=options[mid], grad_accum=per_dp // options[mid])
        ok, mem = _fits(cand, limit_gib)
        if mid == 0:
            smallest = mem
        if ok:
            best = (cand, mem)
            lo = mid + 1
        else:
            hi = mid - 1
    if smallest is None and options:
        smallest = estimate_memory(s.with_(micro_batch=options[0], grad_accum=per_dp // options[0]))
    return best, smallest


def largest_fitting_micro_batch(s: Setup, memory_margin: float = GPU_MARGIN) -> tuple[Setup, str]:
    """For `estimate` without --micro-batch: the largest micro-batch dividing the per-GPU
    batch that fits the GPU by the fit rule (plan/fit.py; micro-batch 1 if none does)."""
    s = on_its_framework(s)  # its memory is that framework's, as estimate_setup then counts it
    per_dp = s.global_batch // s.dp
    chosen = s.with_(micro_batch=1, grad_accum=per_dp)
    fits = False
    for mb in (m for m in MICRO_BATCHES if s.micro_batch_allowed(m)):  # as resolve() would take it
        cand = s.with_(micro_batch=mb, grad_accum=per_dp // mb)
        if estimate_memory(cand).peak / GiB > gpu_limit_gib(s.gpu.memory_gib, memory_margin):
            break
        chosen, fits = cand, True
    if fits:
        return chosen, (f"micro-batch {chosen.micro_batch}: the largest that fits with the {memory_margin:.0%} margin "
                        f"(no --micro-batch given)")
    if estimate_memory(chosen).peak / GiB <= chosen.gpu.memory_gib:  # on the card, inside the margin only
        return chosen, (f"micro-batch 1 (no --micro-batch given): even that leaves less than the {memory_margin:.0%} "
                        f"margin free")
    return chosen, "micro-batch 1 (no --micro-batch given): even that does not fit"


def _score(req: PlanRequest, s: Setup, mem, tps: float) -> tuple[float, float | None, float]:
    """(rank key, total usd or None, hours), for --tokens or else per 1B tokens: the very
    figures the rows show (checkpoint and failure overheads included), so the ranking, the
    limits and the table agree."""
    tps = ranking_tokens_per_s(s, tps, req.optimistic)  # low confidence: the pessimistic end
    rc = run_cost(s, mem.checkpoint_bytes, tps, req.job.tokens or 1e9, spot_mtbf_h=req.spot_mtbf_h)
    usd, hours = rc.total_usd, rc.train_h
    if req.by == "time":
        return hours, usd, hours
    return (usd if usd is not None else float("inf")), usd, hours


HIDDEN_SAVING = 0.2
"""A row a default or a limit keeps out of the plan is named, with the flag that reaches it, when it costs this
fraction less than the best row shown: twice the COMPLEXITY margin, beyond the model's error."""
BEYOND_CAP_PROBES = 2  # instances tried past --max-nodes: the cheapest whose search stopped at the cap


def _usd_per_gpu_hour(inst: Instance) -> float:
    price = inst.price_for("on-demand")
    return price.usd_per_hour / inst.gpu_count if price is not None and price.usd_per_hour else float("inf")


def _beyond_the_cap(req: PlanRequest, catalog: Catalog, model, seq_len: int, gb: int, candidates: list[_Best],
                    needing_more: list[Instance]) -> str | None:
    """A note when --max-nodes keeps out a much cheaper plan: where the cheapest row uses the most nodes allowed
    (or an instance needs more than that), its instance and those are tried at up to 4x the cap."""
    capped = [n for n in NODE_COUNTS if n <= req.max_nodes]
    if req.by != "cost" or req.max_nodes >= NODE_COUNTS[-1] or not capped:
        return None
    winner = min(candidates, key=lambda c: c.score) if candidates else None
    if winner is not None and winner.setup.nodes < capped[-1]:
        return None  # the cheapest row did not need the most nodes allowed: the cap does not bind
    probes = [winner.setup.instance.name] if winner is not None else []
    # the cheapest GPUs first: the probe tries few instances, and a run's cost follows the price of its GPU-hours
    probes += [i.name for i in sorted(needing_more, key=_usd_per_gpu_hour)]
    wider = req.model_copy(update={"max_nodes": min(4 * req.max_nodes, NODE_COUNTS[-1])})
    found: list[_Best] = []
    for name in list(dict.fromkeys(probes))[:BEYOND_CAP_PROBES]:
        more, _, _ = _evaluate_instance(wider, catalog, catalog.instance(name), model, seq_len, gb,
                                        min_nodes=capped[-1] + 1)
        found += more
    if not found:
        return None
    past = min(found, key=lambda c: c.score)
    shown = winner.score if winner is not None else float("inf")
    if past.usd is None or past.score > (1 - HIDDEN_SAVING) * shown:
        return None
    than = (f"{shown / past.score:.1f}x less than the best within it" if shown != float("inf")
            else "where nothing fits within it")
    return (f"--max-nodes {req.max_nodes} keeps out a cheaper plan: {past.setup.nodes} x "
            f"{past.setup.instance.name} costs {usd_text(past.usd)}, {than}: plan again with "
            f"--max-nodes {past.setup.nodes}")


OWN_STACKS = ("megatron", "torchtitan")  # the frameworks whose kernels and recompute have a stack of their own


def _other_stack(req: PlanRequest, catalog: Catalog, model, seq_len: int, gb: int, row: PlanRow) -> str | None:
    """A note when the default stack (a Hugging Face model's eager kernels) hides a much cheaper run on the best
    row's instance under Megatron's or torchtitan's own stack: that instance and node count searched again under
    each. A best row that offloads (its states fit no other way on the default stack) is searched at more nodes
    too, up to 4x --max-nodes: the layouts those stacks run (PP, EP with DeepEP) may fit there without offload,
    as DeepSeek-V3's published runs do on 1,024 H100 where the default stack offloads at a few % MFU."""
    job = req.job
    if job.stack is not None or job.method != "full" or req.by != "cost" or req.calibration is not None:
        return None
    if req.framework not in ("auto", *OWN_STACKS):
        return None
    shown = row.estimate.cost.total_usd if job.tokens else row.estimate.cost.usd_per_billion_tokens
    inst = catalog.instance(row.estimate.setup.instance)
    best: _Best | None = None
    nodes = row.estimate.setup.nodes  # its node count only (the search's time stays the plan's), but for offload
    most = min(4 * req.max_nodes, NODE_COUNTS[-1]) if row.estimate.setup.offload != "none" else nodes
    for name in OWN_STACKS if req.framework == "auto" else (req.framework,):
        other = req.model_copy(update={"job": job.model_copy(update={"stack": name}), "max_nodes": most})
        try:
            found, _, _ = _evaluate_instance(other, catalog, inst, model, seq_len, gb, min_nodes=nodes)
        except UsageError:  # the job asks for something that stack refuses
            continue
        for c in found:
            if c.usd is not None and (best is None or c.usd < best.usd):
                best = c
    if best is None or not shown or best.usd > (1 - HIDDEN_SAVING) * shown:
        return None
    s = best.setup
    return (f"the default stack (a Hugging Face model's eager kernels) prices the best row at {usd_text(shown)}; "
            f"{s.stack}'s own kernels and recompute run {_nodes(s.nodes)} x {inst.name} for {usd_text(best.usd)} "
            f"({1 - best.usd / shown:.0%} less): plan again with --stack {s.stack}"
            + (f" --max-nodes {s.nodes}" if s.nodes > req.max_nodes else ""))


def _evaluate_instance(req: PlanRequest, catalog: Catalog, inst: Instance, model, seq_len: int,
                       gb: int, min_nodes: int = 1) -> tuple[list[_Best], _InstanceLog, int]:
    log = _InstanceLog()
    base = _base_setup(req.job, catalog, inst, model, seq_len, req.calibration, req.framework)
    if base is None:
        recipe = chosen_fp8_recipe(req.job, job_stack(req.job).stack)
        log.batch = ((req.job.precision == "fp8" and fp8_recipe_problem(recipe, catalog.gpu_of(inst)))
                     or f"--precision {req.job.precision} is not supported on {inst.gpu}")
        return [], log, 0
    limit = _limit_gib(req, base.gpu)
    ckpt_options = checkpointing_options(base)  # the same for every node count and layout
    results: list[_Best] = []
    searched = 0
    for nodes in NODE_COUNTS:
        if nodes > req.max_nodes:
            break
        if nodes < min_nodes:
            continue
        if nodes > 1 and base.inter_node_gbps is None:
            log.network = ("its network bandwidth is not in the catalog, so only 1 node was planned "
                           "(give --inter-node-gbps)")
            break
        for strategy, offload in STRATEGIES:  # every variant that fits is compared (_best_per_nodes ranks them)
            for tp, pp, cp, ep, etp in _parallel_options(base, nodes):
                if pp > 1 and strategy not in ("ddp", "zero1"):
                    continue  # ZeRO-2/3 do not combine with pipeline stages (DeepSpeed, FSDP)
                n = nodes * base.gpus_per_node
                dp = n // (tp * pp * cp)
                if gb % dp:
                    log.batch = log.batch or (f"global batch {gb} is not divisible by data-parallel size {dp} "
                                              f"(nearest valid: {nearest_multiples(gb, dp)})")
                    continue
                per_dp = gb // dp
                for ckpt, modules in ckpt_options:
                    s = base.with_(nodes=nodes, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, strategy=strategy,
                                   offload=offload, checkpointing=ckpt, recompute_modules=modules)
                    # the job's EP overlap needs virtual stages under PP: planned without, given them by _moe_dispatch
                    overlap_dropped = s.ep_overlap and s.pp > 1 and s.stack == "megatron"
                    if overlap_dropped:
                        s = s.with_(ep_overlap=False)
                    runs_on, why_not = framework_for(s, req.framework)
                    if why_not:  # not recommended: the framework would not run what the row says
                        log.framework = log.framework or why_not
                        continue
                    s = s.with_(runs_on=runs_on)  # its memory is that framework's (Setup.on_deepspeed)
                    if s.ep > 1 and s.ep_dispatcher == "deepep" and (no_deepep := deepep_reason(s)):
                        log.dispatch = log.dispatch or f"--ep-dispatcher deepep with --ep {s.ep}: {no_deepep}"
                        continue  # the job asked for DeepEP: a row that cannot run it is not offered
                    searched += 1
                    best, smallest = _largest_fitting(s, per_dp, limit)
                    if smallest is not None and smallest.peak / GiB < log.smallest_peak_gib:
                        log.smallest_peak_gib = smallest.peak / GiB
                        off = f"+offload {offload}" if offload != "none" else ""
                        par = layout_text(tp, pp, 1, ep, etp, cp)
                        log.smallest_at = (f"{nodes} node(s), {strategy}{off}, {par}, ckpt "
                                           f"{modules_text(modules) if modules else ckpt}")
                        parts = {"weights": smallest.weights, "gradients": smallest.gradients,
                                 "optimizer": smallest.optimizer, "activations": smallest.activations}
                        top = sorted(parts.items(), key=lambda kv: -kv[1])[:2]
                        log.smallest_parts = ", ".join(f"{k} {v / GiB:,.1f}" for k, v in top)
                    if best is None:
                        continue
                    cand, mem = best
                    fit = fit_of(mem.peak / GiB, cand.gpu.memory_gib, mem.host_per_node / GiB, inst.ram_gib,
                                 req.memory_margin)
                    if fit.host_fits is False:
                        what = "offloading" if offload != "none" else "the job"
                        log.host = log.host or (f"{what} needs {fit.host_text()}, at {nodes} node(s) "
                                                f"({strategy}{'+offload ' + offload if offload != 'none' else ''})")
                        continue
                    step = estimate_step(cand)
                    cand, mem, step = _interleaved(cand, mem, step, limit, req.framework)
                    cand, mem, step = _moe_dispatch(req.job, cand, mem, step, limit, req.framework,
                                                    overlap_asked=overlap_dropped)
                    key, usd, hours = _score(req, cand, mem, step.tokens_per_s)
                    if req.by == "cost" and usd is None:
                        model_name = "spot" if req.job.spot else "on-demand"
                        p = inst.price_for(model_name, req.job.region)
                        where = f" in {req.job.region}" if req.job.region else ""
                        elsewhere = sorted({q.region for q in inst.price if q.model == model_name
                                            and q.usd_per_hour is not None} - {req.job.region})
                        log.price = (f"no {model_name} price{where} in the catalog"
                                     + (f" ({p.note})" if p is not None and p.note else "")
                                     + (f" (it has one in {', '.join(elsewhere)})" if where and elsewhere else "")
                                     + "; give --usd-per-hour" + ("" if req.job.spot else " or try --spot"))
                        continue
                    log.fitted += 1
                    found = _Best(cand, mem, step, key, usd, hours)
                    if ((req.max_usd is not None and usd is not None and usd > req.max_usd)
                            or (req.deadline_hours is not None and hours > req.deadline_hours)):
                        log.over_limits.append(found)  # kept to say what the limits cost this instance
                        continue
                    results.append(found)
    return results, log, searched


def _states_tb(model, method: str) -> float:
    per = 16 if method == "full" else 2
    return per * model.param_count() / 1e12


def _exclusion_reason(req: PlanRequest, inst: Instance, log: _InstanceLog, model, catalog: Catalog) -> str:
    gpu = catalog.gpu_of(inst)
    if log.price:
        return "fits, but " + log.price
    if log.fitted == 0:
        if log.smallest_peak_gib == float("inf"):
            if log.framework:
                return f"--framework {req.framework} runs none of its configurations: {log.framework}"
            return log.batch or log.network or log.dispatch or "no configuration could be formed"
        nodes_needed = log.nodes_needed = _nodes_needed(req, inst, model, catalog)
        tail = ""
        if nodes_needed:
            # counted with ZeRO-3 (_zero3_at): said so, since a framework without it may not fit on as many
            tail = f", which needs >= {nodes_needed} nodes" + ("" if log.host else " with ZeRO-3/FSDP")
            if inst.network_gbps:
                tail += f" over {inst.network_gbps:g} Gbps"
                if nodes_needed > req.max_nodes:
                    tail += f" (more than --max-nodes {req.max_nodes})"
                tail += "; communication-bound" if _comm_bound(req, inst, model, catalog, nodes_needed) else ""
        within = "on 1 node" if log.network else f"within --max-nodes {req.max_nodes}"
        if log.dispatch:  # the skipped layouts were never sized: what did not fit is only what DeepEP could run
            return (f"not planned: {log.dispatch}; the layouts DeepEP could run here do not fit {within} (least: "
                    f"{log.smallest_peak_gib:,.1f} GiB per GPU at {log.smallest_at}); --ep-dispatcher alltoall "
                    f"plans the others" + (f"; {log.network}" if log.network else "") + _way_forward(req, model, gpu))
        if req.job.method == "full":
            head = (f"full training of {model.param_count() / 1e9:.0f}B holds ~{_states_tb(model, 'full'):,.2f} TB "
                    f"of model states; {inst.gpu_count}x{gpu.memory_gib:g} GiB cannot hold them {within}")
        else:
            head = (f"{req.job.method} of {model.param_count() / 1e9:.0f}B does not fit "
                    f"{inst.gpu_count}x{gpu.memory_gib:g} GiB {within}")
        if log.host and log.smallest_peak_gib <= _limit_gib(req, gpu):
            detail = f"even with ZeRO-3{tail}; {log.host}"
        else:
            detail = (f"(least: {log.smallest_peak_gib:,.1f} GiB per GPU at {log.smallest_at}; "
                      f"largest parts {log.smallest_parts} GiB){tail}")
        fw = f"; others not run by --framework {req.framework}: {log.framework}" if log.framework else ""
        return f"{head} {detail}" + (f"; {log.network}" if log.network else "") + fw + _way_forward(req, model, gpu)
    if log.over_limits:
        return "fits, but " + _over_limits(req, log.over_limits)
    return "fits, ranked below the shown rows"


def _way_forward(req: PlanRequest, model, gpu) -> str:
    """The real limit and the next thing to try, where the reasons above alone would leave the user stuck."""
    if not model.moe or req.job.method == "full":
        return ""
    layer = model.param_count() / model.num_layers
    return (f". The limit: without expert parallelism ZeRO-3 gathers whole MoE layers ({layer / 1e9:,.1f}B "
            f"parameters, {2 * layer / 1e9:,.0f} GB in bf16 each, two at a time) on every GPU, and no recipe "
            f"trainready writes runs {req.job.method} with EP (Megatron-Bridge's PEFT and NeMo AutoModel do). "
            f"Next: --method full (EP recipes exist), a GPU with more than {gpu.memory_gib:g} GiB, "
            f"or a framework with {req.job.method} + EP outside trainready's recipes")


def _over_limits(req: PlanRequest, over: list[_Best]) -> str:
    """Why no setup of an instance meets --max-usd / --deadline-hours: its cheapest and its fastest setup, the
    very ones the limits were compared with (not the simpler setups the ranking may prefer within its margin)."""
    priced = [c for c in over if c.usd is not None]
    cheapest = min(priced, key=lambda c: (c.usd, c.hours)) if priced else None
    fastest = min(over, key=lambda c: (c.hours, c.usd if c.usd is not None else float("inf")))
    what = "costs" if req.job.tokens else "costs per 1B tokens"
    parts = []
    ends = " (the pessimistic end of its range, which the limits use)"
    if req.max_usd is not None and cheapest is not None and cheapest.usd > req.max_usd:
        parts.append(f"its cheapest setup ({_nodes(cheapest.setup.nodes)}) {what} {usd_text(cheapest.usd)}"
                     f"{ends if _ranked_pessimistic(req, cheapest) else ''} > --max-usd {usd_text(req.max_usd)}")
    if req.deadline_hours is not None and fastest.hours > req.deadline_hours:
        parts.append(f"its fastest setup ({_nodes(fastest.setup.nodes)}) takes {hours_text(fastest.hours)}"
                     f"{ends if _ranked_pessimistic(req, fastest) else ''} > --deadline-hours {req.deadline_hours:g}")
    if parts:
        return "; ".join(parts)
    return (f"no setup is within both --max-usd {usd_text(req.max_usd)} and --deadline-hours "
            f"{req.deadline_hours:g}: the cheapest {what} {usd_text(cheapest.usd)} in {hours_text(cheapest.hours)}, "
            f"the fastest takes {hours_text(fastest.hours)} for {usd_text(fastest.usd)}")


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _best_per_nodes(candidates: list[_Best], value=lambda c: c.score) -> dict[tuple[str, int], _Best]:
    """The configuration kept per (instance, nodes) by `value` (the rank key unless told):
    candidates come in order of simplicity, so the first stays unless a later one is clearly
    better (by more than TIE, after the handicap for tensor/pipeline parallelism and offload)."""
    best_per: dict[tuple[str, int], _Best] = {}
    for c in candidates:
        key = (c.setup.instance.name, c.setup.nodes)
        if key not in best_per or _adjusted(c, value(c)) < _adjusted(best_per[key], value(best_per[key])) * (1 - TIE):
            best_per[key] = c
    return best_per


def _zero3_at(req: PlanRequest, inst: Instance, model, catalog: Catalog, nodes: int):
    """The leanest plain configuration at `nodes`: ZeRO-3, full recompute, smallest micro-batch."""
    seq_len = req.job.seq_len or default_seq_len(model)
    base = _base_setup(req.job, catalog, inst, model, seq_len, req.calibration, req.framework)
    if base is None:
        return None
    n = nodes * inst.gpu_count
    gb = max(_global_batch(req.job, seq_len), n)
    return on_its_framework(base.with_(nodes=nodes, dp=n, strategy="zero3", checkpointing="full", micro_batch=1,
                                       grad_accum=max(1, gb // n), inter_node_gbps=base.inter_node_gbps or 100.0))


def _nodes_needed(req: PlanRequest, inst: Instance, model, catalog: Catalog) -> int | None:
    limit = _limit_gib(req, catalog.gpu_of(inst))
    for nodes in [*range(1, 65), 96, 128, 192, 256, 384, 512, 768, 1024]:
        s = _zero3_at(req, inst, model, catalog, nodes)
        if s is None:
            return None
        if estimate_memory(s).peak / GiB <= limit:
            return nodes
    return None


def _comm_bound(req: PlanRequest, inst: Instance, model, catalog: Catalog, nodes: int) -> bool:
    step = estimate_step(_zero3_at(req, inst, model, catalog, nodes))
    return step.exposed_comm_s / step.step_s > 0.3


def _machinery(s: Setup) -> dict[str, str]:
    """What a setup needs beyond plain data parallelism, piece by piece (kind: what it is): tensor/pipeline/expert/
    context parallelism needs Megatron-style code, offload needs host RAM and a CPU optimizer."""
    parallel = [name for name, size in (("tensor", s.tp), ("pipeline", s.pp), ("expert", s.ep), ("context", s.cp))
                if size > 1]
    pieces = {"parallelism": f"{'/'.join(parallel)} parallelism"} if parallel else {}
    return pieces | ({"offload": "offload"} if s.offload != "none" else {})


def _adjusted(c: _Best, value: float) -> float:
    """A score with a handicap of COMPLEXITY for each piece of machinery the setup needs (_machinery)."""
    return value * (1.0 + COMPLEXITY * len(_machinery(c.setup)))


def _ranked_pessimistic(req: PlanRequest, b: _Best) -> bool:
    """The row is ranked by the pessimistic end of its range (assumed efficiency factors), not by the point
    estimate its table row shows."""
    return ranking_tokens_per_s(b.setup, b.step.tokens_per_s, req.optimistic) != b.step.tokens_per_s


def _passed_over(req: PlanRequest, shown: list[_Best], i: int) -> tuple[int, _Best, bool] | None:
    """The first row shown below row `i` (1-based) that is better by the figures the ranking uses and sits below
    only for the handicap on its extra machinery: (its rank, it, whether it is ranked by a pessimistic end). Any
    lead counts: the rows' own "+X% vs #1" can differ by one point for a lead under TIE."""
    c = shown[i - 1]
    for j, d in enumerate(shown[i:], start=i + 1):
        if d.score < c.score and set(_machinery(d.setup)) - set(_machinery(c.setup)):
            return j, d, _ranked_pessimistic(req, d)
    return None


def _pessimistic_ends(this: bool, other: bool, this_label: str = "", other_label: str = "") -> str:
    """Which of two compared figures are the pessimistic ends of ranges (what the ranking used; the table shows
    points), each named by its label ("" : the sentence's subject)."""
    if this and other:
        return " (both at the pessimistic ends of their ranges, as ranked)"
    label = this_label if this else other_label if other else None
    if label is None:
        return ""
    return f" ({label + ' ' if label else ''}at the pessimistic end of its range, as ranked)"


def describe(s: Setup) -> str:
    """A configuration in short, as the rows print it."""
    off = f"+offload {s.offload}" if s.offload != "none" else ""
    return f"{_nodes(s.nodes)} x {s.instance.name}, {s.strategy}{off}, {layout_text(s.tp, s.pp, s.pp_virtual, s.ep, s.expert_tp, s.cp)}"


def _pct(x: float) -> str:
    """A lead in percent: one decimal under 1% (a lead that small still orders rows)."""
    return f"{x:.1f}%" if x < 1 else f"{x:.0f}%"


def _why(rank: int, best: _Best, first: _Best, by: str, est: EstimateResult, top: _Best | None = None,
         passed: tuple[int, _Best, bool] | None = None, pessimistic: tuple[bool, bool] = (False, False),
         top_pessimistic: bool = False, ranged_below: bool = False) -> str:
    """The row's reason, true by the tool's own figures. `top`: the best-scoring configuration of all that
    fit; when the first row is not it (a simpler one within COMPLEXITY won), the first row says so. `passed`:
    the first row shown below this one that scores better by the model (rank, configuration): this row is
    above it only for being simpler, and says so. `pessimistic`: whether this row and #1 are ranked by the
    pessimistic end of a range (said beside the figures they compare); `top_pessimistic`: likewise for `top`;
    `ranged_below`: a row shown below #1 is ranked by its pessimistic end (its point may be below #1's)."""
    mem_pct = est.memory.per_gpu_gib.peak / est.memory.gpu_gib * 100
    comm_pct = est.throughput.step_breakdown_s.exposed_communication / est.throughput.step_time_s * 100
    facts = f"MFU {est.throughput.mfu * 100:.0f}%, {mem_pct:.0f}% of GPU memory, {est.throughput.bottleneck}-bound"
    if comm_pct >= 1:
        facts += f" (exposed comm {comm_pct:.0f}%)"
    word = "cheapest" if by == "cost" else "fastest"
    if rank == 1:
        if top is not None and top is not best and top.score < best.score * (1 - TIE):
            lead = (1 - top.score / best.score) * 100
            ends = _pessimistic_ends(pessimistic[0], top_pessimistic, this_label="this row")
            return (f"simpler than the {word}: {describe(top.setup)} is {_pct(lead)} "
                    f"{'cheaper' if by == 'cost' else 'faster'} by the model{ends}, less than the {COMPLEXITY:.0%} per "
                    f"added piece of machinery it must beat (model error); " + facts)
        below = " (rows marked ~ at the pessimistic end of their ranges)" if ranged_below and not pessimistic[0] else ""
        return f"{word} that fits{_pessimistic_ends(*pessimistic, other_label='#1')}{' as ranked' + below if below else ''}; " + facts
    if passed is not None:
        below, other, other_pessimistic = passed
        lead = (1 - other.score / best.score) * 100
        mine = _machinery(best.setup)
        extra = " and ".join(v for k, v in _machinery(other.setup).items() if k not in mine)
        ends = _pessimistic_ends(pessimistic[0], other_pessimistic, "this row", f"#{below}")
        facts = (f"above #{below} for being simpler: #{below} "
                 f"{f'is {_pct(lead)} cheaper' if by == 'cost' else f'takes {_pct(lead)} less time'} by the model{ends} "
                 f"but needs {extra}, and the ranking charges {COMPLEXITY:.0%} per piece of machinery (model error); "
                 + facts)
    if by == "cost":
        rel = (best.score / first.score - 1) * 100 if first.score not in (0, float("inf")) else 0
        speed = first.step.tokens_per_s and best.step.tokens_per_s / first.step.tokens_per_s
        return f"{rel:+.0f}% cost vs #1{_pessimistic_ends(*pessimistic, other_label='#1')}, {speed:.2f}x its speed; " + facts
    rel = (best.score / first.score - 1) * 100
    return f"{rel:+.0f}% time vs #1{_pessimistic_ends(*pessimistic, other_label='#1')}; " + facts


def _framework_only(log: _InstanceLog) -> str | None:
    """The framework's reason when it alone excluded the instance (no configuration formed but for it)."""
    if log.price or log.fitted or log.smallest_peak_gib != float("inf"):
        return None
    return log.framework or None


def _refuse_static_conflict(req: PlanRequest, rows: list, whys: list[str | None]) -> None:
    """--framework X with a job X can never run (e.g. megatron with LoRA) is a usage error, not
    "nothing fits": every instance that formed configurations was excluded by the framework alone, for one and
    the same reason."""
    whys = [w for w in whys if w != ""]
    if rows or req.framework == "auto" or not whys:
        return
    distinct = set(whys)
    if len(distinct) == 1 and None not in distinct:
        named = (f'the job\'s framework = "{req.framework}" (--framework auto plans every framework)'
                 if req._framework_from_job else f"--framework {req.framework}")
        raise UsageError(f"{named} cannot run this job: {distinct.pop()}")


def plan(req: PlanRequest, catalog: Catalog) -> PlanResult:
    if req.job.region is not None:  # a typo is an error, not "nothing fits" for want of prices
        req = req.model_copy(update={"job": req.job.model_copy(update={"region": catalog.region(req.job.region)})})
    job = req.job
    model = resolve_model(job)
    stack = job_stack(job)  # an unknown --stack is exit 2 before any search
    if req.calibration is not None:  # a calibration is for one stack: another's factors would mislead
        check_stack(req.calibration, stack.stack.name)
    check_fp8_recipe_precision(job, job.precision)
    torch_compile_of(job.torch_compile, stack.stack)  # a stack without one is exit 2 before any search
    cuda_graphs_of(job.cuda_graphs, stack.stack)
    if not stack.stack.has_recipe:
        raise UsageError(f"--stack {stack.stack.name} estimates runs of {stack.stack.description.split(':')[0]}, "
                         f"which trainready does not launch (no recipe): use `trainready estimate --stack "
                         f"{stack.stack.name}` for one setup, or plan with --stack "
                         f"{', '.join(n for n, s in STACKS.items() if s.has_recipe)}")
    seq_len = job.seq_len or default_seq_len(model)
    gb = _global_batch(job, seq_len)
    wanted = None
    if req.instances:
        wanted = {catalog.instance(name).name for name in req.instances}
    clouds = {c.lower() for c in req.clouds} if req.clouds else None
    if clouds:
        known = {i.cloud for i in catalog.instances.values()}
        bad = clouds - known
        if bad:
            near = [n for b in sorted(bad) for n in closest(b, known)]
            hint = f"; did you mean: {', '.join(dict.fromkeys(near))}?" if near else ""
            raise UsageError(f"unknown cloud(s) {', '.join(printable(b) for b in sorted(bad))}{hint} "
                             f"Valid: {', '.join(sorted(known))}")
    candidates: list[_Best] = []
    excluded: list[Exclusion] = []
    framework_whys: list[str | None] = []  # per excluded instance: the framework's reason if it alone excluded it
    needing_more: list[Instance] = []  # excluded for needing more nodes than --max-nodes (where nodes can be costed)
    searched = 0
    for inst in sorted(catalog.instances.values(), key=lambda i: i.name):
        if wanted is not None and inst.name not in wanted:
            continue
        if clouds and inst.cloud not in clouds:
            continue
        gpu = catalog.gpu_of(inst)
        if req.min_gpu_mem_gib and gpu.memory_gib < req.min_gpu_mem_gib:
            reason = f"{gpu.memory_gib:g} GiB per GPU < --min-gpu-mem {req.min_gpu_mem_gib:g}"
            excluded.append(Exclusion(instance=inst.name, reason=reason))
            framework_whys.append(None)
            continue
        if power := power_problem(req.job, gpu):
            excluded.append(Exclusion(instance=inst.name, reason=power))
            framework_whys.append(None)
            continue
        found, log, n = _evaluate_instance(req, catalog, inst, model, seq_len, gb)
        searched += n
        if not found:
            excluded.append(Exclusion(instance=inst.name, reason=_exclusion_reason(req, inst, log, model, catalog)))
            if log.nodes_needed and log.nodes_needed > req.max_nodes and inst.network_gbps:
                needing_more.append(inst)
            # "": no configuration formed at all (the GPU cannot run the precision): no say either way
            framework_whys.append(_framework_only(log) if n or log.framework else "")
        candidates.extend(found)
    beyond = _beyond_the_cap(req, catalog, model, seq_len, gb, candidates, needing_more)
    # best configuration per (instance, nodes), then the top rows overall
    # ranked with the handicap for machinery (COMPLEXITY), so a simpler setup within it comes first
    ranked = sorted(_best_per_nodes(candidates).values(), key=lambda c: (_adjusted(c, c.score), -c.step.tokens_per_s))
    top = None  # the cheapest configuration of all, when the first row is not it (it carries more machinery)
    if ranked:
        top = min(candidates, key=lambda c: (c.score, -c.step.tokens_per_s))
        if _adjusted(top, 1.0) <= _adjusted(ranked[0], 1.0):
            top = None
    rows: list[PlanRow] = []
    shown_best = ranked[: req.top]
    first_ranged = bool(ranked) and _ranked_pessimistic(req, ranked[0])
    top_ranged = top is not None and _ranked_pessimistic(req, top)
    ranged_below = any(_ranked_pessimistic(req, b) for b in shown_best[1:])
    for i, c in enumerate(shown_best, start=1):
        est = assemble(c.setup.with_(tokens=job.tokens), c.mem, c.step, spot_mtbf_h=req.spot_mtbf_h,
                       memory_margin=req.memory_margin)
        ends = (_ranked_pessimistic(req, c), first_ranged and i > 1)
        rows.append(PlanRow(rank=i, why=_why(i, c, ranked[0], req.by, est, top=top,
                                             passed=_passed_over(req, shown_best, i), pessimistic=ends,
                                             top_pessimistic=top_ranged, ranged_below=ranged_below),
                            framework=framework_for(c.setup, req.framework)[0], estimate=est))
    shown = {r.estimate.setup.instance for r in rows}
    others: list[Alternative] = []
    for c in ranked:
        name = c.setup.instance.name
        if name in shown or any(o.instance == name for o in others):
            continue
        # the point figures, as the rows show theirs (the ranking used the pessimistic end of an assumed GPU's range)
        point = run_cost(c.setup, c.mem.checkpoint_bytes, c.step.tokens_per_s, job.tokens or 1e9,
                         spot_mtbf_h=req.spot_mtbf_h)
        others.append(Alternative(instance=name, nodes=c.setup.nodes, total_usd=point.total_usd if job.tokens else None,
                                  train_hours=point.train_h if job.tokens else None, tokens_per_s=c.step.tokens_per_s,
                                  assumed=_ranked_pessimistic(req, c)))
    _refuse_static_conflict(req, rows, framework_whys)
    notes = [f"global batch {gb} sequences of {seq_len} tokens ({count_text(gb * seq_len)} tokens per step)"
             + ("" if job.global_batch else " (default: ~1M tokens per step; set --global-batch)"),
             stack.describe(named=job.stack is not None)]
    if said := compile_assumption(stack, bool(job.torch_compile)):
        notes.append(said)
    if job.torch_compile and req.framework in ("auto", "megatron"):
        notes.append("--compile: no row runs on Megatron-LM, which does not torch.compile the model with its loss "
                     "(without --compile, plan may choose it)")
    own_stack = sorted({r.framework for r in rows if r.framework in ("megatron", "torchtitan")})
    if job.stack is None and own_stack:  # the row's figures assume the default stack, not that framework's
        notes.append(f"rows launched with {' and '.join(own_stack)} are estimated with the default stack's "
                     f"kernels and recompute; for {own_stack[0]}'s own, plan again with --stack {own_stack[0]}")
    if said := qlora_moe_note(model, job.method):
        notes.append(said)
    if job.cuda_graphs:
        notes.append("--cuda-graphs: layers captured whole (dense, MoE padded to capacity) launch no kernels from the "
                     "host; a dropless MoE layer, graphed in part, keeps its launch floor; "
                     + CUDA_GRAPHS_MEMORY.format("GiB/GPU"))
    if job.doc_len:
        notes.append(doc_len_assumption(job.doc_len, seq_len) + (
            f"; context parallelism not searched: over separately masked documents it is modelled on --stack megatron "
            f"only, not {stack.stack.name}" if seq_len >= CP_MIN_SEQ_LEN and not stack.stack.cp_over_documents else ""))
    if beyond:
        notes.append(beyond)
    single = sorted({c.setup.instance.name for c in candidates if c.setup.inter_node_gbps is None
                     and c.setup.instance.network_gbps is None} & ({r.estimate.setup.instance for r in rows}
                                                                  | {o.instance for o in others}))
    if single and req.max_nodes > 1:
        notes.append(f"planned on 1 node only: {', '.join(single)} (their network bandwidth is not in the catalog, "
                     f"so more nodes could not be costed; give --inter-node-gbps to plan them)")
    if rows and (said := _other_stack(req, catalog, model, seq_len, gb, rows[0])):
        notes.append(said)
    for arch in sorted({c.setup.gpu.arch for c in ranked[: req.top]}):
        said = attention_note(model, stack, arch)
        if said and said not in notes:
            notes.append(said)
    if job.tp_overlap and stack.stack.tp_overlap is None:
        notes.append(tp_overlap_of(True, stack.stack, 2)[1])
    if job.power_limit_w is not None and not ranked and excluded and all(
            e.reason.startswith("--power-limit") for e in excluded):
        notes.append(f"--power-limit {job.power_limit_w:.10g} W excluded every instance: the model knows caps down to "
                     + ", ".join(f"{p.low_fraction:.0%} of rated power on {arch}" for arch, p in POWER_PAIRS.items())
                     + _power_ranges(catalog, excluded) + "; give a limit in that range, or leave it out")
    if job.power_limit_w is not None and ranked:
        b = ranked[0].setup
        notes.append(f"GPUs capped at {job.power_limit_w:.10g} W (--power-limit): the best row's {b.gpu.name} keep "
                     f"{b.power_scale:.0%} of their rated compute; memory and links at full speed")
    if ranked and (said := dispatch_note(job, ranked[0].setup)):
        notes.append(said)
    if job.fp8_param_gather and ranked and not (b := ranked[0].setup).fp8_param_gather:
        notes.append("--fp8-gather does not apply to the best row: " + str(fp8_param_gather_problem(
            get_stack(b.stack), precision=b.precision, recipe=b.fp8_recipe, strategy=b.strategy, method=b.method,
            offload=b.offload)))
    if ranked and (said := ranked[0].setup.autocast_ignored):  # trainready's LoRA recipe is DeepSpeed's
        notes.append(said + " (the best row)")
    advice = batch_advice(ranked[0].setup) if ranked else None
    if advice:
        notes.append(f"best row: {advice}")
    if not job.tokens:
        notes.append("no --tokens: costs are per 1B tokens")
    assumed = sorted({c.setup.gpu.name for c in ranked if is_assumed(c.setup)})
    if assumed:
        notes.append(f"efficiency of {', '.join(assumed)} is assumed, not measured (rows marked ~): ranked by "
                     + ("the point estimate (--optimistic)" if req.optimistic else
                        "the pessimistic end of its range (--optimistic: by the point estimate)"))
    if any(r.estimate.cost.pricing.suspect for r in rows):
        notes.append("some prices are marked suspect in the catalog: verify them before buying"
                     + ("; suspect spot prices are ranked at the top of their per-zone range (or on-demand without "
                        "one), never at the dubious low" if job.spot else ""))
    if req.calibration is not None:
        notes.insert(0, f"rows on {req.calibration.gpu}: {req.calibration.describe()}")
    return PlanResult(model=model.name, params=model.param_count(), method=job.method, tokens=job.tokens,
                      ranked_by=req.by, global_batch=gb, seq_len=seq_len, rows=rows, excluded=excluded,
                      others=others, candidates=[
                          Candidate(instance=c.setup.instance.name, nodes=c.setup.nodes, gpus=c.setup.n_gpus,
                                    strategy=c.setup.strategy, total_usd=c.usd, train_hours=c.hours,
                                    tokens_per_s=c.step.tokens_per_s, row=i if i <= req.top else None)
                          for i, c in enumerate(ranked, start=1)],
                      framework=req.framework, recipe=recipe_for(ranked[0].setup, req.framework) if ranked else None,
                      searched=searched, notes=notes)


def job_for_row(job: JobSpec, row: PlanRow, framework: str = "auto") -> JobSpec:
    """`job` with the layout of a plan row, as `plan --save` writes it: the file `estimate --job` and `run --job`
    read back to the same setup. Fields the row leaves at their convention stay None, so older releases read it;
    the framework too when the plan's was "auto" (the same setup picks the same one again)."""
    best = row.estimate.setup
    return job.model_copy(update={
        "model_spec": resolve_model(job), "instance": best.instance, "gpu": None, "gpus": best.gpus,
        "gpus_per_node": best.gpus_per_node, "strategy": best.strategy, "tp": best.tp, "pp": best.pp,
        "micro_batch": best.micro_batch, "global_batch": best.global_batch, "seq_len": best.seq_len,
        "precision": best.precision, "activation_checkpointing": best.activation_checkpointing,
        # Megatron's module list where it is not the default (None: older releases read the file)
        "recompute_modules": best.recompute_modules if best.recompute_modules not in (None, list(DEFAULT_MODULES))
        else None,
        # MoE dispatch the search chose (_moe_dispatch); otherwise the job's own, or the stack's (None)
        "ep_dispatcher": best.ep_dispatcher if best.ep_dispatcher == "deepep" else job.ep_dispatcher,
        # an ep-1 row keeps the job's (it changes nothing there); one that could not run the asked overlap says so
        "ep_overlap": True if best.ep_overlap else (False if best.ep > 1 and job.ep_overlap else job.ep_overlap),
        "offload": best.offload, "ep": best.ep,
        "etp": best.etp if best.ep > 1 or best.etp != best.tp else None,  # None: the stack's convention
        "pp_virtual": best.pp_virtual if best.pp_virtual > 1 else None, "cp": best.cp,
        "pp_local_batch": None,  # the search runs a step's micro-batches in one schedule call (a file's is not read)
        "tp_overlap": best.tp_overlap or None,  # None: off
        "torch_compile": best.torch_compile or None,  # None: off
        "cuda_graphs": best.cuda_graphs or None,  # None: off
        # the job's own where it applies to this row (elsewhere resolve would refuse it), else the stack's recipe
        "fp8_param_gather": job.fp8_param_gather if best.fp8_param_gather or job.fp8_param_gather is False else None,
        "framework": row.framework if framework != "auto" else job.framework})  # its memory is that framework's
