"""The one list of checks: id -> function(Context) -> Finding. Duplicate ids are an error.

A check may return a list instead: its first finding carries the registered id (the summary), the
others ids of their own (`dcgm.<test>`: one per DCGM test that did not pass)."""

from __future__ import annotations

from collections.abc import Callable

from .context import Context
from .findings import Finding

CheckFn = Callable[[Context], "Finding | list[Finding]"]
CHECKS: dict[str, tuple[str, CheckFn, bool]] = {}  # id -> (area, fn, deep_only)


def check(check_id: str, area: str, deep: bool = False) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if check_id in CHECKS:
            raise ValueError(f"check id {check_id} registered twice")
        CHECKS[check_id] = (area, fn, deep)
        return fn
    return register


def run_checks(ctx: Context, deep: bool) -> list[Finding]:
    from . import checks_accept_deep, checks_deep, checks_gpu, checks_host, checks_node, checks_system  # noqa: F401  (registration)

    findings = []
    for check_id, (area, fn, deep_only) in sorted(CHECKS.items()):
        if deep_only and not deep:
            findings.append(Finding(id=check_id, area=area, status="skip", reason="needs --deep",
                                    advice="run `trainready check --deep` to measure it"))
            continue
        try:
            finding = fn(ctx)
        except Exception as exc:  # a check bug must not hide the other findings
            finding = Finding(id=check_id, area=area, status="skip",
                              reason=f"check could not run: {type(exc).__name__}: {exc}"[:300],
                              advice="please report this with the bundle (trainready check collect --out DIR)")
        findings.extend(finding if isinstance(finding, list) else [finding])
    return findings
