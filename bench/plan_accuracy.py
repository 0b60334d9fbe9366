"""How close is `trainready estimate` to measured training runs?

Runs the planner's estimate on published measurements and on our own H200 measurements,
and prints the median and 90th-percentile absolute percentage error (APE) of tokens/s/GPU
and of peak memory, with the row count n behind every figure, PASS/MISS against the
targets, and the worst rows.

Data: bench/data/plan_reference/*.csv, one published measurement per row with its source
(paper and table, or repository, file and commit), written from the publications; our own
runs are bench/data/gpu_*_h200_*.json. `--reference DIR` reads the same rows from the shared
reference layout instead (plan_ground_truth.csv, mosaicml_llmfoundry_a100_80gb_h100.csv):
the figures are the same.

Targets (issue 13, section 5), as benchmarks:
  dense tokens/s/GPU  median <= 5%,  p90 <= 12%
  MoE tokens/s/GPU    median <= 10%, p90 <= 20%
  peak memory         every row with a published peak within 15% (median and p90 shown too)

Inclusion rule, dense (fixed before tuning; printed with the results):
  A row counts toward a target when (1) its configuration is published in full -- model
  shape, GPU, GPU count, parallelism, micro-batch, activation checkpointing, precision --
  and uses only techniques `estimate` models, and (2) it measures training steps, not a
  whole run. Each measured run counts once: rows 1-30 of plan_ground_truth.csv repeat
  MosaicML rows and are taken from the MosaicML file only.
  Excluded, and why:
  * Megatron-LM Table 1 (rows 31-40): micro-batch size not published; reported as a check
    of hardware TFLOP/s (their formula counts recompute) with micro-batch 1 assumed.
  * LLaMA rows 88-91: whole-run GPU-hours include downtime: a sanity check only.
  * torchtune rows 69, 71-78: unpacked variable-length samples (69), or techniques
    estimate does not model (torch.compile, chunked cross-entropy, optimizer-in-backward,
    activation offload, 8-bit Adam).
  * ZeRO paper row 102: model-state memory only; checked against the paper's formulas.

Inclusion rule, MoE (fixed before any MoE row was compared with the model; the rows are in
bench/data/plan_reference/moe.csv, `included` and `exclusion` say which count and why):
  A MoE row counts toward the MoE target when
  (1) it measures training steps (tokens/s/GPU, or step time with global batch and sequence
      length), not whole-run GPU-hours;
  (2) its configuration is published in full: model, GPU and count, TP, PP, EP, expert TP,
      CP, micro-batch, global batch, sequence length, precision and recompute, in the
      publication or in the recipe file it names;
  (3) the GPU is in the catalog with measured efficiency factors (A100, H100, H200);
  (4) `estimate` can express the layout: CP = 1; EP x ETP divides TP x DP (Megatron parallel
      folding: the expert grid ETP x EP x EDP over the TP x DP GPUs of a pipeline stage,
      arXiv 2504.14960; rows with EP carved out of DP are the case ETP = TP); a decoder layer
      per (virtual) pipeline stage; dropless routing or a published capacity factor.
      (Rule 4 read "EP divides the data-parallel size; expert TP equal to TP" until `estimate`
      modelled expert TP and folding; the rows that became expressible were marked before
      their errors were looked at);
  (5) a preset of the model exists (its total and active parameters as published).
  Each configuration counts once, with the newest figure its publisher gives for it; one
  row per (publisher, model, GPU system, precision) -- the latest release -- for tables
  that are re-measured every release.
  Not reasons to exclude (recorded in `notes`): the framework's own scheduling and kernels
  (interleaved pipeline stages, DeepEP, grouped GEMM, A2A overlap), which belong to the
  stack; forced load balancing in benchmarks; FP8 recipes (`estimate --precision fp8`), shown
  separately from bf16. What the source states about routing, token dispatch and the pipeline
  schedule is passed to the estimate (columns load_imbalance, expert_routing, ep_dispatcher,
  ep_overlap, fp8_dispatch, vpp: forced balance is expert_load_imbalance 1.0; Automodel's
  fake_balanced_gate sends token t to the consecutive experts t*k..t*k+k-1 (expert_routing
  contiguous), Megatron's forced balance draws random logits (random); DeepEP/HybridEP is
  ep_dispatcher deepep; vpp is the interleaved stages per rank, pp_virtual; pp_local_batch, added
  2026-12-07, the sequences per data-parallel rank in one pipeline schedule call on stacks that
  call it once per local batch); blank: the stack's values, random routing and the 1.15
  imbalance assumption.

Usage: python bench/plan_accuracy.py [--reference ../shared/reference] [--worst 8]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainready.catalog import load_catalog  # noqa: E402
from trainready.errors import UsageError  # noqa: E402
from trainready.plan.activations import korthikanti_layer_bytes, layer_bytes_per_token  # noqa: E402
from trainready.plan.job import JobSpec  # noqa: E402
from trainready.plan.memory import GiB, estimate_memory  # noqa: E402
from trainready.plan.model_spec import ModelSpec  # noqa: E402
from trainready.plan.performance import estimate_step  # noqa: E402
from trainready.plan.presets import preset  # noqa: E402
from trainready.plan.recompute import published_modules  # noqa: E402
from trainready.plan import track_record  # noqa: E402
from trainready.plan.setup import Setup, resolve  # noqa: E402

CATALOG = load_catalog()
DATA = ROOT / "bench" / "data" / "plan_reference"

# (median, p90) APE targets in percent, issue 13 section 5
DENSE_TARGET = (5.0, 12.0)
MOE_TARGET = (10.0, 20.0)
MEMORY_TARGET = 15.0  # every row


@dataclass
class Row:
    source: str
    label: str
    job: JobSpec
    model: ModelSpec
    tok_s_gpu: float | None = None
    mem_gib: float | None = None
    mem_kind: str = "reserved"  # which allocator figure was measured


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise SystemExit(f"missing data file {path}")
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def with_stack(stack: str, **flags: str) -> dict[str, str]:
    """JobSpec arguments for a row run on `stack` (plan/stacks.py): the stack's name and only
    the flags the source documents otherwise. Before stacks existed: the flags themselves."""
    if "stack" not in JobSpec.model_fields:
        return flags
    from trainready.plan.stacks import get_stack

    st = get_stack(stack)
    return {"stack": stack, **{k: v for k, v in flags.items() if v != getattr(st, k)}}


# ----------------------------------------------------------------------------- data sources
# Each loader returns rows in the column names of bench/data/plan_reference/*.csv; the
# `_shared_*` ones read the same measurements from the shared reference layout.

def _shared_mosaic(ref: Path) -> list[dict[str, str]]:
    # same columns, minus `source`
    return read_csv(ref / "mosaicml_llmfoundry_a100_80gb_h100.csv")


def _shared_torchtune(ref: Path) -> list[dict[str, str]]:
    out = []
    for r in read_csv(ref / "plan_ground_truth.csv"):
        if r["id"] == "70":
            out.append({"id": "70", "model": "llama-3.2-3b", "gpu": "a100-80gb", "num_gpus": "1",
                        "micro_batch": r["micro_batch"], "seq_len": r["seq_len"], "precision": "bf16",
                        "optimizer_dtype": "bf16", "tok_s_gpu": r["tok_s_gpu"], "peak_mem_gib": r["peak_mem_GiB"],
                        "mem_kind": "allocated", "source": r["source"]})
    return out


def _shared_megatron(ref: Path) -> list[dict[str, str]]:
    out = []
    for r in read_csv(ref / "plan_ground_truth.csv"):
        if r["id"].isdigit() and 31 <= int(r["id"]) <= 40:
            out.append({"model": r["model"], "layers": r["layers"], "hidden": r["hidden"], "heads": r["heads"],
                        "vocab": r["vocab"], "seq_len": r["seq_len"], "tp": r["tp"], "pp": r["pp"], "dp": r["dp"],
                        "global_batch": r["global_batch_seqs"], "tflops_gpu": r["tflops_gpu"], "source": r["source"]})
    return out


def _mpt(name: str, layers: int, d: int, heads: int, vocab: int, seq: int) -> ModelSpec:
    # llm-foundry benchmark configs: GELU 4x MLP, LayerNorm and linear biases, learned
    # positions sized to the sequence, tied embeddings (this reproduces their NumParams).
    return ModelSpec(name=name, family="mpt", vocab_size=vocab, hidden_size=d, num_layers=layers,
                     num_heads=heads, num_kv_heads=heads, ffn_hidden_size=4 * d, mlp="gelu",
                     norm="layernorm", position="learned", max_seq_len=seq, tied_embeddings=True,
                     qkv_bias=True, out_bias=True, mlp_bias=True)


def mosaic_rows(records: list[dict[str, str]]) -> list[Row]:
    rows = []
    for r in records:
        seq = int(r["seq_len"])
        model = _mpt(r["model"], int(r["layers"]), int(r["d_model"]), int(r["heads"]), int(r["vocab"]), seq)
        if model.param_count() != int(r["n_params"]):
            raise SystemExit(f"parameter count mismatch for {r['model']} s={seq}: "
                             f"{model.param_count()} vs {r['n_params']}")
        gpu = "a100-80gb" if r["gpu"].startswith("a100") else "h100-80gb"
        n = int(r["num_gpus"])
        job = JobSpec(gpu=gpu, gpus=n, gpus_per_node=8,
                      inter_node_gbps=1600 if gpu == "a100-80gb" else 3200,
                      strategy="zero3" if r["sharding"] == "FULL_SHARD" else "zero2",
                      micro_batch=int(r["micro_batch"]),
                      global_batch=int(r["micro_batch"]) * int(r["grad_accum"]) * n,
                      seq_len=seq, precision="bf16",
                      # Composer of that time: DEFAULT gathers fp32 params, reduces in bf16;
                      # PURE does both in bf16
                      gather_dtype="bf16" if r["mp_mode"] == "PURE" else "fp32",
                      activation_checkpointing="full" if r["act_ckpt"] == "True" else "none",
                      # llm-foundry's tables predate torch 2.0 and FlashAttention-2 (their README:
                      # "TODO: Update tables with torch 2.0"): eager modules, FlashAttention-1/Triton
                      **with_stack("llm-foundry-2023", reduce_dtype="bf16", kernels="eager", attention_kernel="flash1"))
        rows.append(Row("MosaicML llm-foundry", f"{r['model']} s{seq} {n}x{gpu} mb{r['micro_batch']}",
                        job, model, tok_s_gpu=float(r["tok_per_s_per_gpu"])))
    return rows


LLAMA_3_2_3B = ModelSpec(name="llama-3.2-3b", vocab_size=128256, hidden_size=3072, num_layers=28,
                         num_heads=24, num_kv_heads=8, ffn_hidden_size=8192, tied_embeddings=True)


def torchtune_rows(records: list[dict[str, str]]) -> list[Row]:
    rows = []
    for r in records:
        model = {"llama-3.2-3b": LLAMA_3_2_3B}[r["model"]]
        job = JobSpec(gpu=r["gpu"], gpus=int(r["num_gpus"]), strategy="ddp", micro_batch=int(r["micro_batch"]),
                      global_batch=int(r["micro_batch"]), seq_len=int(r["seq_len"]), precision=r["precision"],
                      optimizer_dtype=r["optimizer_dtype"],
                      # torchtune: native PyTorch modules, SDPA, no compile in this row: torchtitan's kernels
                      **with_stack("torchtitan", kernels="eager", attention_kernel="sdpa"))
        rows.append(Row(f"torchtune (row {r['id']})", "llama3.2-3b 1xA100 mb2 s4096 packed", job, model,
                        tok_s_gpu=float(r["tok_s_gpu"]), mem_gib=float(r["peak_mem_gib"]), mem_kind=r["mem_kind"]))
    return rows


DEVICE_SHAPES = {
    "llama-0.9b": ModelSpec(name="llama-0.9b", vocab_size=32000, hidden_size=2048, ffn_hidden_size=5632,
                            num_layers=16, num_heads=16, num_kv_heads=8),
    "llama-2-7b": preset("llama-2-7b"),
    "llama-3-8b": preset("llama-3-8b"),
    "mistral-7b": preset("mistral-7b"),
    "llama-3.2-3b": LLAMA_3_2_3B,
    "qwen2-1.5b": ModelSpec(name="qwen2-1.5b", vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12,
                            num_kv_heads=2, ffn_hidden_size=8960, tied_embeddings=True, qkv_bias=True,
                            out_bias=True),
    "gpt2-1.3b": ModelSpec(name="gpt2-1.3b", family="gpt", vocab_size=50257, hidden_size=2048, num_layers=24,
                           num_heads=16, num_kv_heads=16, ffn_hidden_size=8192, mlp="gelu",
                           activation="gelu_tanh_composed", norm="layernorm",  # HF GPT-2: gelu_new
                           position="learned", max_seq_len=2048, tied_embeddings=True, qkv_bias=True,
                           out_bias=True, mlp_bias=True),
}
DEVICE_FILES = {"gpu_ground_truth_h200_2026-11-29.json": "H200 measured",
                "gpu_heldout_h200_2026-11-29.json": "H200 held out"}


def device_rows() -> list[Row]:
    rows = []
    for fname, label in DEVICE_FILES.items():
        rows += _device_file(ROOT / "bench" / "data" / fname, label)
    return rows


def _device_file(path: Path, label: str) -> list[Row]:
    data = json.loads(path.read_text())
    rows = []
    leaked_gib = 0.0
    for r in data["steps"]:
        # The 2026-11-29 script kept each FSDP2 row's module alive into the next row: that
        # row's steady state holds exactly the FSDP model's fp32 parameters more (0.9B: 3.30
        # GiB, seen as llama-2-7b's two rows differing by it; 3.2B: 11.97 GiB, seen as
        # mistral-7b's steady state minus its bf16 weights and adapters). Subtract it.
        # The script now runs each row in its own process.
        carried, leaked_gib = leaked_gib, (r["params"] * 4 / 2**30 if r.get("mode") == "fsdp" and r.get("ok") else 0.0)
        if not r.get("ok"):
            continue
        mode = r["mode"]
        job = JobSpec(gpu="h200", gpus=1, strategy="zero3" if mode == "fsdp" else "ddp",
                      micro_batch=r["micro_batch"], global_batch=r["micro_batch"], seq_len=r["seq"],
                      precision="bf16", optimizer_dtype="bf16" if mode == "pure_bf16" else "fp32",
                      method="lora" if mode == "lora" else "full", lora_rank=r.get("lora_rank", 16),
                      # the LoRA rows ran a bf16 model without autocast (bench/gpu_ground_truth.py: use_autocast only
                      # for "amp"): PEFT's fp32 adapters saved fp32 copies and ran fp32 matmuls
                      autocast=False if mode == "lora" else None,
                      activation_checkpointing=r.get("checkpointing", "none"),
                      # Hugging Face LlamaForCausalLM (sdpa) in a plain PyTorch loop: the hf-trainer stack
                      **with_stack("hf-trainer", kernels="eager", attention_kernel="sdpa"))
        label_row = f"{r['shape']} {mode} mb{r['micro_batch']} s{r['seq']} ckpt={r.get('checkpointing', 'none')}"
        model = DEVICE_SHAPES[r["shape"]]
        if model.param_count() != r["params"]:
            raise SystemExit(f"parameter count mismatch for {r['shape']}: {model.param_count()} vs {r['params']}")
        rows.append(Row(f"{label} {data['date']}", label_row, job, model,
                        tok_s_gpu=r["tokens_per_s"], mem_gib=r["max_reserved_gib"] - carried))
    return rows


def dense_rows(mosaic: list[dict[str, str]], tune: list[dict[str, str]]) -> list[Row]:
    """Every dense row: MosaicML, torchtune, our H200 runs. torchtitan's 2024-12 FSDP rows live in
    plan_accuracy_2024.py's set, on the H100 part they ran on."""
    return mosaic_rows(mosaic) + torchtune_rows(tune) + device_rows()


