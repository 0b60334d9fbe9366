"""Resolve a JobSpec against the catalog into one fully specified, validated setup.

Every impossible combination is a UsageError that names the rule it breaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import lru_cache

from trainready.catalog import Catalog, Gpu, Instance
from trainready.errors import UsageError, printable

from .attention import attention_path
from .efficiency import FP8_RECIPES, ArchEfficiency, power_scale
from .hf_config import load_hf_config
from .job import JobSpec
from .model_spec import ModelSpec
from .lora_targets import check_autocast, check_dropout, check_targets
from .presets import generic_model, preset
from .recompute import DEFAULT_MODULES, check_modules
from .stacks import (
    DEFAULT_STACK,
    STACKS,
    Resolved,
    Stack,
    checkpointing_kind,
    cuda_graphs_of,
    default_etp,
    fp8_param_gather_of,
    get_stack,
    optimizer_dtype_of,
    resolve_stack,
    stack_warnings,
    torch_compile_of,
    tp_overlap_of,
)

MIXED = ("bf16", "fp16", "fp8")
TOKENS_PER_STEP_TARGET = 1_048_576  # default global batch: ~1M tokens per optimizer step


@dataclass(frozen=True)
class Setup:
    """One concrete configuration: everything the memory and speed models need."""

    model: ModelSpec
    gpu: Gpu
    instance: Instance | None
    nodes: int
    gpus_per_node: int
    dp: int
    tp: int
    pp: int
    strategy: str  # ddp | zero1 | zero2 | zero3
    micro_batch: int
    grad_accum: int
    seq_len: int
    precision: str
    optimizer_dtype: str
    reduce_dtype: str
    gather_dtype: str
    checkpointing: str
    offload: str
    method: str
    lora_rank: int
    kernels: str
    attention_kernel: str
    inter_node_gbps: float | None
    tokens: float | None = None
    spot: bool = False
    region: str | None = None
    usd_per_hour: float | None = None
    keep_hot: int = 2
    ep: int = 1  # expert-parallel size: EP x etp divides the tp x dp ranks of a stage (plan/moe.py)
    etp: int | None = None  # expert tensor-parallel size; None: tp (expert_tp)
    notes: tuple[str, ...] = field(default=())
    stack: str = DEFAULT_STACK  # plan/stacks.py: whose defaults kernels, reduce dtype and checkpointing follow
    stack_named: bool = False  # the job named it (False: the default stack)
    load_imbalance: float | None = None  # MoE busiest-rank load over the mean; None: efficiency.LOAD_IMBALANCE assumed
    ep_dispatcher: str = "alltoall"  # MoE dispatch: "alltoall" | "deepep" (stacks.Stack.ep_dispatcher)
    ep_overlap: bool = False  # MoE all-to-alls overlapped with another micro-batch's compute
    fp8_dispatch: bool = False  # dispatch in FP8 (precision fp8 only)
    pp_virtual: int = 1  # interleaved (virtual) pipeline stages per rank: 1 is plain 1F1B
    pp_local_batch: int | None = None  # sequences per dp rank per pipeline schedule call; None: the step's share
    fp8_recipe: str = "tensorwise"  # FP8 scaling recipe (efficiency.FP8_RECIPES); read only under precision fp8
    fp8_param_gather_asked: bool | None = None  # the job's --fp8-param-gather (None: the stack's recipe)
    tp_overlap: bool = False  # TP collectives pipelined with the GEMMs (efficiency.TP_OVERLAP_EXPOSED)
    cuda_graphs: bool = False  # the layers captured in CUDA graphs (Stack.cuda_graphs): no host launch floor there
    torch_compile: bool = False  # the model and its loss compiled (stacks.Stack.torch_compile): the loss fused
    recompute_modules: tuple[str, ...] = ()  # Megatron-style selective recompute: what it recomputes (recompute.py)
    lora_targets: tuple[str, ...] | None = None  # LoRA/QLoRA: the linear layers adapted (lora_targets.py); None: all
    lora_dropout: float = 0.0  # LoRA/QLoRA: the adapters' dropout probability (JobSpec.lora_dropout); 0: none
    autocast_asked: bool | None = None  # LoRA/QLoRA: the job's --autocast/--no-autocast (None: the stack's)
    cp: int = 1  # context-parallel size: each sequence split over cp GPUs (ring attention); dp x tp x pp x cp GPUs
    doc_len: int | None = None  # packed documents' mean length, attention masked to each (JobSpec.doc_len)
    expert_routing: str = "random"  # MoE: "random" (a trained or forced-random router) | "contiguous" (moe.py)
    efficiency: ArchEfficiency | None = None  # calibrated factors (plan/calibration.py); None: efficiency.ARCH's
    power_limit_w: float | None = None  # the GPUs' power limit below their rated power (efficiency.power_scale)
    # the framework that runs the row (plan/recipes framework_for); the default stack leaves it to the recipe, and a
    # row DeepSpeed runs holds DeepSpeed's model states (Setup.on_deepspeed). None: not chosen yet
    runs_on: str | None = None
    framework: str = "auto"  # the one asked for (JobSpec.framework, plan's --framework) that runs_on is chosen by

    @property
    def power_scale(self) -> float:
        """The fraction of its rated compute each GPU keeps under `power_limit_w` (1.0: rated power)."""
        if self.power_limit_w is None:
            return 1.0
        return power_scale(self.gpu.arch, self.power_limit_w, self.gpu.power_w)

    @property
    def lora_dropout_at(self) -> str | None:
        """Where the adapters' dropout sits ("pre": their inputs, "post": their outputs; Stack.lora_dropout_position);
        None without one (no dropout, or full training)."""
        if self.method == "full" or not self.lora_dropout:
            return None
        return get_stack(self.stack).lora_dropout_position

    @property
    def on_deepspeed(self) -> bool:
        """DeepSpeed runs the row, and its model states are DeepSpeed's ZeRO: the deepspeed stack's rows
        (Stack.deepspeed_zero_memory), and a row of the default stack, which leaves the framework to the recipe, when
        DeepSpeed is the one chosen (runs_on)."""
        return get_stack(self.stack).deepspeed_zero_memory or self.runs_on == "deepspeed"

    @property
    def autocast(self) -> bool:
        """The forward runs under torch.autocast: asked (--autocast/--no-autocast), else the stack's (Stack.autocast:
        the Trainer's bf16=True); never in an fp32 job, nor where DeepSpeed runs the row, whatever was asked: its
        engine runs none (accelerate sets native_amp only outside DeepSpeed: stacks.DEEPSPEED_CASTS), and trainready's
        DeepSpeed recipe is what the row launches (autocast_ignored says so)."""
        if self.precision == "fp32" or self.on_deepspeed:
            return False
        if self.autocast_asked is not None:
            return self.autocast_asked
        return get_stack(self.stack).autocast

    @property
    def on_fsdp(self) -> bool:
        """The row shards with FSDP (ZeRO-2 or 3 without DeepSpeed), whose mixed precision gathers parameters in bf16."""
        return self.strategy in ("zero2", "zero3") and not self.on_deepspeed

    @property
    def peft_lora(self) -> bool:
        """LoRA or QLoRA with PEFT's fp32 adapters (Stack.lora_fp32_adapters): what --autocast is modelled for."""
        return self.method != "full" and get_stack(self.stack).lora_fp32_adapters

    @property
    def autocast_ignored(self) -> str | None:
        """Why the job's --autocast/--no-autocast changes nothing on this row (None: it does, or was not asked)."""
        if self.autocast_asked is not None and self.on_fsdp and self.peft_lora and self.precision != "fp32":
            flag = "--autocast" if self.autocast_asked else "--no-autocast"
            return (f"{flag} changes nothing here: FSDP ({self.strategy}) gathers PEFT's adapters in bf16 (its mixed "
                    f"precision's param_dtype), so they read the model's own tensors either way")
        if not (self.autocast_asked and self.on_deepspeed):
            return None
        kept = ("PEFT's adapters keep fp32 copies" if self.lora_fp32_copies else
                "its engine casts PEFT's adapters to bf16, so they copy nothing either way")
        return (f"--autocast not applied: {self.runs_on or 'DeepSpeed'} runs this row, and DeepSpeed runs no autocast "
                f"(accelerate sets native_amp only outside it): {kept}")

    @property
    def lora_fp32_copies(self) -> bool:
        """Each adapter casts its input to fp32, a copy of its own that it runs on (lora_copy_bytes: what autograd
        saves of it): PEFT's fp32 adapters (Stack.lora_fp32_adapters) on a bf16 or fp16 model. False: the adapters
        read the very tensor the frozen linear reads -- adapters in the model's dtype, an fp32 model, QLoRA's 4-bit
        layers under autocast, which hand the adapters the bf16 input, DeepSpeed, whose engine casts every
        floating-point parameter to bf16 (fp16), the adapters too (stacks.DEEPSPEED_CASTS), except a model
        transformers builds under ZeRO-Init (ZeRO-3; 4-bit models are not): the engine leaves it uncast and PEFT
        adds its adapters afterwards, in fp32; and FSDP (ZeRO-2/3 outside DeepSpeed: FSDP2's FULL_SHARD and its
        reshard_after_forward=False form), whose mixed precision gathers every parameter in the compute dtype, the
        adapters too (stacks.FSDP_CASTS)."""
        if not self.peft_lora or self.precision == "fp32":
            return False
        if self.on_deepspeed:
            return self.strategy == "zero3" and self.method == "lora"
        if self.on_fsdp:
            return False
        return not (self.method == "qlora" and self.autocast)

    @property
    def lora_copy_bytes(self) -> int:
        """Bytes per element autograd saves of each adapter's input copy (0: no copy, lora_fp32_copies): the fp32 copy
        itself (4), or under autocast (2) the bf16 cast that autocast makes of it for lora_A's matmul (torch casts a
        linear's fp32 inputs to the autocast dtype, caching only leaf weights, so every adapter makes its own), the
        fp32 copy itself then saved by nothing: PEFT's _cast_input_dtype (tuners_utils.py) copies with x.to(float32)
        whatever autocast says."""
        if not self.lora_fp32_copies:
            return 0
        return 2 if self.autocast else 4

    @property
    def compiled(self) -> bool:
        """The model and its loss run compiled: asked (--compile), or implied by a TP overlap that runs only compiled
        (Stack.tp_overlap_compiles: torchtitan's async TP)."""
        return self.torch_compile or (self.tp > 1 and self.tp_overlap and get_stack(self.stack).tp_overlap_compiles)

    @property
    def recomputes(self) -> tuple[str, ...]:
        """The modules Megatron-style selective recompute runs again (plan/recompute.py): the job's list, else the
        attention core; () under any other checkpointing."""
        if self.checkpointing != "selective-attn":
            return ()
        return self.recompute_modules or DEFAULT_MODULES

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shard_dp(self) -> int:
        """Ranks holding the same weights, over which gradients are reduced and ZeRO/FSDP shards the states:
        dp x cp (context-parallel ranks hold the same weights: Megatron's data-parallel-with-context group,
        torchtitan's FSDP mesh dp_shard x cp)."""
        return self.dp * self.cp

    @property
    def pp_stage_gathered(self) -> bool:
        """ZeRO-3/FSDP under pipeline stages on a stack that keeps each stage's parameters gathered through the
        step and reduces gradients once, after the last micro-batch (Stack.pp_gathers_stage; torchtitan), with or
        without CPU offload (torchtitan's reshard_after_forward ignores it)."""
        return self.strategy == "zero3" and self.pp > 1 and get_stack(self.stack).pp_gathers_stage

    @property
    def gradient_bytes(self) -> int:
        """Bytes of one element of full training's gradients as the framework keeps them between micro-batches: 2 in
        pure bf16, or where the stack keeps them in the reduce dtype and that is bf16 (Stack.grads_in_reduce_dtype:
        Megatron's --grad-reduce-in-bf16 buffer); else fp32."""
        bf16 = self.optimizer_dtype == "bf16" or (self.reduce_dtype == "bf16"
                                                  and get_stack(self.stack).grads_in_reduce_dtype)
        return 2 if bf16 else 4

    @property
    def wgrad_in_place(self) -> bool:
        """Full training whose weight-gradient GEMMs add into the unsharded gradient buffer themselves
        (Stack.wgrad_accumulates); ZeRO-2/3 shard that buffer, so their gradients are added in a pass of their own."""
        return (self.method == "full" and self.strategy not in ("zero2", "zero3")
                and get_stack(self.stack).wgrad_accumulates)

    @property
    def graphs_whole_layers(self) -> bool:
        """CUDA graphs capture every layer whole: dense, or MoE padded to capacity (static shapes); a dropless MoE
        layer's dispatch and experts stay eager (Megatron graphs attention, router and preprocessing there)."""
        return self.cuda_graphs and (self.model.moe is None or self.model.moe.capacity_factor is not None)

    @property
    def attention_len(self) -> int:
        """The tokens a query's causal attention spans the like of: the document's length where packed documents
        are masked apart (doc_len), else the sequence's."""
        return min(self.seq_len, self.doc_len) if self.doc_len else self.seq_len

    @property
    def local_tokens(self) -> int:
        """Tokens one GPU computes per micro-batch: its 1/cp share of each sequence."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def stage_layers(self) -> int:
        """Layers of the busiest pipeline rank (the first one: pipeline_ranks), all its virtual stages."""
        if self.pp_virtual == 1:
            return -(-self.model.num_layers // self.pp)
        return len(pipeline_ranks(self.model.num_layers, self.pp, self.pp_virtual)[0])

    @property
    def schedule_microbatches(self) -> int:
        """Micro-batches in one call of the pipeline schedule: the step's all (Megatron runs them in one
        forward_backward_func call), or a local batch's where torch.distributed.pipelining stacks loop their
        gradient accumulation over schedule calls (pp_local_batch)."""
        return self.pp_local_batch // self.micro_batch if self.pp_local_batch else self.grad_accum

    @property
    def fp8_param_gather(self) -> bool:
        """Whether linear weights are all-gathered in FP8 over data parallelism (stacks.fp8_param_gather_of): what
        the job asked for where it applies (resolve refuses it elsewhere; the search's other strategies drop it),
        else the stack's recipe."""
        return fp8_param_gather_of(self.fp8_param_gather_asked, get_stack(self.stack), strict=False,
                                   precision=self.precision, recipe=self.fp8_recipe, strategy=self.strategy,
                                   method=self.method, offload=self.offload)

    @property
    def schedule_calls(self) -> int:
        """Pipeline schedule calls per optimizer step, each filling and draining the pipeline once."""
        return self.grad_accum // self.schedule_microbatches

    def micro_batch_allowed(self, mb: int) -> bool:
        """Whether micro-batch `mb` runs this setup's batch and pipeline as resolve() would accept it: it divides
        each data-parallel rank's share; interleaved stages take micro-batches in groups of pp; torch.distributed
        .pipelining's Schedule1F1B needs pp of them a call (_check_local_batch)."""
        share = self.global_batch // self.dp
        if mb < 1 or share % mb:
            return False
        if self.pp == 1:
            return True
        if self.pp_local_batch and self.pp_local_batch % mb:
            return False
        per_call = (self.pp_local_batch or share) // mb
        return call_runs(per_call, self.pp, self.pp_virtual, get_stack(self.stack).torch_pipelining)

    @property
    def expert_tp(self) -> int:
        """Ranks each routed expert is split over (Megatron's expert_tensor_parallel_size)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size: ranks of a pipeline stage holding the same expert shard, over which
        ZeRO/FSDP shards the experts' states and their gradients are reduced (tp x dp / (etp x ep);
        Megatron's expert_data_parallel_size, torchtitan's efsdp)."""
        return max(1, self.tp * self.dp * self.cp // (self.expert_tp * self.ep))

    def with_(self, **changes) -> "Setup":
        """A copy with `changes` (dataclasses.replace without re-running __init__ over every field: the
        search makes ~60,000 of these per plan, where replace alone took a fifth of the time)."""
        unknown = changes.keys() - _SETUP_FIELDS
        if unknown:
            raise TypeError(f"Setup has no field(s) {', '.join(sorted(unknown))}")
        new = object.__new__(Setup)
        # a frozen instance's fields live in its __dict__: copied and updated without its __setattr__
        fields_of = new.__dict__
        fields_of.update(self.__dict__)
        fields_of.update(changes)
        return new


_SETUP_FIELDS = frozenset(f.name for f in fields(Setup))


def job_stack(job: JobSpec) -> Resolved:
    """The job's stack (the default when it names none) with its explicit flags applied."""
    return resolve_stack(job.stack, kernels=job.kernels, attention_kernel=job.attention_kernel,
                         reduce_dtype=job.reduce_dtype)


def resolve_model(job: JobSpec) -> ModelSpec:
    """The job's model, with its MoE routing as the job asks (`with_routing`)."""
    return with_routing(_model_of(job), job)


def check_fp8_recipe_precision(job: JobSpec, precision: str | None) -> None:
    """A recipe only means something under fp8: a usage error otherwise."""
    if job.fp8_recipe is not None and precision != "fp8":
        runs = f"this job runs {precision}" if precision else "no --precision given"
        raise UsageError(f"--fp8-recipe {job.fp8_recipe} needs --precision fp8 ({runs})")


def fp8_recipe_problem(recipe: str, gpu: Gpu) -> str | None:
    """Why `gpu` cannot run FP8 recipe `recipe` (None: it can)."""
    if not FP8_RECIPES[recipe].blackwell_only or gpu.arch == "blackwell":
        return None
    valid = ", ".join(n for n, r in FP8_RECIPES.items() if not r.blackwell_only)
    return (f"--fp8-recipe {recipe} runs on Blackwell GPUs only (Transformer Engine); {gpu.name} is {gpu.arch}: "
            f"use {valid}")


def chosen_fp8_recipe(job: JobSpec, stack: Stack) -> str:
    """The job's FP8 recipe, else the stack's default."""
    return job.fp8_recipe or stack.fp8_recipe


def fp8_recipe_of(job: JobSpec, stack: Stack, gpu: Gpu, precision: str) -> str:
    """The job's FP8 recipe, else the stack's; a usage error where it cannot run."""
    check_fp8_recipe_precision(job, precision)
    recipe = chosen_fp8_recipe(job, stack)
    problem = fp8_recipe_problem(recipe, gpu) if precision == "fp8" else None
    if problem:
        raise UsageError(problem)
    return recipe


def with_routing(model: ModelSpec, job: JobSpec) -> ModelSpec:
    """`model` routed as `job.moe_routing` / `job.capacity_factor` say (None: as its config says)."""
    routing, factor = job.moe_routing, job.capacity_factor
    if routing is None and factor is None:
        return model
    flags = " / ".join(f for f, v in (("--moe-routing", routing), ("--capacity-factor", factor)) if v is not None)
    if model.moe is None:
        verb = "apply" if routing is not None and factor is not None else "applies"
        raise UsageError(f"{flags} {verb} to mixture-of-experts models; {model.name} is dense")
    if routing == "dropless" and factor is not None:
        raise UsageError(f"--capacity-factor {factor:g} sizes token-drop routing: give --moe-routing capacity, or drop "
                         f"--capacity-factor for dropless routing")
    cf = None if routing == "dropless" else (factor or model.moe.capacity_factor or 1.0)
    return model.model_copy(update={"moe": model.moe.model_copy(update={"capacity_factor": cf})})


def _model_of(job: JobSpec) -> ModelSpec:
    given = [x for x in (job.model, job.model_config_path, job.params) if x is not None]
    if job.model_spec is not None and not given:
        return job.model_spec
    if len(given) > 1:
        raise UsageError("give one of --model, --model-config or --params, not several")
    if job.model is not None:
        return preset(job.model)
    if job.model_config_path is not None:
        return load_hf_config(job.model_config_path)
    if job.params is not None:
        return generic_model(job.params)
    if job.model_spec is not None:
        return job.model_spec
    raise UsageError("no model given: use --model NAME, --model-config config.json or --params 13e9")


def default_precision(gpu: Gpu) -> str:
    return "bf16" if gpu.peak_tflops("bf16") else "fp16"


def default_seq_len(model: ModelSpec) -> int:
    return min(model.max_seq_len or 2048, 4096)


def default_global_batch(seq_len: int, dp: int, micro_batch: int) -> int:
    """About 1M tokens per step, rounded up to a multiple of micro_batch x dp."""
    unit = micro_batch * dp
    target = max(1, round(TOKENS_PER_STEP_TARGET / seq_len))
    return max(unit, math.ceil(target / unit) * unit)


def nearest_multiples(value: int, unit: int) -> str:
    """The multiples of `unit` nearest to `value` from below and above, each once: "8" or "24 or 32"."""
    below, above = value // unit * unit, (value // unit + 1) * unit
    return " or ".join(str(v) for v in dict.fromkeys((below, above)) if v > 0)


def pipeline_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers of each pipeline stage: as even as possible, the extra layers on the earliest stages,
    as torchtitan's generate_llm_fqn_per_model_part distributes them (distributed/pipeline_parallel.py);
    Megatron-Core takes any split through --pipeline-model-parallel-layout (or, when only the first and
    last stages differ, --decoder-first/last-pipeline-num-layers). The first stage is the largest, and
    under 1F1B it also holds the most micro-batches in flight: it sets the pace and the memory."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (j < extra) for j in range(pp))


@lru_cache(maxsize=1024)
def pipeline_ranks(num_layers: int, pp: int, v: int = 1) -> tuple[tuple[int, ...], ...]:
    """Layer indices each pipeline rank holds. Plain 1F1B (v = 1): pipeline_split's contiguous stages.
    Interleaved (v virtual stages per rank): the layers split into pp x v virtual stages as pipeline_split
    splits them, virtual stage i on rank i mod pp (Narayanan et al. 2021, Sec. 2.2.2; Megatron-Core's
    PipelineParallelLayerLayout puts layout entry i on pp rank i % pp; torchtitan's stage_ids_this_rank
    takes rank + s x pp). The first rank holds the most layers."""
    split = pipeline_split(num_layers, pp * v)
    starts = [sum(split[:i]) for i in range(len(split))]
    return tuple(tuple(j for i in range(r, pp * v, pp) for j in range(starts[i], starts[i] + split[i]))
                 for r in range(pp))


def in_flight_micro_batches(pp: int, v: int, micro_batches: int, rank: int = 0) -> float:
    """Micro-batches whose activations a pipeline rank holds at once, counted in whole-rank micro-batches
    (all its layers). 1F1B: rank r runs pp - r forwards before its first backward (at most the step's
    micro-batches). Interleaved: rank r warms up with 2 (pp - 1 - r) + (v - 1) pp virtual-stage forwards
    and holds one more in steady state (Megatron-Core schedules.py num_warmup_microbatches; PyTorch
    ScheduleInterleaved1F1B warmup_steps), each 1/v of the rank's layers: for the first rank
    pp (1 + (pp - 1)/(pp v)) micro-batches, Korthikanti et al. 2022 Sec. 4.2.3 and Megatron-LM's
    theoretical_memory_usage.py interleaved_schedule_memory_penalty."""
    if v == 1:
        return float(min(pp - rank, micro_batches))
    return min(2 * (pp - 1 - rank) + (v - 1) * pp + 1, micro_batches * v) / v


def _normalize_strategy(strategy: str) -> str:
    return "zero3" if strategy == "fsdp" else strategy


def layout_text(tp: int, pp: int, v: int, ep: int, etp: int, cp: int = 1) -> str:
    """A layout in short: tp4 pp4x2v cp2 ep8 etp1 (virtual stages, cp, ep and expert TP only where they apply)."""
    return (f"tp{tp} pp{pp}" + (f"x{v}v" if v > 1 else "") + (f" cp{cp}" if cp > 1 else "") + (f" ep{ep}" if ep > 1 else "")
            + (f" etp{etp}" if etp != tp else ""))


def tp_splits_heads(model: ModelSpec, tp: int) -> bool:
    """Whether `tp` ranks can split the attention: tp divides the heads and divides, or is a multiple of,
    the KV heads (_check_parallel says which rule a tp breaks; plan's search tries only these)."""
    return not model.num_heads % tp and not (model.num_kv_heads % tp and tp % model.num_kv_heads)


def _check_parallel(model: ModelSpec, tp: int, pp: int, gpus_per_node: int, nodes: int = 1) -> None:
    if model.num_heads % tp:
        raise UsageError(f"--tp {tp} must divide the number of attention heads ({model.num_heads})")
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise UsageError(f"--tp {tp} must divide, or be a multiple of, the KV heads ({model.num_kv_heads})")
    if tp > gpus_per_node:
        raise UsageError(f"--tp {tp} exceeds the {gpus_per_node} GPUs per node: tensor parallelism must stay inside a node")
    if nodes > 1 and gpus_per_node % tp:  # tp consecutive ranks: tp 5 on 8-GPU nodes puts ranks 5-9 on two nodes
        valid = [d for d in _divisors(gpus_per_node, gpus_per_node) if tp_splits_heads(model, d)]
        raise UsageError(f"--tp {tp} does not divide the {gpus_per_node} GPUs of a node: across {nodes} nodes some "
                         f"tensor-parallel groups would span two nodes (it must stay inside one); valid: "
                         f"{', '.join(map(str, valid))}")
    if pp > model.num_layers:  # uneven stages are fine (pipeline_split); empty ones are not
        raise UsageError(f"--pp {pp} is more than the {model.num_layers} layers of {printable(model.name)}: "
                         f"every pipeline stage needs a layer (--pp 1..{model.num_layers})")


def _check_cp(cp: int, seq_len: int, gpus: int = 0, tp_pp: int = 1) -> None:
    """Context parallelism splits each sequence into 2 x cp chunks, two per rank (the load-balanced causal
    split of Megatron-Core's and torchtitan's ring attention), so 2 x cp must divide the length; the values
    offered also divide the GPUs with tp x pp (`gpus`; 0: not known)."""
    if cp > 1 and seq_len % (2 * cp):
        valid = [c for c in (2, 4, 8, 16, 32) if seq_len % (2 * c) == 0 and (not gpus or gpus % (tp_pp * c) == 0)]
        raise UsageError(f"--cp {cp} needs a sequence length divisible by 2 x cp = {2 * cp} (each rank takes two "
                         f"chunks of every sequence); --seq-len {seq_len} allows --cp "
                         f"{', '.join(map(str, valid)) or '1 only'}")


def check_doc_len(doc_len: int | None, seq_len: int, cp: int, model: ModelSpec, st: Resolved) -> None:
    """Packed documents with their own attention masks: shorter than the sequence, with context parallelism only where
    the stack splits each document over the ranks (Stack.cp_over_documents), and through a
    kernel that skips the masked tiles: an eager score matrix, or SDPA given a dense mask (what transformers builds
    from position ids that restart per document: Stack.transformers_attention), computes every key."""
    if doc_len is None:
        return
    given = f"doc_len {doc_len} (--doc-len, or a --job file's doc_len)"
    if doc_len >= seq_len:
        raise UsageError(f"{given} is not shorter than the {seq_len}-token sequence (--seq-len, or the model's "
                         f"default): attention spans the sequence anyway; give --doc-len below {seq_len} or a longer "
                         f"--seq-len, or leave doc_len out")
    if cp > 1 and not st.stack.cp_over_documents:
        raise UsageError(f"{given} with --cp {cp} on stack {st.stack.name}: its context parallelism over packed, "
                         f"separately masked documents is not modelled; --stack megatron (Transformer Engine's THD, "
                         f"each document split over the ranks) models it, or --cp 1, or leave doc_len out")
    if cp > 1 and doc_len < 2 * cp:
        raise UsageError(f"{given} with --cp {cp}: each document is split into 2 x cp = {2 * cp} chunks "
                         f"(Megatron-Core's per-document zigzag), more than its tokens; a --cp of at most "
                         f"{max(1, doc_len // 2)}")
    dense = st.stack.transformers_attention and st.attention_kernel == "sdpa"
    if dense or attention_path(model, st.stack, st.attention_kernel) != "tiles":
        kernel = ("attn_implementation='kernels-community/vllm-flash-attn3' (FlashAttention-3 with sinks) or "
                  "'flex_attention'" if model.attention_sinks else
                  "attn_implementation=\"flash_attention_2\" (FlashAttention's varlen kernel)")
        raise UsageError(f"{given} on stack {st.stack.name}: its attention would take the documents' masks as a "
                         f"dense matrix (transformers' SDPA path) or run eagerly, computing every key, so masking "
                         f"documents apart saves nothing; with {kernel} they run apart: give --attention-kernel "
                         f"flash2, or leave doc_len out")


def _check_virtual(model: ModelSpec, pp: int, v: int, micro: int, dp: int, global_batch: int, accum: int) -> None:
    """Interleaved pipeline stages: pp > 1, a layer per virtual stage, and micro-batches in whole groups of
    pp: Megatron-Core's interleaved schedule runs micro-batches pp at a time per virtual stage
    (microbatch_group_size_per_vp_stage defaults to pp; schedules.py refuses a remainder below pp), the
    case the bubble (pp - 1)/(v m) of Narayanan et al. 2021 describes."""
    if v == 1:
        return
    if pp == 1:
        raise UsageError(f"--pp-virtual {v} needs pipeline stages (--pp 2 or more): it interleaves each "
                         f"rank's layers into {v} virtual stages")
    if pp * v > model.num_layers:
        most = model.num_layers // pp
        raise UsageError(f"--pp-virtual {v} with --pp {pp} makes {pp * v} virtual stages for the "
                         f"{model.num_layers} layers of {printable(model.name)}: every virtual stage needs a layer "
                         f"(--pp-virtual 1..{most})")
    if accum % pp:
        unit = micro * dp * pp
        raise UsageError(f"--pp-virtual {v}: {accum} micro-batches per step is not a multiple of --pp {pp} (the "
                         f"interleaved schedule runs micro-batches in groups of pp); global batch {global_batch} "
                         f"-> nearest valid: {nearest_multiples(global_batch, unit)}")


def call_runs(micro_batches: int, pp: int, v: int, torch_pipelining: bool) -> bool:
    """Whether one pipeline schedule call of `micro_batches` runs: interleaved stages take them in whole groups of pp
    (_check_virtual), torch.distributed.pipelining's Schedule1F1B needs at least pp."""
    return (v == 1 or micro_batches % pp == 0) and not (torch_pipelining and micro_batches < pp)


def _check_local_batch(local: int | None, pp: int, v: int, stack: Stack, micro: int, dp: int,
                       global_batch: int) -> None:
    """A local batch per schedule call (JobSpec.pp_local_batch): pipeline stages on a torch.distributed.pipelining
    stack (torchtitan's trainer and NeMo AutoModel's loop call the schedule once per local batch, gradient
    accumulation over the calls), a whole number of micro-batches that divides each rank's share of the step, and
    per call as many micro-batches as Schedule1F1B needs (pp), in whole groups of pp when interleaved."""
    if local is None:
        return
    if pp == 1:
        raise UsageError(f"--pp-local-batch {local} needs pipeline stages (--pp 2 or more): without them the local "
                         f"batch is the micro-batch (--micro-batch)")
    if not stack.torch_pipelining:
        users = ", ".join(st.name for st in STACKS.values() if st.torch_pipelining)
        raise UsageError(f"--pp-local-batch: stack {stack.name} runs every micro-batch of a step in one pipeline "
                         f"schedule call; the option is torch.distributed.pipelining's local_batch_size "
                         f"(--stack {users.replace(', ', ' or ')})")
    share = global_batch // dp

    def runs(d: int) -> bool:  # the stack pipelines with torch.distributed.pipelining (checked above)
        return d % micro == 0 and share % d == 0 and call_runs(d // micro, pp, v, True)

    if runs(local):
        return
    root = math.isqrt(share)
    valid = [d for i in range(1, root + 1) if share % i == 0 for d in {i, share // i} if runs(d)]
    near = ", ".join(map(str, sorted(sorted(valid, key=lambda d: (abs(d - local), d))[:2])))
    if local % micro or share % local:
        whole = f"a multiple of --micro-batch {micro} that divides" if micro > 1 else "a divisor of"
        why = (f"must be {whole} the {share} sequences each data-parallel rank takes per step (global batch "
               f"{global_batch} / dp {dp})")
    elif local // micro < pp:
        why = (f"makes {local // micro} micro-batch(es) per schedule call for --pp {pp}: "
               f"torch.distributed.pipelining's Schedule1F1B needs at least as many as stages")
    else:
        why = (f"makes {local // micro} micro-batches per schedule call: the interleaved schedule runs them in "
               f"groups of --pp {pp}")
    raise UsageError(f"--pp-local-batch {local} {why}; nearest valid: {near}")


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _check_ep(model: ModelSpec, ep: int, etp: int, tp: int, dp: int, gpus_per_node: int, cp: int = 1) -> None:
    """Megatron-Core's expert grid (parallel_state.initialize_model_parallel: the expert RankGenerator, order
    tp-ep-dp-pp with tp = expert_tensor_parallel_size) lays etp x ep x edp over the same tp x cp x dp ranks of a
    pipeline stage as attention's tp x cp x dp (MoE parallel folding, arXiv 2504.14960; megatron-core 0.16
    parallel_state.py: expert_data_parallel_size = world_size // (etp x ep x pp), whatever cp is; torchtitan 0.3:
    efsdp = dp_shard x cp x tp / ep): ep must divide the routed experts and ep x etp the stage's ranks, context-
    parallel ones included. The expert TP group (etp consecutive ranks) stays inside a node, as TP does."""
    name = printable(model.name)
    if model.moe is None:
        if ep != 1:
            raise UsageError(f"--ep {ep} needs a mixture-of-experts model; {name} is dense (use --ep 1)")
        if etp != tp:
            raise UsageError(f"--etp {etp} needs a mixture-of-experts model; {name} is dense (drop --etp)")
        return
    stage = tp * cp * dp
    ranks = f"tp {tp} x cp {cp} x dp {dp}" if cp > 1 else f"tp {tp} x dp {dp}"
    # an expert TP group is etp consecutive ranks: inside a node only where etp divides the node's GPUs (etp 3 on
    # 8-GPU nodes puts ranks 6-8 on two nodes); each rank takes expert_ffn/etp columns, a whole number
    # (Megatron-Core's TEGroupedMLP: fc2's input moe_ffn_hidden_size goes through divide(input_size, tp_size),
    # extensions/transformer_engine.py, which asserts it)
    ffn = model.moe.expert_ffn_hidden_size
    straddles = etp != tp and gpus_per_node % etp  # tp's own node check is _check_parallel's
    if stage % etp or etp > gpus_per_node or straddles or ffn % etp:
        valid = [d for d in _divisors(stage, gpus_per_node) if not ffn % d and (d == tp or not gpus_per_node % d)]
        raise UsageError(f"--etp {etp} must divide the {stage} GPUs of a pipeline stage ({ranks}) and the "
                         f"{ffn} columns of an expert's FFN, and a node's GPUs to stay inside a node of {gpus_per_node}; "
                         f"valid: {', '.join(map(str, valid))}")
    experts = model.moe.num_experts
    if experts % ep or stage % (ep * etp):
        valid = [e for e in _divisors(experts, stage // etp) if (stage // etp) % e == 0]
        over = "TP, context-parallel and data-parallel" if cp > 1 else "TP and data-parallel"
        fold = (f"; or --etp 1 (experts whole, EP folded over {over} ranks)"
                if etp > 1 and not experts % ep and not stage % ep else "")
        raise UsageError(f"--ep {ep} must divide the {experts} experts of {name}, and --ep x --etp = {ep} x {etp} the "
                         f"{stage} GPUs of a pipeline stage ({ranks}: experts fold over {over} "
                         f"ranks); valid: {', '.join(map(str, valid))} (with --etp {etp}){fold}")


def megatron_ep_overlap_problem(ep: int, pp: int, pp_virtual: int, checkpointing: str,
                                modules: tuple[str, ...]) -> str | None:
    """Why Megatron-Core's --overlap-moe-expert-parallel-comm refuses this layout, with the way out (None: it runs it,
    or there is no expert parallelism to overlap, where Megatron's recipe leaves the flag out): pipeline stages
    without virtual ones, full recompute, `moe` among the recomputed modules (megatron/core/transformer/
    transformer_config.py __post_init__, its asserts). resolve refuses the job; the megatron recipe declines the row."""
    if ep <= 1:
        return None
    if pp > 1 and pp_virtual <= 1:
        return f"with pipeline stages it needs virtual ones: --pp-virtual 2 or more with --pp {pp}"
    if checkpointing == "full":
        return "it does not run under full recompute: --activation-checkpointing selective-attn or none"
    if "moe" in modules:
        return "it does not run with the MoE layer among the recomputed modules: --recompute-modules without moe"
    return None


def dispatch_flags(deepep: bool, overlap: bool | None, fp8_dispatch: bool | None) -> list[str]:
    """The MoE dispatch flags a job gives, as the command line spells them."""
    return [f for f, on in (("--ep-dispatcher deepep", deepep), ("--ep-overlap", overlap),
                            ("--fp8-dispatch", fp8_dispatch)) if on]


def ep1_dispatch_note(deepep: bool, overlap: bool, fp8_dispatch: bool) -> str | None:
    """What the MoE dispatch flags do with --ep 1: nothing, said (None: none asked)."""
    asked = dispatch_flags(deepep, overlap, fp8_dispatch)
    if not asked:
        return None
    return (f"{' and '.join(asked)} {'act' if len(asked) > 1 else 'acts'} on expert parallelism: with --ep 1 no "
            f"token leaves its GPU, so {'they change' if len(asked) > 1 else 'it changes'} nothing")


def moe_comm(job: JobSpec, model: ModelSpec, stack: Stack, precision: str) -> dict:
    """Setup fields of the MoE communication: the job's values, else the stack's."""
    if job.expert_load_imbalance is not None and model.moe is None:
        raise UsageError(f"--expert-load-imbalance needs a mixture-of-experts model; {printable(model.name)} is dense")
    fp8 = stack.fp8_dispatch if job.fp8_dispatch is None else job.fp8_dispatch
    if job.fp8_dispatch and precision != "fp8":
        raise UsageError(f"--fp8-dispatch needs --precision fp8 (this job computes in {precision})")
    if job.expert_routing is not None and model.moe is None:
        raise UsageError(f"expert_routing needs a mixture-of-experts model; {printable(model.name)} is dense")
    asked = dispatch_flags(job.ep_dispatcher == "deepep", job.ep_overlap, job.fp8_dispatch)
    if asked and model.moe is None:
        raise UsageError(f"{asked[0]} needs a mixture-of-experts model; {printable(model.name)} is dense")
    return dict(load_imbalance=job.expert_load_imbalance, ep_dispatcher=job.ep_dispatcher or stack.ep_dispatcher,
                expert_routing=job.expert_routing or "random",
                ep_overlap=stack.ep_overlap if job.ep_overlap is None else job.ep_overlap,
                fp8_dispatch=fp8 and precision == "fp8")


def _check_precision(gpu: Gpu, precision: str, optimizer_dtype: str) -> None:
    if precision in ("bf16", "fp16", "fp8") and not gpu.peak_tflops(precision):
        have = [p for p in ("bf16", "fp16", "fp8") if gpu.peak_tflops(p)]
        raise UsageError(f"--precision {precision} is not supported on {gpu.name}; use one of: {', '.join(have + ['fp32'])}")
    if optimizer_dtype == "bf16" and precision != "bf16":
        raise UsageError("--optimizer-dtype bf16 (pure bf16 training) needs --precision bf16")


def _check_offload(strategy: str, offload: str, method: str) -> None:
    if offload == "optimizer" and strategy == "ddp":
        raise UsageError("--offload optimizer needs a ZeRO stage (zero1, zero2 or zero3), not ddp")
    if offload == "optimizer+params" and strategy != "zero3":
        raise UsageError("--offload optimizer+params needs --strategy zero3 (or fsdp)")


def _default_per_node(gpu: Gpu, total: int | None) -> int:
    """GPUs per "node" (the NVLink domain the model treats as one) for --gpu without --gpus-per-node: 8 (an HGX
    server), or for a GPU whose NVLink spans servers (GB200 NVL72) the largest part of --gpus that one domain holds."""
    if gpu.nvlink_domain is None:
        return min(8, total or 8)
    total = total or gpu.nvlink_domain
    return max(d for d in range(1, min(total, gpu.nvlink_domain) + 1) if total % d == 0)


def _placement(job: JobSpec, catalog: Catalog) -> tuple[Gpu, Instance | None, int, int]:
    """(gpu, instance, gpus_per_node, nodes) from --instance/--gpu, --gpus, --gpus-per-node."""
    if job.instance and job.gpu:
        inst = catalog.instance(job.instance)
        gpu = catalog.gpu(job.gpu)
        if gpu.name != inst.gpu:
            raise UsageError(f"--gpu {printable(job.gpu)} contradicts --instance {inst.name}, which has {inst.gpu}; "
                             f"give one of them")
    if job.instance:
        inst = catalog.instance(job.instance)
        gpu = catalog.gpu_of(inst)
        per_node = job.gpus_per_node or inst.gpu_count
        if per_node > inst.gpu_count:
            raise UsageError(f"--gpus-per-node {per_node} is more than {inst.name} has ({inst.gpu_count})")
    elif job.gpu:
        inst = None
        gpu = catalog.gpu(job.gpu)
        per_node = job.gpus_per_node or _default_per_node(gpu, job.gpus)
    else:
        raise UsageError("no hardware given: use --instance TYPE or --gpu NAME (see `trainready catalog`)")
    total = job.gpus or per_node
    if total < per_node:
        per_node = total
    if total % per_node:
        raise UsageError(f"--gpus {total} is not a whole number of nodes of {per_node} GPUs")
    return gpu, inst, per_node, total // per_node


def power_problem(job: JobSpec, gpu: Gpu) -> str | None:
    """Why the job's --power-limit cannot be modelled on `gpu` (None: no limit, or it can): resolve's usage error
    and plan's exclusion."""
    if job.power_limit_w is None:
        return None
    try:
        power_scale(gpu.arch, job.power_limit_w, gpu.power_w)
    except ValueError as exc:
        return f"--power-limit {job.power_limit_w:.10g} on {gpu.name}: {exc}"
    return None


def resolve(job: JobSpec, catalog: Catalog, *, model: ModelSpec | None = None) -> Setup:
    """Validate a fully specified job (micro-batch may still be None: defaults to 1)."""
    model = model or resolve_model(job)
    st = job_stack(job)
    ckpt = checkpointing_kind(job.activation_checkpointing, st.stack)
    gpu, inst, per_node, nodes = _placement(job, catalog)
    region = job.region
    if region is not None:  # a typo is an error, not a run priced nowhere ("-" in every cost column)
        region = catalog.region(region, inst, need_price=job.usd_per_hour is None)
    strategy = _normalize_strategy(job.strategy)
    _check_parallel(model, job.tp, job.pp, per_node, nodes)
    n_gpus = per_node * nodes
    cp = job.cp
    if n_gpus % (job.tp * job.pp * cp):
        raise UsageError(f"{n_gpus} GPUs are not divisible by --tp {job.tp} x --pp {job.pp}"
                         + (f" x --cp {cp}" if cp > 1 else ""))
    dp = n_gpus // (job.tp * job.pp * cp)
    etp = job.etp if job.etp is not None else default_etp(st.stack, job.tp, job.ep)
    _check_ep(model, job.ep, etp, job.tp, dp, per_node, cp)
    precision = job.precision or default_precision(gpu)
    optimizer_dtype = optimizer_dtype_of(job.optimizer_dtype, st.stack, precision)
    _check_precision(gpu, precision, optimizer_dtype)
    _check_offload(strategy, job.offload, job.method)
    seq_len = job.seq_len or default_seq_len(model)
    _check_cp(cp, seq_len, n_gpus, job.tp * job.pp)
    check_doc_len(job.doc_len, seq_len, cp, model, st)
    notes: list[str] = []
    if model.position == "learned" and model.max_seq_len and seq_len > model.max_seq_len:
        raise UsageError(f"--seq-len {seq_len} exceeds {model.name}'s learned position table ({model.max_seq_len})")
    if model.max_seq_len and seq_len > model.max_seq_len:
        notes.append(f"seq_len {seq_len} is beyond {model.name}'s trained context ({model.max_seq_len})")
    micro = job.micro_batch or 1
    v = job.pp_virtual or 1
    # interleaved stages run micro-batches in groups of pp (_check_virtual): the default batch is a whole number
    global_batch = job.global_batch or default_global_batch(seq_len, dp * (job.pp if v > 1 else 1), micro)
    if global_batch % (micro * dp):
        raise UsageError(f"global batch {global_batch} is not divisible by micro-batch {micro} x data-parallel "
                         f"size {dp} = {micro * dp}; nearest valid: {nearest_multiples(global_batch, micro * dp)}")
    accum = global_batch // (micro * dp)
    _check_virtual(model, job.pp, v, micro, dp, global_batch, accum)
    if job.pp > 1 and accum < job.pp and st.stack.torch_pipelining:
        need = micro * dp * job.pp
        raise UsageError(f"{accum} micro-batch(es) per step for --pp {job.pp}: stack {st.stack.name} pipelines with "
                         f"torch.distributed.pipelining, whose Schedule1F1B needs at least as many micro-batches as "
                         f"stages; --global-batch {need} (or more) or a smaller --micro-batch")
    _check_local_batch(job.pp_local_batch, job.pp, v, st.stack, micro, dp, global_batch)
    if job.pp > 1 and accum < job.pp:
        notes.append(f"only {accum} micro-batches per step for {job.pp} pipeline stages: the bubble is large")
    comm = moe_comm(job, model, st.stack, precision)
    if model.moe is not None and job.ep == 1:
        if said := ep1_dispatch_note(job.ep_dispatcher == "deepep", comm["ep_overlap"], comm["fp8_dispatch"]):
            notes.append(said + " here")
        # no token leaves its GPU: the setup (and the assumptions said from it) holds none of them
        comm.update(ep_dispatcher="alltoall", ep_overlap=False, fp8_dispatch=False)
    overlap, why = tp_overlap_of(job.tp_overlap, st.stack, job.tp)
    if why:
        notes.append(why)
    compiled = torch_compile_of(job.torch_compile, st.stack)
    graphs = cuda_graphs_of(job.cuda_graphs, st.stack)
    modules = check_modules(job.recompute_modules, model, stack=st.stack.name, checkpointing=ckpt,
                            asked=job.activation_checkpointing, method=job.method)
    if model.moe is not None and comm["ep_overlap"] and st.stack.name == "megatron" and (
            problem := megatron_ep_overlap_problem(job.ep, job.pp, v, ckpt, modules or ())):
        raise UsageError(f"--ep-overlap on stack megatron: Megatron-Core's --overlap-moe-expert-parallel-comm refuses "
                         f"this layout ({problem}), or --no-ep-overlap")
    recipe = fp8_recipe_of(job, st.stack, gpu, precision)
    fp8_param_gather_of(job.fp8_param_gather, st.stack, precision=precision, recipe=recipe, strategy=strategy,
                        method=job.method, offload=job.offload)  # a usage error where asked for and impossible
    notes += stack_warnings(st.stack, fp8_recipe=recipe if precision == "fp8" else None,
                            token_drop=model.moe is not None and model.moe.capacity_factor is not None
                            and (job.moe_routing == "capacity" or job.capacity_factor is not None))
    if problem := power_problem(job, gpu):  # a usage error where the evidence does not cover it
        raise UsageError(problem)
    inter = job.inter_node_gbps or (inst.network_gbps if inst else None)
    if nodes > 1 and inter is None:
        raise UsageError(f"{nodes} nodes need an inter-node bandwidth: the catalog does not know it for "
                         f"{inst.name if inst else gpu.name}; give --inter-node-gbps")
    return Setup(model=model, gpu=gpu, instance=inst, nodes=nodes, gpus_per_node=per_node, dp=dp, tp=job.tp,
                 pp=job.pp, strategy=strategy, micro_batch=micro, grad_accum=accum, seq_len=seq_len,
                 precision=precision, optimizer_dtype=optimizer_dtype, reduce_dtype=st.reduce_dtype,
                 gather_dtype=job.gather_dtype,
                 checkpointing=ckpt, offload=job.offload, method=job.method,
                 lora_rank=job.lora_rank, kernels=st.kernels,
                 attention_kernel=st.attention_kernel, inter_node_gbps=inter, tokens=job.tokens,
                 spot=job.spot, region=region, usd_per_hour=job.usd_per_hour, keep_hot=job.keep_hot,
                 ep=job.ep, etp=etp, notes=tuple(notes), stack=st.stack.name, stack_named=job.stack is not None,
                 framework=job.framework or "auto",
                 pp_virtual=v, pp_local_batch=job.pp_local_batch, cp=cp, doc_len=job.doc_len, tp_overlap=overlap,
                 fp8_recipe=recipe,
                 fp8_param_gather_asked=job.fp8_param_gather, torch_compile=compiled, cuda_graphs=graphs,
                 recompute_modules=modules, power_limit_w=job.power_limit_w,
                 lora_targets=check_targets(job.lora_targets, model, job.method),
                 lora_dropout=check_dropout(job.lora_dropout, job.method),
                 autocast_asked=check_autocast(job.autocast, job.method, st.stack, precision), **comm)
