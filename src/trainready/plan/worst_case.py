"""The 90th percentile of a run's length under the failure model of reliability.py: a user budgets
for the bad run, not only the average one.

Interruptions arrive as a Poisson process at the job's MTBF (reliability.job_mtbf_h). Each costs a
restart (reliability.RESTART_S) and the work since the last checkpoint, uniform between 0 and the
checkpoint interval (the expected model counts half an interval: Young/Daly). With N interruptions
the lost time is N x restart + interval x (U_1 + ... + U_N), the U uniform on [0, 1]: a Poisson
mixture of Irwin-Hall distributions, whose quantile is found by bisection on its exact CDF (a
normal approximation from N > IRWIN_HALL_EXACT_MAX, where the exact sum loses precision).
"""

from __future__ import annotations

import math

IRWIN_HALL_EXACT_MAX = 12
TAIL = 1e-12  # Poisson terms beyond this probability are left out


def _irwin_hall_cdf(x: float, n: int) -> float:
    """P(U_1 + ... + U_n <= x), U uniform on [0, 1]."""
    if n == 0:
        return 1.0 if x >= 0 else 0.0
    if x <= 0:
        return 0.0
    if x >= n:
        return 1.0
    if n > IRWIN_HALL_EXACT_MAX:
        z = (x - n / 2) / math.sqrt(n / 12)
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))
    total = sum((-1) ** k * math.comb(n, k) * (x - k) ** n for k in range(int(math.floor(x)) + 1))
    return min(1.0, max(0.0, total / math.factorial(n)))


def _poisson(lam: float) -> list[tuple[int, float]]:
    """(n, P(N = n)) for the terms that matter."""
    if lam <= 0:
        return [(0, 1.0)]
    terms, n = [], 0
    log_p = -lam
    top = lam + 12 * math.sqrt(lam) + 12
    while n <= top:
        p = math.exp(log_p)
        if p > TAIL or n <= lam:
            terms.append((n, p))
        n += 1
        log_p += math.log(lam) - math.log(n)
    return terms


def lost_hours_quantile(run_h: float, mtbf_h: float, interval_s: float, restart_s: float, q: float = 0.9) -> float:
    """Hours lost to interruptions (restarts and rework) that a run of `run_h` hours stays within with
    probability `q`."""
    if not 0 < q < 1:
        raise ValueError("q must be between 0 and 1")
    lam = run_h / mtbf_h if mtbf_h > 0 else 0.0
    terms = _poisson(lam)
    tau, r = interval_s / 3600, restart_s / 3600

    def cdf(t: float) -> float:
        return sum(p * _irwin_hall_cdf((t - n * r) / tau if tau > 0 else (math.inf if t >= n * r else -1.0), n)
                   for n, p in terms)

    if cdf(0.0) >= q:
        return 0.0
    lo, hi = 0.0, max(n for n, _ in terms) * (r + tau) + tau
    for _ in range(80):
        mid = (lo + hi) / 2
        if cdf(mid) >= q:
            hi = mid
        else:
            lo = mid
    return hi


def worst_case_hours(compute_h: float, stall_s: float, interval_s: float, mtbf_h: float, restart_s: float,
                     q: float = 0.9) -> float:
    """Wall-clock hours at the `q` quantile: compute, the checkpoint stalls (every interval), and the
    quantile of the time lost to interruptions over that run."""
    base = compute_h * (1 + stall_s / interval_s) if interval_s > 0 else compute_h
    return base + lost_hours_quantile(base, mtbf_h, interval_s, restart_s, q)
