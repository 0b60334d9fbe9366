"""Write the planner's track record: every published run the accuracy benches count, as estimated now.

For each run that bench/plan_accuracy.py (MosaicML, torchtune, the H200 device runs, MoE) and
bench/plan_accuracy_2024.py (Megatron-Bridge, torchtitan, torchao, NeMo AutoModel) count toward their
targets, the publisher's layout is estimated exactly as those benches do, and its regime
(plan/track_record.regime_of), signed error of tokens/s per GPU and, where the source published its peak, the
memory model's signed error (plan/memory_record.py) go to
src/trainready/plan/data/track_record.json, which `estimate` quotes. Runs a bench lists for information
only (outside its inclusion rule) are left out, as they are from the targets.

Usage: python bench/track_record.py           write the file and print each regime's figures
       python bench/track_record.py --check   exit 1 if the file differs from what the model gives now
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "src"))

import plan_accuracy as acc2023  # noqa: E402
import plan_accuracy_2024 as acc2024  # noqa: E402

from trainready.plan.memory import estimate_memory  # noqa: E402
from trainready.plan.performance import estimate_step  # noqa: E402
from trainready.plan.setup import resolve  # noqa: E402
from trainready.plan.memory_record import KEPT, MEMORY_FIELDS  # noqa: E402
from trainready.plan.memory_record import compared as memory_compared  # noqa: E402
from trainready.plan.memory_record import regime_label as memory_label  # noqa: E402
from trainready.plan.memory_record import row_key as memory_row_key  # noqa: E402
from trainready.plan.memory_record import summarize as memory_summary  # noqa: E402
from trainready.plan.track_record import (  # noqa: E402
    MIN_RUNS, REGIME_FIELDS, TRACK_RECORD_SCHEMA_VERSION, RecordFile, RecordRow, key_of, regime_of, summarize, text,
)

OUT = BENCH.parent / "src" / "trainready" / "plan" / "data" / "track_record.json"


def _row(id_: str, source: str, setup, pred: float, meas: float,
         memory: tuple[float, float] | None = None) -> RecordRow:
    return RecordRow(id=id_, source=source, regime=regime_of(setup), signed_error_pct=round((pred / meas - 1) * 100, 1),
                     memory_signed_error_pct=None if memory is None else round(memory[0], 1),
                     memory_transient_ratio=None if memory is None else round(memory[1], 3))


def _memory_2023(row, setup) -> tuple[float, float] | None:
    """The memory model against the row's published peak (plan/memory_record.compared), as bench/plan_accuracy.py
    compares it: allocated where it says so, else reserved."""
    if not row.mem_gib:
        return None
    kind = "allocated" if row.mem_kind == "allocated" else "reserved"
    return memory_compared(estimate_memory(setup), row.mem_gib, kind)


def records() -> list[RecordRow]:
    out: list[RecordRow] = []
    d, read = acc2023.DATA, acc2023.read_csv
    for row in acc2023.dense_rows(read(d / "mosaicml_llmfoundry.csv"), read(d / "torchtune.csv")):
        if not row.tok_s_gpu:  # the dense rows plan_accuracy.py counts, as it estimates them
            continue
        setup = resolve(row.job, acc2023.CATALOG, model=row.model)
        out.append(_row(f"{row.source}: {row.label}", "plan_accuracy.py", setup,
                        estimate_step(setup).tokens_per_s / setup.n_gpus, row.tok_s_gpu, _memory_2023(row, setup)))
    for r, pred, setup in acc2023.counted_moe(read(d / "moe.csv")):  # the MoE rule's rows that it can estimate
        out.append(_row(r["id"], "moe.csv", setup, pred, float(r["tok_s_gpu"])))
    for res in acc2024.evaluated()[0]:  # each configuration once, as the bench counts them
        if "err" in res:
            memory = (res["mem_signed"], res["mem_ratio"]) if "mem_signed" in res else None
            out.append(_row(res["row"]["id"], res["row"]["_file"], res["setup"], res["pred"], res["meas"], memory))
    dup = [k for k, n in Counter(x.id for x in out).items() if n > 1]
    if dup:
        raise SystemExit(f"runs counted twice: {dup}")
    return out


def document(rows: list[RecordRow]) -> str:
    doc = RecordFile(schema_version=TRACK_RECORD_SCHEMA_VERSION, generated_by="bench/track_record.py", rows=rows)
    return json.dumps(doc.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


def regime_groups(rows: list[RecordRow]) -> dict[tuple, list[RecordRow]]:
    """Every regime and each of its wider ones (a prefix of REGIME_FIELDS), with their runs."""
    groups: dict[tuple, list[RecordRow]] = {}
    for x in rows:
        for depth in range(1, len(REGIME_FIELDS) + 1):
            groups.setdefault(key_of(x.regime)[:depth], []).append(x)
    return groups


def markdown(rows: list[RecordRow]) -> str:
    """docs/planner.md's table: the regimes an estimate can quote (MIN_RUNS runs or more)."""
    out = ["| regime | runs | median | p90 (worst under 10) | lean |", "|---|---|---|---|---|"]
    for key, sel in sorted(regime_groups(rows).items()):
        if len(sel) < MIN_RUNS:
            continue
        t = summarize(sel, " / ".join(key))
        spread = (f"{t.p90_abs_error_pct:.0f}%" if t.p90_abs_error_pct is not None
                  else f"({abs(t.worst_signed_error_pct):.0f}%)")
        out.append(f"| {t.regime} | {t.runs} | {t.median_abs_error_pct:.0f}% | {spread} | "
                   f"{t.signed_median_pct:+.0f}% |")
    return "\n".join(out)


