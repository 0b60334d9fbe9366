"""`plan --live`: the plan's rows held against the account, now.

For each row on AWS, in each region asked (concurrently): can it launch (offering, quota, a
RunInstances dry run; account.region_report decides), at what price (the Price List API for
on-demand, the cheapest AZ's spot price for spot), with which spot placement score and Capacity
Block. Rows that cannot launch anywhere asked go to the exclusions with the reason; the rest are
re-ranked by their live cost (or time), in the cheapest region where they launch. With `--data
s3://bucket/...` a region other than the bucket's pays for moving the dataset (once) and the
checkpoints (archived to the bucket's region) across regions, in money and in time. Each row also
gets its cost at the 90th percentile of interruptions (plan/worst_case.py).

Without boto3, credentials or network, nothing fails: every row keeps the catalog's price, the
plan says so in one line (and in `live.reason`).
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from trainready.catalog import Catalog
from trainready.catalog.quotas import aws_limits
from trainready.errors import printable
from trainready.plan import reliability as rel
from trainready.plan.live_info import CapacityBlockOffer, DataLocation, LivePlan, LiveRow
from trainready.plan.search import Exclusion, PlanResult, PlanRow
from trainready.plan.worst_case import worst_case_hours

from . import OFFLINE
from .account import Ask, _scores, region_report
from .aws import AwsProvider, CallFailed, NoAccess, deadline_s_from_env, missing_boto
from .cache import Cache
from .report import RegionReport

MAX_WORKERS = 16
FAR_BELOW = 0.5  # policy: a quota under half of what a row needs is "far below": the row is excluded, not annotated


@dataclass(frozen=True)
class LiveRequest:
    regions: tuple[str, ...] | None  # None: each row's catalog price region (or the job's --region)
    data_url: str | None = None
    spot: bool = False
    spot_mtbf_h: float | None = None
    max_age_s: float = 3600.0
    deadline_s: float | None = None  # all AWS calls together; None: TRAINREADY_LIVE_DEADLINE_S, else 60 s


@dataclass
class _Choice:
    region: str | None
    report: RegionReport | None
    usd_per_hour: float | None
    source: str
    as_of: str | None
    hours: float | None
    transfer: tuple[float, float, float] | None  # (GB, USD, hours)
    total: float | None


def annotate(result: PlanResult, catalog: Catalog, req: LiveRequest, provider: AwsProvider | None = None) -> PlanResult:
    """`result` with `live` on every row and on the plan; never raises for a missing account."""
    started = time.monotonic()
    clouds = {catalog.instance(r.estimate.setup.instance).cloud for r in result.rows if r.estimate.setup.instance}
    why_not = None if "aws" in clouds else "no AWS row to check"
    if why_not is None:
        why_not = missing_boto()
    account = None
    if why_not is None:
        try:
            provider = provider or AwsProvider(Cache(max_age_s=req.max_age_s),
                                              deadline_s=req.deadline_s if req.deadline_s is not None
                                              else deadline_s_from_env())
            account, _ = provider.identity()
        except NoAccess as exc:
            why_not = str(exc)
    if why_not is not None:
        return _offline(result, catalog, req, why_not)
    return _live(result, catalog, req, provider, account, started)


def _offline(result: PlanResult, catalog: Catalog, req: LiveRequest, why: str) -> PlanResult:
    rows = [row.model_copy(update={"live": _catalog_row(row, catalog, req, [_not_aws(catalog, row)
                                                                            or f"not checked live: {why}"])})
            for row in result.rows]
    line = f"plan --live: catalog prices, nothing checked live ({why})"
    live = LivePlan(provider="aws", live=False, reason=line, regions=list(req.regions or ()), checked_at=None,
                    seconds=None, data=DataLocation(url=req.data_url, region=None, bytes=None, objects=None)
                    if req.data_url else None, notes=[])
    return result.model_copy(update={"rows": rows, "live": live, "notes": [*result.notes, line]})


def _live(result: PlanResult, catalog: Catalog, req: LiveRequest, provider: AwsProvider, account: str,
          started: float) -> PlanResult:
    notes: list[str] = []
    regions = req.regions
    if regions == ("all",):
        try:
            regions = tuple(provider.enabled_regions())
        except CallFailed as exc:
            notes.append(f"--regions all: cannot list the account's regions ({exc.reason}): each row's price region")
            regions = None
    if regions is None:
        regions = tuple(sorted({r.estimate.cost.pricing.region for r in result.rows
                                if r.estimate.cost.pricing.region} or {"us-east-1"}))
    data = _data(provider, req.data_url, notes) if req.data_url else None
    tasks: dict[tuple[str, int], dict[str, Future]] = {}
    prices: dict[tuple[str, str], Future] = {}
    with ThreadPoolExecutor(max_workers=MAX_WORKERS) as pool:
        for row in result.rows:
            s = row.estimate.setup
            inst = catalog.instance(s.instance)
            if inst.cloud != "aws" or (s.instance, s.nodes) in tasks:
                continue
            ask = Ask(instance=inst, nodes=s.nodes, spot=req.spot, hours=_hours(row, req.spot), regions=regions)
            scores = pool.submit(_scores, provider, ask)
            tasks[(s.instance, s.nodes)] = {r: pool.submit(region_report, provider, r, ask, scores) for r in regions}
            if not req.spot:
                for r in regions:
                    prices.setdefault((s.instance, r), pool.submit(_price, provider, r, s.instance))
        rows, excluded = [], list(result.excluded)
        for row in result.rows:
            s = row.estimate.setup
            not_aws = _not_aws(catalog, row)
            if not_aws is not None:
                rows.append(row.model_copy(update={"live": _catalog_row(row, catalog, req, [not_aws])}))
                continue
            reports = {r: f.result() for r, f in tasks[(s.instance, s.nodes)].items()}
            live, blocked = _aws_row(row, catalog, req, reports, prices, data)
            if blocked:
                excluded.append(Exclusion(instance=s.instance,
                                          reason=f"{s.nodes} node(s) cannot launch now: {blocked}"))
            else:
                rows.append(row.model_copy(update={"live": live}))
    rows = _rerank(rows, result.ranked_by, req.spot)
    checked = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    priced = sum(1 for r in rows if r.live and r.live.price_source == "live")
    count = {k: sum(1 for r in rows if r.live and r.live.attainable is k) for k in (True, None, False)}
    line = (f"plan --live: account {account}, {', '.join(regions)}: {count[True]} row(s) launch now, "
            f"{count[None]} not fully checked, {count[False]} wait for a quota increase, "
            f"{len(excluded) - len(result.excluded)} excluded; {priced} at live prices")
    if provider.cache.hits:
        line += f" ({provider.cache.hits} answer(s) from the cache, --max-age {req.max_age_s / 60:g} min)"
    notes += provider.cache.notes
    if result.others:
        notes.append("'also fits' instances were not checked live")
    live = LivePlan(provider="aws", live=True, reason=line, regions=list(regions), checked_at=checked,
                    seconds=time.monotonic() - started, data=data, notes=notes)
    return result.model_copy(update={"rows": rows, "excluded": excluded, "live": live,
                                     "notes": [*result.notes, line]})


def _not_aws(catalog: Catalog, row: PlanRow) -> str | None:
    """The reason a GCP, Azure or Lambda row is never checked live (whatever the AWS account says), or None."""
    cloud = catalog.instance(row.estimate.setup.instance).cloud
    if cloud == "aws":
        return None
    return f"{OFFLINE.get(cloud, 'this cloud')} has no live provider yet: catalog price, launch not checked"


def _aws_row(row: PlanRow, catalog: Catalog, req: LiveRequest, reports: dict[str, RegionReport],
             prices: dict[tuple[str, str], Future], data: DataLocation | None) -> tuple[LiveRow | None, str | None]:
    """(the row's live facts, None) or (None, why it cannot launch anywhere asked). A region where the quota is
    the only obstacle keeps the row (attainable false, "needs a quota increase"), unless the quota is far
    below the need."""
    reasons: list[str] = []
    launchable: list[str] = []
    unknown: list[str] = []
    quota_only: list[str] = []
    hard: list[str] = []
    not_offered: list[str] = []
    for region, rep in reports.items():
        fails = _fails(rep)
        if not fails:
            (launchable if _decided(rep) else unknown).append(region)
            reasons += [f"{region}: {why}" for why in _unknowns(rep)]
            continue
        quota = rep.quotas[0] if rep.quotas else None
        if quota is not None and fails == [quota.reason] and quota.request_vcpus is not None:
            short = quota.needed_vcpus - (quota.headroom_vcpus or 0)
            text = (f"{region}: needs a quota increase of {short:,.0f} vCPUs ({quota.code}, "
                    f"{quota.limit_vcpus or 0:g} now): {quota.request_command}")
            if (quota.headroom_vcpus or 0) < FAR_BELOW * quota.needed_vcpus:
                hard.append(text)
            else:
                quota_only.append(region)
                reasons.append(text)
        elif rep.offerings.status == "fail":
            not_offered.append(region)
        else:
            hard.append(f"{region}: {fails[0]}")
    if not_offered:
        hard.append(f"not offered in {', '.join(not_offered)}")
    if not (launchable or unknown or quota_only):
        return None, "; ".join(hard)
    candidates = launchable or unknown or quota_only
    attainable = True if launchable else (None if unknown else False)
    choices = [_choose(row, catalog, req, r, reports[r], prices, data) for r in candidates]
    best = min(choices, key=lambda c: (c.total if c.total is not None else float("inf"), c.region or ""))
    rep = best.report
    quota = rep.quotas[0] if rep and rep.quotas else None
    if rep is not None and row.estimate.setup.nodes > 1 and rep.offerings.efa:
        reasons.append(f"{row.estimate.setup.nodes} nodes: needs a cluster placement group in one AZ with EFA")
    return _row(row, req, best, attainable=attainable, reasons=hard + reasons,
                quota_code=quota.code if quota else None,
                headroom=quota.headroom_vcpus if quota else None, azs=rep.offerings.azs if rep else [],
                score=rep.spot.placement_score if rep else None, block=_block(rep)), None


def _fails(rep: RegionReport) -> list[str]:
    lines = [*rep.quotas, rep.offerings, *rep.permissions]
    return [x.reason for x in lines if x.status == "fail"]


def _decided(rep: RegionReport) -> bool:
    """Offering, quota and RunInstances were all checked (ok or warn), none unknown."""
    run = next((p for p in rep.permissions if p.action == "ec2:RunInstances"), None)
    return all(x.status in ("ok", "warn") for x in [*rep.quotas, rep.offerings] + ([run] if run else []))


def _unknowns(rep: RegionReport) -> list[str]:
    run = [p for p in rep.permissions if p.action == "ec2:RunInstances"]
    return [x.reason for x in [*rep.quotas, rep.offerings, *run] if x.status == "unknown"]


def _choose(row: PlanRow, catalog: Catalog, req: LiveRequest, region: str, rep: RegionReport,
            prices: dict[tuple[str, str], Future], data: DataLocation | None) -> _Choice:
    s = row.estimate.setup
    usd, source, as_of = None, "catalog", None
    if req.spot and rep.spot.price_now_usd_per_hour:
        usd, source, as_of = rep.spot.price_now_usd_per_hour, "live", "spot price history, latest"
    elif not req.spot:
        fut = prices.get((s.instance, region))
        got = fut.result() if fut is not None else None
        if got is not None:
            usd, source, as_of = got[0], "live", got[1]
    if usd is None:
        p = catalog.instance(s.instance).price_for("spot" if req.spot else "on-demand", region)
        if p is not None and p.usd_per_hour:
            usd, as_of = p.usd_per_hour, p.as_of
    hours = _hours(row, req.spot)
    transfer = _transfer(row, region, data)
    total = None
    if usd is not None and hours is not None:
        total = usd * s.nodes * (hours + (transfer[2] if transfer else 0)) + (transfer[1] if transfer else 0)
    return _Choice(region, rep, usd, source, as_of, hours, transfer, total)


def _price(provider: AwsProvider, region: str, itype: str) -> tuple[float, str | None] | None:
    try:
        fact, _ = provider.on_demand_price(region, itype)
    except CallFailed:
        return None
    return (fact.usd_per_hour, fact.as_of) if fact.usd_per_hour else None


def _hours(row: PlanRow, spot: bool) -> float | None:
    """Wall-clock hours the row's cost is for: the run (--tokens) or 1B tokens, with its overheads."""
    e = row.estimate
    if spot and e.cost.spot_hours is not None:
        return e.cost.spot_hours
    if not spot and e.time.train_hours is not None:
        return e.time.train_hours
    tps = e.throughput.tokens_per_s
    if not tps:
        return None
    compute_h = e.time.compute_hours if e.time.compute_hours is not None else 1e9 / tps / 3600
    return compute_h * (1 + e.time.overhead_fraction)  # the overhead of the setup's own mode (spot or not)


def _tokens(row: PlanRow) -> float:
    e = row.estimate
    return e.time.compute_hours * 3600 * e.throughput.tokens_per_s if e.time.compute_hours is not None else 1e9


def _transfer(row: PlanRow, region: str, data: DataLocation | None) -> tuple[float, float, float] | None:
    """(GB, USD, hours) that cross from the data bucket's region to `region`, or None when it is the same."""
    if data is None or data.region is None or data.region == region:
        return None
    t = aws_limits().transfer
    e = row.estimate
    st = e.storage
    if data.bytes is not None:
        dataset_gb = data.bytes / 1e9
    else:  # not listable: what the run reads, as token ids
        dataset_gb = _tokens(row) * st.dataset_bytes_per_token / 1e9
    ckpt_gb = (st.checkpoints_written * st.checkpoint_gb if st.checkpoints_written is not None
               else st.archive_gb_per_billion_tokens)
    gb = dataset_gb + ckpt_gb
    # the dataset is read across regions at the assumed rate; checkpoints upload in the background
    hours = dataset_gb * 8 / (t.cross_region_gbps_per_node * e.setup.nodes) / 3600
    return gb, gb * t.inter_region_usd_per_gb, hours


def _row(row: PlanRow, req: LiveRequest, c: _Choice, *, attainable: bool | None, reasons: list[str],
         quota_code: str | None, headroom: float | None, azs: list[str], score: int | None,
         block: CapacityBlockOffer | None) -> LiveRow:
    s = row.estimate.setup
    worst_h, worst_usd = _worst(row, req, c)
    if c.transfer:
        gb, usd, hours = c.transfer
        reasons = [*reasons, f"data in another region: {gb:,.0f} GB cross regions "
                             f"(${aws_limits().transfer.inter_region_usd_per_gb}/GB), ~{hours:.1f} h to read the "
                             f"dataset "
                             f"at an assumed {aws_limits().transfer.cross_region_gbps_per_node:g} Gbit/s per node"]
    if c.source == "catalog":
        reasons = [*reasons, f"no live {'spot' if req.spot else 'on-demand'} price for {s.instance} in "
                             f"{c.region}: catalog price"]
    return LiveRow(attainable=attainable, reasons=reasons, price_source=c.source, price_as_of=c.as_of,  # type: ignore
                   region=c.region, usd_per_hour=c.usd_per_hour, total_usd=c.total, worst_case_usd=worst_usd,
                   worst_case_hours=worst_h, quota_code=quota_code, quota_headroom_vcpus=headroom, azs=azs,
                   spot_score=score, capacity_block=block,
                   transfer_gb=c.transfer[0] if c.transfer else None,
                   transfer_usd=c.transfer[1] if c.transfer else None,
                   transfer_hours=c.transfer[2] if c.transfer else None)


def _worst(row: PlanRow, req: LiveRequest, c: _Choice) -> tuple[float | None, float | None]:
    """(hours, USD) at the 90th percentile of interruptions; never below the expected."""
    e, s = row.estimate, row.estimate.setup
    if c.hours is None:
        return None, None
    compute_h = c.hours / (1 + e.time.overhead_fraction)
    mtbf = rel.job_mtbf_h(s.nodes, s.gpus_per_node, req.spot, req.spot_mtbf_h)
    restart = rel.RESTART_S["spot" if req.spot else "on-demand"]
    hours = max(c.hours, worst_case_hours(compute_h, e.time.checkpoint_stall_s, e.time.checkpoint_interval_s, mtbf,
                                          restart))
    extra_h = c.transfer[2] if c.transfer else 0.0
    if c.usd_per_hour is None:
        return hours + extra_h, None
    usd = c.usd_per_hour * s.nodes * (hours + extra_h) + (c.transfer[1] if c.transfer else 0.0)
    return hours + extra_h, max(usd, c.total or 0.0)


def _catalog_row(row: PlanRow, catalog: Catalog, req: LiveRequest, reasons: list[str]) -> LiveRow:
    e, s = row.estimate, row.estimate.setup
    usd = e.cost.usd_per_hour
    hours = _hours(row, req.spot)
    total = usd * s.nodes * hours if usd and hours else None
    c = _Choice(e.cost.pricing.region, None, usd, "catalog", e.cost.pricing.as_of, hours, None, total)
    return _row(row, req, c, attainable=None, reasons=reasons, quota_code=None, headroom=None, azs=[], score=None,
                block=None).model_copy(update={"reasons": reasons})


def _block(rep: RegionReport | None) -> CapacityBlockOffer | None:
    if rep is None or not rep.capacity_blocks:
        return None
    b = rep.capacity_blocks[0]
    return CapacityBlockOffer(start=b.start, end=b.end, instance_count=b.instance_count,
                              duration_hours=b.duration_hours,
                              upfront_fee_usd=b.upfront_fee_usd, availability_zone=b.availability_zone)


def _rerank(rows: list[PlanRow], by: str, spot: bool) -> list[PlanRow]:
    def key(r: PlanRow) -> tuple[int, float, float]:
        x = r.live
        launch = {True: 0, None: 1, False: 2}[x.attainable if x else None]  # what launches now comes first
        if by == "time":
            h = _hours_of(r, spot)
            return (launch, h if h is not None else float("inf"), 0.0)
        cost = x.total_usd if x and x.total_usd is not None else float("inf")
        return (launch, cost, -r.estimate.throughput.tokens_per_s)

    ranked = sorted(rows, key=key)
    out = []
    first = ranked[0] if ranked else None
    for i, r in enumerate(ranked, start=1):
        facts = r.why.split("; ", 1)[1] if "; " in r.why else r.why
        if i == 1:
            head = ("cheapest" if by == "cost" else "fastest") + (" that can launch now (live)" if r.live and
                                                                  r.live.attainable else " (live; see below)")
        elif by == "cost" and first.live and first.live.total_usd and r.live and r.live.total_usd:
            head = f"+{(r.live.total_usd / first.live.total_usd - 1) * 100:.0f}% cost vs #1 (live)"
        else:
            head = r.why.split("; ", 1)[0]
        out.append(r.model_copy(update={"rank": i, "why": f"{head}; {facts}"}))
    return out


def _hours_of(r: PlanRow, spot: bool) -> float | None:
    """Wall-clock hours to rank by time: the same hours the row's cost counts (a spot row's include its
    interruptions), plus moving the data to the row's region."""
    base = _hours(r, spot)
    if base is None:
        return None
    return base + (r.live.transfer_hours or 0.0 if r.live else 0.0)


def _data(provider: AwsProvider, url: str, notes: list[str]) -> DataLocation:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    region = size = None
    try:
        region = provider.bucket_region(bucket)[0].value
    except CallFailed as exc:
        notes.append(f"--data {printable(url)}: its region is unknown ({exc.reason}): no data gravity counted")
    try:
        size = provider.bucket_size(bucket, prefix)[0]
        if not size.complete:
            notes.append(f"--data {printable(url)}: more than {size.objects:,} objects; its size counts the first ones")
    except CallFailed as exc:
        notes.append(f"--data {printable(url)}: its size is unknown ({exc.reason}): the tokens the run reads count")
    return DataLocation(url=url, region=region, bytes=size.bytes if size else None,
                        objects=size.objects if size else None)
