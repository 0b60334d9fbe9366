"""One GPU, under 8 minutes: measure what the planner's efficiency factors stand for.

    python bench/gpu_suite.py --out DIR [--write-docs]     # on a CUDA machine (H100/H200 class)
    python bench/gpu_suite.py --dry-run [--out DIR]        # the same code paths on CPU, tiny shapes, < 1 min

Six independent sections, each with a time budget (a failure is recorded with its error and the
next section runs; a section that reaches its budget records what it left out):

1. ``gemm``: bf16 and FP8 (``torch._scaled_mm``, tensorwise scales, capability >= 8.9) GEMM TFLOP/s
   at the forward shapes of llama-3.1-8b, llama-3-70b (one TP8 shard) and qwen3-30b-a3b (attention
   projections and one expert's GEMMs), an 8192^3 reference (what ``check --deep`` measures), and the
   experts' grouped GEMM (128 experts x 768 wide, hidden 2048, 128-512 rows per expert) through
   ``torch._grouped_mm`` where this torch has it, and as a loop over experts.
2. ``attention``: causal ``scaled_dot_product_attention`` forward + backward, bf16, head dim 128,
   GQA 32/8, at 2k-128k tokens per sequence (batch x seq = 32k tokens, one sequence beyond), TFLOP/s
   counting causal FLOPs with backward = 2.5x forward (as bench/gpu_ground_truth.py counts them).
   ``ring``: one rank's share of context-parallel ring attention (torch's load-balanced ring, CP 2/4/8 at
   32k tokens per rank, the sends left out; bench/gpu_suite_ring.py says what and why).
3. ``copy``: host<->device GB/s, H2D and D2H, pinned and pageable, 256 MiB and 1 GiB; and a 1 GiB
   device-to-device copy counted read + write (the HBM figure ``check --deep`` takes).
4. ``training``: a 20-step run of a Llama-shaped 0.9B model (plain PyTorch, pure bf16, fused AdamW)
   through ``trainready run`` (torchrun, 1 GPU), timed with CUDA events inside the script; the run
   directory's telemetry is read back with ``trainready.run.summary.summarize``.
5. ``checkpoint``: save and restore ~1.5 GiB of GPU tensors through ``trainready.store.CheckpointManager``
   (torch.distributed.checkpoint): sync save, async save (blocking part and until committed),
   restore with the page cache dropped, bit-exact comparison.

Beside every figure: what the planner assumes for this GPU (efficiency.py's factor x the catalog's
peak), where the catalog knows the GPU. Writes ``gpu_suite.json`` (schema_version 1) and
``gpu_suite.md`` (the Markdown for docs/measurements.md) to ``--out``; ``--write-docs`` appends the
Markdown to docs/measurements.md. On a GPU the catalog knows, it also fits a calibration from the
8192^3 GEMM, the device copy and the training run through the project's own code
(plan/calibration.py, plan/calibration_file.py) and saves it as ``calibration.json`` in ``--out``
(use it with ``trainready estimate ... --calibration DIR/calibration.json``).

Exit codes: 0 every section ran, 1 a section (or a row of one) failed (results still written),
2 usage (no CUDA device without --dry-run).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
try:
    import trainready  # noqa: F401  (importable as installed?)
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when loaded from a file path
import gpu_suite_ring  # noqa: E402
from gpu_suite_report import render_markdown  # noqa: E402

SCHEMA_VERSION = 1
KIND = "trainready-gpu-suite"
MiB, GiB = 1 << 20, 1 << 30
SECTIONS = ("gemm", "attention", "ring", "copy", "training", "checkpoint")
UNITS = {
    "gemm": {"m": "rows", "k": "reduction dim", "n": "columns", "seconds": "s per GEMM", "tflops": "TFLOP/s",
             "planner_tflops": "TFLOP/s", "fraction_of_peak": "of the catalog's dense peak"},
    "attention": {"seq": "tokens", "batch": "sequences", "seconds": "s per fwd+bwd", "tflops": "TFLOP/s (causal)",
                  "planner_tflops": "TFLOP/s", "fraction_of_peak": "of the catalog's bf16 peak"},
    "ring": {"cp": "context-parallel ranks", "seq": "tokens (whole sequence)", "local_tokens": "tokens per rank",
             "forward_s": "s", "backward_s": "s", "seconds": "s per fwd+bwd",
             "tflops": "TFLOP/s (the rank's 1/cp of the causal FLOPs)", "planner_tflops": "TFLOP/s",
             "fraction_of_peak": "of the catalog's bf16 peak", "backward_over_forward": "ratio"},
    "copy": {"bytes": "B", "seconds": "s per copy", "gbps": "GB/s (1e9 B/s)", "planner_gbps": "GB/s"},
    "training": {"params": "parameters", "tokens_per_s": "tokens/s (CUDA events; host clocks on CPU)",
                 "step_s": "s (median after warm-up)", "telemetry_tokens_per_s": "tokens/s (run telemetry median)",
                 "telemetry_step_s": "s", "mfu": "fraction", "max_allocated_gib": "GiB", "max_reserved_gib": "GiB",
                 "peak_host_rss_gib": "GiB", "planner_tokens_per_s": "tokens/s", "planner_reserved_gib": "GiB"},
    "checkpoint": {"bytes": "B", "seconds": "s", "gbps": "GB/s (1e9 B/s)"},
}


# --- sizes: a GPU run and its dry-run miniature ----------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    dry: bool
    tokens: int  # rows of the dense GEMMs (tokens per GPU per micro-batch)
    scale: int  # model dims divided by this (dry run)
    ref: int  # the size^3 reference GEMM
    experts: int
    expert_rows: tuple[int, ...]
    attn_seqs: tuple[int, ...]
    attn_tokens: int
    attn_heads: int
    attn_kv_heads: int
    attn_head_dim: int
    ring_cps: tuple[int, ...]
    ring_local: int  # tokens per rank
    copy_sizes: tuple[int, ...]  # bytes
    hbm_copy: int
    ckpt_bytes: int
    ckpt_tensors: int
    train: dict[str, Any]
    budgets: dict[str, float]
    total_s: float
    row_s: float  # timed per row (the iteration count adapts to it)
    max_iters: int = 50
    min_iters: int = 3
    warmup: int = 2


FULL = Sizes(
    dry=False, tokens=8192, scale=1, ref=8192, experts=128, expert_rows=(128, 256, 512),
    attn_seqs=(2048, 4096, 8192, 16384, 32768, 65536, 131072), attn_tokens=32768, attn_heads=32, attn_kv_heads=8,
    attn_head_dim=128, ring_cps=(2, 4, 8), ring_local=32768,
    copy_sizes=(256 * MiB, GiB), hbm_copy=GiB, ckpt_bytes=1536 * MiB, ckpt_tensors=12,
    # Llama-shaped 0.9B (the "llama-0.9b" of bench/gpu_ground_truth.py, measured there with HF on an H200)
    train=dict(d=2048, layers=16, heads=16, kv_heads=8, ffn=5632, vocab=32000, seq=2048, batch=4, steps=20,
               warmup=5, dtype="bf16"),
    budgets={"gemm": 60, "attention": 75, "ring": 35, "copy": 30, "training": 180, "checkpoint": 80},
    total_s=460, row_s=0.25)
DRY = Sizes(
    dry=True, tokens=64, scale=32, ref=128, experts=8, expert_rows=(16, 32),
    attn_seqs=(64, 128, 256), attn_tokens=512, attn_heads=4, attn_kv_heads=2, attn_head_dim=16,
    ring_cps=(2, 4), ring_local=64,
    copy_sizes=(1 * MiB, 4 * MiB), hbm_copy=4 * MiB, ckpt_bytes=4 * MiB, ckpt_tensors=4,
    train=dict(d=64, layers=2, heads=4, kv_heads=2, ffn=176, vocab=256, seq=32, batch=2, steps=3, warmup=1,
               dtype="fp32"),
    budgets={"gemm": 10, "attention": 8, "ring": 5, "copy": 5, "training": 40, "checkpoint": 15},
    total_s=60, row_s=0.01, max_iters=5, min_iters=1, warmup=1)

# The presets whose GEMMs section 1 times: (preset, tensor-parallel shard)
GEMM_MODELS = (("llama-3.1-8b", 1), ("llama-3-70b", 8), ("qwen3-30b-a3b", 1))
# Used when the presets cannot be read (shapes, not results): hidden, heads, kv heads, head dim, ffn,
# and for MoE (experts, top-k, expert ffn)
FALLBACK_SHAPES = {
    "llama-3.1-8b": (4096, 32, 8, 128, 14336, None),
    "llama-3-70b": (8192, 64, 8, 128, 28672, None),
    "qwen3-30b-a3b": (2048, 32, 4, 128, 6144, (128, 8, 768)),
}


# --- timing --------------------------------------------------------------------------------------------
def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], cuda: bool, target_s: float, max_iters: int = 50, warmup: int = 2,
          min_iters: int = 3) -> float:
    """Seconds per call of `fn`: warm-up calls, one call to size the loop, then a loop of ~target_s timed
    with CUDA events (host clocks on CPU)."""
    for _ in range(warmup):
        fn()
    _sync(cuda)
    t0 = time.perf_counter()
    fn()
    _sync(cuda)
    one = max(time.perf_counter() - t0, 1e-7)
    iters = int(min(max_iters, max(min_iters, target_s / one)))
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000.0 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def host_timed(fn: Callable[[], Any], cuda: bool, iters: int) -> float:
    """Median seconds of `iters` calls, host clock around each call and a device sync (copies: a pageable
    copy returns to the host only when staged, so events alone would not bracket it)."""
    fn()
    _sync(cuda)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(cuda)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Clock:
    def __init__(self, budget_s: float, deadline: float):
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.end = min(self.start + budget_s, deadline)

    def left(self) -> float:
        return self.end - time.monotonic()

    def out(self) -> bool:
        return self.left() <= 0


def _free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


# --- the planner's view of this GPU (read-only use of plan/ and catalog/) ----------------------------------
class Planner:
    """What `trainready estimate` assumes for the measured GPU; every method None where the catalog does
    not know the GPU (or on CPU)."""

    def __init__(self, gpu_name: str | None):
        self.gpu = self.e = None
        self.why: str | None = None
        if not gpu_name:
            self.why = "no GPU"
            return
        try:
            from trainready.catalog import load_catalog
            from trainready.plan import efficiency as eff

            self.gpu = load_catalog().gpu(gpu_name)
            self.e = eff.arch_efficiency(self.gpu.arch)
            self.eff = eff
        except Exception as exc:  # an unknown GPU is a note, not a failure
            self.gpu = self.e = None
            self.why = _error(exc)

    @property
    def known(self) -> bool:
        return self.gpu is not None

    def describe(self) -> dict[str, Any] | None:
        if not self.known:
            return None
        e = self.e
        return {"catalog_gpu": self.gpu.name, "arch": self.gpu.arch, "factors_source": e.source,
                "peak_tflops": {"bf16": self.gpu.peak_tflops("bf16"), "fp8": self.gpu.peak_tflops("fp8")},
                "hbm_gbps": self.gpu.hbm_gbps, "pcie_gbps_per_dir": self.gpu.pcie_gbps_per_dir,
                "gemm": e.gemm, "gemm_k0": e.gemm_k0, "attention": e.attention, "attention_s0": e.attention_s0,
                "memory": e.memory, "grouped_gemm_m0": self.eff.GROUPED_GEMM_M0,
                "pcie_copy_efficiency": self.eff.PCIE_COPY_EFFICIENCY}

    def peak(self, precision: str) -> float | None:
        return self.gpu.peak_tflops(precision) if self.known else None

    def gemm(self, k: int, fp8: bool = False, rows: int | None = None) -> float | None:
        if not self.known:
            return None
        e = self.eff.fp8_gemm(self.e) if fp8 else self.e
        peak = self.peak("fp8" if fp8 else "bf16")
        if not peak:
            return None
        out = peak * e.gemm * k / (k + e.gemm_k0)
        if rows is not None:  # grouped GEMM: rows per expert ramp (moe.py)
            m0 = self.eff.FP8_GROUPED_GEMM_M0 if fp8 else self.eff.GROUPED_GEMM_M0
            out *= rows / (rows + m0)
        return out

    def attention(self, seq: int, head_dim: int, kernel: str = "sdpa") -> float | None:
        """TFLOP/s of causal attention over `seq` tokens (a context-parallel rank: its chunk) with `kernel`
        ("sdpa" or "flash2"), by plan/performance.py's attention_efficiency's factors."""
        if not self.known or not self.peak("bf16"):
            return None
        e, peak = self.e, self.peak("bf16")
        base, s0 = self.eff.attention_factors(e, self.gpu.arch, kernel, peak)
        hd = e.attention_hd64 if head_dim <= 64 else 1.0
        return peak * base * hd * seq / (seq + s0)

    def pcie(self) -> float | None:
        if not self.known or not self.gpu.pcie_gbps_per_dir:
            return None
        return self.gpu.pcie_gbps_per_dir * self.eff.PCIE_COPY_EFFICIENCY

    def hbm_copy(self) -> float | None:
        return self.gpu.hbm_gbps * self.e.memory if self.known else None


# --- host facts ----------------------------------------------------------------------------------------------
SMI_DEVICE = "0"
"""The GPU nvidia-smi is asked about: host_facts sets it to torch's device 0 by UUID (nvidia-smi ignores
CUDA_VISIBLE_DEVICES, so index 0 may be another, idle card)."""


def _smi_query(fields: str, timeout: float = 20) -> list[str] | str:
    """The measured GPU's values of nvidia-smi's comma-separated `fields`, or why there are none."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return "nvidia-smi not found"
    try:
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", SMI_DEVICE],
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _error(exc)
    line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(fields.split(",")):
        return f"nvidia-smi exit {out.returncode}: {(out.stderr or out.stdout)[-300:]}"
    return parts


