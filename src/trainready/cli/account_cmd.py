"""`trainready account`: can this AWS account launch the job now, and where."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trainready.catalog import Catalog, Instance, load_catalog
from trainready.errors import UsageError, closest, did_you_mean, normalize_name, printable

from . import options as o
from .console import emit_json, out

HELP = """Quotas, offerings, permissions, spot and Capacity Block prices and the budget alarm of your AWS account, for an instance type x nodes, per region (regions asked concurrently).

Example: trainready account --instance p5.48xlarge --nodes 2 --region us-east-1,us-west-2

Credentials come from the usual AWS places (AWS_PROFILE, AWS_ACCESS_KEY_ID, an instance role); AWS_ENDPOINT_URL points every call elsewhere. Nothing is changed unless --request-quota or --create-budget is given.

Exit codes: 0 the job can launch in at least one region asked, 1 something blocks it everywhere asked (or the archive bucket is unusable, or nothing could be checked), 2 usage error (also: no credentials, boto3 missing), 3 internal error."""

A = "Account"
W = "Job"
MAX_AGE_DEFAULT = "1h"
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")  # fullmatch: a trailing newline is not an address


def parse_duration(text: str, option: str = "--max-age") -> float:
    """'1h', '30m', '90s', '3600' (seconds) or '0' (no cache) as seconds; anything else is exit 2."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not m:
        raise UsageError(f"{option} '{printable(text)}' is not a duration: give e.g. 1h, 30m, 90s or 0 (no cache)")
    value = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if value > 30 * 86400:
        raise UsageError(f"{option} '{printable(text)}' is more than 30 days: prices and quotas change faster")
    return value


