"""Rich renderers for `account` and for the live part of `plan --live`: one line per check, status
first; commands printed to paste (` \\` continuations, never folded by the terminal)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainready.cloud.report import AccountReport, RegionReport, Status
from trainready.errors import printable
from trainready.plan.search import PlanResult
from trainready.plan.units import hours_text, usd_text

from .console import line, styled
from .render import shell_lines

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}


def _status(status: Status) -> Text:
    return styled(status, STYLE[status])


class _Lines:
    """Status | text rows with a hanging indent: a long reason folds under itself, not under the status."""

    def __init__(self, indent: int = 2):
        self.grid = Table.grid(padding=(0, 1))
        self.grid.add_column(width=indent) if indent else None
        self.grid.add_column(width=7, no_wrap=True)
        self.grid.add_column(overflow="fold")
        self.indent = indent

    def add(self, status: Status, text: str | Text) -> None:
        # the reasons quote what an endpoint answered: control and bidi characters go escaped (errors.printable)
        cells = [_status(status), Text(printable(text.plain), style=text.style) if isinstance(text, Text)
                 else Text(printable(text))]
        self.grid.add_row(*([""] if self.indent else []), *cells)

    def print(self, con: Console) -> None:
        if self.grid.row_count:
            con.print(self.grid)


def _command(con: Console, command: str, indent: str = "    ") -> None:
    text = shell_lines(command, max(con.width, 40) - len(indent))
    con.print(Text("\n".join(indent + ln for ln in text.split("\n"))), soft_wrap=True)


def render_account(con: Console, r: AccountReport) -> None:
    con.print(line(("account ", "bold"), (printable(r.identity.account or "?"), "bold"),
                   f"  {printable(r.identity.arn or '')}"))
    need = f"{r.vcpus_needed:,} vCPUs ({r.vcpus_per_instance} per instance)" if r.vcpus_needed else "vCPUs unknown"
    length = f", {hours_text(r.hours)}" if r.hours else ""
    con.print(f"{r.nodes} x {r.instance} {r.purchase}{length}: {need}")
    not_offered = [x.region for x in r.regions if _only_not_offered(x)]
    for region in r.regions:
        if region.region not in not_offered:
            _region(con, region)
    con.print()
    rows = _Lines(indent=0)
    if not_offered:
        rows.add("fail", f"{r.instance} is not offered in: {', '.join(not_offered)}")
    rows.add(r.budget.status, f"budget: {r.budget.reason}")
    for p in r.permissions:
        rows.add(p.status, f"archive {p.action}: {p.reason}")
    for q in r.quota_requests:
        rows.add(q.status, f"quota request {q.region} {q.code} -> {q.desired_vcpus} vCPUs: {q.reason}"
                           + (f" (id {q.request_id})" if q.request_id else ""))
    rows.print(con)
    if r.budget.command:
        _command(con, r.budget.command, indent="    ")
    for n in [*r.notes, *r.cache.notes]:
        con.print(styled(printable(n), "dim"))
    cached = f"; {r.cache.hits} answer(s) from the cache" if r.cache.hits else ""
    verdict = _Lines(indent=0)
    verdict.add(r.status, Text(r.reason, style="bold"))
    verdict.print(con)
    con.print(styled(f"checked {r.checked_at} in {r.seconds:.1f} s{cached}", "dim"))


def _only_not_offered(r: RegionReport) -> bool:
    return r.offerings.status == "fail" and not r.offerings.azs and all(q.status != "fail" for q in r.quotas)


def _region(con: Console, r: RegionReport) -> None:
    con.print()
    con.print(line((r.region, "bold"), "  ", _status(r.status)))
    rows = _Lines()
    for q in r.quotas:
        rows.add(q.status, f"quota {q.code} {q.name}: {q.reason}")
    o = r.offerings
    azs = f" ({', '.join(o.azs)})" if o.azs else ""
    rows.add(o.status, f"offerings: {o.reason}{azs}")
    # RunInstances and what is denied; a call that failed otherwise already says so on its own line
    shown = [p for p in r.permissions if p.action == "ec2:RunInstances" or p.status in ("fail", "warn")]
    for p in shown:
        rows.add(p.status, f"{p.action}: {p.reason}")
    allowed = sum(1 for p in r.permissions if p not in shown and p.status == "ok")
    if allowed:
        rows.add("ok", f"{allowed} other call(s) allowed")
    rows.add(r.spot.status, f"spot: {r.spot.reason}")
    rows.add(r.capacity.status, f"capacity: {r.capacity.reason}")
    rows.print(con)
    for q in r.quotas:
        if q.status == "fail" and q.request_command:
            _command(con, q.request_command)


def render_live(con: Console, r: PlanResult) -> None:
    """The live columns of `plan --live`: where each row can launch now, at what price, and its worst case."""
    live = r.live
    if live is None:
        return
    con.print()
    head = f"Live ({live.provider}, {', '.join(live.regions) or 'no region'})"
    con.print(line((head, "bold"), f": {live.reason}"))
    for row in r.rows:
        x = row.live
        if x is None:
            continue
        s = row.estimate.setup
        state = {True: ("launchable", "green"), False: ("blocked", "bold red"),
                 None: ("unchecked", "dim")}[x.attainable]
        price = f"{usd_text(x.usd_per_hour)}/h {x.price_source}" if x.usd_per_hour else "no price"
        where = f" in {x.region}" if x.region else ""
        cost = f"expected {usd_text(x.total_usd)}, p90 {usd_text(x.worst_case_usd)}" if x.total_usd else ""
        con.print(line(f"  #{row.rank} {s.nodes} x {s.instance}{where}: ", state, f"; {price}; {cost}".rstrip("; ")))
        facts = []
        if x.quota_headroom_vcpus is not None:
            facts.append(f"quota headroom {x.quota_headroom_vcpus:,.0f} vCPUs")
        if x.azs:
            facts.append(f"AZs {', '.join(x.azs)}")
        if x.spot_score is not None:
            facts.append(f"spot score {x.spot_score}/10")
        if x.capacity_block:
            b = x.capacity_block
            fee = usd_text(b.upfront_fee_usd) if b.upfront_fee_usd is not None else "a fee in another currency"
            facts.append(f"Capacity Block {b.instance_count} x {b.duration_hours or '?'} h from {b.start[:16]} "
                         f"in {b.availability_zone or '?'} for {fee}")
        if x.transfer_usd:
            facts.append(f"data gravity +{usd_text(x.transfer_usd)}, +{hours_text(x.transfer_hours or 0)}")
        # offline, every AWS row's reason is the plan's one line above: not repeated per row
        said = [] if live.live else [t for t in x.reasons if t.startswith("not checked live: ")]
        for text in ([("; ".join(facts))] if facts else []) + [t for t in x.reasons if t not in said]:
            con.print(styled(f"     {text}", "dim"))
    for note in live.notes:
        con.print(styled(note, "dim"))
