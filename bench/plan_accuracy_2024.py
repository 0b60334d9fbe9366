"""How close is `trainready estimate` to training runs published in 2024-2026, and do they fit?

The development set of issue 24: bench/data/plan_reference/megatron_bridge.csv (NVIDIA NeMo and
Megatron-Bridge performance summaries), dgxc_benchmarking.csv (NVIDIA's DGX Cloud Benchmarking recipes, v25.01.1 to
v25.05.05) and
published_2024_2026.csv (torchtitan benchmarks, torchao,
NeMo AutoModel, the Llama 3 paper), one published run per row with its source, collected from the
publications without looking at the planner's figures. For every row the publisher's own layout is
estimated (GPU, GPU count, TP, PP, virtual stages, CP, EP, micro-batch, global batch, sequence length,
precision, recompute, stack) and the script prints, per source and overall: the median and 90th-percentile
absolute error of tokens/s/GPU, the signed median (positive: the planner is optimistic), how many rows the
memory model says fit (peak <= the card, no margin) and how many pass `plan`'s fit rule (with its default
margin), the memory model's error against every peak a source publishes, and every row.

Inclusion rule (fixed before the rows were compared with the planner): `included` = yes in the file (the
layout is published in full and the row measures training steps), and the planner can express it: a model
preset exists, the GPU is in the catalog, the precision is bf16 or FP8 (tensor-wise or row-wise scaling,
or MXFP8, estimated as `--precision fp8` with the row's `--fp8-recipe`; NVFP4 is not modelled), and the
layout resolves. Two clauses were added on 2026-12-06, when GB200 entered the catalog, for what the model
has no shape for: a GB200 run within one NVL72 rack is one 72-GPU NVLink domain, and one across racks is
left out (decided before any GB200 row was compared); a run that offloads activations to host memory
(Megatron's activation CPU offloading, MoE paged stash) is left out (added after the first comparison put
two GB200 rows at 389 and 212 GiB on 185 GiB cards: their recipes turn those offloads on). Rows left out
are listed with the reason.

Each configuration counts once (added 2026-12-07, when the DGX Cloud recipes' older tags brought 5-7 GPU counts of
each layout, fixed before their errors were seen): a row whose estimate inputs (`job_of`), less the GPU count and
what scales with it (global batch, network) but with the micro-batches per step, repeat a row of the same file at
fewer GPUs (or at as many, earlier in the file) is a repeat: printed on a line of its own, left out of the accuracy
targets and the track record, kept in the fit and memory-record checks (every run that ran must fit).

Attention kernel: where a row's attention went through torch's SDPA (torchtitan, torchao, Hugging Face
stacks) on a torch release the source names and that release predates cuDNN as SDPA's choice on
Hopper/Blackwell (torch 2.11, plan/stacks.py), the row is estimated with `--attention-kernel flash2`, the
kernel that release ran; a row whose torch is not published keeps the stack's kernel. The release is the `torch`
column (a build named by commit is read as its release line: 1963fc8 of 2024-12 as 2.6, 38410cf9 of 2025-06 as
2.8, the benchmark files' dates).

What a source states in prose that the estimate takes as an input is a column of its own (added 2026-12-07; until
then the bench read it from the notes with patterns, and a review found a phrase the pattern missed): `torch`,
`power_limit_w`, `host_offload`, `load_imbalance`, `expert_routing`, `ep_dispatcher`, `fp8_param_gather`, and a
`gpu` of `h100-96gb-hbm2e` for Meta's parts; and, with `--lora-targets` (2026-12-07), `lora_rank` and
`lora_targets`: the recipe's LoRA dim and target modules, estimated with `--lora-rank` and `--lora-targets`; with
`--lora-dropout` (2026-12-07), `lora_dropout`: the recipe's LoRA dropout where it states one (blank: the
framework's default, 0 in PEFT, Megatron-Bridge and AutoModel). The notes keep the words the value was read
from, and tests/test_plan_reference.py fails where a note says one thing and the column another.

torch.compile (the `compile` column, from the row's framework release): "model+loss" rows (torchtitan from PR
#1033, 2025-04, which compiles the loss with the model) are estimated with `--compile`; "model" rows (earlier
torchtitan compiled the blocks only, the loss eager) and "yes" rows (what was compiled is not published) without:
`--compile` changes the loss's memory only, and the blocks' compile is not an input. A Megatron row whose source ran
CUDA graphs (the `cuda_graphs` column) is estimated with `--cuda-graphs` (added 2026-12-07; no row's figure moved: the
model has each of them GPU-bound).

MoE dispatch and routing (added 2026-12-07, after the Kimi K2 row read -43% with the stack's collective
all-to-all where its source names DeepEP): a row whose source names DeepEP or HybridEP has `ep_dispatcher`
deepep; one that forced balanced routing (force-balanced, forced load balance, moe_force_load_balance, NeMo
AutoModel's fake_balanced_gate) a `load_imbalance` of 1.0, and fake_balanced_gate's rows `expert_routing`
contiguous. Megatron recipes with `--recompute-modules` are estimated with that list
(plan/recompute.py; publications' short names read by recompute.published_modules).

Pipeline schedule calls (added 2026-12-07, after the Kimi K2 row read +27%; the mechanism read in NeMo AutoModel's
benchmark loop at 89e3a9fdd and torchtitan 0.3's Trainer.train_step, no factor fitted): where a torchtitan or
AutoModel row's source gives the local batch, the `pp_local_batch` column holds it and the row is estimated with
`--pp-local-batch`, one pipeline fill and drain per local batch (Kimi K2: LBS 8 x GA 2).

FP8 parameter all-gather (added 2026-12-07, with `--fp8-gather`; the flags read in Megatron-Bridge's and NeMo's
mixed-precision recipes and torchtitan's float8 config, no factor fitted): an FP8 row whose source says its
weights were all-gathered in float8 ("with float8 all-gather", "FSDP float8 all-gather", "(f8 all-gather)") has
`fp8_param_gather` yes and is estimated with `--fp8-gather`, one that says "bfloat16 all-gather" no and
`--no-fp8-gather`; a row that does not say keeps the stack's recipe (Megatron's delayed and current-scaling
recipes gather FP8, torchtitan's default does not).

Power limits and Meta's H100s (added 2026-12-07, with `--power-limit`; the scale from NVIDIA's datasheets of the
same chip at two board powers, efficiency.power_scale, no factor fitted): a row whose source states its GPUs'
power limit ("500 W power limit", "B200 power limit 750 W"; the `power_limit_w` column) is estimated at that
limit, and a row whose notes say its H100s are Meta's "96GB HBM2e" parts runs on that part (`gpu`
h100-96gb-hbm2e: 2.4 TB/s, 96 GB, the H100 SXM's compute), as torchtitan's benchmark files describe their hardware.

MoE rows of both benches (added 2026-12-07, when seven Qwen3-30B-A3B rows on B200 joined this set, collected by a
helper before the planner saw them, and read -5..+14% while moe.csv's ten read 31% median): issue 24's MoE target
and the fit target count moe.csv's rows too (NeMo AutoModel, Megatron-Bridge and Megatron-MoE-ModelZoo runs
published 2025-2026, estimated by bench/plan_accuracy.py's MoE rule); the "MoE" line is this set's rows alone (the
DeepEP fork's 1-16 node runs of one local batch count once since the configuration rule above).

Targets (issue 24): dense median <= 5%, p90 <= 12%; MoE median <= 10%, p90 <= 20%; every published run fits.

Usage: python bench/plan_accuracy_2024.py [--rows]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # plan_accuracy, whichever way this file is loaded

from trainready.catalog import Catalog, load_catalog  # noqa: E402
from trainready.errors import UsageError  # noqa: E402
from trainready.plan.fit import GPU_MARGIN  # noqa: E402
from trainready.plan.job import JobSpec  # noqa: E402
from trainready.plan.memory import GiB, estimate_memory  # noqa: E402
from trainready.plan.memory_record import compared as memory_compared  # noqa: E402
from trainready.plan.memory_record import memory_record, projected_peak_gib  # noqa: E402
from trainready.plan.memory_record import warning as memory_record_warning  # noqa: E402
from trainready.plan.performance import estimate_step  # noqa: E402
from trainready.plan.presets import preset  # noqa: E402
from trainready.plan.recompute import published_modules  # noqa: E402
from trainready.plan import track_record  # noqa: E402
from trainready.plan.setup import resolve  # noqa: E402
from trainready.plan.stacks import SDPA_CUDNN_TORCH, get_stack  # noqa: E402

import plan_accuracy as acc2023  # noqa: E402  (its MoE rows, moe.csv, are 2024-2026 publications too)

DATA = Path(__file__).resolve().parent / "data" / "plan_reference"
FILES = ("megatron_bridge.csv", "published_2024_2026.csv", "dgxc_benchmarking.csv")
_SHIPPED = load_catalog()
# Meta's benchmark H100s (torchtitan's 2024-12 and 2025-06 tables): "96GB HBM2e with 2.4 TB/sec peak memory
# bandwidth", the H100 SXM's compute; a part of their own, not in the shipped catalog. Rows whose notes say
# "96GB HBM2e" name it as their `gpu` and run on it (its fit judged against 96 GB, its elementwise kernels at 2.4 TB/s).
H100_96GB_HBM2E = _SHIPPED.gpus["h100-80gb"].model_copy(update={
    "name": "h100-96gb-hbm2e", "display_name": "NVIDIA H100 96GB HBM2e (Meta Grand Teton)", "aliases": [],
    "memory_gib": 96e9 / 2**30, "hbm_gbps": 2400,
    "source": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md: 96GB HBM2e, 2.4 TB/s; compute as "
              "the H100 SXM", "sources": {}})
CATALOG = Catalog(gpus={**_SHIPPED.gpus, H100_96GB_HBM2E.name: H100_96GB_HBM2E}, instances=_SHIPPED.instances,
                  files=_SHIPPED.files)
DENSE_TARGET, MOE_TARGET = (5.0, 12.0), (10.0, 20.0)
NVL72 = 72  # GPUs in one GB200 NVL72 NVLink domain


def _checkpointing(recompute: str) -> str:
    r = recompute.strip()
    if r in ("", "none"):
        return "none"
    if r == "full":
        return "full"
    if r == "selective:op":
        return "selective-op"
    if "core_attn" in r:
        return "selective-attn"
    return "selective"


def torch_of(r: dict[str, str]) -> tuple[int, int] | None:
    """The torch release a row ran, from its `torch` column (None: not published)."""
    if not r["torch"]:
        return None
    major, minor = r["torch"].split(".")
    return int(major), int(minor)


def attention_kernel_of(r: dict[str, str], stack: str | None) -> str | None:
    """FlashAttention-2 where the row's attention went through torch's SDPA on a torch before cuDNN became its
    choice on Hopper/Blackwell (plan/stacks.py, SDPA_CUDNN_TORCH); None: the stack's own kernel."""
    torch = torch_of(r)
    if torch is None or not get_stack(stack).torch_sdpa:
        return None
    return "flash2" if torch < tuple(int(x) for x in SDPA_CUDNN_TORCH.split(".")) else None


