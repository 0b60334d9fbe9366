"""How far the memory model was off on the measured peaks of runs like the one estimated: its memory record.

The speed record (plan/track_record.py) has a twin for memory: every run of track_record.json whose source
published its peak, or that was measured here (the H200 runs), carries the memory model's signed error. A fit
is only as good as that model, and the model is not equally good everywhere: on the
six NousResearch runs of Qwen3-30B-A3B under torchtitan with DeepEP the published peaks were 2.1-3.5x its
figure, where on torchtitan's dense runs it is within about 5%. So an estimate quotes the peaks of runs like
it, and where, its memory beyond the persistent states scaled by their median ratio, its own peak would not
fit on the card, says that the fit is not
established (a warning, not a rule: plan's fit rule is the model's, as the speed record is not applied either).

Memory is a matter of the framework (its allocator use, recomputation, buffers), of dense against MoE and of
how MoE tokens are dispatched (DeepEP's buffers and autograd hooks are its own: the model's figure is 21% over
the one published torchtitan MoE peak without it, pith-train's, where the DeepEP peaks are 2.1-3.5x it), so a
regime here always keeps those three and widens by dropping the GPU architecture, then the precision, then the
sequence regime: a Megatron user is never quoted torchtitan's peaks. Where even the three have fewer than
MIN_RUNS peaks they are quoted anyway, said to be few; where they have none, the estimate says its memory figure
was never checked against a measured peak of its kind. A calibration that fitted the allocator slack from the
user's own peak is theirs, not this record's: the record is then not quoted."""

from __future__ import annotations

import statistics

from pydantic import BaseModel, ConfigDict, Field

from .memory import GiB, MemoryResult
from .setup import Setup
from .track_record import MIN_RUNS, RecordRow, committed_rows, p90, regime_of

MEMORY_FIELDS = ("kind", "stack", "dispatcher", "context", "precision", "arch")
"""A memory regime's fields, widest first: quoting widens by dropping them from the right, down to KEPT."""
KEPT = 3
"""Fields never dropped (kind, stack, MoE dispatcher): another framework's peaks say nothing of this one's, and
DeepEP's (its own buffers, its autograd hooks) nothing of all-to-all's."""


class MemoryRecord(BaseModel):
    """How the memory model's peak compared with the measured peaks of a setup's regime."""

    model_config = ConfigDict(frozen=True)

    regime: str = Field(description="the runs compared, in words: the narrowest regime with enough measured "
                                    "peaks, widened from the GPU architecture, then the precision, then the "
                                    "sequence regime; never across dense/MoE, training stacks or MoE dispatchers")
    runs: int = Field(description="runs with a measured (published, or measured here) peak in that regime")
    few: bool = Field(description=f"fewer than {MIN_RUNS} runs: quoted because no wider regime of the same kind, "
                                   "stack and dispatcher has more")
    median_abs_error_pct: float = Field(description="median |model / measured - 1| of the peak, %")
    p90_abs_error_pct: float | None = Field(description="90th percentile of the same (nearest rank); None under 10")
    signed_median_pct: float = Field(description="median of model / measured - 1: - the model counted less "
                                                 "memory than the runs used")
    transient_over_model: float = Field(description="median over the runs of the measured peak less the modelled "
                                                    "persistent states, per GiB of the modelled peak less them: what "
                                                    "the runs used beyond weights, gradients and optimizer state "
                                                    "(activations, buffers, allocator slack) per GiB the model counts")
    worst_run: str = Field(description="the run with the largest error (its id in bench/data/plan_reference, or "
                                       "bench/plan_accuracy.py's label)")
    worst_signed_error_pct: float
    source: str = Field(description="where the figures come from")


def _mkey(s: Setup) -> tuple[str, ...]:
    r = regime_of(s)
    return tuple(getattr(r, f) for f in MEMORY_FIELDS)


def row_key(x: RecordRow) -> tuple[str, ...]:
    """A run's memory regime, MEMORY_FIELDS in order (bench/track_record.py groups its table by it)."""
    return tuple(getattr(x.regime, f) for f in MEMORY_FIELDS)


MEMORY_RECORD_WARNING = "memory track record:"
"""How the warning starts (renderers tell it from the neutral line by it)."""
CALIBRATED_NOTE = "memory record not quoted: the allocator slack is calibrated from your own run's peak"
MEMORY_NOT_QUOTED = ("memory figure unchecked:", CALIBRATED_NOTE)
"""How the assumptions start that say why a setup has no memory record."""
_DISPATCH_WORDS = {"none": " with every expert on its rank (ep 1)", "alltoall": " with all-to-all expert dispatch",
                   "deepep": " with DeepEP dispatch"}


def regime_label(key: tuple[str, ...], depth: int) -> str:
    kind, stack, dispatcher, context, precision, arch = key
    words = "MoE" if kind == "moe" else "dense"
    if depth > 4:
        words += " " + {"fp8": "FP8", "16-bit": "BF16/FP16", "other": "FP32/other-precision"}[precision]
    words += " runs"
    if depth > 3:
        words += (" with long sequences (or context parallel)" if context == "long" else " with standard sequences")
    if depth > 5:
        words += f" on {arch.capitalize()} GPUs"
    return f"{words} under {stack}{_DISPATCH_WORDS[dispatcher] if kind == 'moe' else ''}"