def megatron_rows(records: list[dict[str, str]]) -> list[tuple[str, JobSpec, ModelSpec, float, float]]:
    out = []
    for r in records:
        L, h, a, s, V = int(r["layers"]), int(r["hidden"]), int(r["heads"]), int(r["seq_len"]), int(r["vocab"])
        model = ModelSpec(name=r["model"], family="gpt", vocab_size=V, hidden_size=h, num_layers=L,
                          num_heads=a, num_kv_heads=a, ffn_hidden_size=4 * h, mlp="gelu", norm="layernorm",
                          position="learned", max_seq_len=s, tied_embeddings=True, qkv_bias=True,
                          out_bias=True, mlp_bias=True)
        tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp"])
        job = JobSpec(gpu="a100-80gb", gpus=tp * pp * dp, gpus_per_node=8, inter_node_gbps=1600,
                      strategy="ddp", tp=tp, pp=pp, micro_batch=1, global_batch=int(r["global_batch"]),
                      seq_len=s, precision="fp16", activation_checkpointing="full",
                      # 2021: no FlashAttention; fused softmax, unfused attention: the flash1 class
                      **with_stack("megatron", kernels="fused", attention_kernel="flash1"))
        # their formula: 96 B s l h^2 (1 + s/6h + V/16lh) FLOPs per iteration (with recompute)
        flops_per_token = 96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        out.append((r["model"], job, model, float(r["tflops_gpu"]), flops_per_token))
    return out