def job_of(r: dict[str, str]) -> JobSpec:
    """The publisher's layout as a job; a UsageError says why it cannot be expressed."""
    precision = "fp8" if r["precision"] in ("fp8", "mxfp8") else r["precision"]
    if precision not in ("fp8", "bf16"):
        raise UsageError(f"precision {precision} is not modelled")
    try:
        preset(r["model"])
    except UsageError:
        raise UsageError(f"no preset for {r['model']}") from None
    if r["host_offload"]:  # Megatron's activation CPU offloading / MoE paged stash with a host tier
        raise UsageError(f"activations offloaded to host memory ({r['host_offload']}) are not modelled")
    if r["gpu"] not in CATALOG.gpus:
        raise UsageError(f"GPU {r['gpu'] or '(not published)'} is not in the catalog")
    n = int(r["num_gpus"])
    per_node = int(r["gpus_per_node"] or 8)
    if r["gpu"] == "gb200":
        # a GB200 NVL72 rack is one NVLink domain of 72 GPUs (18 trays of 4): a run inside one rack is one "node"
        # here; one across racks mixes the NVLink domain with the racks' network, which the model has no shape for
        if n > NVL72:
            raise UsageError(f"{n} GB200 GPUs span NVL72 racks (NVLink inside, InfiniBand between): not modelled")
        per_node = n
    kw: dict = dict(model=r["model"], gpu=r["gpu"], gpus=n, gpus_per_node=min(per_node, n),
                    strategy=r["sharding"] or "zero1", tp=int(r["tp"] or 1), pp=int(r["pp"] or 1),
                    cp=int(r["cp"] or 1), ep=int(r["ep"] or 1), micro_batch=int(r["micro_batch"]),
                    global_batch=int(r["global_batch"]), seq_len=int(r["seq_len"]), precision=precision,
                    activation_checkpointing=_checkpointing(r["recompute"]),
                    method="lora" if r["method"] == "lora" else "full")
    if r["recompute"].startswith("selective:") and r["stack"] == "megatron":  # Megatron's --recompute-modules
        kw["recompute_modules"] = published_modules(r["recompute"])
    if n > per_node:
        kw["inter_node_gbps"] = float(r["inter_node_gbps"] or 3200)  # 8 x 400G InfiniBand where not stated
    if r["vpp"] and int(r["vpp"]) > 1:
        kw["pp_virtual"] = int(r["vpp"])
    if r.get("pp_local_batch") and kw["pp"] > 1:  # torch.distributed.pipelining: one schedule call per local batch
        kw["pp_local_batch"] = int(r["pp_local_batch"])
    if r["etp"]:
        kw["etp"] = int(r["etp"])
    if r["lora_rank"]:  # the recipe's LoRA dim
        kw["lora_rank"] = int(r["lora_rank"])
    if r["lora_targets"]:  # the recipe's target modules (Megatron's linear_qkv, PEFT's q_proj, ..., all-linear)
        kw["lora_targets"] = r["lora_targets"].split(",")
    if r["lora_dropout"]:  # the recipe's LoRA dropout, where the stack puts it (AutoModel: on the adapter output)
        kw["lora_dropout"] = float(r["lora_dropout"])
    stack = r["stack"] if r["stack"] in ("megatron", "torchtitan", "deepspeed", "automodel") else None
    if stack:
        kw["stack"] = stack
    recipe = r["fp8_recipe"].lower()
    if precision == "fp8" and recipe:  # the row's scaling recipe; unpublished: the stack's default
        kw["fp8_recipe"] = next((n for n in ("mxfp8", "rowwise", "blockwise", "delayed", "tensorwise") if n in recipe),
                                None)
    # what the source states of routing, dispatch, FP8 weights and power, in columns of their own (the notes say
    # where each comes from; tests/test_plan_reference.py checks that notes and columns agree)
    if r["load_imbalance"]:
        kw["expert_load_imbalance"] = float(r["load_imbalance"])  # 1.0: the benchmark forced an even spread
    if r["expert_routing"]:  # contiguous: NeMo AutoModel's fake_balanced_gate, token t to experts t k .. t k + k - 1
        kw["expert_routing"] = r["expert_routing"]
    if r["ep_dispatcher"]:  # the dispatcher the source names (DeepEP, HybridEP: deepep)
        kw["ep_dispatcher"] = r["ep_dispatcher"]
    if r["fp8_param_gather"] in ("yes", "no"):  # the source says its weights were all-gathered in float8, or not
        kw["fp8_param_gather"] = r["fp8_param_gather"] == "yes"
    if r["power_limit_w"]:  # the GPUs' power limit where the source states one
        kw["power_limit_w"] = float(r["power_limit_w"])
    if r["tp_comm_overlap"] == "yes" and kw["tp"] > 1:  # Megatron's --tp-comm-overlap, torchtitan's async TP
        kw["tp_overlap"] = True
    kernel = attention_kernel_of(r, stack)
    if kernel:
        kw["attention_kernel"] = kernel
    if r["reduce_dtype"] in ("fp32", "bf16"):
        kw["reduce_dtype"] = r["reduce_dtype"]
    if r["compile"] == "model+loss":  # torchtitan from PR #1033 (2025-04) compiles the loss with the model
        kw["torch_compile"] = True
    if r["cuda_graphs"] == "yes" and stack == "megatron":  # Megatron's per-layer graphs (--cuda-graphs)
        kw["cuda_graphs"] = True
    return JobSpec(**kw)


