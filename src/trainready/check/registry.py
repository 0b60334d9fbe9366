"""One shape for every check, and the one list of them.

A check declares, once: its id and area, the facts (or files) it needs, the instances it applies to,
whether it is part of the readiness decision, and whether it needs a GPU. It returns a `Verdict`
(status, observed, expected, reason, advice) and never names itself: the registry stamps the id and
area, answers for it when it does not apply, when no file shows what it needs, or when there is no
GPU, and folds findings that only restate one root cause (a lost GPU) into that root's finding.

This module imports no check: `checks/__init__.py` imports the check modules, which register here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from trainready.errors import printable

from .facts import FACT_SOURCES, Facts, source_name
from .facts.presence import no_gpu_reason
from .findings import Finding, Status


@dataclass
class Verdict:
    """What a check concludes; the registry turns it into a Finding."""

    status: Status
    observed: str = ""
    expected: str = ""
    reason: str = ""
    advice: str = ""
    lost: Literal["only", "also"] | None = None
    """A lost GPU explains this verdict's failure wholly ("only") or in part ("also"): see fold_lost."""
    partial: bool = False
    """The evidence was incomplete (an elided paste, a truncated report): the decision is partly verified."""
    unverified: bool = False
    """A warning about evidence that could not be read: the decision had none (a skip has none either)."""
    extra: list[Finding] = field(default_factory=list)
    """Findings with ids of their own (dcgm.<test>), listed after this one."""

    @classmethod
    def skip(cls, reason: str, advice: str = "", observed: str = "", expected: str = "") -> Verdict:
        return cls("skip", observed=observed, expected=expected, reason=reason, advice=advice)


CheckFn = Callable[["Facts"], "Verdict | None"]
Applies = Callable[["Facts"], "str | None"]
"""Returns why the check does not apply to this node (e.g. "g5.48xlarge has no NVSwitch"), or None."""


@dataclass(frozen=True)
class CheckSpec:
    id: str
    area: str
    fn: CheckFn
    needs: tuple[str, ...] = ()
    """Fact names (facts.FACT_SOURCES) or bundle file names; when no file of any of them is in the
    bundle, the check is `skip` with what would have shown it, without being called."""
    applies: Applies | None = None
    deep: bool = False
    """Measured only with --deep, unless a file it needs (an nccl-tests output) is in the bundle anyway."""
    decisive: bool = False
    """Part of the readiness decision: without evidence, the node is not verified (docs/check.md)."""
    gpu: bool = False
    """Judges GPUs: `skip` (see gpu.count) when the bundle shows there is none."""


CHECKS: dict[str, CheckSpec] = {}


def check(check_id: str, area: str, *, needs: tuple[str, ...] = (), applies: Applies | None = None, deep: bool = False,
          decisive: bool = False, gpu: bool = False) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if check_id in CHECKS:
            raise ValueError(f"check id {check_id} registered twice")
        CHECKS[check_id] = CheckSpec(check_id, area, fn, needs, applies, deep, decisive, gpu)
        return fn
    return register


@dataclass(frozen=True)
class Outcome:
    """A check's finding with what the summary needs: whether it decides readiness and had evidence."""

    finding: Finding
    spec: CheckSpec
    applicable: bool
    evidence: Literal["full", "partial", "none"]
    lost: Literal["only", "also"] | None = None
    extra: tuple[Finding, ...] = ()


def needed_files(needs: tuple[str, ...]) -> list[str]:
    files: list[str] = []
    for need in needs:
        for name in FACT_SOURCES.get(need, (need,)):
            if name not in files:
                files.append(name)
    return files


def _has_any(facts: Facts, files: list[str]) -> bool:
    return any(facts.present(name) for name in files)


