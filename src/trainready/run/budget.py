"""Cost so far, projected cost and the budget guard: pure arithmetic on measured times.

Cost is wall time x price per node-hour x nodes, counted from the first launch of the run
(earlier launches' time is carried in `prior_s`): rented nodes bill while they restart too.
The guard stops *before* the budget would be exceeded: when the next step plus a final
synchronous checkpoint (and its upload), with a 10% margin for jitter, would cross it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WARN_AT = (0.5, 0.8)  # fractions of the budget spent that warn once each
MARGIN = 1.10  # on the time still needed, for step-to-step jitter


@dataclass(frozen=True, slots=True)
class CostClock:
    usd_per_hour: float | None  # per node
    nnodes: int
    prior_s: float
    launch_unix: float

    @property
    def usd_per_s(self) -> float | None:
        return None if self.usd_per_hour is None else self.usd_per_hour * self.nnodes / 3600.0

    def billed_s(self, now: float) -> float:
        return self.prior_s + max(0.0, now - self.launch_unix)

    def spent_usd(self, now: float) -> float | None:
        rate = self.usd_per_s
        return None if rate is None else rate * self.billed_s(now)


@dataclass(frozen=True, slots=True)
class BudgetView:
    spent_usd: float | None
    projected_usd: float | None  # spent + remaining steps at the current pace (needs total_steps)
    eta_s: float | None
    stop: bool
    warnings: tuple[str, ...]


@dataclass
class BudgetGuard:
    budget_usd: float | None
    clock: CostClock
    _warned: set[str] = field(default_factory=set)

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
        warnings = []
        for fraction in WARN_AT:
            key = f"spent-{fraction}"
            if spent >= fraction * self.budget_usd and key not in self._warned:
                self._warned.add(key)
                warnings.append(f"spent ${spent:.2f}, {fraction:.0%} of the ${self.budget_usd:.2f} budget")
        if projected is not None and projected > self.budget_usd and "projected" not in self._warned:
            self._warned.add("projected")
            left = self.budget_usd - spent - rate * final_save_s * MARGIN
            affordable = int(max(0.0, left) / (rate * step_s * MARGIN)) if step_s > 0 else 0
            warnings.append(f"projected cost ${projected:.2f} is over the ${self.budget_usd:.2f} budget: "
                            f"the run will stop with a checkpoint after about {affordable} more steps")
        needed = rate * (step_s + final_save_s) * MARGIN
        stop = remaining_steps != 0 and spent + needed > self.budget_usd
        return BudgetView(spent, projected, eta, stop, tuple(warnings))

    def stop_message(self, billed_s: float, step: int) -> str:
        spent = (self.clock.usd_per_s or 0.0) * billed_s
        return (f"budget guard: stopped after step {step} with ${spent:.2f} of the ${self.budget_usd:.2f} budget "
                "spent; another step and the final checkpoint would have exceeded it")