def evaluate(r: dict[str, str]) -> dict:
    out = {"row": r}
    try:
        job = job_of(r)
        setup = resolve(job, CATALOG)
        step = estimate_step(setup)
        mem = estimate_memory(setup)
    except (UsageError, ValueError) as exc:
        out["why_not"] = str(exc).splitlines()[0][:120]
        return out
    out["job"], out["setup"] = job, setup
    out["pred"] = step.tokens_per_s / setup.n_gpus
    out["peak_gib"] = mem.peak / GiB
    if r["peak_mem_gib"]:  # the published peak, compared with the same quantity the source reports
        out["mem_signed"], out["mem_ratio"] = memory_compared(mem, float(r["peak_mem_gib"]), r["mem_kind"])
    out["gpu_gib"] = setup.gpu.memory_gib
    if r["tok_s_gpu"]:
        out.update(_compared(out["pred"], float(r["tok_s_gpu"])))
    return out


def _compared(pred: float, meas: float) -> dict[str, float]:
    """A row's measured tokens/s/GPU and the prediction's absolute and signed error (%)."""
    return {"meas": meas, "err": abs(pred - meas) / meas * 100, "signed": (pred / meas - 1) * 100}


p90 = track_record.p90  # nearest rank, as bench/plan_accuracy.py and `plan`'s track record count it