def known_regions(catalog: Catalog) -> list[str]:
    names = set(catalog.regions)
    try:
        import boto3

        session = boto3.session.Session()
        for partition in session.get_available_partitions():
            names.update(session.get_available_regions("ec2", partition_name=partition))
    except Exception:  # noqa: BLE001 - without boto3 the catalog's regions are what we know
        pass
    return sorted(n for n in names if re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", n))


def parse_regions(value: str | None, catalog: Catalog, default: str | None) -> list[str] | None:
    """The regions asked for, each checked (exit 2 with the nearest names); None for `all`."""
    if value is None:
        if default:
            return [default]
        name = _session_region()
        if name is None:
            return ["us-east-1"]
        known = known_regions(catalog)
        key = _canonical(name, known)
        if key is None:  # AWS_DEFAULT_REGION / AWS_REGION / the profile's region: checked as --region is
            hint = did_you_mean(closest(name, known))
            raise UsageError(f"unknown region '{printable(name)}' (AWS_REGION, AWS_DEFAULT_REGION or the profile's "
                             f"region).{hint} Give --region, or fix that setting")
        return [key]
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise UsageError("--region is empty: give region names (us-east-1,us-west-2) or all")
    if [n.lower() for n in names] == ["all"]:  # case ignored, as in region names
        return None
    known = known_regions(catalog)
    out_: list[str] = []
    for name in names:
        key = _canonical(name, known)
        if key is None:
            hint = did_you_mean(closest(name, known))
            raise UsageError(f"unknown region '{printable(name)}'.{hint} (`--regions all` asks the account for "
                             f"its regions)")
        if key not in out_:
            out_.append(key)
    return out_


def _canonical(name: str, known: list[str]) -> str | None:
    """`name` as AWS spells it, case and separators ignored as `plan --region` ignores them (us_east_1)."""
    return {normalize_name(r): r for r in known}.get(normalize_name(name))


def _session_region() -> str | None:
    try:
        import boto3

        return boto3.session.Session().region_name
    except Exception:  # noqa: BLE001
        return None


def aws_instance(catalog: Catalog, name: str) -> Instance:
    inst = catalog.instance(name)  # unknown: exit 2 with the nearest names
    if inst.cloud != "aws":
        from trainready.cloud import OFFLINE

        raise UsageError(f"{inst.name} is a {OFFLINE.get(inst.cloud, inst.cloud)} instance type: `account` checks AWS "
                         f"accounts only for now (GCP and Azure stay offline; `plan` uses their catalog prices)")
    return inst


def _from_job(job_path: Path, catalog: Catalog) -> tuple[str, int, bool, float | None, str | None]:
    """(instance, nodes, spot, hours, region) of a job file; hours from its estimate when it has --tokens."""
    from trainready.plan.estimate import estimate_setup
    from trainready.plan.job import load_job
    from trainready.plan.search import largest_fitting_micro_batch
    from trainready.plan.setup import resolve

    job = load_job(job_path)
    if not job.instance:
        raise UsageError(f"{printable(job_path)} names no instance: save one with `trainready plan --save` "
                         f"or give --instance")
    inst = catalog.instance(job.instance)
    nodes = max(1, (job.gpus or inst.gpu_count) // (job.gpus_per_node or inst.gpu_count))
    hours = None
    if job.tokens:
        setup = resolve(job, catalog)
        if job.micro_batch is None:
            setup, _ = largest_fitting_micro_batch(setup)
        est = estimate_setup(setup)
        hours = est.cost.spot_hours if job.spot and est.cost.spot_hours else est.time.train_hours
    return inst.name, nodes, bool(job.spot), hours, job.region


def account(
    job_path: o.JobPath = None,
    instance: Annotated[Optional[str], typer.Option("--instance", "-i", help="Instance type, e.g. p5.48xlarge.", rich_help_panel=W)] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", parser=o.number("2", hi=1024, whole=True), help="Instances the job runs on. [default: 1, or the job's]", rich_help_panel=W)] = None,
    spot: o.Spot = None,
    hours: Annotated[Optional[float], typer.Option("--hours", parser=o.number("72", hi=24 * 366), help="How long the job runs (for Capacity Blocks). [default: the job's estimate, else 24]", rich_help_panel=W)] = None,
    region: Annotated[Optional[str], typer.Option("--region", "--regions", metavar="REGIONS", help="Regions, comma-separated, or all (the account's enabled regions). [default: the job's, else AWS_DEFAULT_REGION, else us-east-1]", rich_help_panel=A)] = None,
    archive: Annotated[Optional[str], typer.Option("--archive", metavar="S3URL", help="The job's checkpoint archive, s3://bucket/prefix: checks the bucket.", rich_help_panel=A)] = None,
    request_quota: Annotated[bool, typer.Option("--request-quota", help="File the quota increase where a quota is short (otherwise only the command is shown).", rich_help_panel=A)] = False,
    create_budget: Annotated[Optional[float], typer.Option("--create-budget", metavar="USD", parser=o.number("500", hi=1e9), help="Create a monthly cost budget of USD with e-mail alerts at 50/80/100% (needs --email).", rich_help_panel=A)] = None,
    email: Annotated[Optional[str], typer.Option("--email", metavar="ADDR", help="Where --create-budget sends its alerts.", rich_help_panel=A)] = None,
    max_age: Annotated[str, typer.Option("--max-age", metavar="AGE", help="Reuse cached answers younger than this: 1h, 30m, 0 (ask again).", rich_help_panel=A)] = MAX_AGE_DEFAULT,
    deadline: Annotated[Optional[float], typer.Option("--deadline", metavar="SECONDS", parser=o.number("60", hi=24 * 3600), help="All AWS calls together end within this; what has no answer by then is unknown. [default: 60, or TRAINREADY_LIVE_DEADLINE_S]", rich_help_panel=A)] = None,
    catalog_file: o.CatalogFile = None,
    json_out: o.Json = False,
) -> None:
    from trainready.cloud.aws import missing_boto

    catalog = load_catalog(catalog_file)
    job_region = None
    job_hours = None
    if job_path is not None:
        name, job_nodes, job_spot, job_hours, job_region = _from_job(job_path, catalog)
        instance = instance or name
        nodes = nodes or job_nodes
        spot = job_spot if spot is None else spot
    if not instance:
        raise UsageError("give --instance TYPE (and --nodes N), or --job job.toml")
    inst = aws_instance(catalog, instance)
    if (create_budget is None) != (email is None):
        raise UsageError("--create-budget USD and --email ADDR go together: the budget's alerts need an address")
    if email is not None and not _EMAIL.fullmatch(email):
        raise UsageError(f"--email '{printable(email)}' is not an e-mail address")
    if archive is not None:
        from trainready.io.urls import validate_bucket

        if not archive.startswith("s3://"):
            raise UsageError(f"--archive '{printable(archive)}': give an s3://bucket/prefix URL")
        validate_bucket(archive)
    age = parse_duration(max_age)
    regions = parse_regions(region, catalog, job_region)
    why = missing_boto()
    if why:
        raise UsageError(f"`account` asks AWS: {why}")
    report = run_account(inst, nodes or 1, bool(spot), hours or job_hours, regions, archive=archive,
                         request_quota=request_quota,
                         create_budget=(create_budget, email) if create_budget is not None else None, max_age_s=age,
                         deadline_s=deadline)
    if json_out:
        emit_json(report)
    else:
        from .render_account import render_account

        render_account(out, report)
    if report.status == "fail" or not report.usable_regions:  # none usable: blocked, or nothing could be checked
        raise typer.Exit(1)


def run_account(inst: Instance, nodes: int, spot: bool, hours: float | None, regions: list[str] | None,
                **kw: Any):
    from trainready.cloud.account import Ask, check_account
    from trainready.cloud.aws import AwsProvider, CallFailed, deadline_s_from_env
    from trainready.cloud.cache import Cache

    deadline_s = kw.pop("deadline_s", None)
    provider = AwsProvider(Cache(max_age_s=kw.pop("max_age_s")),
                           deadline_s=deadline_s if deadline_s is not None else deadline_s_from_env())
    if regions is None:  # all: ask who we are first (a clear exit 2 without credentials), then which regions
        provider.identity()
        try:
            regions = provider.enabled_regions()
        except CallFailed as exc:
            raise UsageError(f"--regions all: cannot list the account's regions ({exc.reason}); name them") from None
    ask = Ask(instance=inst, nodes=nodes, spot=spot, hours=hours, regions=tuple(regions), **kw)
    return check_account(provider, ask)


def live_plan(result: Any, catalog: Catalog, *, regions: str | None, data: str | None, max_age: str, spot: bool,
              spot_mtbf_h: float | None, deadline_s: float | None = None) -> Any:
    """`plan --live`: the plan's rows checked against the account (trainready.cloud.live); bad options are
    exit 2 before anything is asked, a missing account is one line in the plan."""
    from trainready.cloud.live import LiveRequest, annotate

    age = parse_duration(max_age)
    asked: tuple[str, ...] | None = None
    if regions is not None:
        parsed = parse_regions(regions, catalog, None)
        asked = ("all",) if parsed is None else tuple(parsed)
    if data is not None:
        from trainready.io.urls import validate_bucket

        if not data.startswith("s3://"):
            raise UsageError(f"--data '{printable(data)}': give an s3://bucket/prefix URL")
        validate_bucket(data)
    return annotate(result, catalog, LiveRequest(regions=asked, data_url=data, spot=spot, spot_mtbf_h=spot_mtbf_h,
                                                 max_age_s=age, deadline_s=deadline_s))