def calibrated(s: Setup) -> bool:
    """Whether the setup's allocator slack comes from the user's own measured peak (a calibration that fitted the
    fragmentation of its strategy): the record is the shipped model's, not theirs, so it is not quoted."""
    e = s.efficiency
    return e is not None and (e.fragmentation_zero3 if s.strategy == "zero3" else e.fragmentation) is not None


def memory_record(s: Setup, rows: tuple[RecordRow, ...] | None = None) -> MemoryRecord | None:
    """The memory model's record on measured peaks of `s`'s regime (None: no peak of its kind, stack and
    dispatcher, no readable track record, or a calibrated fragmentation)."""
    if calibrated(s):
        return None
    rows = committed_rows() if rows is None else rows
    if not rows:
        return None
    key = _mkey(s)
    peaks = [(row_key(x), x) for x in rows if x.memory_signed_error_pct is not None
             and x.memory_transient_ratio is not None]
    for depth in range(len(MEMORY_FIELDS), KEPT - 1, -1):
        same = [x for k, x in peaks if k[:depth] == key[:depth]]
        if len(same) >= MIN_RUNS or (depth == KEPT and same):
            return summarize(same, regime_label(key, depth))
    return None


def summarize(rows: list[RecordRow], regime: str) -> MemoryRecord:
    signed = [x.memory_signed_error_pct for x in rows]
    errs = [abs(e) for e in signed]
    worst = max(rows, key=lambda x: abs(x.memory_signed_error_pct))
    median = statistics.median(signed)
    return MemoryRecord(regime=regime, runs=len(rows), few=len(rows) < MIN_RUNS,
                        median_abs_error_pct=statistics.median(errs),
                        p90_abs_error_pct=p90(errs) if len(rows) >= 10 else None, signed_median_pct=median,
                        transient_over_model=statistics.median(x.memory_transient_ratio for x in rows),
                        worst_run=worst.id,
                        worst_signed_error_pct=worst.memory_signed_error_pct,
                        source="bench/track_record.py over the measured peaks of the runs bench/plan_accuracy.py "
                               "and bench/plan_accuracy_2024.py count (bench/data/plan_reference)")


def unchecked(s: Setup) -> str:
    """What an estimate says where no measured peak of its kind, stack and dispatcher exists."""
    return (f"memory figure unchecked: no measured peak of {regime_label(_mkey(s), KEPT)} among the runs the "
            "accuracy benches count, so how far this stack's memory strays from the model is not known")


def text(r: MemoryRecord) -> str:
    """One line: the regime, the median and 90th-percentile (or worst) error, and the lean as a ratio."""
    spread = (f"{r.p90_abs_error_pct:.0f}% for 9 in 10" if r.p90_abs_error_pct is not None
              else f"at worst {abs(r.worst_signed_error_pct):.0f}%")
    few = f" (only {r.runs})" if r.few else ""
    peaks = "peak" if r.runs == 1 else "peaks"
    lean = ("it leaned neither way" if abs(r.signed_median_pct) < 0.5
            else f"it leaned {'under' if r.signed_median_pct < 0 else 'over'} ({r.signed_median_pct:+.0f}% median)")
    lean += (f"; beyond the persistent states the runs used {r.transient_over_model:.2f}x what the model counts"
             if abs(r.transient_over_model - 1) >= 0.05 else "")
    return (f"on {r.runs} measured {peaks} of {r.regime}{few}, the memory model was off by "
            f"{r.median_abs_error_pct:.0f}% (median), {spread}; {lean}")


def states_bytes(mem: MemoryResult) -> float:
    """The persistent states at the peak (weights, the gradients then held, optimizer state): the part of a peak
    the record takes as counted right. Across the six DeepEP runs the model's states move with the node count
    exactly as the published peaks do (1 to 16 nodes: 53 GiB both), while their excess grows with the batch."""
    return mem.weights + mem.gradients + mem.optimizer


def compared(mem: MemoryResult, published_gib: float, kind: str) -> tuple[float, float]:
    """(signed error %, transient ratio) of the model's peak against a published one: `kind` says which quantity
    the source reports (reserved, allocated, else the whole peak), compared with the same one of ours; the ratio
    is what the run used beyond the modelled states per byte the model counts beyond them (0 where the published
    peak is under the states)."""
    ours = mem.reserved_peak if kind == "reserved" else mem.allocated_peak if kind == "allocated" else mem.peak
    states = states_bytes(mem)
    beyond = max(ours - states, 1.0)  # activations and slack are never nothing; a byte keeps the ratio finite
    return (ours / (published_gib * GiB) - 1) * 100, max(0.0, published_gib * GiB - states) / beyond


def projected_peak_gib(r: MemoryRecord, mem: MemoryResult) -> float:
    """The modelled peak with what it holds beyond the persistent states scaled by the regime's median ratio:
    what runs like it used for this figure."""
    return (mem.peak + (mem.reserved_peak - states_bytes(mem)) * (r.transient_over_model - 1)) / GiB


def warning(r: MemoryRecord, mem: MemoryResult, gpu_gib: float) -> str | None:
    """A warning where, at the regime's median ratio, the peak would not fit on the card (None: it would)."""
    projected = projected_peak_gib(r, mem)
    if projected <= gpu_gib:
        return None
    return (f"{MEMORY_RECORD_WARNING} {text(r)}; at that median this setup's peak would be ~{projected:,.0f} GiB, "
            f"over the {gpu_gib:,.0f} GiB card: the fit is not established (measure one step's peak memory at "
            "this batch before committing to it)")
