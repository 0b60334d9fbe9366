"""Can this account launch the job, and where: the provider's facts turned into status lines.

Regions are asked concurrently (one worker per region, each with its own clients); within a
region the questions go one after another, and a question that fails makes its own line
`unknown` while the rest go on. The rules that decide ok/warn/fail live here, in one place:
`plan --live` uses them too (`region_report`).
"""

from __future__ import annotations

import datetime as dt
import math
import shlex
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from trainready.catalog import Instance
from trainready.catalog.quotas import aws_limits

from .aws import AwsProvider, CallFailed, Scores, budget_documents
from .report import (
    AccountReport,
    Budget,
    CacheInfo,
    CapacityBlock,
    Identity,
    Line,
    Offerings,
    Permission,
    QuotaLine,
    QuotaRequest,
    RegionReport,
    SpotInfo,
    Status,
    worst,
)

MAX_WORKERS = 16
LOW_PLACEMENT_SCORE = 3  # policy: AWS calls 1-3 "not likely to succeed" on its 1-10 scale (EC2 User Guide,
#                          Spot placement score: "a score of 10 means highly likely, 1 means not likely")
BUDGET_NAME = "trainready"
SHOWN_BLOCKS = 3


@dataclass(frozen=True)
class Ask:
    """What to check: an instance type x nodes, on-demand or spot, for `hours`, in `regions`."""

    instance: Instance
    nodes: int
    spot: bool
    hours: float | None
    regions: tuple[str, ...]
    archive: str | None = None  # s3://bucket/prefix the job writes checkpoints to
    request_quota: bool = False
    create_budget: tuple[float, str] | None = None  # (USD per month, e-mail)

    @property
    def purchase(self) -> str:
        return "spot" if self.spot else "on-demand"


def check_account(provider: AwsProvider, ask: Ask) -> AccountReport:
    """Every check for `ask`; raises NoAccess (exit 2) only when no credentials work at all."""
    started = time.monotonic()
    account, arn = provider.identity()
    identity = Identity(account=account, arn=arn, status="ok", reason="credentials work (sts:GetCallerIdentity)")
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(ask.regions) + 2)) as pool:
        scores = pool.submit(_scores, provider, ask)
        futures = {r: pool.submit(region_report, provider, r, ask, scores) for r in ask.regions}
        budget_f = pool.submit(_budget, provider, ask)
        archive_f = pool.submit(_archive, provider, ask.archive) if ask.archive else None
        regions = [futures[r].result() for r in ask.regions]
        budget = budget_f.result()
        archive = archive_f.result() if archive_f else []
    requests = _file_requests(provider, regions) if ask.request_quota else []
    usable = [r.region for r in regions if r.status != "fail" and _checked(r)]  # unknown everywhere is not usable
    status, reason = _verdict(ask, regions, usable, budget, archive)
    c = provider.cache
    return AccountReport(
        instance=ask.instance.name, nodes=ask.nodes, purchase=ask.purchase,
        vcpus_per_instance=_vcpus(ask.instance, regions), vcpus_needed=_needed(ask.instance, regions, ask.nodes),
        hours=ask.hours, identity=identity, regions=regions, budget=budget, permissions=archive,
        quota_requests=requests, usable_regions=usable, status=status, reason=reason,
        checked_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        seconds=time.monotonic() - started,
        cache=CacheInfo(directory=str(c.dir), max_age_s=c.max_age_s, hits=c.hits, misses=c.misses, notes=c.notes),
        notes=_notes(ask))


# ---- one region ---------------------------------------------------------------------------------------------

