"""From a bundle (live or on disk) to a report: work out the instance, build the context and the
facts, run every check, and say how much of the readiness decision the evidence covers. Pure apart
from reading the catalog."""

from __future__ import annotations

from trainready.catalog import load_catalog
from trainready.errors import UnknownNameError
from trainready.plan.job import JobSpec

from . import checks  # noqa: F401  (registers every check)
from .bundle import Bundle
from .context import Context, JobNeeds
from .facts import Facts
from .findings import CheckReport, Readiness
from .registry import Outcome, run_checks


def job_needs(job: JobSpec) -> JobNeeds:
    """What a job (plan --save, or --model/--method/--strategy) needs from one node: host RAM and checkpoint space."""
    from trainready.plan.estimate import estimate_setup
    from trainready.plan.setup import resolve

    result = estimate_setup(resolve(job, load_catalog()))
    return JobNeeds(host_ram_gib=result.memory.host_gib, checkpoint_gib=result.storage.checkpoint_gb_per_node * 1e9 / 1024**3,
                    description=f"{result.model.name}, {result.setup.method}, {result.setup.strategy}")


def analyze(bundle: Bundle, instance_type: str | None = None, job: JobNeeds | None = None, deep: bool = False,
            live: bool = False, cpu_only: bool = False, mig: bool = False, only: tuple[str, ...] | None = None) -> CheckReport:
    """`cpu_only`: the user says the node has no GPU; otherwise no GPU where training needs one fails.
    `mig`: MIG mode is intended on this node. `only`: report just these checks (single files given
    without a bundle: --nccl-tests, --dcgm-output), with no readiness verdict."""
    catalog = load_catalog()
    note = ""
    name = instance_type
    if not name:  # the bundle's own word for it: checked to be a name at all, else unknown with why
        name, note = bundle.instance_type()
    instance = gpu = None
    if name:
        try:
            instance = catalog.instance(name)
        except UnknownNameError:
            if instance_type:  # given by the user: a usage error; detected: unknown to us, check without
                raise
            where = "detected on this machine" if bundle.source == "live" else "from the bundle's instance-type.txt"
            instance, note = None, f"{name} ({where}) is not in the catalog"
        if instance is not None:
            gpu = catalog.gpu_of(instance)
    ctx = Context(bundle=bundle, instance=instance, gpu=gpu, job=job, live=live, cpu_only=cpu_only,
                  instance_note=note, mig_expected=mig)
    outcomes = run_checks(Facts(ctx), deep)
    if only is not None:
        outcomes = [o for o in outcomes if o.spec.id in only]
    findings = [f for o in outcomes for f in (o.finding, *o.extra)]
    return CheckReport.build(instance.name if instance else name, bundle.source, findings,
                             None if only is not None else readiness(outcomes, cpu_only))


def readiness(outcomes: list[Outcome], cpu_only: bool) -> Readiness:
    """Ready only when nothing failed and every check that decides readiness had evidence. With
    --cpu-only the GPU checks do not decide."""
    decisive = [o for o in outcomes if o.spec.decisive and not (cpu_only and o.spec.area in ("gpu", "nvswitch"))]
    failed = [o.finding.id for o in outcomes if o.finding.status == "fail"]
    verified = [o.finding.id for o in decisive if o.applicable and o.evidence == "full"]
    partial = [o.finding.id for o in decisive if o.applicable and o.evidence == "partial"]
    unverified = [f"{o.finding.id}: {o.finding.reason}"[:300] for o in decisive if o.applicable and o.evidence == "none"]
    not_applicable = [o.finding.id for o in decisive if not o.applicable]
    deciding = len(verified) + len(partial) + len(unverified)
    shown = f"verified {len(verified) + len(partial)} of {deciding} deciding checks" if deciding else \
        "no deciding check applies"
    if failed:
        status, text = "not-ready", f"not ready: {len(failed)} failed ({', '.join(failed[:6])}); {shown}"
    elif unverified:
        status = "not-verified"
        text = "not verified: no evidence for " + ", ".join(u.split(":")[0] for u in unverified) + f"; {shown}"
    else:
        status = "ready"
        text = ("ready" + (" (CPU-only: the GPU checks do not decide)" if cpu_only else "") +
                (f"; partly verified: {', '.join(partial)} (output cut or elided)" if partial else "") + f"; {shown}")
    return Readiness(status=status, text=text, verified=verified, partial=partial, unverified=unverified,
                     not_applicable=not_applicable)
