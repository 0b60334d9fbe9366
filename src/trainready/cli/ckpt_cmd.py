"""`trainready ckpt ls|verify|pull|prune`: checkpoints seen from outside a job."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

from trainready.errors import UsageError, printable

from . import options as o
from .console import emit_json, err, out, progress
from .render_ckpt import (
    plain,
    render_ckpt_list,
    render_ckpt_prune,
    render_ckpt_prune_plan,
    render_ckpt_pull,
    render_ckpt_verify,
)

WHERE = ("URL is a local directory (a node's hot tier, or a local archive) or an fsspec URL such as "
         "s3://bucket/prefix (AWS_ENDPOINT_URL_S3 for other S3 endpoints) or file:///path.")
CODES = ("Exit codes: 0 ok; 1 a checkpoint is damaged: a file missing, the wrong size or checksum, or its "
         "manifest or directory unreadable or a symlink (verify, ls --verify, pull; also when you name its step); "
         "2 usage error (bad option, an empty URL or --to, no checkpoint at that step or only an uncommitted one "
         "(with the nearest steps), location missing or unreadable (an invalid or missing bucket, an S3 prefix with "
         "nothing under it), an unknown --run-id, pull target exists or cannot be written, prune of an archive "
         "without --yes when stdin is not a terminal); 3 internal error. ls without --verify checks nothing and "
         "exits 0.")

app = typer.Typer(no_args_is_help=True, help=f"List, verify, copy and prune checkpoints. {WHERE}\n\n{CODES}")

Url = Annotated[str, typer.Argument(metavar="URL", help="Local directory or fsspec URL (s3://bucket/prefix).", show_default=False)]


@app.command("ls", short_help="Every checkpoint, committed or not, with size, age and run.", help=f"Every checkpoint directory, committed or not, oldest first. {WHERE}\n\n{CODES}")
def ls(url: Url,
       verify: Annotated[bool, typer.Option("--verify", help="Check every file's size against the manifest (sizes only, no data read: a changed byte is not seen; `ckpt verify` compares SHA-256); exit 1 if one is off or a checkpoint is unreadable.")] = False,
       json_out: o.Json = False) -> None:
    from trainready.store.inspect import list_checkpoints

    listing = list_checkpoints(url, verify=verify)
    if json_out:
        emit_json(listing)
    else:
        render_ckpt_list(out, listing)
    if any(c.verified is False for c in listing.checkpoints):
        raise typer.Exit(1)


@app.command("verify", short_help="Check files against the manifest: sizes and SHA-256.", help="Check committed checkpoints (all, or those at --step): every file present, with its "
             f"size and SHA-256 as the manifest says. {WHERE}\n\n{CODES}")
def verify(url: Url,
           step: Annotated[Optional[int], typer.Option("--step", min=0, help="Only the checkpoint(s) at this step. (default: every committed one)")] = None,
           checksums: Annotated[bool, typer.Option("--checksums/--no-checksums", help="Read every file and compare its SHA-256 (--no-checksums: sizes only, fast).")] = True,
           json_out: o.Json = False) -> None:
    from trainready.store.inspect import verify_checkpoints

    with progress("verifying (SHA-256)", as_json=json_out or not checksums, unit="bytes") as sink:  # sizes: quick
        report = verify_checkpoints(url, step=step, checksums=checksums, on_progress=sink.advance,
                                    on_total=sink.set_total)
    if json_out:
        emit_json(report)
    else:
        render_ckpt_verify(out, report)
    if not report.ok:
        raise typer.Exit(1)


@app.command("pull", short_help="Copy one checkpoint to a local directory, checksummed and atomic.", help="Copy the committed checkpoint at --step (its newest generation; without --step the newest "
             "committed checkpoint) to TO/<name>: every file checked against its SHA-256, the manifest written last, "
             f"then an atomic rename; an existing target is never overwritten. {WHERE}\n\n{CODES}")
def pull(url: Url,
         dest: Annotated[Optional[str], typer.Argument(metavar="[DIR]", help="Directory to copy into (created if missing), as `cp SRC DIR`; or --to.", show_default=False)] = None,
         to: Annotated[Optional[str], typer.Option("--to", help="Directory to copy into (created if missing); the same as the DIR argument.", show_default=False)] = None,
         step: Annotated[Optional[int], typer.Option("--step", min=0, help="Step to copy. (default: the newest committed checkpoint)", show_default=False)] = None,
         json_out: o.Json = False) -> None:
    from trainready.store.inspect import pull as run_pull

    if dest is not None and to is not None and os.path.normpath(dest) != os.path.normpath(to):
        raise UsageError(f"two destinations: DIR {printable(dest)} and --to {printable(to)}; give one")
    to = dest if dest is not None else to
    if to is None:
        raise UsageError("no destination: give it after the location, as cp does (trainready ckpt pull URL DIR), "
                         "or with --to DIR")

    with progress("pulling", as_json=json_out, unit="bytes") as sink:
        result = run_pull(url, step, to, on_progress=sink.advance, on_total=sink.set_total)
    if json_out:
        emit_json(result)
    else:
        render_ckpt_pull(out, result, newest=step is None)


@app.command("prune", short_help="Delete old checkpoints and debris, keeping the newest --keep.", help="Delete all but the newest --keep committed checkpoints of the run that owns the location "
             "(the writer lease's run, or --run-id), plus uncommitted debris older than the newest committed one (a "
             "newer one may still be being written): the same rule the checkpoint manager applies. The newest "
             "committed checkpoint is never deleted; only checkpoints that pass the size check count toward --keep, "
             "and those that fail it are left alone; unreadable manifests, fenced commits and other runs' "
             "checkpoints are never deleted. On an archive (a URL: s3://, file://) it lists what it will delete and "
             "asks first, unless --yes; with stdin not a terminal it refuses without --yes. "
             f"{WHERE}\n\n{CODES}")
def prune(url: Url,
          keep: Annotated[int, typer.Option("--keep", min=1, help="Committed checkpoints to keep.", show_default=False)],
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be deleted; delete nothing.")] = False,
          run_id: Annotated[Optional[str], typer.Option("--run-id", help="Whose checkpoints to prune. (default: the run the writer lease names)")] = None,
          yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete from an archive without asking.")] = False,
          json_out: o.Json = False) -> None:
    from trainready.store.inspect import prune as run_prune

    archive = "://" in url  # the durable copy: deleting there is for good, so ask first
    result = run_prune(url, keep, dry_run=dry_run, run_id=run_id, confirm=None if yes or not archive else _ask)
    if json_out:
        emit_json(result)
    else:
        render_ckpt_prune(out, result)


def _ask(names: list[str], url: str) -> bool:
    """Confirm deleting from an archive on a terminal; without one, refuse (exit 2): say --yes."""
    if not sys.stdin.isatty():
        raise UsageError(f"prune deletes from the archive {url} for good and asks first, but stdin is not a "
                         "terminal: pass --yes (or --dry-run to see what it would delete)")
    if not names:
        return True
    render_ckpt_prune_plan(err, names, url)
    err.print(f"Delete these {len(names)} from {plain(url)}? [y/N] ", end="")  # stdout stays the result's alone
    answer = sys.stdin.readline()  # Ctrl-C: exit 130, nothing deleted
    if not answer:  # end of input
        err.print()
    return answer.strip().lower() in ("y", "yes")