def _num(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None


def _nvidia_smi() -> dict[str, Any]:
    parts = _smi_query("name,driver_version,memory.total,power.limit,clocks.max.sm")
    if isinstance(parts, str):
        return {"error": parts}
    return {"name": parts[0], "driver": parts[1], "memory_total_mib": _num(parts[2]), "power_limit_w": _num(parts[3]),
            "max_sm_clock_mhz": _num(parts[4])}


def under_load(fn: Callable[[], Any], cuda: bool, seconds: float) -> dict[str, Any]:
    """SM clock, power draw, temperature and nvidia-smi's clock event reasons, sampled once half-way through
    `seconds` of back-to-back calls of `fn`: whether a power or thermal cap holds the clock down (a datasheet
    peak assumes the boost clock; published runs name 500 W H100s and 750 W B200s)."""
    if not cuda:
        return {"skipped": "no GPU"}
    sample: dict[str, Any] = {}

    def query() -> None:
        time.sleep(seconds / 2)
        for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):  # newer, older drivers
            parts = _smi_query(f"clocks.sm,power.draw,temperature.gpu,{reasons}", timeout=5)
            if not isinstance(parts, str):
                sample.update(sm_clock_mhz=_num(parts[0]), power_draw_w=_num(parts[1]), temperature_c=_num(parts[2]),
                              clock_event_reasons=parts[3])
                return
            sample["error"] = parts
            if "valid field" not in parts:  # only an unknown field name is worth the older name
                return

    sampler = threading.Thread(target=query, daemon=True)
    sampler.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end or sampler.is_alive():
        for _ in range(8):
            fn()
        torch.cuda.synchronize()
        if time.monotonic() > end + 10:  # nvidia-smi hung: stop loading the GPU, keep what there is
            break
    sampler.join(timeout=1)
    got = dict(sample)  # a copy: a sampler still hanging writes to its own
    if "sm_clock_mhz" in got:
        got.pop("error", None)
    elif sampler.is_alive():
        got.setdefault("error", "nvidia-smi did not answer in time")
    return got