def line(label: str, res: list[dict]) -> str:
    errs = [x["err"] for x in res if "err" in x]
    if not errs:
        return f"  {label:34s} n=0"
    signed = statistics.median(x["signed"] for x in res if "err" in x)
    fits = sum(x["peak_gib"] <= x["gpu_gib"] for x in res)
    margin = sum(x["peak_gib"] <= x["gpu_gib"] * (1 - GPU_MARGIN) for x in res)
    return (f"  {label:34s} median {statistics.median(errs):5.1f}%  p90 {p90(errs):5.1f}%  signed median "
            f"{signed:+5.1f}%  fit {fits}/{len(res)} (within the {GPU_MARGIN:.0%} margin {margin})  (n={len(errs)})")


_SCALE_INPUTS = {"gpus", "gpus_per_node", "global_batch", "inter_node_gbps"}  # what grows with the GPU count


def configuration(res: dict) -> str:
    """An estimated row's configuration (`evaluate`'s result): the estimate's inputs less the GPU count and what
    scales with it (GPUs per node below one node, global batch, network), with the micro-batches per step in their
    place (the pipeline's bubble depends on them), and the row's file."""
    inputs = res["job"].model_dump(exclude=_SCALE_INPUTS)
    return json.dumps([res["row"]["_file"], inputs, res["setup"].grad_accum], sort_keys=True, default=str)


