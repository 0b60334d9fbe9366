"""Does calibrating on one configuration cut the planner's error on others? (issue 15 section 4)

1. Synthetic: "hardware" that behaves with known factors, different from the shipped ones, runs
   several configurations; the planner itself generates what each run measures (step split into
   compute / exposed communication / optimizer, peak memory). Calibrate on one configuration, predict
   the others: mean |predicted/measured - 1| of the step before (shipped factors) and after.
2. Real: the H200 measurements in bench/data (gpu_ground_truth_h200_*.json, gpu_heldout_h200_*.json:
   22 single-GPU Hugging Face runs with step time and peak reserved memory, plus the 8192^3 GEMM of the
   ground-truth file as `check --deep` would measure it). No GPU is used here: these are the files the
   accuracy benchmark (bench/plan_accuracy.py) reads. Calibrate on one real configuration and predict
   the other 21, for every choice of that one configuration, from two starting points:
   - the shipped Hopper factors: they were fitted to the ground-truth file on 2026-11-29, so there is
     little left to gain and calibration must at least not make things worse;
   - the factors of a GPU nobody measured (efficiency.ARCH["other"], what `estimate` assumes for an
     unknown architecture): what a user on new hardware starts from.
   And the issue's case: calibrate on one configuration, predict two others on the same GPU.

Usage: python bench/calibration_bench.py   (a few seconds on one core)
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainready.catalog import load_catalog  # noqa: E402
from trainready.plan import calibration as cal  # noqa: E402
from trainready.plan import efficiency as eff  # noqa: E402
from trainready.plan.job import JobSpec  # noqa: E402
from trainready.plan.memory import GiB, estimate_memory  # noqa: E402
from trainready.plan.performance import estimate_step  # noqa: E402
from trainready.plan.setup import resolve  # noqa: E402

CATALOG = load_catalog()


def _accuracy_module():
    spec = importlib.util.spec_from_file_location("plan_accuracy", ROOT / "bench" / "plan_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["plan_accuracy"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def step_error(m: cal.StepMeasurement, e: eff.ArchEfficiency) -> float:
    r = next(r for r in cal.step_residuals(m, e) if r.kind in ("step", "tokens_per_s"))
    return abs(r.ratio - 1)


def memory_error(m: cal.StepMeasurement, e: eff.ArchEfficiency) -> float | None:
    r = next((r for r in cal.step_residuals(m, e) if r.kind == "peak_memory"), None)
    return None if r is None else abs(r.ratio - 1)


def pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


# --- 1. synthetic ----------------------------------------------------------------------------------
H200 = "p5en.48xlarge"
A100 = "p4de.24xlarge"
SYNTHETIC = {
    "H200, slow GEMMs and NVLink (gemm 0.6, eager 0.30, intra 0.55)": (
        {"gemm": 0.6, "eager_memory": 0.30, "intra_node": 0.55}, [
            JobSpec(model="llama-3-8b", instance=H200, strategy="zero3", micro_batch=2, seq_len=4096, global_batch=64),
            JobSpec(model="llama-2-13b", instance=H200, strategy="zero3", micro_batch=1, seq_len=4096, global_batch=32,
                    activation_checkpointing="full"),
            JobSpec(model="llama-3.2-3b", instance=H200, strategy="ddp", micro_batch=8, seq_len=2048, global_batch=64),
            JobSpec(model="llama-3-8b", instance=H200, gpus=16, strategy="zero3", micro_batch=1, seq_len=8192,
                    global_batch=32)]),
    "A100 over a weak network (gemm 0.7, attention 0.5, inter 0.5, overlap 0.8)": (
        {"gemm": 0.7, "attention": 0.5, "inter_node": 0.5, "overlap": 0.8}, [
            JobSpec(model="llama-3-8b", instance=A100, gpus=16, strategy="zero3", micro_batch=1, seq_len=4096,
                    global_batch=32),
            JobSpec(model="llama-3.2-3b", instance=A100, gpus=16, strategy="ddp", micro_batch=4, seq_len=2048,
                    global_batch=64),
            JobSpec(model="llama-3.2-3b", instance=A100, gpus=8, strategy="zero3", micro_batch=1, seq_len=16384,
                    global_batch=8, activation_checkpointing="full"),
            JobSpec(model="llama-2-13b", instance=A100, gpus=32, strategy="zero3", micro_batch=1, seq_len=4096,
                    global_batch=64, activation_checkpointing="full")]),
}


def synthetic_measurement(job: JobSpec, truth: dict[str, float], label: str) -> cal.StepMeasurement:
    s = resolve(job, CATALOG)
    hw = s.with_(efficiency=cal.with_factors(eff.arch_efficiency(s.gpu.arch), truth))
    r = estimate_step(hw)
    return cal.StepMeasurement(label, s, step_s=r.step_s, compute_s=r.step_s - r.exposed_comm_s - r.optimizer_s,
                               comm_s=r.exposed_comm_s, optimizer_s=r.optimizer_s,
                               peak_gib=estimate_memory(hw).reserved_peak / GiB)


def synthetic() -> None:
    print("1. Synthetic: calibrate on one configuration's run, predict the others (step, mean |error|);")
    print("   moved: the factors the fit changed (~: partly informed, moved together with others)")
    for title, (truth, jobs) in SYNTHETIC.items():
        ms = [synthetic_measurement(j, truth, f"cfg{i}") for i, j in enumerate(jobs)]
        prior = eff.arch_efficiency(ms[0].setup.gpu.arch)
        print(f"  {title}")
        for k, train in enumerate(ms):
            fit = cal.fit([train])
            rest = [m for i, m in enumerate(ms) if i != k]
            before = statistics.mean(step_error(m, prior) for m in rest)
            after = statistics.mean(step_error(m, fit.efficiency) for m in rest)
            moved = ", ".join(f"{n} {f.value:.2f}{'' if f.status == 'informed' else '~'}"
                              for n, f in fit.factors.items() if f.status != "not informed")
            print(f"    on cfg{k} ({train.setup.model.name}, {train.setup.n_gpus} GPUs, {train.setup.strategy}): "
                  f"others {pct(before)} -> {pct(after)}   moved: {moved or '-'}")


# --- 2. real H200 measurements -------------------------------------------------------------------------
def real_measurements() -> tuple[list[cal.StepMeasurement], cal.GemmMeasurement]:
    acc = _accuracy_module()
    out = []
    for row in acc.device_rows():
        s = resolve(row.job, CATALOG, model=row.model)
        out.append(cal.StepMeasurement(f"{row.label} ({row.source.split(' 2026')[0]})", s,
                                       step_s=s.tokens_per_step / (row.tok_s_gpu * s.n_gpus), peak_gib=row.mem_gib))
    data = json.loads(next((ROOT / "bench" / "data").glob("gpu_ground_truth_h200_*.json")).read_text())
    big = next(g for g in data["gemm"] if g["m"] == g["n"] == g["k"] == 8192)
    return out, cal.GemmMeasurement("ground truth GEMM 8192^3", CATALOG.gpu("h200"), big["tflops"], 8192)


def _ends(e: eff.ArchEfficiency) -> list[tuple[str, eff.ArchEfficiency]]:
    """The point, and the pessimistic end `plan` ranks by when factors are assumed (a range)."""
    b = e.bounds()
    return [("point", e)] + ([("pessimistic end", b[0])] if b else [])


def leave_one_in(ms: list[cal.StepMeasurement], prior: eff.ArchEfficiency, extra: list[cal.Measurement]) -> None:
    fits = [cal.fit([train, *extra], prior=prior) for train in ms]
    for what, before_e in _ends(prior):
        before_all, after_all = [], []
        for k, fit in enumerate(fits):
            rest = [m for i, m in enumerate(ms) if i != k]
            after_e = dict(_ends(fit.efficiency)).get(what, fit.efficiency)
            before_all.append(statistics.mean(step_error(m, before_e) for m in rest))
            after_all.append(statistics.mean(step_error(m, after_e) for m in rest))
        better = sum(a < b for a, b in zip(after_all, before_all, strict=True))
        print(f"    step ({what}): mean |error| on the other {len(ms) - 1} rows, median over the {len(ms)} choices "
              f"{pct(statistics.median(before_all))} -> {pct(statistics.median(after_all))} "
              f"(best {pct(min(after_all))}, worst {pct(max(after_all))}; better for {better} of {len(ms)})")
    mem_b = [statistics.mean(memory_error(m, prior) for i, m in enumerate(ms) if i != k) for k in range(len(ms))]
    mem_a = [statistics.mean(memory_error(m, f.efficiency) for i, m in enumerate(ms) if i != k)
             for k, f in enumerate(fits)]
    print(f"    peak memory: {pct(statistics.median(mem_b))} -> {pct(statistics.median(mem_a))}")


def real() -> None:
    ms, gemm = real_measurements()
    print(f"\n2. Real: {len(ms)} H200 runs (bench/data, 2026-11-29; no GPU here), calibrate on one, predict the rest")
    shipped = eff.arch_efficiency("hopper")
    unknown = replace(eff.ARCH["other"], source="an unmeasured GPU's factors (efficiency.ARCH['other'])")
    for title, prior in (("shipped Hopper factors (already fitted to these files)", shipped),
                         ("an unmeasured GPU's assumed factors and range (ARCH['other'])", unknown)):
        print(f"  from {title}:")
        print("   one run:")
        leave_one_in(ms, prior, [])
        print("   one run + the GEMM figure (as check --deep measures it):")
        leave_one_in(ms, prior, [gemm])

    print("\n  The issue's case: calibrate on one configuration, predict two others (step error):")
    train = next(m for m in ms if "llama-2-7b pure_bf16 mb1 s4096" in m.label)
    others = [next(m for m in ms if "llama-3-8b pure_bf16 mb1 s4096" in m.label),
              next(m for m in ms if "qwen2-1.5b amp mb4 s4096" in m.label)]
    for title, prior in (("shipped", shipped), ("unmeasured-GPU", unknown)):
        fit = cal.fit([train], prior=prior)
        moved = ", ".join(f"{n} {f.value:.3f} ({f.status})" for n, f in fit.factors.items()
                          if f.status != "not informed")
        print(f"    {title} prior; fitted on {train.label}: {moved}")
        after = dict(_ends(fit.efficiency))
        for m in others:
            figures = ", ".join(f"{what} {pct(step_error(m, e))} -> "
                                f"{pct(step_error(m, after.get(what, fit.efficiency)))}" for what, e in _ends(prior))
            print(f"      {m.label}: {figures}")


def main() -> None:
    print(__doc__.split("Usage:")[0].strip().splitlines()[0])
    print()
    synthetic()
    real()
    print(f"\n(mean |predicted/measured - 1| of the step time; fit: plan/calibration.py, prior sd {cal.PRIOR_TAU}, "
          f"{math.fsum(1 for _ in cal.FACTORS):.0f} factors)")


if __name__ == "__main__":
    main()