def region_report(provider: AwsProvider, region: str, ask: Ask, scores: Future | None = None) -> RegionReport:
    offerings, type_fact = _offerings(provider, region, ask)
    vcpus = (type_fact.vcpus if type_fact else None) or ask.instance.vcpus
    quotas = [_quota(provider, region, ask, vcpus)]
    offered = offerings.status != "fail"  # unknown (the offerings call failed): the dry run still tells
    run = _dry_run(provider, region, ask, type_fact, offered)
    spot = _spot(provider, region, ask, scores)
    blocks, reservations, capacity = _capacity(provider, region, ask, offered)
    permissions = _permissions(provider, region, run)
    lines: list[Status] = [offerings.status, spot.status, capacity.status, *(q.status for q in quotas),
                           *(p.status for p in permissions)]
    return RegionReport(region=region, status=worst(lines), quotas=quotas, offerings=offerings,
                        permissions=permissions, spot=spot, capacity_blocks=blocks,
                        capacity_reservations=reservations, capacity=capacity)


def _offerings(provider: AwsProvider, region: str, ask: Ask):
    itype = ask.instance.name
    try:
        fact, _ = provider.instance_type(region, itype)
    except CallFailed as exc:
        fact, type_reason = None, exc.reason
    else:
        type_reason = ""
    try:
        azs = provider.offerings(region, itype)[0].azs
    except CallFailed as exc:
        return Offerings(azs=[], efa=fact.efa if fact else None, network_cards=fact.network_cards if fact else None,
                         efa_interfaces=fact.efa_interfaces if fact else None, vcpus=fact.vcpus if fact else None,
                         status="unknown", reason=f"which AZs offer {itype}: {exc.reason}"), fact
    if not azs or (fact is not None and not fact.exists):
        return Offerings(azs=[], efa=None, network_cards=None, status="fail",
                         reason=f"{itype} is not offered in {region} (DescribeInstanceTypeOfferings)"), fact
    efa = fact.efa if fact else None
    cards = fact.network_cards if fact else None
    status: Status = "ok"
    reason = f"offered in {len(azs)} AZ(s)"
    if fact is None:
        status, reason = "unknown", reason + f"; EFA and network cards unknown ({type_reason})"
    elif ask.nodes > 1 and efa:
        reason += (f"; {ask.nodes} nodes need a cluster placement group in one AZ with EFA "
                   f"({cards or '?'} network card(s), up to {fact.efa_interfaces or '?'} EFA interface(s) each)")
    elif ask.nodes > 1 and efa is False:
        status, reason = "warn", reason + f"; {itype} has no EFA: {ask.nodes} nodes talk over TCP (slower all-reduce)"
    return Offerings(azs=azs, efa=efa, network_cards=cards, efa_interfaces=fact.efa_interfaces if fact else None,
                     vcpus=fact.vcpus if fact else None, status=status, reason=reason), fact


def _quota(provider: AwsProvider, region: str, ask: Ask, vcpus: int | None) -> QuotaLine:
    code = aws_limits().quota_for(ask.instance.name, ask.purchase)  # type: ignore[arg-type]
    needed = (vcpus or 0) * ask.nodes
    if code is None:
        return QuotaLine(code="?", name="?", purchase=ask.purchase, limit_vcpus=None, used_vcpus=None,
                         needed_vcpus=needed, headroom_vcpus=None, status="unknown",
                         reason=f"no {ask.purchase} vCPU quota is known for {ask.instance.name}")
    base = dict(code=code.code, name=code.name, purchase=ask.purchase, needed_vcpus=needed)
    if not vcpus:
        return QuotaLine(**base, limit_vcpus=None, used_vcpus=None, headroom_vcpus=None, status="unknown",
                         reason=f"vCPUs of {ask.instance.name} unknown: cannot compare with the quota")
    try:
        fact, _ = provider.quota(region, code.code)
    except CallFailed as exc:
        why = exc.reason if exc.kind != "not-found" else \
            f"Service Quotas has no ec2 quota {code.code} here ({exc.code})"
        return QuotaLine(**base, limit_vcpus=None, used_vcpus=None, headroom_vcpus=None, status="unknown",
                         reason=why, request_command=_request_command(region, code.code, needed))
    base["name"] = fact.name
    used, usage_note = None, "usage unknown (no CloudWatch usage metric for this quota)"
    if fact.usage_dimensions:
        try:
            usage, _ = provider.quota_usage(region, fact)
            used = usage.used
            usage_note = (f"{used:g} vCPUs in use" if usage.datapoints else
                          "no usage datapoint in the last hour: nothing of this class running")
        except CallFailed as exc:
            usage_note = f"usage unknown ({exc.reason})"
    limit = fact.value
    if limit is None:
        return QuotaLine(**base, limit_vcpus=None, used_vcpus=used, headroom_vcpus=None, status="unknown",
                         reason=f"Service Quotas gave no value for {code.code}")
    headroom = limit - (used or 0.0)
    if headroom >= needed:
        return QuotaLine(**base, limit_vcpus=limit, used_vcpus=used, headroom_vcpus=headroom, status="ok",
                         reason=f"{headroom:g} of {limit:g} vCPUs free, the job needs {needed}; {usage_note}")
    ask_for = math.ceil((used or 0.0) + needed)
    short = needed - headroom
    head = (f"quota is {limit:g} vCPUs" if used is None or used == 0 else
            f"{used:g} of {limit:g} vCPUs in use, {max(headroom, 0):g} free")
    return QuotaLine(**base, limit_vcpus=limit, used_vcpus=used, headroom_vcpus=headroom, request_vcpus=ask_for,
                     request_command=_request_command(region, code.code, ask_for), status="fail",
                     reason=f"{head}; the job needs {needed} ({ask.nodes} x {vcpus}): short by {short:g}. "
                            f"Ask for {ask_for} (command below, or --request-quota)")