def evaluated_all() -> tuple[list[dict], list[dict], list[dict]]:
    """(counted, repeats, left out) for every row the files include, each as `evaluate` gives it (its file in
    row["_file"]). Each configuration counts once, at the fewest GPUs its file publishes (the first such row on a
    tie); the same configuration at more GPUs, or measured again, is a repeat (its `repeat_of` names the row that
    counts): a weak-scaling series is one configuration, not one row per count."""
    counted, repeats, left_out, first = [], [], [], {}
    for name in FILES:
        rows = [dict(r, _file=name) for r in csv.DictReader((DATA / name).open(newline="")) if r["included"] == "yes"]
        for r in sorted(rows, key=lambda r: int(r["num_gpus"])):  # stable: file order among equal counts
            res = evaluate(r)
            if "why_not" in res:
                left_out.append(res)
                continue
            key = configuration(res)
            if key in first:
                repeats.append(dict(res, repeat_of=first[key]))
            else:
                first[key] = r["id"]
                counted.append(res)
    return counted, repeats, left_out


def evaluated() -> tuple[list[dict], list[dict]]:
    """(counted, left out): `evaluated_all` without the repeats."""
    counted, _, left_out = evaluated_all()
    return counted, left_out


def _record_warns(setup) -> bool:
    rec = memory_record(setup)
    return rec is not None and memory_record_warning(rec, estimate_memory(setup), setup.gpu.memory_gib) is not None