def memory_markdown(rows: list[RecordRow]) -> str:
    """docs/planner.md's memory table: the memory regimes an estimate can quote (plan/memory_record.py)."""
    out = ["| memory regime | peaks | median | p90 (worst under 10) | lean | beyond the states |",
           "|---|---|---|---|---|---|"]
    groups: dict[tuple, list[RecordRow]] = {}
    for x in rows:
        if x.memory_signed_error_pct is None:
            continue
        key = memory_row_key(x)
        for depth in range(KEPT, len(MEMORY_FIELDS) + 1):
            groups.setdefault(key[:depth], []).append(x)
    for key, sel in sorted(groups.items()):
        if len(sel) < MIN_RUNS and len(key) > KEPT:
            continue
        full = key + ("",) * (len(MEMORY_FIELDS) - len(key))
        t = memory_summary(sel, memory_label(full, len(key)))
        spread = (f"{t.p90_abs_error_pct:.0f}%" if t.p90_abs_error_pct is not None
                  else f"({abs(t.worst_signed_error_pct):.0f}%)")
        out.append(f"| {t.regime} | {t.runs} | {t.median_abs_error_pct:.0f}% | {spread} | "
                   f"{t.signed_median_pct:+.0f}% | {t.transient_over_model:.2f}x |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    ap.add_argument("--markdown", action="store_true", help="print docs/planner.md's regime table (nothing written)")
    args = ap.parse_args()
    rows = records()
    if args.markdown:
        print(markdown(rows))
        print()
        print(memory_markdown(rows))
        return 0
    new = document(rows)
    if args.check:
        old = OUT.read_text(encoding="utf-8") if OUT.is_file() else ""
        if old != new:
            print(f"{OUT} is stale: run python bench/track_record.py and commit it")
            return 1
        print(f"{OUT.name} matches the model ({len(rows)} runs)")
        return 0
    OUT.write_text(new, encoding="utf-8")
    print(f"wrote {OUT} ({len(rows)} runs)")
    groups = regime_groups(rows)
    for key in sorted(groups):
        sel = groups[key]
        t = summarize(sel, " / ".join(key))
        print(f"  {' / '.join(key):40s} n={len(sel):4d}  {text(t)}")
    print("memory regimes (measured peaks):")
    print(memory_markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
