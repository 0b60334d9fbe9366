"""How far the planner's speed was off on measured runs like the one estimated: its track record.

bench/track_record.py estimates every measured run that the accuracy benches (bench/plan_accuracy.py and
bench/plan_accuracy_2024.py) count, published ones and the H200 runs a trainready session measured, with the
run's own layout, and writes plan/data/track_record.json: one line
per run with its regime (regime_of), the signed error of tokens/s per GPU and, where the source published a
peak, the memory model's error against it (read by plan/memory_record.py). An estimate quotes the
narrowest regime that holds at least MIN_RUNS runs: (dense or MoE, sequence regime, precision, GPU
architecture, training stack), then without the stack, then without the architecture, then without the
precision, then the kind alone. The stack is the narrowest field because stacks of one regime miss by different
amounts (on Hopper FP8 with long sequences, torchtitan's context-parallel runs lean +23% where Megatron's lean
+10%, as of 2026-12-08): a user of one should not be quoted the other's lean.

The error is what the planner got wrong on runs that were measured, not a range of its inputs: a user reads
"runs like this were off by 10% (median), 31% (9 in 10)" beside the point estimate. The file is ours, but it
is checked like any other (schema_version, every field); one that does not load gives no track record,
never a wrong one. A test regenerates it (tests/test_track_record.py), so it is the current model's.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainready.io import parse_json

from .setup import Setup
from .stacks import STACKS

TRACK_RECORD_SCHEMA_VERSION = 3  # 2: a regime names its training stack; 3: a run carries its memory error
MIN_RUNS = 8
"""Fewest runs a regime needs to be quoted (below it, the next broader regime)."""
LONG_SEQUENCE = 32768
"""Sequences from this length, or split over CP ranks, form the long-context regime."""
WIDE_P90_PCT = 20.0
"""A regime whose 90th-percentile error exceeds this (the MoE target of issue 24) is also a warning."""
MAX_FILE_BYTES = 4 * 2**20
"""~100 bytes a run: a file larger than this is not ours (read no further)."""
REGIME_FIELDS = ("kind", "context", "precision", "arch", "stack")
"""A regime's fields, narrowest last: quoting widens by dropping them from the right."""

Kind = Literal["dense", "moe"]
Context = Literal["standard", "long"]
Precision = Literal["16-bit", "fp8", "other"]
Arch = Literal["volta", "ampere", "ada", "hopper", "blackwell", "other"]
Dispatcher = Literal["none", "alltoall", "deepep"]
StackName = Literal[tuple(STACKS)]  # type: ignore[valid-type]  # a stack this release knows: no other matches
MEASURED_DEPTH = REGIME_FIELDS.index("arch") + 1
"""Fields of a regime (kind .. arch) that must hold a measured run for the setup to count as measured: a stack
with no run of its own is quoted its regime's runs without a warning, as before stacks were a field."""