# ----------------------------------------------------------------------------- MoE rows

def moe_model_available() -> str | None:
    """None when the planner can evaluate MoE rows, else why not."""
    if "ep" not in JobSpec.model_fields:
        return "JobSpec has no `ep` (expert parallelism) yet"
    try:
        if not preset("deepseek-v3").is_moe:
            return "the deepseek-v3 preset is not a MoE shape"
    except (UsageError, AttributeError) as exc:
        return f"no MoE presets yet ({exc})"
    return None


def moe_job(r: dict[str, str]) -> JobSpec:
    recompute = r["recompute"]
    checkpointing = "none" if recompute == "none" else "full" if recompute == "full" else "selective"
    kwargs = dict(model=r["model"], gpu=r["gpu"], gpus=int(r["num_gpus"]), gpus_per_node=int(r["gpus_per_node"]),
                  inter_node_gbps=float(r["inter_node_gbps"]), strategy=r["sharding"], tp=int(r["tp"]),
                  pp=int(r["pp"]), ep=int(r["ep"]), micro_batch=int(r["micro_batch"] or 1),  # unknown: 1
                  global_batch=int(r["global_batch"]), seq_len=int(r["seq_len"]), precision=r["precision"],
                  activation_checkpointing=checkpointing)
    if recompute.startswith("selective:") and r["stack"] == "megatron":  # Megatron's --recompute-modules
        kwargs["recompute_modules"] = published_modules(recompute)
    if r["etp"] and "etp" in JobSpec.model_fields:  # expert tensor-parallel size; blank: the stack's convention
        kwargs["etp"] = int(r["etp"])
    if r["vpp"] and "pp_virtual" in JobSpec.model_fields:  # interleaved (virtual) pipeline stages per rank
        kwargs["pp_virtual"] = int(r["vpp"])
    if r["pp_local_batch"] and int(r["pp"]) > 1:  # torch.distributed.pipelining: one schedule call per local batch
        kwargs["pp_local_batch"] = int(r["pp_local_batch"])
    # published values that differ from the stack's are passed explicitly
    kwargs.update(with_stack(r["stack"], **{k: r[k] for k in ("reduce_dtype", "kernels", "attention_kernel") if r[k]}))
    # what the run did with its tokens, where the source states it: forced balance (load imbalance 1.0), the
    # dispatcher (DeepEP/HybridEP: deepep), all-to-all overlap, FP8 dispatch; blank: the stack's / the assumption
    if "expert_load_imbalance" in JobSpec.model_fields:
        if r["load_imbalance"]:
            kwargs["expert_load_imbalance"] = float(r["load_imbalance"])
        if r["ep_dispatcher"]:
            kwargs["ep_dispatcher"] = r["ep_dispatcher"]
        if r.get("expert_routing") and "expert_routing" in JobSpec.model_fields:
            kwargs["expert_routing"] = r["expert_routing"]
        for k in ("ep_overlap", "fp8_dispatch"):
            if r[k]:
                kwargs[k] = r[k] == "yes"
    return JobSpec(**kwargs)


