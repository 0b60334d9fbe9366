"""`trainready run --emit KIND`: the same options, rendered as a launch file (emit.py)."""

from __future__ import annotations

from trainready.errors import UsageError, closest

from . import preflight
from .configure import RunOptions
from .emit import EMIT_KINDS, build_spec, emit


def emit_for(kind: str, opts: RunOptions) -> str:
    if kind not in EMIT_KINDS:
        near = closest(kind, EMIT_KINDS)
        raise UsageError(f"--emit {kind!r}: valid kinds are {', '.join(EMIT_KINDS)}"
                         f"{f'. Did you mean: {near[0]}?' if near else ''}")
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
    nproc = int(opts.nproc_per_node) if opts.nproc_per_node.isdigit() else None
    spec = build_spec(command=opts.command, nnodes=opts.nnodes, nproc_per_node=nproc, rdzv_port=port,
                      rdzv_id=opts.rdzv_id, head_host=host, instance=opts.instance, spot=opts.spot,
                      region=opts.region, job=str(opts.job) if opts.job else None, max_restarts=opts.max_restarts,
                      hot=opts.hot, archive=opts.archive, ckpt_every=opts.ckpt_every or "auto", usd_per_hour=opts.usd_per_hour,
                      budget_usd=opts.budget_usd, run_dir=str(opts.run_dir) if opts.run_dir else None,
                      cloud="aws" if opts.instance and "." in opts.instance else None)
    return emit(kind, spec)