def _request_command(region: str, code: str, value: int) -> str:
    return (f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
            f"--desired-value {value} --region {region}")


def _dry_run(provider: AwsProvider, region: str, ask: Ask, fact, offered: bool) -> Permission:
    action = "ec2:RunInstances"
    if not offered:
        return Permission(action=action, status="unknown", reason="not tried: the type is not offered here")
    arch = (fact.architectures[0] if fact and fact.architectures else "x86_64")
    try:
        ami = provider.ami(region, arch)[0].value
    except CallFailed as exc:
        return Permission(action=action, status="unknown",
                          reason=f"not tried: a dry run needs an AMI id from SSM ({exc.reason})")
    result, detail = provider.dry_run(region, ask.instance.name, ask.nodes, ask.spot, ami)
    if result == "allowed":
        return Permission(action=action, status="ok", reason=f"allowed (dry run of {ask.nodes} x {ask.instance.name}"
                                                             f"{' spot' if ask.spot else ''})")
    if result == "denied":
        why = "denied (UnauthorizedOperation)"
        if detail:
            try:
                why += f": {provider.decode(detail)}"
            except CallFailed as exc:
                why += (f"; the reason is encoded and decoding it {exc.reason.split(':')[0]} "
                        f"(sts:DecodeAuthorizationMessage)")
        return Permission(action=action, status="fail", reason=why)
    if result in ("Unsupported", "InsufficientInstanceCapacity"):
        return Permission(action=action, status="fail" if result == "Unsupported" else "warn", reason=detail)
    return Permission(action=action, status="unknown", reason=f"dry run inconclusive: {detail}")


def _spot(provider: AwsProvider, region: str, ask: Ask, scores: Future | None) -> SpotInfo:
    empty = dict(price_now_usd_per_hour=None, by_az={}, min=None, median=None, max=None, records=0,
                 placement_score=None)
    try:
        stats, _ = provider.spot_history(region, ask.instance.name)
    except CallFailed as exc:
        info = SpotInfo(**empty, status="unknown", reason=f"spot price history: {exc.reason}")
    else:
        if not stats.by_az:
            info = SpotInfo(**empty, status="warn" if ask.spot else "ok",
                            reason="no spot price in the last 7 days: not sold as spot here")
        else:
            now = min(stats.by_az.values())
            info = SpotInfo(price_now_usd_per_hour=now, by_az=stats.by_az, min=stats.min, median=stats.median,
                            max=stats.max, records=stats.records, placement_score=None, status="ok",
                            reason=f"{_usd_h(now)}/h now in the cheapest AZ; 7 days: {_usd_h(stats.min)}-"
                                   f"{_usd_h(stats.max)}, median {_usd_h(stats.median)}")
    got = scores.result() if scores is not None else None
    if isinstance(got, CallFailed):
        return info.model_copy(update={"reason": info.reason + f"; placement score: {got.reason}",
                                       "status": worst([info.status, "unknown"])})
    if isinstance(got, Scores):
        score = got.by_region.get(region)
        if score is None:
            return info.model_copy(update={"reason": info.reason + f"; no placement score for {ask.nodes} node(s) "
                                                                   f"in one AZ"})
        low = score.score <= LOW_PLACEMENT_SCORE
        status: Status = "warn" if (low and ask.spot) else info.status
        return info.model_copy(update={
            "placement_score": score.score, "placement_az_id": score.az_id, "status": worst([info.status, status]),
            "reason": info.reason + f"; placement score {score.score}/10 for {ask.nodes} node(s) in "
                                    f"{score.az_id or 'one AZ'}"
                      + (" (spot requests likely to wait or fail)" if low else "")})
    return info