def moe_results(records: list[dict[str, str]]) -> list[tuple[dict[str, str], float | None, str, Setup | None]]:
    """(row, predicted tokens/s/GPU or None, why not, its setup or None) for every row with a measured figure."""
    out = []
    for r in records:
        if not r["tok_s_gpu"]:
            continue
        try:
            setup = resolve(moe_job(r), CATALOG)
            step = estimate_step(setup)
            out.append((r, step.tokens_per_s / setup.n_gpus, "", setup))
        except (UsageError, ValueError, KeyError) as exc:
            msg = str(exc).splitlines()[0]
            out.append((r, None, msg.split(". ")[0][:110], None))
    return out


def counted_moe(records: list[dict[str, str]]) -> list[tuple[dict[str, str], float, Setup]]:
    """(row, predicted tokens/s/GPU, setup) of the rows the MoE targets count: included by the MoE rule and
    expressible by `estimate`."""
    return [(r, pred, setup) for r, pred, _, setup in moe_results(records)
            if r["included"] == "yes" and pred is not None]


# ----------------------------------------------------------------------------- statistics

def ape(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100


p90 = track_record.p90  # nearest rank, as the 2024 bench and `plan`'s track record count it


def summary(errs: list[float]) -> str:
    if not errs:
        return "n=0"
    return f"median {statistics.median(errs):5.1f}%  p90 {p90(errs):5.1f}%  (n={len(errs)})"


def verdict(errs: list[float], target: tuple[float, float]) -> str:
    if not errs:
        return "n=0: no verdict"
    med, q90 = statistics.median(errs), p90(errs)
    ok = lambda v, t: "PASS" if v <= t else "MISS"  # noqa: E731
    return (f"median {med:5.1f}% <= {target[0]:g}% {ok(med, target[0])}   "
            f"p90 {q90:5.1f}% <= {target[1]:g}% {ok(q90, target[1])}   (n={len(errs)})")


# ----------------------------------------------------------------------------- report

def main() -> None:
    parser = argparse.ArgumentParser(description="planner accuracy against measured runs")
    parser.add_argument("--reference", default=None,
                        help="read the rows from the shared reference layout in DIR instead of "
                             "bench/data/plan_reference")
    parser.add_argument("--worst", type=int, default=8)
    args = parser.parse_args()
    if args.reference:
        ref = Path(args.reference)
        mosaic, tune, mega = _shared_mosaic(ref), _shared_torchtune(ref), _shared_megatron(ref)
    else:
        mosaic = read_csv(DATA / "mosaicml_llmfoundry.csv")
        tune = read_csv(DATA / "torchtune.csv")
        mega = read_csv(DATA / "megatron_table1.csv")
    moe = read_csv(DATA / "moe.csv")
    print(__doc__.split("Usage:")[0].strip().split("\n\n", 1)[1])
    print()
    rows = dense_rows(mosaic, tune)
    tput, mem, flat = [], [], []
    for row in rows:
        setup = resolve(row.job, CATALOG, model=row.model)
        step = estimate_step(setup)
        pred_tps = step.tokens_per_s / setup.n_gpus
        if row.tok_s_gpu:
            tput.append((ape(pred_tps, row.tok_s_gpu), row, pred_tps, row.tok_s_gpu))
            # the rule of thumb: 6 N FLOPs per token at 50% of the dense peak
            peak = setup.gpu.peak_tflops("bf16") * 1e12
            flat.append(ape(0.5 * peak / (6 * row.model.param_count()), row.tok_s_gpu))
        if row.mem_gib:
            m = estimate_memory(setup)
            pred = (m.allocated_peak if row.mem_kind == "allocated" else m.reserved_peak) / GiB
            mem.append((ape(pred, row.mem_gib), row, pred, row.mem_gib))

    print("Throughput, dense, tokens/s/GPU")
    print(f"  {'all rows':30s} {summary([e for e, *_ in tput])}")
    for src in sorted({r.source for _, r, *_ in tput}):
        print(f"  {src:30.30s} {summary([e for e, r, *_ in tput if r.source == src])}")
    for gpu in ("a100-80gb", "h100-80gb", "h200"):
        sel = [e for e, r, *_ in tput if r.job.gpu == gpu]
        print(f"  {gpu:30s} {summary(sel)}")
    print(f"  for scale, 6ND at 50% MFU on the same rows: {summary(flat)}")
    print("  worst rows:")
    for e, r, p, m in sorted(tput, key=lambda x: -x[0])[: args.worst]:
        print(f"    {e:5.1f}%  pred {p:9.0f}  meas {m:9.0f}  {r.source}: {r.label}")

    print("\nPeak memory per GPU")
    print(f"  {'all rows':30s} {summary([e for e, *_ in mem])}")
    for e, r, p, m in sorted(mem, key=lambda x: -x[0]):
        print(f"    {e:5.1f}%  pred {p:6.2f} GiB  meas {m:6.2f} GiB ({r.mem_kind})  {r.source}: {r.label}")

    moe_report = report_moe(moe)

    print("\nTargets (issue 13, section 5)")
    print(f"  dense tokens/s/GPU  {verdict([e for e, *_ in tput], DENSE_TARGET)}")
    if moe_report is None:
        n = sum(1 for r in moe if r["included"] == "yes")
        print(f"  MoE tokens/s/GPU    MoE rows: model not available yet (n={n})")
    else:
        moe_errs, missing = moe_report
        print(f"  MoE tokens/s/GPU    {verdict(moe_errs, MOE_TARGET)}"
              + (f"  + {missing} rows the planner cannot express" if missing else ""))
    mem_errs = [e for e, *_ in mem]
    worst = max(mem_errs) if mem_errs else 0.0
    print(f"  peak memory         worst row {worst:5.1f}% <= {MEMORY_TARGET:g}% "
          f"{'PASS' if worst <= MEMORY_TARGET else 'MISS'}   ({summary(mem_errs)})")

    print("\nZeRO paper worked example (Rajbhandari et al. 2020, Fig. 1: 7.5B params, 64 GPUs, K=12,")
    print("fp16 gradients): model-state GB per GPU")
    psi, nd = 7.5e9, 64
    for label, ours, paper in (("DP baseline (2+2+K)", (2 + 2 + 12) * psi, 120), ("P_os 4+K/Nd", 4 * psi + 12 * psi / nd, 31.4),
                               ("P_os+g 2+(2+K)/Nd", 2 * psi + 14 * psi / nd, 16.6), ("P_os+g+p (2+2+K)/Nd", 16 * psi / nd, 1.9)):
        print(f"  {label:22s} ours {ours / 1e9:6.1f}  paper {paper:6.1f}")
    print("  trainready's default counts fp32 gradients (+2 bytes/param on the unsharded stages): see docs/planner.md")

    print("\nKorthikanti et al. 2022 activation bytes per token per layer (34h + 5as, dropout, no Flash):")
    for name in ("gpt3-175b", "gpt3-13b"):
        m = preset(name)
        ours = layer_bytes_per_token(m.model_copy(update={"head_dim": None, "hidden_size": m.q_dim})
                                     if m.q_dim != m.hidden_size else m, kernels="fused", residual_bytes=2,
                                     act_bytes=2, dropout=True, flash=False, seq_len=2048)
        paper = korthikanti_layer_bytes(m if m.q_dim == m.hidden_size else m.model_copy(update={"hidden_size": m.q_dim}), 2048)
        print(f"  {name:10s} s=2048  ours {ours / 1e6:7.3f} MB  paper {paper / 1e6:7.3f} MB")

    print("\nMegatron-LM Table 1 (not in the targets: micro-batch 1 assumed), hardware TFLOP/s per GPU:")
    errs = []
    for name, job, model, meas, fpt in megatron_rows(mega):
        setup = resolve(job, CATALOG, model=model)
        step = estimate_step(setup)
        pred = step.tokens_per_s / setup.n_gpus * fpt / 1e12
        errs.append(ape(pred, meas))
        signed = (pred / meas - 1) * 100
        print(f"  {name:11s} tp{job.tp} pp{job.pp} dp{setup.dp:3d}  pred {pred:6.1f}  meas {meas:6.1f}  ({signed:+.0f}%)")
    print(f"  {summary(errs)}")


def report_moe(records: list[dict[str, str]]) -> tuple[list[float], int] | None:
    """Print the MoE rows; return the APEs of the rows the rule includes (None: no model yet)."""
    included = [r for r in records if r["included"] == "yes"]
    why = moe_model_available()
    print(f"\nThroughput, MoE, tokens/s/GPU ({len(included)} of {len(records)} rows in bench/data/plan_reference/moe.csv "
          "meet the MoE rule)")
    if why:
        print(f"  MoE rows: model not available yet (n={len(included)}): {why}")
        return None
    errs, bf16, missing = [], [], 0
    results = moe_results(records)
    for r, pred, err, _ in results:
        tag = "target" if r["included"] == "yes" else "outside the rule"
        meas = float(r["tok_s_gpu"])
        what = (f"{r['model']} {r['num_gpus']}x{r['gpu']} tp{r['tp']} pp{r['pp']} ep{r['ep']} etp{r['etp'] or '?'} "
                f"mb{r['micro_batch'] or '?'} gbs{r['global_batch']} {r['precision']} ckpt={r['recompute']}")
        if pred is None:
            missing += r["included"] == "yes"
            print(f"    {'':6s}  cannot evaluate: {err}  [{tag}] {r['id']}: {what}")
            continue
        e = ape(pred, meas)
        if r["included"] == "yes":
            errs.append(e)
            if r["precision"] == "bf16":
                bf16.append(e)
        print(f"    {e:5.1f}%  pred {pred:8.0f}  meas {meas:8.0f} ({(pred / meas - 1) * 100:+.0f}%)  [{tag}] "
              f"{r['id']}: {what}")
    print(f"  {'rows in the target':30s} {summary(errs)}"
          + (f"; {missing} more cannot be evaluated (above)" if missing else ""))
    print(f"  {'  of which bf16':30s} {summary(bf16)}")
    return errs, missing


if __name__ == "__main__":
    main()
