"""Cost so far, projected cost and the budget guard: pure arithmetic on measured times.

Cost is wall time x price per node-hour x nodes, counted from the moment the launcher process
started (start-up is billed too) and across launches (earlier launches' time is carried in
`prior_s`): rented nodes bill while they start, restart and shut down. The guard stops
*before* the budget would be exceeded: when the next step, a final synchronous checkpoint (and
its upload) and the exit (workers and launcher shutting down), with a 10% margin for jitter,
would cross it. Before the workers' first step the launcher itself watches the clock (there
is nothing to save yet): see launcher.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WARN_AT = (0.5, 0.8)  # fractions of the budget spent that warn once each, in this order
MARGIN = 1.10  # on the time still needed, for step-to-step jitter
EXIT_S_DEFAULT = 10.0  # stop record -> launcher end, until a launch of this run has measured it
EXIT_JITTER = 1.5  # on the slowest shutdown measured: seen to vary by 30% between launches on a busy machine
KILL_S = 2.0  # the launcher ending workers that have nothing to save: kill, their watchdog, run.json


def usd_per_second(usd_per_hour: float | None, nnodes: int) -> float | None:
    """What the job costs per second of wall time: the price per node-hour x nodes (None: no price). The one
    billing formula: the budget guard, the launcher's announcements, preflight, the summary and goodput use it."""
    return None if usd_per_hour is None else usd_per_hour * nnodes / 3600.0


@dataclass(frozen=True, slots=True)
class CostClock:
    usd_per_hour: float | None  # per node
    nnodes: int
    prior_s: float
    launch_unix: float

    @property
    def usd_per_s(self) -> float | None:
        return usd_per_second(self.usd_per_hour, self.nnodes)

    def billed_s(self, now: float) -> float:
        return self.prior_s + max(0.0, now - self.launch_unix)

    def spent_usd(self, now: float) -> float | None:
        rate = self.usd_per_s
        return None if rate is None else rate * self.billed_s(now)


@dataclass
class SpendWarnings:
    """The 50% and 80% warnings: each once, in order, when the spend crosses it. Thresholds
    already behind at the start (earlier launches spent them) are not announced as crossings."""

    budget_usd: float
    already_usd: float = 0.0
    _done: set[float] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._done = {f for f in WARN_AT if self.already_usd >= f * self.budget_usd}

    def crossed(self, spent_usd: float) -> list[str]:
        out = []
        for fraction in WARN_AT:
            if fraction not in self._done and spent_usd >= fraction * self.budget_usd:
                self._done.add(fraction)
                out.append(f"spent ${spent_usd:.2f}, {fraction:.0%} of the ${self.budget_usd:.2f} budget")
        return out


@dataclass(frozen=True, slots=True)
class BudgetView:
    spent_usd: float | None
    projected_usd: float | None  # spent + remaining steps at the current pace (needs total_steps)
    eta_s: float | None
    stop: bool
    warnings: tuple[str, ...]


@dataclass
class BudgetGuard:
    """`warn_spent`: emit the 50%/80% warnings here (a process on its own); under `trainready run`
    the launcher does, on its own clock, so they come when crossed and not at the next step."""

    budget_usd: float | None
    clock: CostClock
    exit_s: float = EXIT_S_DEFAULT
    warn_spent: bool = True
    _projected_warned: bool = False
    _spend: SpendWarnings | None = None

    def __post_init__(self) -> None:
        if self.budget_usd is not None and self.warn_spent:
            rate = self.clock.usd_per_s or 0.0
            self._spend = SpendWarnings(self.budget_usd, rate * self.clock.prior_s)

    def reserve_s(self, step_s: float, final_save_s: float) -> float:
        """Wall time the run still needs to take one more step and then stop cleanly."""
        return (step_s + final_save_s + self.exit_s) * MARGIN

    def assess(self, billed_s: float, step_s: float, final_save_s: float, remaining_steps: int | None,
               peek: bool = False) -> BudgetView:
        """`billed_s`: seconds billed so far (rank 0's clock, the same on every rank); `step_s`: wall
        time per step lately; `final_save_s`: a synchronous save plus upload. `peek`: no warnings."""
        rate = self.clock.usd_per_s
        spent = None if rate is None else rate * billed_s
        eta = remaining_steps * step_s if remaining_steps is not None else None
        projected = spent + rate * eta if (rate is not None and eta is not None) else None
        if self.budget_usd is None or rate is None or peek:
            return BudgetView(spent, projected, eta, False, ())
        warnings = self._spend.crossed(spent) if self._spend is not None else []
        if projected is not None and projected > self.budget_usd and not self._projected_warned:
            self._projected_warned = True
            left = self.budget_usd - spent - rate * (final_save_s + self.exit_s) * MARGIN
            affordable = int(max(0.0, left) / (rate * step_s * MARGIN)) if step_s > 0 else 0
            warnings.append(f"projected cost ${projected:.2f} is over the ${self.budget_usd:.2f} budget: "
                            f"the run will stop with a checkpoint after about {affordable} more steps")
        stop = remaining_steps != 0 and spent + rate * self.reserve_s(step_s, final_save_s) > self.budget_usd
        return BudgetView(spent, projected, eta, stop, tuple(warnings))

    def stop_message(self, billed_s: float, step: int) -> str:
        spent = (self.clock.usd_per_s or 0.0) * billed_s
        return (f"budget guard: stopped after step {step} with ${spent:.2f} of the ${self.budget_usd:.2f} budget "
                "spent before shutdown; another step, the final checkpoint and the shutdown would have exceeded it")
