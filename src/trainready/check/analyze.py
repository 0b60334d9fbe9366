"""From a bundle (live or on disk) to a report: work out the instance, build the context, run
every check. Pure apart from reading the catalog."""

from __future__ import annotations

from trainready.catalog import load_catalog
from trainready.errors import UnknownNameError
from trainready.plan.job import JobSpec

from .bundle import Bundle
from .context import Context, JobNeeds
from .findings import CheckReport
from .registry import run_checks


def job_needs(job: JobSpec) -> JobNeeds:
    """What a job (plan --save, or --model/--method/--strategy) needs from one node: host RAM and checkpoint space."""
    from trainready.plan.estimate import estimate_setup
    from trainready.plan.setup import resolve

    result = estimate_setup(resolve(job, load_catalog()))
    return JobNeeds(host_ram_gib=result.memory.host_gib, checkpoint_gib=result.storage.checkpoint_gb_per_node * 1e9 / 1024**3,
                    description=f"{result.model.name}, {result.setup.method}, {result.setup.strategy}")


def analyze(bundle: Bundle, instance_type: str | None = None, job: JobNeeds | None = None, deep: bool = False,
            live: bool = False, cpu_only: bool = False, mig: bool = False) -> CheckReport:
    """`cpu_only`: the user says the node has no GPU; otherwise no GPU where training needs one fails.
    `mig`: MIG mode is intended on this node."""
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
    return CheckReport.build(instance.name if instance else name, bundle.source, run_checks(ctx, deep))