def run_one(spec: CheckSpec, facts: Facts, deep: bool) -> Outcome:
    files = needed_files(spec.needs)
    if spec.applies is not None:
        why_not = spec.applies(facts)
        if why_not:
            return Outcome(_finding(spec, Verdict.skip(f"not applicable: {why_not}")), spec, False, "none")
    refused = [n for n in files if n in facts.bundle.refused]
    if refused and not _has_any(facts, files):  # a file of its own is there but was not read: say why
        return Outcome(_finding(spec, Verdict.skip(facts.bundle.why_missing(refused[0]))), spec, True, "none")
    if spec.deep and not deep and not (files and _has_any(facts, [f for f in files if f != "deep.json"])):
        return Outcome(_finding(spec, Verdict.skip("needs --deep", "run `trainready check --deep` to measure it")),
                       spec, True, "none")
    if spec.gpu and (no_gpu := no_gpu_reason(facts)):
        return Outcome(_finding(spec, Verdict.skip(no_gpu)), spec, True, "none")
    if files and not _has_any(facts, files):
        return Outcome(_finding(spec, _no_evidence(facts, files)), spec, True, "none")
    try:
        verdict = spec.fn(facts)
    except Exception as exc:  # a check bug must not hide the other findings
        verdict = Verdict.skip(f"check could not run: {type(exc).__name__}: {exc}"[:300],
                               "please report this with the bundle (trainready check collect --out DIR)")
    if verdict is None:
        verdict = _no_evidence(facts, files)
    if verdict.status != "skip" and any((p := facts.paste(n)) is not None and p.elided for n in files):
        verdict.partial = True  # an author cut the output: what the cut stood for is unknown
    evidence = "none" if verdict.status == "skip" or verdict.unverified else "partial" if verdict.partial else "full"
    extra = tuple(f.model_copy(update={k: printable(getattr(f, k)) for k in ("observed", "expected", "reason", "advice")})
                  for f in verdict.extra)
    return Outcome(_finding(spec, verdict), spec, True, evidence, verdict.lost, extra)


def _no_evidence(facts: Facts, files: list[str]) -> Verdict:
    shown_by = ", ".join(dict.fromkeys(source_name(f) for f in files))
    present = [f for f in files if facts.present(f)]
    unreadable = [(f, why) for f in present if (why := facts.unreadable(f))]
    if unreadable:
        name, why = unreadable[0]
        return Verdict("warn", reason=f"unreadable: {name}: {why}", unverified=True,
                       advice="collect the output again (trainready check collect --out DIR), whole")
    if present:
        absent = [f for f in files if f not in present]
        return Verdict.skip(f"no evidence: {', '.join(dict.fromkeys(source_name(f) for f in present))} "
                            f"{'is' if len(present) == 1 else 'are'} in the bundle but show{'s' if len(present) == 1 else ''} "
                            f"nothing about it (it is shown by {shown_by}" +
                            (f"; {facts.why_missing(absent)})" if absent else ")"),
                            "collect the bundle on the node: trainready check collect --out DIR")
    return Verdict.skip(f"no evidence: shown by {shown_by}; none is in the bundle ({facts.why_missing(files)})",
                        "collect the bundle on the node: trainready check collect --out DIR")


def _finding(spec: CheckSpec, v: Verdict) -> Finding:
    """Stamped with the check's id; what a file said (names, messages) shown as text, never as a terminal
    escape or a bidi override."""
    return Finding(id=spec.id, area=spec.area, status=v.status, observed=printable(v.observed),
                   expected=printable(v.expected), reason=printable(v.reason), advice=printable(v.advice))


def run_checks(facts: Facts, deep: bool) -> list[Outcome]:
    """Every registered check, in id order (checks/__init__.py must have been imported)."""
    return fold_lost([run_one(spec, facts, deep) for _, spec in sorted(CHECKS.items())])


# The finding that names a lost GPU's cause, in this order: the kernel's words (fallen off the bus),
# else the inventory that misses it.
ROOT_ORDER = ("gpu.xid", "gpu.count")


def fold_lost(outcomes: list[Outcome]) -> list[Outcome]:
    """One root cause, one finding: when a GPU is lost, the first failing finding of ROOT_ORDER that
    names it stays a failure and lists the others; findings that fail only because of it become
    `skip` ("consequence of ...") with their own observation kept."""
    failing = [o for o in outcomes if o.finding.status == "fail" and o.lost]
    root = next((o for rid in ROOT_ORDER for o in failing if o.spec.id == rid), None)
    if root is None:
        root = next((o for o in failing), None)
    if root is None:
        return outcomes
    folded, out = [], []
    for o in outcomes:
        if o is not root and o.finding.status == "fail" and o.lost == "only":
            f = o.finding
            folded.append(f"{f.id}: {f.observed or f.reason}"[:160])
            out.append(Outcome(f.model_copy(update={
                "status": "skip", "reason": f"consequence of the lost GPU (see {root.spec.id}): {f.reason}"[:500],
                "advice": f"fix {root.spec.id} first"}), o.spec, o.applicable, o.evidence, o.lost, o.extra))
        else:
            out.append(o)
    if folded:
        f = root.finding
        index = out.index(root)
        out[index] = Outcome(f.model_copy(update={"reason": (f.reason + "; consequences: " + "; ".join(folded))[:900]}),
                             root.spec, root.applicable, root.evidence, root.lost, root.extra)
    return out