class Regime(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    kind: Kind
    context: Context
    precision: Precision
    arch: Arch
    stack: StackName = Field(description="the stack preset (plan/stacks.py)")
    dispatcher: Dispatcher = Field(description="how MoE tokens reach their experts' ranks: none (dense, or every "
                                               "expert local, ep 1), alltoall or deepep (DeepEP keeps its own "
                                               "buffers); a field of the memory record only (plan/memory_record.py)")


class RecordRow(BaseModel):
    """One measured run as the planner estimated it."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1, max_length=200, description="the bench data file it comes from")
    regime: Regime
    signed_error_pct: float = Field(ge=-100, le=10_000, description="estimate / measured - 1, in %")
    memory_signed_error_pct: float | None = Field(
        None, gt=-100, le=10_000, description="the memory model's peak / the published peak - 1, in %, the same "
                                              "quantity the source reports (max reserved or allocated); None: no "
                                              "peak published (plan/memory_record.py)")
    memory_transient_ratio: float | None = Field(
        None, ge=0, le=1000, description="the published peak less the modelled persistent states, per byte of the "
                                         "modelled peak less them (plan/memory_record.compared); None: no peak")


class RecordFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    schema_version: Literal[3]
    generated_by: str = Field(max_length=200)
    rows: list[RecordRow] = Field(max_length=10_000)

    @field_validator("schema_version", mode="before")
    @classmethod
    def _an_int(cls, v: object) -> object:
        if type(v) is not int:  # Literal[3] alone takes True and 3.0
            raise ValueError("schema_version must be the integer 3")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RecordFile:
        for r in self.rows:  # a half-written row would drop out of the memory record and call its regime unchecked
            if (r.memory_signed_error_pct is None) != (r.memory_transient_ratio is None):
                raise ValueError(f"run {r.id!r}: a memory error needs its transient ratio, and the other way round")
            if r.regime.kind == "dense" and r.regime.dispatcher != "none":  # regime_of never writes it
                raise ValueError(f"run {r.id!r}: a dense run has no MoE dispatcher")
        return self

    @model_validator(mode="after")
    def _each_run_once(self) -> RecordFile:
        if len({r.id for r in self.rows}) != len(self.rows):  # a run counted twice would weigh twice
            raise ValueError("a run is listed more than once")
        return self


class TrackRecord(BaseModel):
    """How the planner's tokens/s compared with measured runs (published, or ours on an H200) of a setup's regime."""

    model_config = ConfigDict(frozen=True)  # one instance per regime, shared by every estimate that quotes it

    regime: str = Field(description="the runs compared, in words: the narrowest regime with enough runs, widened "
                                    "from the training stack, then the GPU architecture, then the precision, then "
                                    "the sequence regime")
    runs: int = Field(description="measured runs in that regime")
    median_abs_error_pct: float = Field(description="median |estimate / measured - 1| of tokens/s per GPU, %")
    p90_abs_error_pct: float | None = Field(description="90th percentile of the same (nearest rank: the ceil(0.9 n)-th "
                                                        "smallest); None under 10 runs")
    signed_median_pct: float = Field(description="median of estimate / measured - 1: + the planner was optimistic")
    worst_run: str = Field(description="the run with the largest error: its id in bench/data/plan_reference, or the "
                                       "label bench/plan_accuracy.py gives the runs it builds (MosaicML, torchtune, "
                                       "the H200 runs)")
    worst_signed_error_pct: float
    narrower: str | None = Field(None, description="the narrowest regime's own runs and their errors where they are "
                                                   "too few to quote alone (or that there are none); None: quoted")
    narrower_errors_pct: list[float] = Field(default_factory=list,
                                             description="signed errors of those few runs (empty: none, or quoted)")
    regime_measured: bool = Field(True, description="false: no measured run shares the setup's whole regime (its "
                                                    "GPU architecture or precision was never measured), a warning")
    source: str = Field(description="where the figures come from")


Key = tuple[str, str, str, str, str]
"""A regime as plain strings in REGIME_FIELDS order: what `plan` computes for every candidate."""


def _key(s: Setup) -> Key:
    return ("moe" if s.model.is_moe else "dense",
            "long" if s.cp > 1 or s.attention_len >= LONG_SEQUENCE else "standard",  # packed documents: theirs
            "fp8" if s.precision == "fp8" else "16-bit" if s.precision in ("bf16", "fp16") else "other",
            s.gpu.arch, s.stack)


def dispatcher_of(s: Setup) -> str:
    return s.ep_dispatcher if s.model.is_moe and s.ep > 1 else "none"


def regime_of(s: Setup) -> Regime:
    return Regime(**dict(zip(REGIME_FIELDS, _key(s))), dispatcher=dispatcher_of(s))


def key_of(r: Regime) -> Key:
    return tuple(getattr(r, f) for f in REGIME_FIELDS)


def _label(key: Key, depth: int) -> str:
    """The regime's first `depth` fields, in words."""
    kind, context, precision, arch, stack = key
    parts = ["MoE" if kind == "moe" else "dense"]
    if depth > 2:
        parts.append({"fp8": "FP8", "16-bit": "BF16/FP16", "other": "FP32/other-precision"}[precision])
    words = " ".join(parts) + " runs"
    if depth > 1:
        words += (f" with long sequences (>= {LONG_SEQUENCE // 1024}k tokens or context parallel)"
                  if context == "long" else f" with sequences under {LONG_SEQUENCE // 1024}k")
    if depth > 3:
        words += f" on {arch.capitalize()} GPUs"
    if depth > 4:
        words += f" under {stack}"
    return words


def parse(data: str | bytes) -> tuple[RecordRow, ...] | None:
    """The records a track_record.json holds (None: it does not hold what it must, or no run at all)."""
    try:
        rows = tuple(RecordFile.model_validate(parse_json(data)).rows)
    except (ValueError, ValidationError):  # UnicodeDecodeError is a ValueError
        return None
    return rows or None


@cache
def _rows() -> tuple[RecordRow, ...] | None:
    """The committed records (None: the file is missing or unreadable)."""
    try:
        with (resources.files("trainready.plan") / "data" / "track_record.json").open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    return parse(raw) if len(raw) <= MAX_FILE_BYTES else None


def committed_rows() -> tuple[RecordRow, ...] | None:
    """The runs of the shipped track_record.json (None: missing or unreadable), for the memory record too."""
    return _rows()


def p90(xs: list[float]) -> float:
    """The 90th percentile by nearest rank: the ceil(0.9 n)-th smallest (NaN for none). The one definition the
    accuracy benches (bench/plan_accuracy*.py) and the track record share, so their figures compare."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.9 * len(xs)) - 1)] if xs else float("nan")


def summarize(rows: list[RecordRow], regime: str, narrower: str | None = None,
              narrower_errors: list[float] | None = None, regime_measured: bool = True) -> TrackRecord:
    errs = [abs(r.signed_error_pct) for r in rows]
    worst = max(rows, key=lambda r: abs(r.signed_error_pct))
    return TrackRecord(regime=regime, runs=len(rows), median_abs_error_pct=statistics.median(errs),
                       p90_abs_error_pct=p90(errs) if len(rows) >= 10 else None,
                       signed_median_pct=statistics.median(r.signed_error_pct for r in rows),
                       worst_run=worst.id, worst_signed_error_pct=worst.signed_error_pct, narrower=narrower,
                       narrower_errors_pct=narrower_errors or [], regime_measured=regime_measured,
                       source="bench/track_record.py over the runs bench/plan_accuracy.py and "
                              "bench/plan_accuracy_2024.py count (bench/data/plan_reference)")


def track_record(s: Setup, rows: tuple[RecordRow, ...] | None = None) -> TrackRecord | None:
    """The planner's record on measured runs of `s`'s regime (None: no record could be read, or fewer than
    MIN_RUNS runs of its kind). The record is the shipped model's: an estimate on calibrated factors does not
    quote it (estimate.py)."""
    if rows is None:
        return _committed(_key(s))
    return _of_regime(_key(s), rows) if rows else None


@cache
def _committed(key: Key) -> TrackRecord | None:
    rows = _rows()
    return _of_regime(key, rows) if rows else None


def _of_regime(key: Key, rows: tuple[RecordRow, ...]) -> TrackRecord | None:
    """The narrowest regime along REGIME_FIELDS, widened from the right, with MIN_RUNS runs; the first narrower
    one that has runs but too few is named with their errors, so a broad figure does not hide them, and a setup
    whose whole regime has none is said to be unmeasured."""
    keyed = [(key_of(x.regime), x) for x in rows]
    notes, few, measured = [], [], True
    for depth in range(len(REGIME_FIELDS), 0, -1):
        same = [x for k, x in keyed if k[:depth] == key[:depth]]
        if len(same) >= MIN_RUNS:
            return summarize(same, _label(key, depth) + _mostly_another_stack(same, key, depth),
                             "; ".join(notes) or None, few, measured)
        if not same and depth == MEASURED_DEPTH:
            measured = False
            notes.append(f"no measured {_label(key, depth)}")
        elif same and not few:
            few = sorted(x.signed_error_pct for x in same)
            notes.append(f"too few measured {_label(key, depth)} to quote alone "
                         f"({len(same)}: {', '.join(f'{e:+.0f}%' for e in few)})")
    return None


def _mostly_another_stack(same: list[RecordRow], key: Key, depth: int) -> str:
    """" (8 of 9 under torchtitan)" where a regime wider than the stack is quoted and most of its runs are another
    stack's: its lean is then mostly that stack's, and the reader should know."""
    if depth >= len(REGIME_FIELDS):
        return ""
    stack, n = Counter(x.regime.stack for x in same).most_common(1)[0]
    return f" ({n} of {len(same)} under {stack})" if stack != key[-1] and 2 * n > len(same) else ""


def text(t: TrackRecord) -> str:
    """One line: the regime, its median and 90th-percentile (or worst) error and its lean."""
    spread = (f"{t.p90_abs_error_pct:.0f}% for 9 in 10" if t.p90_abs_error_pct is not None
              else f"at worst {abs(t.worst_signed_error_pct):.0f}%")
    lean = ("neither way" if abs(t.signed_median_pct) < 0.5 else
            f"{'optimistic' if t.signed_median_pct > 0 else 'pessimistic'} ({t.signed_median_pct:+.0f}% median)")
    return (f"on {t.runs} measured {t.regime}, the estimated tokens/s was off by {t.median_abs_error_pct:.0f}% "
            f"(median), {spread}; it leaned {lean}"
            + (f"; {t.narrower}" if t.narrower else ""))


def wide(t: TrackRecord) -> bool:
    """Whether the record is too loose to take the point estimate at its word (a warning): the quoted regime's
    90th-percentile error (its worst under 10 runs), or any of the narrower regime's few runs, beyond WIDE_P90_PCT,
    or no measured run in the setup's whole regime."""
    spread = t.p90_abs_error_pct if t.p90_abs_error_pct is not None else abs(t.worst_signed_error_pct)
    return not t.regime_measured or max([spread, *map(abs, t.narrower_errors_pct)]) > WIDE_P90_PCT