def _usd_h(x: float | None) -> str:
    """A spot price: cents where it matters, more digits for a tiny one."""
    if x is None:
        return "?"
    return f"${x:,.2f}" if x >= 0.1 else f"${x:.3g}"


def _scores(provider: AwsProvider, ask: Ask) -> Scores | CallFailed:
    try:
        return provider.placement_scores(list(ask.regions), ask.instance.name, ask.nodes)[0]
    except CallFailed as exc:
        return exc


def _capacity(provider: AwsProvider, region: str, ask: Ask, offered: bool) -> tuple[list[CapacityBlock], list, Line]:
    rules = aws_limits().capacity_blocks
    parts: list[str] = []
    statuses: list[Status] = []
    blocks: list[CapacityBlock] = []
    if ask.instance.name not in rules.instance_types:
        parts.append(f"Capacity Blocks are not sold for {ask.instance.name}")
    elif not offered:
        parts.append("no Capacity Blocks: the type is not offered here")
    else:
        count = rules.instance_count(ask.nodes)
        hours = rules.duration_hours(ask.hours or 24)
        if count is None or hours is None:
            parts.append(f"no Capacity Block holds {ask.nodes} nodes for {ask.hours or 24:g} h")
        else:
            try:
                blocks = provider.capacity_blocks(region, ask.instance.name, count, hours)[0].blocks[:SHOWN_BLOCKS]
            except CallFailed as exc:
                statuses.append("unknown")
                parts.append(f"Capacity Blocks: {exc.reason}")
            else:
                if blocks:
                    b = blocks[0]
                    fee = f"${b.upfront_fee_usd:,.0f}" if b.upfront_fee_usd is not None else "a fee in another currency"
                    parts.append(f"Capacity Block: {count} x {hours} h from {b.start} in {b.availability_zone or '?'} "
                                 f"for {fee}")
                else:
                    parts.append(f"no Capacity Block offered for {count} x {hours} h")
    reservations = []
    try:
        reservations = provider.reservations(region, ask.instance.name)[0].items
    except CallFailed as exc:
        statuses.append("unknown")
        parts.append(f"capacity reservations: {exc.reason}")
    else:
        free = sum(r.available for r in reservations)
        if reservations:
            parts.append(f"{len(reservations)} capacity reservation(s), {free} instance(s) free")
    return blocks, reservations, Line(status=worst(statuses), reason="; ".join(parts) or "nothing to report")


def _permissions(provider: AwsProvider, region: str, run: Permission) -> list[Permission]:
    """RunInstances (the one that blocks), then every other call made here: allowed, or what is missing."""
    lines = [run]
    for action, (kind, reason) in sorted(provider.calls.get(region, {}).items()):
        if action == "ec2:RunInstances":
            continue
        if kind == "allowed":
            lines.append(Permission(action=action, status="ok", reason=reason))
        elif kind == "denied":
            lines.append(Permission(action=action, status="warn", reason=f"denied: trainready cannot read this "
                                                                         f"(grant {action})"))
        else:
            lines.append(Permission(action=action, status="unknown", reason=reason))
    return lines