def known_oom() -> list[dict]:
    """known_oom.csv: published runs that ran out of memory, each as the row it names (`like`) with its local and
    global batch changed; with the model's peak and the peak at the memory record's median error."""
    rows = {r["id"]: r for name in FILES for r in csv.DictReader((DATA / name).open(newline=""))}
    out = []
    for k in csv.DictReader((DATA / "known_oom.csv").open(newline="")):
        job = job_of(rows[k["like"]]).model_copy(update={"micro_batch": int(k["micro_batch"]),
                                                         "global_batch": int(k["global_batch"])})
        setup = resolve(job, CATALOG)
        mem = estimate_memory(setup)
        rec = memory_record(setup)
        out.append({"id": k["id"], "setup": setup, "peak_gib": mem.peak / GiB, "gpu_gib": setup.gpu.memory_gib,
                    "at_record_gib": projected_peak_gib(rec, mem) if rec else None, "warned": _record_warns(setup)})
    return out


def moe_csv_results() -> list[dict]:
    """moe.csv's MoE rows (NeMo AutoModel, Megatron-Bridge, Megatron-MoE-ModelZoo: published 2025-2026, estimated as
    bench/plan_accuracy.py's MoE rule has them), in `evaluate`'s form: issue 24's MoE target counts them with this
    set's own."""
    return [{"row": dict(r, _file="moe.csv"), "setup": setup, "pred": pred, **_compared(pred, float(r["tok_s_gpu"])),
             "peak_gib": estimate_memory(setup).peak / GiB, "gpu_gib": setup.gpu.memory_gib}
            for r, pred, setup in acc2023.counted_moe(acc2023.read_csv(DATA / "moe.csv"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args()
    print(__doc__.split("Usage:")[0].strip())
    print()
    results, repeats, left_out = evaluated_all()
    dense = [x for x in results if not x["setup"].model.is_moe]
    moe = [x for x in results if x["setup"].model.is_moe]
    print("Tokens/s/GPU and fit, per source")
    for name in FILES:
        print(line(name, [x for x in results if x["row"]["_file"] == name]))
    for label, sel in (("dense", dense), ("dense bf16", [x for x in dense if x["row"]["precision"] == "bf16"]),
                       ("dense fp8", [x for x in dense if x["row"]["precision"] != "bf16"]),
                       ("dense long context (cp > 1)", [x for x in dense if x["setup"].cp > 1]),
                       ("dense LoRA/SFT", [x for x in dense if x["row"]["method"] in ("lora", "sft")]),
                       ("MoE", moe)):
        print(line(label, sel))
    moe_csv = moe_csv_results()
    moe_all = moe + moe_csv
    print(line("MoE, with moe.csv's rows", moe_all))
    for gpu in sorted({x["setup"].gpu.name for x in results}):
        print(line(gpu, [x for x in results if x["setup"].gpu.name == gpu]))
    errs = lambda sel: [x["err"] for x in sel if "err" in x]  # noqa: E731
    for label, sel, (t_med, t_p90) in (("dense", dense, DENSE_TARGET), ("MoE", moe_all, MOE_TARGET)):
        e = errs(sel)
        if e:
            med, hi = statistics.median(e), p90(e)
            print(f"  target {label:6s} median {med:5.1f}% <= {t_med:g}% {'PASS' if med <= t_med else 'MISS'}   "
                  f"p90 {hi:5.1f}% <= {t_p90:g}% {'PASS' if hi <= t_p90 else 'MISS'}")
    if repeats:
        e = errs(repeats)
        print(f"  not counted: {len(repeats)} repeats of a counted configuration (more GPUs, or measured again): "
              f"median {statistics.median(e):.1f}%  p90 {p90(e):.1f}%  signed median "
              f"{statistics.median(x['signed'] for x in repeats):+.1f}%")
    ran_all = results + repeats  # every run that ran must fit, repeats too
    every_run = ran_all + moe_csv
    unfit = [x for x in every_run if x["peak_gib"] > x["gpu_gib"]]
    print(f"  target fit: {len(every_run) - len(unfit)} of {len(every_run)} published runs fit by the memory model "
          f"{'PASS' if not unfit else 'MISS'}")
    print("\nPeak memory against the published peaks (torch's max reserved or allocated, as the source reports; "
          "every run, repeats too:\nsharded state shrinks as the GPU count grows)")
    for name in FILES:
        sel = [x for x in ran_all if x["row"]["_file"] == name and "mem_signed" in x]
        if sel:
            e = [abs(x["mem_signed"]) for x in sel]
            print(f"  {name:34s} median {statistics.median(e):5.1f}%  p90 {p90(e):5.1f}%  signed median "
                  f"{statistics.median(x['mem_signed'] for x in sel):+5.1f}%  worst "
                  f"{max(sel, key=lambda x: abs(x['mem_signed']))['mem_signed']:+5.1f}%  (n={len(sel)})")
    for x in sorted((x for x in ran_all if "mem_signed" in x), key=lambda x: -abs(x["mem_signed"])):
        print(f"    {x['mem_signed']:+6.1f}%  published {float(x['row']['peak_mem_gib']):6.1f} GiB "
              f"{x['row']['mem_kind']:9s} {x['row']['id']}")
    print("\nThe memory record (plan/memory_record.py): a warning where, scaled by the median ratio of the published "
          "peaks of runs\nlike it, a setup's peak would exceed the card; never on a run that ran, always on one that "
          "ran out of memory (known_oom.csv)")
    ran = [x for x in every_run if _record_warns(x["setup"])]
    print(f"  runs that ran, warned: {len(ran)} of {len(every_run)} (target 0)"
          + "".join(f"\n    {x['row']['id']}" for x in ran))
    for x in known_oom():
        said = ("said not to fit" if x["peak_gib"] > x["gpu_gib"] else
                "warned" if x["warned"] else "NOT WARNED")
        at = f"{x['at_record_gib']:6.1f}" if x["at_record_gib"] is not None else "     -"
        print(f"  ran out of memory: {x['id']}: model {x['peak_gib']:6.1f} GiB, at the record {at} GiB of "
              f"{x['gpu_gib']:.0f}: {said}")
    print("\nRows said not to fit (peak > the card):")
    for x in unfit:
        r = x["row"]
        print(f"    {x['peak_gib']:6.1f} > {x['gpu_gib']:6.1f} GiB  {r['id']}  (published peak: {r['peak_mem_gib'] or '-'})")
    rows = sorted(results + (repeats if args.rows else []), key=lambda x: -x.get("err", 0))
    print(f"\n{'Every row' if args.rows else 'Worst 15 rows'} (signed error: + = the planner is optimistic):")
    for x in rows if args.rows else rows[:15]:
        r, s = x["row"], x["setup"]
        if "err" not in x:
            continue
        print(f"  {x['signed']:+6.1f}%  pred {x['pred']:8.0f}  meas {x['meas']:8.0f}  peak {x['peak_gib']:5.1f}/"
              f"{x['gpu_gib']:.0f}  {r['id']}: {r['model']} {s.n_gpus}x{s.gpu.name} tp{s.tp} pp{s.pp}"
              f"{'x' + str(s.pp_virtual) if s.pp_virtual > 1 else ''} cp{s.cp} ep{s.ep} mb{s.micro_batch} "
              f"gb{s.global_batch} s{s.seq_len} {r['precision']} {s.checkpointing} {s.stack}"
              + ("" if s.attention_kernel == "sdpa" else f" attention {s.attention_kernel}")
              + (f" (repeat of {x['repeat_of']}, not counted)" if "repeat_of" in x else ""))
    print(f"\nLeft out ({len(left_out)}: included in the file, but the planner cannot express them):")
    for x in left_out:
        print(f"    {x['row']['id']}: {x['why_not']}")


if __name__ == "__main__":
    main()
