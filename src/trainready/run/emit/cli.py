"""`trainready run --emit KIND`: the same options, rendered as a launch file (emit/__init__.py)."""

from __future__ import annotations

import re
from pathlib import Path

from trainready.errors import UsageError, closest, printable
from trainready.io import redact

from .. import preflight
from ..configure import RunOptions, default_run_dir
from . import EMIT_KINDS, build_spec, emit
from .node import suggest_name

CLUSTER_KINDS = ("k8s", "jobset", "pcluster")
# which kinds take each cluster option (docs/emit.md's table): named in the message for a kind that does not
TAKEN_BY = {"image": "k8s, jobset", "service_account": "k8s, jobset", "aws_secret": "k8s, jobset",
            "shared_fs": "pcluster", "capacity_reservation": "pcluster", "queue": "k8s, jobset, pcluster and slurm"}


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# which kinds take --workdir, and how: named in the message for a kind that does not
WORKDIR_NOT = {"k8s": "a TrainJob's trainer has no working directory: set WORKDIR in the image (or use --emit jobset)",
               "pcluster": "a cluster config starts no job: give --workdir to the job file (--emit slurm)"}


def parse_env(pairs: list[str]) -> dict[str, str]:
    """--env KEY=VALUE, repeated: a name as the shells take it; the same name twice with two values is refused."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.fullmatch(name):
            raise UsageError(f"--env '{printable(redact(pair))}': give NAME=VALUE, NAME letters, digits and '_' not "
                             "starting with a digit (e.g. --env NCCL_DEBUG=WARN)")
        if name in out and out[name] != value:
            raise UsageError(f"--env {name} given twice with different values: give it once")
        out[name] = value
    return out


def default_workdir(kind: str, command: list[str]) -> str | None:
    """SkyPilot copies `workdir` to every node: the current directory when the command names a file in it (as
    `python train.py` does), so the script reaches the nodes; None otherwise (the script is on the nodes already)."""
    if kind != "skypilot":
        return None
    for word in command[1:]:
        path = Path(word)
        if not path.is_absolute() and ".." not in path.parts and path.is_file():
            return "."
    return None


def emit_for(kind: str, opts: RunOptions, *, workdir: str | None = None, env: list[str] | None = None,
             **cluster: str | None) -> str:
    """`cluster`: the EmitSpec fields of the cluster kinds (image, queue, service_account, aws_secret, shared_fs,
    capacity_reservation), None where not given. `workdir`/`env`: --workdir and --env as given."""
    if kind not in EMIT_KINDS:
        near = closest(kind, EMIT_KINDS)
        raise UsageError(f"--emit {kind!r}: valid kinds are {', '.join(EMIT_KINDS)}"
                         f"{f'. Did you mean: {near[0]}?' if near else ''}")
    allowed = {"slurm": ("queue",)}.get(kind, cluster if kind in CLUSTER_KINDS else ())
    for key, value in cluster.items():
        if value is not None and key not in allowed:
            raise UsageError(f"--{key.replace('_', '-')} does not apply to --emit {kind} (it is for "
                             f"{TAKEN_BY.get(key, ', '.join(CLUSTER_KINDS))})")
    if workdir is not None and kind in WORKDIR_NOT:
        raise UsageError(f"--workdir does not apply to --emit {kind}: {WORKDIR_NOT[kind]}")
    if env and kind == "pcluster":
        raise UsageError("--env does not apply to --emit pcluster: a cluster config starts no job; give --env to the "
                         "job file (--emit slurm)")
    if not opts.command:  # the script lives on the cluster: only its presence is checked here
        raise UsageError("no training command: put it after `--`, e.g. trainready run --emit slurm -- python train.py")
    host, port = None, 29500
    if opts.rdzv_endpoint:
        preflight.check_rendezvous(max(opts.nnodes, 1), 0, opts.rdzv_endpoint)
        host, _, port_text = opts.rdzv_endpoint.rpartition(":")
        port = int(port_text)
    if opts.instance:
        from trainready.catalog import load_catalog

        load_catalog().instance(opts.instance)  # unknown -> "did you mean"
    # not given, or 'gpu': one worker per GPU of the instance (node.procs_per_node), not the single worker of a local run
    given = opts.nproc_per_node
    if given is not None and given != "gpu" and not (given.isascii() and given.isdigit()):
        raise UsageError(f"--nproc-per-node '{printable(given)}': a number >= 1, or 'gpu'")
    nproc = int(given) if given is not None and given != "gpu" else None
    spec = build_spec(command=opts.command, nnodes=opts.nnodes, nproc_per_node=nproc, rdzv_port=port,
                      rdzv_id=opts.rdzv_id, head_host=host, instance=opts.instance, spot=opts.spot,
                      region=opts.region, job=str(opts.job) if opts.job else None, max_restarts=opts.max_restarts,
                      hot=opts.hot, archive=opts.archive, ckpt_every=opts.ckpt_every or "auto", usd_per_hour=opts.usd_per_hour,
                      budget_usd=opts.budget_usd, run_dir=str(opts.run_dir) if opts.run_dir else None,
                      cloud="aws" if opts.instance and "." in opts.instance else None,
                      workdir=workdir if workdir is not None else default_workdir(kind, opts.command),
                      env=parse_env(env or []),
                      **{k: v for k, v in cluster.items() if v is not None}, **_cluster_name(kind, opts))
    return emit(kind, spec)


def _cluster_name(kind: str, opts: RunOptions) -> dict[str, str]:
    """The cluster kinds name their objects after --run-dir's last part, else the script (lowercase, '-')."""
    if kind not in CLUSTER_KINDS:
        return {}
    stem = (opts.run_dir or default_run_dir(opts.command)).name
    return {"job_name": suggest_name(stem, 40, fallback="trainready")}