# ---- account-wide -------------------------------------------------------------------------------------------

def _budget(provider: AwsProvider, ask: Ask) -> Budget:
    created = False
    if ask.create_budget is not None:
        usd, email = ask.create_budget
        try:
            provider.create_budget(BUDGET_NAME, usd, email)
            created = True
        except CallFailed as exc:
            return Budget(present=None, name=None, limit_usd=None, status="fail",
                          reason=f"creating budget '{BUDGET_NAME}' failed: {exc.reason}")
    try:
        found = provider.budgets()
    except CallFailed as exc:
        return Budget(present=None, name=None, limit_usd=None, created=created, status="unknown",
                      reason=f"budgets: {exc.reason}", command=None if created else budget_command(provider.account))
    if not found:
        return Budget(present=False, name=None, limit_usd=None, created=created, status="warn",
                      reason="no AWS Budgets cost budget: nothing warns you before the bill "
                             "(--create-budget USD --email ADDR, or the command below)",
                      command=budget_command(provider.account))
    b = next((x for x in found if x.name == BUDGET_NAME), found[0])
    limit = f"${b.limit_usd:,.0f} {(b.time_unit or '').lower()}".rstrip() if b.limit_usd is not None else "no USD limit"
    return Budget(present=True, name=b.name, limit_usd=b.limit_usd, created=created, status="ok",
                  reason=("created " if created and b.name == BUDGET_NAME else "") +
                         f"cost budget '{b.name}' ({limit}){'' if len(found) == 1 else f' and {len(found) - 1} more'}")


def budget_command(account: str | None, usd: float = 100.0, email: str = "you@example.com") -> str:
    """The AWS CLI command that creates what --create-budget creates, in the CLI's shorthand syntax (one
    quoted word per alert, so it breaks into lines that paste)."""
    budget, notes = budget_documents(BUDGET_NAME, usd, email)
    lim = budget["BudgetLimit"]
    words = [f"BudgetName={budget['BudgetName']},BudgetLimit={{Amount={lim['Amount']},Unit={lim['Unit']}}},"
             f"TimeUnit={budget['TimeUnit']},BudgetType={budget['BudgetType']}"]
    alerts = []
    for n in notes:
        x, sub = n["Notification"], n["Subscribers"][0]
        alerts.append(f"Notification={{NotificationType={x['NotificationType']},ComparisonOperator="
                      f"{x['ComparisonOperator']},Threshold={x['Threshold']:g},ThresholdType={x['ThresholdType']}}},"
                      f"Subscribers=[{{SubscriptionType={sub['SubscriptionType']},Address={sub['Address']}}}]")
    return (f"aws budgets create-budget --account-id {account or 'ACCOUNT_ID'} --budget {shlex.quote(words[0])} "
            f"--notifications-with-subscribers {' '.join(shlex.quote(a) for a in alerts)}")


