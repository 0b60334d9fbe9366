"""Rich renderers for `trainready ckpt`. Names, URLs and problems come from disks and libraries:
they are printed as Text (never markup) with control characters shown as \\xNN."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from trainready.cli.console import line, styled
from trainready.cli.render import _age, _Grid, _size, _table
from trainready.errors import printable as plain  # names, URLs, problems from disks and libraries

if TYPE_CHECKING:  # the store loads only for `ckpt`
    from trainready.store.inspect import CheckpointListing, PruneResult, PullResult, VerifyReport


def render_ckpt_list(con: Console, listing: CheckpointListing) -> None:
    items = listing.checkpoints
    url = plain(listing.url)
    if not items:
        con.print(f"no checkpoints in {url}")
        _lease_warning(con, listing)
        return
    sizes = "; sizes checked, no data read" if listing.checked == "sizes" else ""
    con.print(f"Checkpoints in {url} ({items[0].tier}{sizes})")  # as wide as the screen, not the table
    t = _Grid("", ["step", "gen", "commit", "check", "size", "files", "world", "age", "run"],
              left=("commit", "check", "run"))  # every cell whole: a run id never folds, columns go instead
    styles = {"committed": styled("yes", "green"), "uncommitted": styled("no", "yellow"),
              "unreadable": styled("unreadable", "red"), "fenced": styled("fenced", "red")}
    for c in items:
        committed = styles.get(c.status, plain(c.status))
        verified = "-" if c.verified is None else (styled("size ok", "green") if c.verified else
                                                    styled("size BAD" if c.committed else "damaged", "red"))
        world = "-" if c.world_size is None else str(c.world_size) + (f" (node {c.node})" if c.node is not None else "")
        unknown = c.status == "unreadable" and not c.files  # nothing could be seen inside it
        t.add_row(f"{c.step:,}", str(c.generation), committed, verified, "-" if unknown else _size(c.size_bytes),
                  "-" if unknown else str(c.files), world, _age(c.created_unix), plain(c.run_id or "-"))
    unchecked = ("check",) if listing.checked != "sizes" else ()  # all "-": says nothing
    t.print_fitted(con, (*unchecked, "files", "age", "gen", "world"))
    for c in items:
        if c.problem:
            con.print(line(f"  {plain(c.name)}: ", (plain(c.problem), "red" if c.committed else "")))
    done = [c for c in items if c.committed]
    summary = line(f"{len(done)} committed ({_size(sum(c.size_bytes for c in done))})")
    unreadable = sum(c.status == "unreadable" for c in items)
    if len(done) + unreadable < len(items):
        summary.append(f", {len(items) - len(done) - unreadable} not committed (being written, or debris from an "
                       "interrupted save)")
    if unreadable:
        summary.append_text(line(", ", (f"{unreadable} unreadable", "red"),
                                 " (kept, never deleted automatically)"))
    fenced = sum(c.status == "fenced" for c in items)
    if fenced:
        summary.append_text(line(", ", (f"{fenced} fenced", "red"), " (never restored)"))
    bad = [c for c in done if c.verified is False]
    if bad:
        summary.append_text(line("; ", (f"{len(bad)} failed the size check", "red")))
    con.print(summary)
    if listing.checked == "sizes":
        con.print(f"sizes only: a changed byte keeps its size; `trainready ckpt verify {url}` compares every "
                  "file's SHA-256")
    _lease_warning(con, listing)


def _lease_warning(con: Console, listing: CheckpointListing) -> None:
    if listing.lease_problem:
        con.print(line(("warning:", "yellow"), f" {plain(listing.lease_problem)} (a job rebuilds it at its next start)"))


def render_ckpt_verify(con: Console, report: VerifyReport) -> None:
    how = "sizes and SHA-256 checksums" if report.checksums else "sizes only"
    if not report.checkpoints:
        con.print(styled(plain(report.problem), "red"))
        return
    con.print(f"Verified in {plain(report.url)} ({how})")
    t = _table("")
    for col in ("name", "files", "size", "result"):
        t.add_column(col, justify="right" if col in ("files", "size") else "left", no_wrap=True)
    for c in report.checkpoints:
        t.add_row(plain(c.name), str(c.files), _size(c.size_bytes),
                  styled("ok", "green") if c.ok else styled(f"{len(c.problems)} problem(s)", "red"))
    con.print(t)
    for c in report.checkpoints:
        for p in c.problems:
            con.print(line((plain(c.name), "red"), f": {plain(p)}"))
    bad = sum(not c.ok for c in report.checkpoints)
    con.print(styled(f"all {len(report.checkpoints)} intact", "green") if not bad
              else styled(f"{bad} of {len(report.checkpoints)} damaged", "red"))


def render_ckpt_pull(con: Console, r: PullResult, newest: bool = False) -> None:
    which = f"step {r.step:,}, the newest committed; " if newest else ""
    con.print(f"pulled {plain(r.name)} ({which}{r.files} files, {_size(r.size_bytes)}, every checksum matched) from "
              f"{plain(r.url)} to {plain(r.path)} in {r.seconds:,.1f} s")


def render_ckpt_prune_plan(con: Console, names: list[str], url: str) -> None:
    """What prune is about to delete, before it asks."""
    con.print(f"prune would delete {len(names)} from {plain(url)} (for good):")
    for name in names:
        con.print(f"  {plain(name)}")


def render_ckpt_prune(con: Console, r: PruneResult) -> None:
    verb = "would delete" if r.dry_run or r.cancelled else "deleted"
    con.print(f"{verb} {len(r.deleted)}: " + (plain(", ".join(r.deleted)) or "nothing"))
    con.print(f"kept {len(r.kept)}: " + (plain(", ".join(r.kept)) or "nothing"))
    if r.untouched:
        owner = f"of another run than {plain(r.run_id)}" if r.run_id else "of another run"
        con.print(f"never deleted automatically (unreadable manifest, fenced commit, or {owner}): "
                  + plain(", ".join(r.untouched)))
    for name in r.broken:
        con.print(line(("warning:", "yellow"), f" {plain(name)} is committed but fails the size check: kept, not "
                       f"counted toward --keep {r.keep} (trainready ckpt verify {plain(r.url)} for details)"))
    if r.dry_run:
        con.print(styled("dry run: nothing was deleted", "dim"))
    elif r.cancelled:
        con.print(styled("not confirmed: nothing was deleted", "yellow"))