def host_facts(cuda: bool) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None, "driver": None,
    }
    try:
        import trainready as tr

        facts["trainready"] = getattr(tr, "__version__", None)
    except ImportError:
        pass
    if not cuda:
        facts["device"] = "cpu"
        return facts
    props = torch.cuda.get_device_properties(0)
    global SMI_DEVICE
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        SMI_DEVICE = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    facts.update({"device": "cuda", "gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
                  "capability": f"{props.major}.{props.minor}", "gpu_memory_gib": props.total_memory / GiB,
                  "sm_count": props.multi_processor_count,
                  "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None})
    smi = _nvidia_smi()
    if "driver" in smi:
        facts["driver"], facts["driver_source"] = smi.pop("driver"), "nvidia-smi"
        facts["nvidia_smi"] = smi
    else:
        facts["driver_source"] = f"unknown ({smi.get('error')})"
        get = getattr(torch._C, "_cuda_getDriverVersion", None)
        if get is not None:
            try:
                v = int(get())
                facts["cuda_driver_api"] = f"{v // 1000}.{v % 1000 // 10}"
            except Exception:  # noqa: BLE001 (a fact we could not read is left out)
                pass
    return facts


# --- 1. GEMMs ------------------------------------------------------------------------------------------------
def _dim(x: int, scale: int) -> int:
    """`x` / scale, a multiple of 16 (FP8 and grouped GEMMs want it), at least 16."""
    return max(16, (x // scale) // 16 * 16)


def gemm_shapes(sz: Sizes) -> tuple[list[dict[str, Any]], list[str]]:
    """(model, gemm, m, k, n) rows for the presets' forward GEMMs; notes."""
    notes = []
    rows = [{"model": "reference", "gemm": f"{sz.ref}^3", "m": sz.ref, "k": sz.ref, "n": sz.ref}]
    try:
        from trainready.plan.presets import preset

        shapes = {}
        for name, _tp in GEMM_MODELS:
            s = preset(name)
            moe = (s.moe.num_experts, s.moe.experts_per_token, s.moe.expert_ffn_hidden_size) if s.moe else None
            shapes[name] = (s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim or s.hidden_size // s.num_heads,
                            s.ffn_hidden_size, moe)
        notes.append("shapes from trainready's model presets")
    except Exception as exc:  # presets being edited elsewhere: the same shapes, written down
        shapes = dict(FALLBACK_SHAPES)
        notes.append(f"presets unreadable ({_error(exc)}): shapes from this script's table")
    for name, tp in GEMM_MODELS:
        h, heads, kv, hd, ffn, moe = shapes[name]
        heads_tp, kv_tp = heads // tp, max(1, kv // tp)
        d = lambda x: _dim(x, sz.scale)  # noqa: E731
        t = sz.tokens
        label = f"{name} (TP{tp} shard)" if tp > 1 else name
        rows += [{"model": label, "gemm": "qkv", "m": t, "k": d(h), "n": d((heads_tp + 2 * kv_tp) * hd)},
                 {"model": label, "gemm": "o", "m": t, "k": d(heads_tp * hd), "n": d(h)}]
        if moe:
            experts, topk, eff_ffn = moe
            per_expert = max(16, t * topk // experts // 16 * 16) if not sz.dry else max(16, t // 4)
            rows += [{"model": label, "gemm": "expert up/gate", "m": per_expert, "k": d(h), "n": d(eff_ffn)},
                     {"model": label, "gemm": "expert down", "m": per_expert, "k": d(eff_ffn), "n": d(h)}]
        else:
            rows += [{"model": label, "gemm": "ffn up/gate", "m": t, "k": d(h), "n": d(ffn // tp)},
                     {"model": label, "gemm": "down", "m": t, "k": d(ffn // tp), "n": d(h)}]
    return rows, notes


def fp8_support(cuda: bool) -> str | None:
    """None when FP8 GEMMs can run here, else why not."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
    if not cuda:
        return None  # the CPU path (dry run): exercises the code, says nothing about a GPU
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < (8, 9):
        return f"compute capability {major}.{minor} < 8.9: no FP8 tensor cores"
    return None


def _fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensorwise scaling: x / scale fits e4m3's range (448)."""
    amax = x.abs().max().float().clamp(min=1e-12)
    scale = amax / 448.0
    return (x / scale).to(torch.float8_e4m3fn), scale.reshape(())


def bench_gemm(sec: dict[str, Any], clock: Clock, sz: Sizes, cuda: bool, planner: Planner) -> None:
    dev = "cuda" if cuda else "cpu"
    shapes, notes = gemm_shapes(sz)
    sec["notes"] += notes
    no_fp8 = fp8_support(cuda)
    if no_fp8:
        sec["skipped"].append({"what": "FP8 GEMMs", "reason": no_fp8})
    else:
        sec["notes"].append("FP8: torch._scaled_mm, e4m3 x e4m3 -> bf16, tensorwise scales; the timed call is the "
                            "GEMM alone (amax and casts are done once, outside)" + ("" if cuda else "; CPU path"))
    for shape in shapes:
        m, k, n = shape["m"], shape["k"], shape["n"]
        what = f"{shape['model']} {shape['gemm']} {m}x{k}x{n}"
        if clock.out():
            sec["skipped"].append({"what": what, "reason": f"section time budget ({clock.budget_s:.0f} s) reached"})
            continue
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)  # nn.Linear's layout: y = a @ w.T
        for dtype in ("bf16",) + (() if no_fp8 else ("fp8",)):
            try:
                if dtype == "bf16":
                    b = w.t()
                    seconds = timed(lambda a=a, b=b: a @ b, cuda, sz.row_s, sz.max_iters, sz.warmup, sz.min_iters)
                else:
                    a8, sa = _fp8(a)
                    w8, sw = _fp8(w)
                    b8 = w8.t()  # column-major, as _scaled_mm wants its second operand
                    seconds = timed(lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16),
                                    cuda, sz.row_s, sz.max_iters, sz.warmup, sz.min_iters)
                tflops = 2 * m * k * n / seconds / 1e12
                row = {**shape, "dtype": dtype, "seconds": seconds, "tflops": tflops}
                if shape["model"] == "reference" and dtype == "bf16":  # clocks and power while it runs (2 s)
                    try:
                        row["under_load"] = under_load(lambda a=a, b=b: a @ b, cuda, 2.0)
                    except Exception as exc:  # the GEMM's figure stays
                        row["under_load"] = {"error": _error(exc)}
                pred = planner.gemm(k, fp8=dtype == "fp8")
                if pred:
                    row["planner_tflops"] = pred
                    row["fraction_of_peak"] = tflops / planner.peak("fp8" if dtype == "fp8" else "bf16")
                sec["rows"].append(row)
            except Exception as exc:
                sec["errors"].append({"what": f"{dtype} {what}", "error": _error(exc)})
        del a, w
        _free(cuda)
    grouped_gemms(sec, clock, sz, cuda, planner)


def _grouped_fn(a: torch.Tensor, w: torch.Tensor, rows: int, experts: int) -> tuple[Callable[[], Any] | None, str]:
    """torch._grouped_mm over all experts (w: experts x n x k), checked against the loop; (None, why) when
    this torch or GPU cannot run it."""
    if not hasattr(torch, "_grouped_mm"):
        return None, f"torch {torch.__version__} has no torch._grouped_mm"
    offs = torch.arange(rows, rows * experts + 1, rows, device=a.device, dtype=torch.int32)
    why = []
    for layout, b in (("column-major weights", w.transpose(-2, -1)),
                      ("row-major weights", w.transpose(-2, -1).contiguous())):
        try:
            out = torch._grouped_mm(a, b, offs=offs)
            for g in (0, experts - 1):  # a wrong layout would give wrong numbers, not an error
                ref = a[g * rows:(g + 1) * rows] @ b[g]
                got = out[g * rows:(g + 1) * rows]
                if not torch.allclose(got.float(), ref.float(), rtol=2e-2, atol=2e-2 * float(ref.abs().max())):
                    raise ValueError(f"expert {g} differs from the loop")
            return (lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs)), layout
        except Exception as exc:
            why.append(f"{layout}: {_error(exc)}")
    return None, "; ".join(why)


def grouped_gemms(sec: dict[str, Any], clock: Clock, sz: Sizes, cuda: bool, planner: Planner) -> None:
    dev = "cuda" if cuda else "cpu"
    experts = sz.experts
    hidden, width = _dim(2048, sz.scale), _dim(768, sz.scale)  # qwen3-30b-a3b: hidden 2048, expert ffn 768
    grouped_ok: bool | None = None
    first = True  # the first expert shape is measured even past the budget (as the reference shape is): a busy
    # machine whose dense shapes used it all still gets one grouped figure, and the dry run its code path
    for rows in sz.expert_rows:
        for gemm, k, n in (("experts up/gate", hidden, width), ("experts down", width, hidden)):
            what = f"{gemm} {experts} x {rows} rows x {k} x {n}"
            if clock.out() and not first:
                sec["skipped"].append({"what": what, "reason": f"section time budget ({clock.budget_s:.0f} s) reached"})
                continue
            first = False  # before the set-up: a first shape that fails does not carry the exemption on
            try:
                a = torch.randn(experts * rows, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
                out = torch.empty(experts * rows, n, device=dev, dtype=torch.bfloat16)
                wt = w.transpose(-2, -1)

                def loop(a=a, wt=wt, out=out, rows=rows):
                    for g in range(experts):
                        torch.mm(a[g * rows:(g + 1) * rows], wt[g], out=out[g * rows:(g + 1) * rows])

                methods: list[tuple[str, Callable[[], Any], str]] = []
                if grouped_ok is not False:
                    fn, how = _grouped_fn(a, w, rows, experts)
                    if fn is None:
                        grouped_ok = False
                        sec["skipped"].append({"what": "torch._grouped_mm", "reason": how})
                    else:
                        grouped_ok = True
                        methods.append(("grouped_mm", fn, how))
                methods.append(("loop", loop, f"{experts} torch.mm calls"))
                flops = 2 * experts * rows * k * n
                for method, fn, how in methods:
                    seconds = timed(fn, cuda, sz.row_s, sz.max_iters, sz.warmup, sz.min_iters)
                    row = {"model": "qwen3-30b-a3b experts", "gemm": gemm, "experts": experts, "rows_per_expert": rows,
                           "m": experts * rows, "k": k, "n": n, "dtype": "bf16", "method": method, "how": how,
                           "seconds": seconds, "tflops": flops / seconds / 1e12}
                    pred = planner.gemm(k, rows=rows)
                    if pred:
                        row["planner_tflops"] = pred
                        row["fraction_of_peak"] = row["tflops"] / planner.peak("bf16")
                    sec["rows"].append(row)
                del a, w, out, wt
            except Exception as exc:
                sec["errors"].append({"what": what, "error": _error(exc)})
            _free(cuda)


# --- 2. attention --------------------------------------------------------------------------------------------
def attention_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """Causal forward + backward: half of 4 b h s^2 d forward, backward 2.5x forward (bench/gpu_ground_truth.py)."""
    return 3.5 * 4 * batch * heads * seq * seq * head_dim / 2


def bench_attention(sec: dict[str, Any], clock: Clock, sz: Sizes, cuda: bool, planner: Planner) -> None:
    dev = "cuda" if cuda else "cpu"
    heads, kv, hd = sz.attn_heads, sz.attn_kv_heads, sz.attn_head_dim
    gqa = "enable_gqa"
    sec["notes"].append(f"F.scaled_dot_product_attention(is_causal=True), bf16, {heads} query heads, {kv} KV heads "
                        f"(llama-3.1-8b's GQA), head dim {hd}; gradients by torch.autograd.grad")
    fused: Callable[[], Any] = contextlib.nullcontext
    if cuda:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            kernels = [b for b in (getattr(SDPBackend, n, None) for n in
                                   ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")) if b is not None]
            fused = lambda: sdpa_kernel(kernels)  # noqa: E731
            sec["notes"].append("SDPA limited to its fused kernels (cuDNN, flash, memory-efficient: torch's own "
                                "order among them); the math fallback would build the s x s matrix")
        except ImportError:
            sec["notes"].append(f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel: SDPA's default choice")
    for seq in sz.attn_seqs:
        batch = max(1, sz.attn_tokens // seq)
        what = f"seq {seq} x batch {batch}"
        if clock.out():
            sec["skipped"].append({"what": what, "reason": f"section time budget ({clock.budget_s:.0f} s) reached"})
            continue
        try:
            q = torch.randn(batch, heads, seq, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(batch, kv, seq, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(batch, kv, seq, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn(batch, heads, seq, hd, device=dev, dtype=torch.bfloat16)

            def step(q=q, k=k, v=v, grad=grad):
                if gqa == "enable_gqa":
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                else:  # an older torch: K/V expanded to every query head
                    rep = heads // kv
                    out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                         is_causal=True)
                torch.autograd.grad(out, (q, k, v), grad)

            with fused():
                if gqa == "enable_gqa":
                    try:
                        step()
                    except (TypeError, RuntimeError) as exc:  # no enable_gqa, or no fused kernel takes it
                        gqa = "expanded K/V"
                        sec["notes"].append(f"from seq {seq}: K/V expanded to the query heads (enable_gqa: "
                                            f"{_error(exc)[:200]})")
                        _free(cuda)
                seconds = timed(step, cuda, sz.row_s, sz.max_iters, 1, sz.min_iters)
            tflops = attention_flops(batch, heads, seq, hd) / seconds / 1e12
            row = {"seq": seq, "batch": batch, "heads": heads, "kv_heads": kv, "head_dim": hd, "gqa": gqa,
                   "seconds": seconds, "tflops": tflops}
            pred = planner.attention(seq, hd)
            if pred:
                row["planner_tflops"] = pred
                row["fraction_of_peak"] = tflops / planner.peak("bf16")
            sec["rows"].append(row)
            del q, k, v, grad
        except Exception as exc:
            sec["errors"].append({"what": what, "error": _error(exc)})
        _free(cuda)


def bench_ring(sec: dict[str, Any], clock: Clock, sz: Sizes, cuda: bool, planner: Planner) -> None:
    gpu_suite_ring.bench_ring(
        sec, clock, sz.ring_cps, sz.ring_local, sz.attn_heads, sz.attn_head_dim, cuda,
        lambda fn: timed(fn, cuda, sz.row_s, sz.max_iters, 1, sz.min_iters), attention_flops,
        lambda local, hd: planner.attention(local, hd, "flash2"), planner.peak("bf16"), _error, lambda: _free(cuda))


# --- 3. copies -------------------------------------------------------------------------------------------------
def bench_copy(sec: dict[str, Any], clock: Clock, sz: Sizes, cuda: bool, planner: Planner) -> None:
    if not cuda:
        sec["notes"].append("CPU: no device, so 'host -> device' is a host-to-host copy (the code path, not a figure)")
        sec["skipped"].append({"what": "pinned host memory", "reason": "no CUDA (pinned memory needs a device)"})
    dev = "cuda" if cuda else "cpu"
    iters = 3 if sz.dry else 5
    for size in sz.copy_sizes:
        for memory in ("pinned", "pageable"):
            if memory == "pinned" and not cuda:
                continue
            what = f"{memory} {size // MiB} MiB"
            if clock.out():
                sec["skipped"].append({"what": what, "reason": f"section time budget ({clock.budget_s:.0f} s) reached"})
                continue
            try:
                host = torch.empty(size, dtype=torch.uint8, pin_memory=memory == "pinned")
                host.fill_(1)  # touched: no first-touch page faults inside the timed copies
                device = torch.empty(size, dtype=torch.uint8, device=dev)
                device.fill_(2)
                nb = memory == "pinned"
                for direction, fn in (("H2D", lambda d=device, h=host: d.copy_(h, non_blocking=nb)),
                                      ("D2H", lambda d=device, h=host: h.copy_(d, non_blocking=nb))):
                    seconds = host_timed(fn, cuda, iters)
                    row = {"direction": direction, "memory": memory, "bytes": size, "seconds": seconds,
                           "gbps": size / seconds / 1e9}
                    if memory == "pinned" and planner.pcie():
                        row["planner_gbps"] = planner.pcie()
                    sec["rows"].append(row)
                del host, device
            except Exception as exc:
                sec["errors"].append({"what": what, "error": _error(exc)})
            _free(cuda)
    what = f"device-to-device {sz.hbm_copy // MiB} MiB"
    if clock.out():
        sec["skipped"].append({"what": what, "reason": f"section time budget ({clock.budget_s:.0f} s) reached"})
        return
    try:
        a = torch.empty(sz.hbm_copy, dtype=torch.uint8, device=dev).fill_(3)
        b = torch.empty_like(a)
        seconds = timed(lambda a=a, b=b: b.copy_(a), cuda, sz.row_s, sz.max_iters, sz.warmup, sz.min_iters)
        row = {"direction": "D2D", "memory": "device", "bytes": sz.hbm_copy, "counted": "read + write",
               "seconds": seconds, "gbps": 2 * sz.hbm_copy / seconds / 1e9}
        if planner.hbm_copy():
            row["planner_gbps"] = planner.hbm_copy()
        sec["rows"].append(row)
        del a, b
    except Exception as exc:
        sec["errors"].append({"what": what, "error": _error(exc)})
    _free(cuda)


# --- 4. a training run through `trainready run` --------------------------------------------------------------
TRAIN_SCRIPT = Path(__file__).with_name("gpu_suite_train.py")
"""The model and loop the run trains (its own file: launched by `trainready run`, never imported here)."""


def train_job(sz: Sizes, catalog_gpu: str, path: Path) -> Path:
    """The run's configuration as a job spec (`trainready run --job`): the planner's prediction goes into
    run.json, and the run can be calibrated from (report/calibration.py reads it)."""
    from trainready.plan.job import JobSpec, save_job
    from trainready.plan.model_spec import ModelSpec

    t = sz.train
    spec = ModelSpec(name="llama-suite", family="llama", vocab_size=t["vocab"], hidden_size=t["d"],
                     num_layers=t["layers"], num_heads=t["heads"], num_kv_heads=t["kv_heads"], ffn_hidden_size=t["ffn"])
    # plain PyTorch modules, SDPA, one GPU: the hf-trainer stack's kernels; pure bf16 (bf16 optimizer states)
    job = JobSpec(model_spec=spec, gpu=catalog_gpu, gpus=1, strategy="ddp", micro_batch=t["batch"],
                  global_batch=t["batch"], seq_len=t["seq"], precision="bf16",
                  optimizer_dtype="bf16" if t["dtype"] == "bf16" else "fp32", stack="hf-trainer")
    save_job(job, path)
    return path


def _run_launcher(cmd: list[str], timeout: float, env: dict[str, str]) -> tuple[int | None, str]:
    """(exit code or None on timeout, output tail); on timeout SIGTERM (the launcher stops its workers),
    then SIGKILL."""
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(ROOT))
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = None
        log.seek(0)
        return rc, log.read()[-3000:]


def bench_training(sec: dict[str, Any], clock: Clock, sz: Sizes, cuda: bool, planner: Planner, out: Path,
                   state: dict[str, Any]) -> None:
    from trainready.run.summary import summarize

    t = sz.train
    run_dir = out / "train-run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    work = Path(tempfile.mkdtemp(prefix="gpu_suite_train-"))
    try:
        script = TRAIN_SCRIPT
        result_path = work / "result.json"
        cmd = [sys.executable, "-m", "trainready", "run", "--nproc-per-node", "1", "--run-dir", str(run_dir),
               "--ckpt-every", "off"]
        job = None
        if planner.known:
            try:
                job = train_job(sz, planner.gpu.name, out / "train-job.toml")
                cmd += ["--job", str(job)]
            except Exception as exc:
                sec["notes"].append(f"no job spec (no planner prediction, no calibration from the run): {_error(exc)}")
        cmd += ["--", sys.executable, str(script), "--result", str(result_path)]
        for key in ("d", "layers", "heads", "kv_heads", "ffn", "vocab", "seq", "batch", "steps", "warmup"):
            cmd += [f"--{key.replace('_', '-')}", str(t[key])]
        cmd += ["--dtype", t["dtype"]]
        # the launcher's own settings come from its flags, not from a session this suite may run inside
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TRAINREADY_", "TORCHELASTIC")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        if os.environ.get("TRAINREADY_NO_IMDS"):
            env["TRAINREADY_NO_IMDS"] = os.environ["TRAINREADY_NO_IMDS"]
        src = str(ROOT / "src")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if not cuda:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a dry run on a GPU machine stays on the CPU (gloo)
        timeout = max(5.0, clock.left())
        t0 = time.monotonic()
        rc, tail = _run_launcher(cmd, timeout, env)
        launch_s = time.monotonic() - t0
        sec["command"] = " ".join(cmd[1:]).replace(str(work), "$TMP").replace(str(out), "$OUT").replace(str(ROOT), "$REPO")
        if rc is None:
            raise RuntimeError(f"`trainready run` did not finish within the section's {timeout:.0f} s: {tail[-1500:]}")
        if rc != 0:
            raise RuntimeError(f"`trainready run` exited {rc}: {tail[-1500:]}")
        if not result_path.exists():
            raise RuntimeError(f"the training script wrote no result: {tail[-1500:]}")
        res = json.loads(result_path.read_text())
        summary = summarize(run_dir)
        row: dict[str, Any] = {
            "model": f"Llama-shaped d{t['d']} {t['layers']}L GQA {t['heads']}/{t['kv_heads']} ffn {t['ffn']} "
                     f"vocab {t['vocab']}", "params": res["params"], "micro_batch": t["batch"], "seq": t["seq"],
            "dtype": t["dtype"], "steps": res["steps"], "warmup": res["warmup"], "timing": res["timing"],
            "step_s": res["step_s"], "tokens_per_s": res["tokens_per_s"], "launch_s": launch_s,
            "run_status": summary.status, "steps_logged": summary.steps_logged,
        }
        for key in ("max_allocated_gib", "max_reserved_gib", "peak_host_rss_gib"):
            if res.get(key):
                row[key] = res[key]
        if summary.tokens_per_s_median:
            row["telemetry_tokens_per_s"] = summary.tokens_per_s_median
        if summary.step_s_median:
            row["telemetry_step_s"] = summary.step_s_median
        if summary.mfu_median:
            row["mfu"] = summary.mfu_median
        if summary.shares is not None:
            row["telemetry_shares"] = {k: v for k, v in summary.shares.model_dump().items()
                                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if job is not None:
            try:
                from trainready.catalog import load_catalog
                from trainready.plan.job import load_job
                from trainready.plan.memory import estimate_memory
                from trainready.plan.performance import estimate_step
                from trainready.plan.setup import resolve

                setup = resolve(load_job(job), load_catalog())
                row["planner_tokens_per_s"] = estimate_step(setup).tokens_per_s
                row["planner_reserved_gib"] = estimate_memory(setup).reserved_peak / GiB
            except Exception as exc:
                sec["notes"].append(f"planner prediction failed: {_error(exc)}")
        if not cuda:
            sec["notes"].append("CPU: gloo, host clocks, fp32; peak memory is the worker's peak RSS")
        sec["rows"].append(row)
        state["run_dir"], state["job"] = run_dir, job
        state["peak_reserved_gib"] = res.get("max_reserved_gib")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- 5. checkpoint save/restore -----------------------------------------------------------------------------------
def _evict(directory: Path) -> bool:
    """Drop the checkpoint's files from the page cache, so the restore reads the disk."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def bench_checkpoint(sec: dict[str, Any], clock: Clock, sz: Sizes, cuda: bool, scratch: Path) -> None:
    from trainready.store import CheckpointManager, CheckpointManagerOptions

    dev = "cuda" if cuda else "cpu"
    logging_quiet()
    gen = torch.Generator(device=dev).manual_seed(7)
    # bf16 weights and fp32 optimizer-like tensors, as a training state holds them
    per = sz.ckpt_bytes // sz.ckpt_tensors
    state: dict[str, Any] = {"model": {}, "optim": {}}
    for i in range(sz.ckpt_tensors):
        if i % 3 == 2:
            state["optim"][f"exp_avg.{i:02d}"] = torch.randn(per // 4, device=dev, dtype=torch.float32, generator=gen)
        else:
            state["model"][f"layer.{i:02d}.weight"] = torch.randn(per // 2, device=dev, generator=gen,
                                                                  dtype=torch.float32).to(torch.bfloat16)
    tensors = [(g, k, v) for g in state for k, v in state[g].items()]
    nbytes = sum(v.numel() * v.element_size() for _, _, v in tensors)
    _sync(cuda)
    sec["notes"].append(f"{len(tensors)} tensors on {dev} ({nbytes / GiB:.2f} GiB), scratch directory on "
                        f"{scratch.parent}; CheckpointManager(keep_hot=1), no archive")
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        # warm-up on a tiny state (imports, DCP planner): untimed
        with CheckpointManager(scratch / "warmup", options=CheckpointManagerOptions(async_save=False, keep_hot=1)) as mgr:
            mgr.save(0, {"model": {"w": torch.ones(16, device=dev)}})
        shutil.rmtree(scratch / "warmup", ignore_errors=True)

        with CheckpointManager(scratch / "sync", options=CheckpointManagerOptions(async_save=False, keep_hot=1)) as mgr:
            t0 = time.perf_counter()
            mgr.save(1, state)
            save_s = time.perf_counter() - t0
        sec["rows"].append({"what": "save (sync, until committed)", "bytes": nbytes, "seconds": save_s,
                            "gbps": nbytes / save_s / 1e9})
        if clock.out():
            sec["skipped"].append({"what": "restore, async save", "reason": f"section time budget "
                                                                            f"({clock.budget_s:.0f} s) reached"})
            return
        cold = _evict(scratch / "sync")
        into = {g: {k: torch.zeros_like(v) for k, v in state[g].items()} for g in state}
        _sync(cuda)
        with CheckpointManager(scratch / "sync", options=CheckpointManagerOptions(async_save=False, keep_hot=1)) as mgr:
            t0 = time.perf_counter()
            step = mgr.restore(into)
            _sync(cuda)
            restore_s = time.perf_counter() - t0
        if step != 1:
            raise RuntimeError(f"restore returned step {step!r}, saved step 1")
        differ = [f"{g}.{k}" for g, k, v in tensors if not _bits_equal(v, into[g][k])]
        if differ:
            raise RuntimeError(f"restore is not bit-exact: {len(differ)} tensor(s) differ ({', '.join(differ[:3])})")
        sec["rows"].append({"what": "restore (page cache dropped)" if cold else "restore (page cache warm)",
                            "bytes": nbytes, "seconds": restore_s, "gbps": nbytes / restore_s / 1e9,
                            "bit_exact": True, "tensors_compared": len(tensors)})
        del into
        shutil.rmtree(scratch / "sync", ignore_errors=True)
        _free(cuda)
        if clock.out():
            sec["skipped"].append({"what": "async save", "reason": f"section time budget ({clock.budget_s:.0f} s) "
                                                                   f"reached"})
            return
        with CheckpointManager(scratch / "async", options=CheckpointManagerOptions(async_save=True, keep_hot=1)) as mgr:
            mgr.save(1, state)  # the first async save allocates the host staging buffers
            mgr.wait()
            t0 = time.perf_counter()
            mgr.save(2, state)
            blocked = time.perf_counter() - t0
            mgr.wait()
            total = time.perf_counter() - t0
        sec["rows"].append({"what": "async save: training blocked (staging to host)", "bytes": nbytes,
                            "seconds": blocked, "gbps": nbytes / blocked / 1e9})
        sec["rows"].append({"what": "async save: until committed", "bytes": nbytes, "seconds": total,
                            "gbps": nbytes / total / 1e9})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def logging_quiet() -> None:
    import logging

    logging.getLogger("trainready").setLevel(logging.WARNING)


# --- calibration through the project's own code ---------------------------------------------------------------------
def build_calibration(catalog_gpu: str, gemm_ref: dict[str, Any] | None, hbm_copy: dict[str, Any] | None,
                      run_dir: Path | None, peak_reserved_gib: float | None, results_path: Path,
                      out_path: Path) -> dict[str, Any]:
    """Fit the planner's factors (plan/calibration.py) to the size^3 GEMM, the device copy and the training
    run, save the calibration file (plan/calibration_file.py) at `out_path`, read it back as `--calibration`
    would; returns a summary for the results JSON."""
    from trainready.catalog import load_catalog
    from trainready.plan import calibration as cal
    from trainready.plan import calibration_file as cf
    from trainready.report.calibration import run_measurement

    catalog = load_catalog()
    gpu = catalog.gpu(catalog_gpu)
    measurements: list[Any] = []
    what: list[str] = []
    sources = []
    if gemm_ref:
        measurements.append(cal.GemmMeasurement("gpu_suite gemm", gpu, float(gemm_ref["tflops"]), int(gemm_ref["k"])))
        what.append(f"bf16 GEMM {gemm_ref['tflops']:,.0f} TFLOP/s at {gemm_ref['k']}^3")
    if hbm_copy:
        measurements.append(cal.HbmCopyMeasurement("gpu_suite device copy", gpu, float(hbm_copy["gbps"])))
        what.append(f"device-to-device copy {hbm_copy['gbps']:,.0f} GB/s (read + write)")
    stack = None
    if what:
        sources.append(cf.CalibrationSource(kind="measurements", path=str(results_path.absolute())[:4096], what=what))
    if run_dir is not None:
        m, notes, _job = run_measurement(run_dir, catalog, None)
        if peak_reserved_gib:
            m = replace(m, peak_gib=float(peak_reserved_gib))
            notes = [*notes, f"peak reserved {peak_reserved_gib:.2f} GiB (torch.cuda.max_memory_reserved)"]
        measurements.append(m)
        stack = m.setup.stack
        sources.append(cf.CalibrationSource(kind="run", path=str(run_dir.absolute())[:4096], what=notes))
    if not measurements:
        raise ValueError("nothing measured to calibrate from")
    fit = cal.fit(measurements)
    name = cf.default_name(gpu.name, stack)[:53].rstrip("._-") + "-gpu-suite"
    made = cf.from_fit(name, fit, gpu=gpu.name, instance=None, stack=stack, sources=sources)
    path = cf.save(made, out_path)
    back = cf.parse(path.read_text(), str(path))  # as `--calibration FILE` reads it
    cf.check_known(back, catalog, str(path))
    return {"path": str(path), "name": back.name, "gpu": back.gpu, "stack": back.stack,
            "factors": {n: {"value": f.value, "prior": f.prior, "status": f.status} for n, f in back.factors.items()},
            "error_before": back.fit.error_before, "error_after": back.fit.error_after,
            "step_error_before": back.fit.step_error_before, "step_error_after": back.fit.step_error_after,
            "describe": back.describe()}


def _section(name: str) -> dict[str, Any]:
    return {"status": "ok", "units": UNITS[name], "rows": [], "skipped": [], "errors": [], "notes": []}


def run_suite(args: argparse.Namespace, cuda: bool) -> tuple[dict[str, Any], int]:
    sz = DRY if args.dry_run else FULL
    started = time.monotonic()
    total_s = args.time_budget or sz.total_s
    deadline = started + total_s
    # a --time-budget other than the default scales every section's budget by the same factor: 2x the time, 2x
    # each section's (the test suite gives its dry run ten times the default, so a busy machine leaves nothing out)
    budgets = {name: seconds * total_s / sz.total_s for name, seconds in sz.budgets.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.ones(1, device="cuda")  # the context, before anything is timed
    else:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    host = host_facts(cuda)
    planner = Planner(host.get("gpu"))
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "date": time.strftime("%Y-%m-%d"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dry_run": bool(args.dry_run),
        "host": host, "planner": planner.describe(), "planner_why": planner.why,
        "budgets_s": {**budgets, "total": total_s}, "sections": {},
    }
    results_path = out / "gpu_suite.json"
    report["results_file"] = str(results_path)
    state: dict[str, Any] = {}
    scratch = Path(args.ckpt_dir) if args.ckpt_dir else out
    runners: dict[str, Callable[[dict[str, Any], Clock], None]] = {
        "gemm": lambda s, c: bench_gemm(s, c, sz, cuda, planner),
        "attention": lambda s, c: bench_attention(s, c, sz, cuda, planner),
        "ring": lambda s, c: bench_ring(s, c, sz, cuda, planner),
        "copy": lambda s, c: bench_copy(s, c, sz, cuda, planner),
        "training": lambda s, c: bench_training(s, c, sz, cuda, planner, out, state),
        "checkpoint": lambda s, c: bench_checkpoint(s, c, sz, cuda, scratch / "ckpt-scratch"),
    }
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    for name in SECTIONS:
        sec = _section(name)
        report["sections"][name] = sec
        if name not in only:
            sec["status"] = "skipped"
            sec["skipped"].append({"what": name, "reason": "not selected (--only)"})
            continue
        clock = Clock(budgets[name], deadline)
        sec["budget_s"] = budgets[name]
        print(f"gpu_suite: {name} (budget {min(clock.budget_s, max(0.0, clock.left())):.0f} s) ...", file=sys.stderr,
              flush=True)
        if clock.out():
            sec["status"] = "skipped"
            sec["skipped"].append({"what": name, "reason": "the suite's total time budget was spent"})
            continue
        try:
            runners[name](sec, clock)
        except Exception as exc:  # recorded; the next section runs
            sec["status"] = "error"
            sec["error"] = _error(exc)
            sec["trace"] = traceback.format_exc()[-2000:]
        finally:
            _free(cuda)
        sec["wall_s"] = time.monotonic() - clock.start
        if sec["status"] == "ok" and sec["errors"]:
            sec["status"] = "partial"
        if sec["status"] == "ok" and not sec["rows"]:
            sec["status"] = "skipped"
        print(f"gpu_suite: {name} {sec['status']} in {sec['wall_s']:.1f} s ({len(sec['rows'])} rows)",
              file=sys.stderr, flush=True)
        # what is done so far, should the machine be taken away before the end
        results_path.write_text(json.dumps({**report, "partial": True}, indent=1, default=str) + "\n")

    # calibration: only from a GPU the catalog knows
    if args.dry_run or not cuda:
        report["calibration"] = {"skipped": "dry run: CPU figures say nothing about a GPU's factors"}
    elif not planner.known:
        report["calibration"] = {"skipped": f"GPU not in the catalog ({planner.why})"}
    else:
        try:
            ref = next((r for r in report["sections"]["gemm"]["rows"]
                        if r.get("model") == "reference" and r.get("dtype") == "bf16"), None)
            d2d = next((r for r in report["sections"]["copy"]["rows"] if r.get("direction") == "D2D"), None)
            report["calibration"] = build_calibration(planner.gpu.name, ref, d2d, state.get("run_dir"),
                                                      state.get("peak_reserved_gib"), results_path,
                                                      out / "calibration.json")
        except Exception as exc:
            report["calibration"] = {"error": _error(exc), "trace": traceback.format_exc()[-1500:]}
    report["wall_s"] = time.monotonic() - started
    failed = [n for n, s in report["sections"].items() if s["status"] in ("error", "partial")]
    report["failed_sections"] = failed
    results_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    md = render_markdown(report)
    (out / "gpu_suite.md").write_text(md)
    return report, 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:5]))
    ap.add_argument("--out", help="directory for gpu_suite.json, gpu_suite.md, calibration.json and the run "
                                  "directory (default: a new temporary directory)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes and budgets: checks the code paths")
    ap.add_argument("--write-docs", action="store_true", help="append the Markdown to docs/measurements.md")
    ap.add_argument("--docs-file", help="the file --write-docs appends to (default docs/measurements.md)")
    ap.add_argument("--only", help=f"comma-separated sections to run ({','.join(SECTIONS)})")
    ap.add_argument("--time-budget", type=float,
                    help="seconds for the whole suite (default 460; dry run 60); each section's budget scales with it")
    ap.add_argument("--ckpt-dir", help="where the checkpoint section writes (default --out); removed afterwards")
    args = ap.parse_args(argv)
    if args.only:
        unknown = set(args.only.split(",")) - set(SECTIONS)
        if unknown:
            print(f"gpu_suite: unknown section(s) {', '.join(sorted(unknown))}; sections: {', '.join(SECTIONS)}",
                  file=sys.stderr)
            return 2
    cuda = torch.cuda.is_available()
    if not args.dry_run and not cuda:
        print("gpu_suite: no CUDA device; use --dry-run (the same code paths on CPU, tiny shapes)", file=sys.stderr)
        return 2
    if args.dry_run and args.write_docs and not args.docs_file:
        print("gpu_suite: a dry run's figures are not measurements: --write-docs with --dry-run needs --docs-file",
              file=sys.stderr)
        return 2
    cuda = cuda and not args.dry_run
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="gpu_suite-")
    report, code = run_suite(args, cuda)
    md = (Path(args.out) / "gpu_suite.md").read_text()
    print(md)
    if args.write_docs:
        docs = Path(args.docs_file) if args.docs_file else ROOT / "docs" / "measurements.md"
        with open(docs, "a") as fh:
            fh.write("\n" + md)
        print(f"gpu_suite: appended to {docs}", file=sys.stderr)
    print(f"gpu_suite: {report['wall_s']:.1f} s; results in {Path(args.out) / 'gpu_suite.json'}"
          + (f"; failed: {', '.join(report['failed_sections'])}" if report["failed_sections"] else ""),
          file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