def _archive(provider: AwsProvider, url: str) -> list[Permission]:
    """The calls the job's checkpoint archive needs: listing the bucket and knowing its region."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    lines = []
    try:
        region = provider.bucket_region(bucket)[0].value
        lines.append(Permission(action="s3:GetBucketLocation", status="ok", reason=f"bucket {bucket} is in {region}"))
    except CallFailed as exc:
        lines.append(_archive_line("s3:GetBucketLocation", bucket, exc))
    try:
        size = provider.bucket_size(bucket, prefix)[0]
        more = "" if size.complete else " (at least)"
        lines.append(Permission(action="s3:ListBucket", status="ok",
                                reason=f"s3://{bucket}/{prefix}: {size.objects:,} object(s){more}"))
    except CallFailed as exc:
        lines.append(_archive_line("s3:ListBucket", bucket, exc))
    lines.append(Permission(action="s3:PutObject", status="unknown",
                            reason="not tried: S3 has no dry run and trainready writes nothing to check (the first "
                                   "checkpoint upload will tell)"))
    return lines


def _archive_line(action: str, bucket: str, exc: CallFailed) -> Permission:
    if exc.kind == "not-found":
        return Permission(action=action, status="fail", reason=f"bucket {bucket} does not exist")
    if exc.kind == "denied":
        return Permission(action=action, status="fail", reason=f"denied on bucket {bucket}: the job cannot use it")
    return Permission(action=action, status="unknown", reason=exc.reason)


def _file_requests(provider: AwsProvider, regions: list[RegionReport]) -> list[QuotaRequest]:
    out = []
    for r in regions:
        for q in r.quotas:
            if q.status != "fail" or q.request_vcpus is None or r.offerings.status == "fail":
                continue
            try:
                rid, state = provider.request_quota(r.region, q.code, q.request_vcpus)
                out.append(QuotaRequest(region=r.region, code=q.code, desired_vcpus=q.request_vcpus, request_id=rid,
                                        state=state, status="ok", reason=f"requested ({state or 'state unknown'})"))
            except CallFailed as exc:
                out.append(QuotaRequest(region=r.region, code=q.code, desired_vcpus=q.request_vcpus, request_id=None,
                                        state=None, status="fail", reason=exc.reason))
    return out


def _verdict(ask: Ask, regions: list[RegionReport], usable: list[str], budget: Budget,
             archive: list[Permission]) -> tuple[Status, str]:
    what = f"{ask.nodes} x {ask.instance.name}{' spot' if ask.spot else ''}"
    blocked_archive = [p for p in archive if p.status == "fail"]
    if not usable:
        unchecked = [r for r in regions if r.status != "fail"]
        if unchecked:  # every line of those regions unknown (unreachable, not answered): unknown is not yes
            why = "; ".join(f"{r.region}: {_first_unknown(r)}" for r in unchecked)
            return "unknown", f"whether {what} can launch could not be checked in any region asked: {why}"
        why = "; ".join(f"{r.region}: {_first_fail(r)}" for r in regions)
        return "fail", f"{what} cannot launch now in any region asked: {why}"
    if blocked_archive:
        return "fail", f"the archive is not usable: {blocked_archive[0].reason}"
    best = min((r for r in regions if r.region in usable), key=lambda r: ["ok", "unknown", "warn"].index(r.status))
    status = worst([best.status, budget.status, *(p.status for p in archive)])
    return status, f"{what} can launch now in: {', '.join(usable)}"


def _lines(r: RegionReport) -> list:
    return [*r.quotas, r.offerings, *r.permissions, r.spot, r.capacity]


def _checked(r: RegionReport) -> bool:
    """Whether anything about launching in the region is known: a quota, the offerings, spot or capacity answered,
    or the launch's own permission decided (ec2:RunInstances' dry run; a denied read only says that read was
    denied, and other services' answers say nothing of the launch)."""
    facts = [*r.quotas, r.offerings, r.spot, r.capacity]
    return any(line.status != "unknown" for line in facts) or any(
        p.action == "ec2:RunInstances" and p.status in ("ok", "fail") for p in r.permissions)


def _first_unknown(r: RegionReport) -> str:
    return next((line.reason for line in _lines(r) if line.status == "unknown"), "?")


def _first_fail(r: RegionReport) -> str:
    return next((line.reason for line in _lines(r) if line.status == "fail"), "?")


def _vcpus(inst: Instance, regions: list[RegionReport]) -> int | None:
    return next((r.offerings.vcpus for r in regions if r.offerings.vcpus), None) or inst.vcpus


def _needed(inst: Instance, regions: list[RegionReport], nodes: int) -> int | None:
    v = _vcpus(inst, regions)
    return v * nodes if v else None


def _notes(ask: Ask) -> list[str]:
    notes = []
    if ask.hours is None:
        notes.append("job length unknown (no --job with --tokens, no --hours): Capacity Blocks asked for 24 h")
    q = aws_limits().quota_for(ask.instance.name, ask.purchase)  # type: ignore[arg-type]
    if q is not None and q.uncertain:
        notes.append(f"{q.code}: {q.uncertain}")
    return notes
