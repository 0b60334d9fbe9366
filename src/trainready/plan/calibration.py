"""Fit the planner's efficiency factors to what the user's own runs and `check --deep` measured.

The factors are those `estimate_step` and `estimate_memory` already use (efficiency.py): GEMM and
attention fractions of the peak, HBM fractions of fused and eager elementwise kernels, collective
bandwidth inside a node and over the network, the cost of overlapped communication, and the
allocator's fragmentation. Measurements are compared with the planner's prediction in log space:

* a run's step: per component where it was measured -- compute (forward, backward, recompute),
  exposed communication, optimizer -- and the whole step (tokens/s when no step time is known);
  a component that was not measured is skipped, never taken as zero; peak memory (reserved);
* `check --deep`: GEMM TFLOP/s at size^3 (the GEMM factor directly), a device-to-device copy's
  GB/s (the fused memory factor directly) and all-reduce bus bandwidth (intra- or inter-node
  collective efficiency, as nccl-tests defines busbw).

The fit is a maximum a-posteriori estimate: residuals log(predicted/measured)/sigma (sigma: how
noisy each kind of measurement is) plus a weak prior log(factor/prior)/tau pulling every factor
towards efficiency.py's value, minimized by a bounded Levenberg-Marquardt in log space. A factor
is *informed* when the data cut its prior uncertainty at least in half (linearized posterior:
(J^T J + I/tau^2)^-1), *partly informed* when they cut it a little (it moves together with factors
the data cannot tell apart, along the direction they do determine), and one the data leave alone
stays exactly at its prior and is reported "not informed".

scipy.optimize.least_squares would do the minimization, but scipy (+numpy, ~100 MB installed) is
not a dependency of the CLI and this problem has at most 9 parameters: the solver below is 60
lines of pure Python (finite-difference Jacobian, normal equations, projection onto the bounds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from trainready.catalog import Gpu

from . import efficiency as eff
from .memory import GiB, estimate_memory
from .performance import StepResult, collective_s, estimate_step, links
from .setup import Setup


@dataclass(frozen=True)
class FactorSpec:
    lower: float
    upper: float
    what: str


# Bounds: fractions of a datasheet peak are below 1; the lower ends lie well below any figure
# published for a working system (efficiency.py's sources), so a bound is only hit by a broken
# measurement, and the fit says so (at_bound).
FACTORS: dict[str, FactorSpec] = {
    "gemm": FactorSpec(0.2, 0.98, "GEMM fraction of the dense peak (large K)"),
    "attention": FactorSpec(0.05, 0.95, "attention (SDPA/FlashAttention) fraction of the dense peak, long sequences"),
    "memory": FactorSpec(0.1, 0.98, "HBM fraction of fused elementwise kernels and the optimizer"),
    "eager_memory": FactorSpec(0.05, 0.95, "HBM fraction of eager (unfused) elementwise kernels"),
    "intra_node": FactorSpec(0.1, 0.98, "collective bandwidth fraction of the GPUs' links in a node"),
    "inter_node": FactorSpec(0.1, 1.0, "collective bandwidth fraction of the node's network"),
    "overlap": FactorSpec(0.02, 1.0, "share of overlapped communication that still slows compute"),
    "fragmentation": FactorSpec(0.005, 0.6, "allocator reserve over allocated memory (DDP, ZeRO-1/2)"),
    "fragmentation_zero3": FactorSpec(0.005, 0.8, "allocator reserve over allocated memory (ZeRO-3/FSDP)"),
}
# How far off the shipped factors may be (log-space sd of the prior): ~30%, the spread between
# efficiency.py's assumed ranges and what was measured where we could measure.
PRIOR_TAU = 0.3
# Noise of each kind of measurement (sd of log(measured) for whole figures; for a component of the
# step, sd of (predicted - measured) / step): whole steps repeat within ~2-3% between runs; a
# per-component split is rougher (attribution of overlapped work, host vs CUDA-event timing), and a
# component is compared as a share of the step, so one that is 1% of it (exposed comm on one node)
# cannot swing the fit; check --deep's GEMM and all-reduce figures vary a few percent between calls;
# the allocator's peak is deterministic for a fixed program to ~1-2%.
SIGMA = {"step": 0.03, "tokens_per_s": 0.03, "compute": 0.04, "communication": 0.04, "optimizer": 0.04,
         "peak_memory": 0.03, "gemm_tflops": 0.03, "busbw": 0.05, "hbm_copy": 0.03}
COMPONENTS = ("compute", "communication", "optimizer")
INVERTED = ("tokens_per_s", "gemm_tflops", "busbw", "hbm_copy")  # kept as 1/x in a Residual (Residual.natural)
# A factor is informed when the data cut its prior sd at least in half (its own value is known);
# partly informed when they cut it by 5% or more (it moves with others the data cannot tell apart,
# e.g. GEMM and elementwise kernels from step times alone); otherwise it stays at its prior.
INFORMED = 0.5
UNINFORMED = 0.95


# --- measurements ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepMeasurement:
    """What one run measured per GPU step (seconds; None: not measured, skipped in the fit)."""

    label: str
    setup: Setup  # the configuration that ran
    step_s: float | None = None  # step minus data wait and what lies outside the step (checkpoint saves)
    compute_s: float | None = None  # forward + backward (+ recompute): the step less comm and optimizer
    comm_s: float | None = None  # exposed communication
    optimizer_s: float | None = None
    tokens_per_s: float | None = None  # all GPUs; used when step_s is unknown
    peak_gib: float | None = None  # torch.cuda.max_memory_reserved per GPU, GiB


@dataclass(frozen=True)
class GemmMeasurement:
    """check --deep: a bf16 GEMM of size^3."""

    label: str
    gpu: Gpu
    tflops: float
    size: int


@dataclass(frozen=True)
class BusbwMeasurement:
    """check --deep: all-reduce bus bandwidth (nccl-tests' busbw) over `setup`'s GPUs."""

    label: str
    setup: Setup  # its gpu, instance, nodes and inter-node bandwidth: the links the collective ran over
    busbw_gbps: float
    size_bytes: float


@dataclass(frozen=True)
class HbmCopyMeasurement:
    """check --deep: a device-to-device copy, (read + write) bytes / time: large contiguous elementwise
    traffic, what efficiency.py's fused `memory` fraction was set from (H200: 4.3 of 4.8 TB/s)."""

    label: str
    gpu: Gpu
    gbps: float


Measurement = StepMeasurement | GemmMeasurement | BusbwMeasurement | HbmCopyMeasurement


@dataclass(frozen=True)
class Residual:
    label: str  # "llama-3-8b ...: compute"
    kind: str  # a SIGMA key
    predicted: float
    measured: float
    scale: float | None = None  # components: the measured step they are a part of

    @property
    def ratio(self) -> float | None:
        """predicted / measured (None: nothing measured)."""
        return self.predicted / self.measured if self.measured > 0 else None

    def natural(self) -> tuple[float, float]:
        """(predicted, measured) in the figure's own unit: tokens/s, TFLOP/s and GB/s are compared as
        their inverse (time per unit of work, so that a higher ratio is slower everywhere)."""
        if self.kind in INVERTED:
            return 1 / self.predicted, 1 / self.measured
        return self.predicted, self.measured

    @property
    def error(self) -> float:
        """What the fit minimizes (over SIGMA): log(predicted/measured); a component's (predicted -
        measured) / step, so a part near zero on either side stays finite."""
        if self.scale is not None:
            return (self.predicted - self.measured) / self.scale
        return math.log(max(self.predicted, 1e-30) / self.measured)


# --- factors <-> ArchEfficiency ----------------------------------------------------------------
def _nvlink(gpu: Gpu, instance) -> bool:
    topo = instance.topology if instance else ("nvswitch" if gpu.has_nvlink else "pcie")
    return topo in ("nvswitch", "nvlink-mesh") and bool(gpu.nvlink_links and gpu.nvlink_link_gbps)


def prior_factors(e: eff.ArchEfficiency, nvlink: bool = True) -> dict[str, float]:
    """The factors as `e` (and efficiency.py's module figures) have them."""
    return {"gemm": e.gemm, "attention": e.attention, "memory": e.memory,
            "eager_memory": e.eager_memory_efficiency(),
            "intra_node": e.intra_node or (eff.NVLINK_EFFICIENCY if nvlink else eff.PCIE_P2P_EFFICIENCY),
            "inter_node": e.inter_node or eff.NETWORK_EFFICIENCY, "overlap": e.overlap_contention(),
            "fragmentation": e.fragmentation_of("ddp"), "fragmentation_zero3": e.fragmentation_of("zero3")}


def with_factors(e: eff.ArchEfficiency, values: dict[str, float]) -> eff.ArchEfficiency:
    """`e` with the factors in `values` replaced (others kept)."""
    return replace(e, **values)


# --- predictions -------------------------------------------------------------------------------
def step_residuals(m: StepMeasurement, e: eff.ArchEfficiency) -> list[Residual]:
    s = m.setup.with_(efficiency=e)
    r: StepResult = estimate_step(s)
    out = []
    compute = r.step_s - r.exposed_comm_s - r.optimizer_s  # what a run's split calls compute (+ stalls, bubble)
    parts = (("compute", compute, m.compute_s), ("communication", r.exposed_comm_s, m.comm_s),
             ("optimizer", r.optimizer_s, m.optimizer_s))
    scale = m.step_s or sum(meas for _, _, meas in parts if meas is not None)
    for kind, pred, meas in parts:
        if meas is not None and meas >= 0 and scale > 0:
            out.append(Residual(f"{m.label}: {kind}", kind, pred, meas, scale))
    if m.step_s is not None and m.step_s > 0:
        out.append(Residual(f"{m.label}: step", "step", r.step_s, m.step_s))
    elif m.tokens_per_s is not None and m.tokens_per_s > 0:  # time per token, so a higher ratio = slower, as above
        out.append(Residual(f"{m.label}: tokens/s", "tokens_per_s", 1 / r.tokens_per_s, 1 / m.tokens_per_s))
    if m.peak_gib is not None and m.peak_gib > 0:
        out.append(Residual(f"{m.label}: peak memory", "peak_memory", estimate_memory(s).reserved_peak / GiB,
                            m.peak_gib))
    return out


def predicted_gemm_tflops(gpu: Gpu, size: int, e: eff.ArchEfficiency) -> float:
    """bf16 size^3 at the GEMM factor and its K ramp (performance._gemm_time)."""
    peak = gpu.peak_tflops("bf16") or gpu.peak_tflops("fp16") or 0.0
    return peak * e.gemm * size / (size + e.gemm_k0)


def predicted_busbw_gbps(s: Setup, size_bytes: float, e: eff.ArchEfficiency) -> float:
    """nccl-tests busbw of one all-reduce of `size_bytes` over s's GPUs, as the planner times it."""
    n = s.n_gpus
    t = collective_s("allreduce", size_bytes, n, s.gpus_per_node, links(s, e))
    return size_bytes / t / 1e9 * 2 * (n - 1) / n if t > 0 else 0.0


def residuals(measurements: Sequence[Measurement], e: eff.ArchEfficiency) -> list[Residual]:
    out: list[Residual] = []
    for m in measurements:
        if isinstance(m, StepMeasurement):
            out += step_residuals(m, e)
        elif isinstance(m, GemmMeasurement):
            pred = predicted_gemm_tflops(m.gpu, m.size, e)
            out.append(Residual(f"{m.label}: GEMM {m.size}^3", "gemm_tflops", 1 / pred, 1 / m.tflops))
        elif isinstance(m, HbmCopyMeasurement):
            out.append(Residual(f"{m.label}: HBM copy", "hbm_copy", 1 / (m.gpu.hbm_gbps * e.memory), 1 / m.gbps))
        elif isinstance(m, BusbwMeasurement) and m.setup.n_gpus > 1:
            pred = predicted_busbw_gbps(m.setup, m.size_bytes, e)
            out.append(Residual(f"{m.label}: all-reduce busbw", "busbw", 1 / pred, 1 / m.busbw_gbps))
    return out


# --- the fit -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FittedFactor:
    name: str
    value: float
    prior: float
    status: Literal["informed", "partly informed", "not informed"]
    sd: float  # posterior sd in log space (~ relative uncertainty); PRIOR_TAU when not informed
    informed_by: tuple[str, ...] = ()  # the measurements that move it most
    at_bound: bool = False


@dataclass(frozen=True)
class Fit:
    factors: dict[str, FittedFactor]
    before: list[Residual]
    after: list[Residual]
    efficiency: eff.ArchEfficiency  # the prior with the informed factors replaced
    iterations: int
    notes: list[str] = field(default_factory=list)

    @property
    def calibrated(self) -> list[str]:
        """The factors the data moved (informed or partly informed)."""
        return [n for n, f in self.factors.items() if f.status != "not informed"]


def mean_abs_error(rs: Sequence[Residual], kinds: Sequence[str] | None = ("step", "tokens_per_s")) -> float | None:
    """Mean |predicted/measured - 1| over the residuals of `kinds` (whole steps by default; None: all)."""
    errs = [abs(r.ratio - 1) for r in rs if (kinds is None or r.kind in kinds) and r.ratio is not None]
    return sum(errs) / len(errs) if errs else None


def _vector(measurements, base: eff.ArchEfficiency, names: list[str], x: list[float]) -> list[float]:
    e = with_factors(base, {n: math.exp(v) for n, v in zip(names, x, strict=True)})
    return [r.error / SIGMA[r.kind] for r in residuals(measurements, e)]


def _jacobian(f: Callable[[list[float]], list[float]], x: list[float], lo: list[float], hi: list[float],
              f0: list[float], h: float = 1e-3) -> list[list[float]]:
    """d f / d x by central differences (one-sided at a bound); rows = residuals, columns = x."""
    cols = []
    for i in range(len(x)):
        a, b = max(lo[i], x[i] - h), min(hi[i], x[i] + h)
        xa, xb = list(x), list(x)
        xa[i], xb[i] = a, b
        fa = f0 if a == x[i] else f(xa)
        fb = f0 if b == x[i] else f(xb)
        cols.append([(vb - va) / (b - a) for va, vb in zip(fa, fb, strict=True)])
    return [list(row) for row in zip(*cols, strict=True)] if cols else [[] for _ in f0]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting (a is small, symmetric positive definite)."""
    n = len(b)
    m = [list(row) + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        piv = m[c][c] or 1e-300
        for r in range(c + 1, n):
            k = m[r][c] / piv
            if k:
                for j in range(c, n + 1):
                    m[r][j] -= k * m[c][j]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][j] * x[j] for j in range(r + 1, n))) / (m[r][r] or 1e-300)
    return x


def _normal(jac: list[list[float]], n: int) -> list[list[float]]:
    return [[sum(row[i] * row[j] for row in jac) + (1 / PRIOR_TAU ** 2 if i == j else 0.0) for j in range(n)]
            for i in range(n)]


def _posterior_sd(jac: list[list[float]], n: int) -> list[float]:
    a = _normal(jac, n)
    return [math.sqrt(max(0.0, _solve(a, [1.0 if j == i else 0.0 for j in range(n)])[i])) for i in range(n)]


def _lm(f, x0: list[float], prior: list[float], lo: list[float], hi: list[float],
        max_iter: int = 60) -> tuple[list[float], int]:
    """Bounded Levenberg-Marquardt on |f(x)|^2 + |(x - prior)/tau|^2, steps projected onto [lo, hi]."""
    def cost(x, fx):
        return sum(v * v for v in fx) + sum(((a - p) / PRIOR_TAU) ** 2 for a, p in zip(x, prior, strict=True))

    x, fx = list(x0), f(x0)
    c, lam, n = cost(x, fx), 1e-3, len(x0)
    it = done = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        jac = _jacobian(f, x, lo, hi, fx)
        a = _normal(jac, n)
        g = [sum(row[i] * v for row, v in zip(jac, fx, strict=True)) + (x[i] - prior[i]) / PRIOR_TAU ** 2
             for i in range(n)]
        improved = False
        while lam < 1e10:
            damped = [[a[i][j] + (lam * a[i][i] if i == j else 0.0) for j in range(n)] for i in range(n)]
            step = _solve(damped, [-v for v in g])
            xn = [min(hi[i], max(lo[i], x[i] + step[i])) for i in range(n)]
            fn = f(xn)
            cn = cost(xn, fn)
            if cn < c:
                moved = max(abs(p - q) for p, q in zip(xn, x, strict=True))
                x, fx, lam, improved = xn, fn, max(lam / 3, 1e-9), True
                done = c - cn < 1e-12 * max(1.0, c) or moved < 1e-7
                c = cn
                break
            lam *= 4
        if not improved or done:
            break
    return x, it


def gpu_of(m: Measurement) -> Gpu:
    return m.gpu if isinstance(m, (GemmMeasurement, HbmCopyMeasurement)) else m.setup.gpu


def _arch_prior(measurements: Sequence[Measurement]) -> tuple[eff.ArchEfficiency, bool]:
    gpus = {gpu_of(m).name for m in measurements}
    if len(gpus) != 1:
        raise ValueError(f"one calibration is for one GPU; these measurements ran on {', '.join(sorted(gpus))}")
    gpu = gpu_of(measurements[0])
    setups = [m.setup for m in measurements if isinstance(m, (StepMeasurement, BusbwMeasurement))]
    inst = setups[0].instance if setups else None
    e = next((s.efficiency for s in setups if s.efficiency), None)
    return e or eff.arch_efficiency(gpu.arch), _nvlink(gpu, inst)


def fit(measurements: Sequence[Measurement], prior: eff.ArchEfficiency | None = None) -> Fit:
    """Fit the factors the measurements inform; the rest stay at `prior` (default: the GPU's factors)."""
    if not measurements:
        raise ValueError("nothing to calibrate from: no measurements")
    base, nvlink = _arch_prior(measurements)
    base = prior or base
    priors = prior_factors(base, nvlink)
    names = list(FACTORS)
    before = residuals(measurements, base)
    if not before:
        raise ValueError("the measurements hold nothing the planner predicts (no step time, component, "
                         "peak memory, GEMM or all-reduce figure)")
    lo_all = [math.log(FACTORS[n].lower) for n in names]
    hi_all = [math.log(FACTORS[n].upper) for n in names]
    x_prior = [min(h, max(lo, math.log(priors[n]))) for n, lo, h in zip(names, lo_all, hi_all, strict=True)]
    f_all = lambda x: _vector(measurements, base, names, x)  # noqa: E731

    def posterior(x_full: list[float]) -> tuple[list[float], list[list[float]]]:
        jac = _jacobian(f_all, x_full, lo_all, hi_all, f_all(x_full))
        return _posterior_sd(jac, len(names)), jac

    x_full, iterations, free = list(x_prior), 0, None
    sd, jac = posterior(x_full)  # at the end of each pass too: the next pass starts from it
    for _ in range(3):  # nonlinear: a factor can matter once others moved (exposed comm as compute speeds up)
        now = [v < UNINFORMED * PRIOR_TAU for v in sd]
        if now == free:
            break
        free = now
        idx = [i for i, v in enumerate(free) if v]
        fixed = with_factors(base, {names[i]: math.exp(x_prior[i]) for i in range(len(names)) if not free[i]})
        f_sub = lambda x, sub=[names[i] for i in idx], b=fixed: _vector(measurements, b, sub, x)  # noqa: E731
        x_sub, it = _lm(f_sub, [x_prior[i] for i in idx], [x_prior[i] for i in idx],
                        [lo_all[i] for i in idx], [hi_all[i] for i in idx])
        iterations += it
        x_full = list(x_prior)
        for i, v in zip(idx, x_sub, strict=True):
            x_full[i] = v
        sd, jac = posterior(x_full)
    labels = [r.label for r in before]  # which residuals there are depends on the measurements, not the factors
    factors = {}
    for i, n in enumerate(names):
        status = ("not informed" if not free[i] else "informed" if sd[i] < INFORMED * PRIOR_TAU else "partly informed")
        top = sorted(((abs(row[i]), lab) for row, lab in zip(jac, labels, strict=True) if abs(row[i]) > 1e-9),
                     reverse=True)[:3]
        at_bound = free[i] and min(abs(x_full[i] - lo_all[i]), abs(x_full[i] - hi_all[i])) < 1e-6
        factors[n] = FittedFactor(n, math.exp(x_full[i]) if free[i] else priors[n], priors[n], status,
                                  sd[i] if free[i] else PRIOR_TAU, tuple(lab for _, lab in top) if free[i] else (),
                                  at_bound)
    fitted = calibrated_efficiency(base, {n: f.value for n, f in factors.items() if f.status != "not informed"},
                                   "fitted")
    notes = [f"{n} reached its bound ({FACTORS[n].lower:g}..{FACTORS[n].upper:g}): a measurement may be broken"
             for n, f in factors.items() if f.at_bound]
    return Fit(factors=factors, before=before, after=residuals(measurements, fitted), efficiency=fitted,
               iterations=iterations, notes=notes)


def calibrated_efficiency(base: eff.ArchEfficiency, values: dict[str, float], source: str) -> eff.ArchEfficiency:
    """`base` with the calibrated factors in `values`: a factor fitted from measurements drops its
    assumed range (the confidence range keeps the ranges of factors still assumed)."""
    unknown = set(values) - set(FACTORS)
    if unknown:
        raise ValueError(f"unknown factors: {', '.join(sorted(unknown))}")
    gemm_range = None if "gemm" in values else base.gemm_range
    attention_range = None if "attention" in values else base.attention_range
    compute_fitted = "gemm" in values or "attention" in values
    confidence = "measured" if compute_fitted and not (gemm_range or attention_range) else base.confidence
    return replace(with_factors(base, values), source=source, gemm_range=gemm_range,
                   attention_range=attention_range, confidence=confidence)
