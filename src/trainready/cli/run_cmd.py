"""`trainready run [options] -- python train.py ARGS`: launch on torchrun, watch, budget, resume.
`trainready report RUN_DIR`: what a run did (finished or still running)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trainready.run.settings import RunSettings

from . import options as o
from .console import emit_json, err, out

CODES = ("Exit codes: 0 training finished (or --emit/--scaling done); 1 a worker failed and --max-restarts ran out "
         "(its last log lines and a diagnosis are shown); 2 usage error (bad option, missing script, unknown instance, "
         "budget below one step, archive without credentials or unreachable, a run directory holding another command's "
         "run without --resume), nothing started; 3 internal error; "
         "4 stopped by the budget guard after a final checkpoint; 128+N interrupted by signal N (130 SIGINT, "
         "143 SIGTERM) after a final checkpoint.")
HELP = ("Run a training command on torchrun with checkpoints, telemetry, a live view and a budget guard. Workers get "
        "their settings as TRAINREADY_* variables (trainready.init() reads them); the run directory holds run.json, "
        "telemetry.jsonl, logs/ and summary.json. Run the same command again to resume (a changed command needs "
        "--resume); a run that reached its total_steps is not launched again unless --resume.\n\n" + CODES)
REPORT_HELP = ("Summarize a run directory: steps, throughput, MFU, where the time went, checkpoints, cost, how it "
               "ended. Works while the run is going. --html FILE writes the same as one self-contained page with "
               "charts (docs/run.md). Exit codes: 0 ok; 2 not a run directory; 3 internal error.")

LAUNCH, CKPT, COST, MODES = "Launch", "Checkpoints", "Cost", "Other modes"
CLUSTER = "Cluster (--emit k8s, jobset, pcluster)"


def run(command: Annotated[Optional[list[str]], typer.Argument(metavar="-- COMMAND...", help="The training command, after `--`.", show_default=False)] = None,
        nproc_per_node: Annotated[Optional[str], typer.Option("--nproc-per-node", help="Worker processes on this node: a number or 'gpu'. [default: 1; with --emit, one per GPU of --instance]", rich_help_panel=LAUNCH)] = None,
        nnodes: Annotated[int, typer.Option("--nnodes", help="Nodes in the job.", rich_help_panel=LAUNCH)] = 1,
        node_rank: Annotated[int, typer.Option("--node-rank", help="This node's rank (0 on the first node).", rich_help_panel=LAUNCH)] = 0,
        rdzv_endpoint: Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (the first node); needed with --nnodes > 1.", rich_help_panel=LAUNCH)] = None,
        rdzv_id: Annotated[Optional[str], typer.Option("--rdzv-id", help="Rendezvous id, the same on every node.", rich_help_panel=LAUNCH)] = None,
        max_restarts: Annotated[Optional[int], typer.Option("--max-restarts", help="Restart the workers this many times after a failure (they resume from the newest checkpoint). [default: 0; with --emit, 3 for a multi-node or spot job]", rich_help_panel=LAUNCH)] = None,
        run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory; with --nnodes > 1 each node uses RUN_DIR/node<R>. [default: runs/<script name>]", rich_help_panel=LAUNCH)] = None,
        resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --run-dir even though the command differs from the one that started it (without it, a different command there is refused).", rich_help_panel=LAUNCH)] = False,
        grace: Annotated[float, typer.Option("--grace", parser=o.number_for(RunSettings, "grace_s", "120"), help="Seconds from SIGINT/SIGTERM to exit: the final checkpoint and its upload (spot gives 120).", rich_help_panel=LAUNCH)] = 100.0,
        show_ranks: Annotated[str, typer.Option("--show-ranks", help="Local ranks whose output is echoed here, e.g. 0 or 0,1 (all go to the logs).", rich_help_panel=LAUNCH)] = "0",
        log_to: Annotated[Optional[str], typer.Option("--log-to", help="Also write the per-step metrics to tensorboard, mlflow and/or wandb (comma-separated; files in the run directory, W&B offline; each needs its extra, e.g. trainready[mlflow]).", rich_help_panel=LAUNCH)] = None,
        hot: Annotated[Optional[str], typer.Option("--hot", help="Hot checkpoint tier (the node's NVMe). [default: RUN_DIR/checkpoints]", rich_help_panel=CKPT)] = None,
        archive: Annotated[Optional[str], typer.Option("--archive", help="Archive tier: a shared path or s3://bucket/prefix.", rich_help_panel=CKPT)] = None,
        ckpt_every: Annotated[Optional[str], typer.Option("--ckpt-every", help="Checkpoint every N steps; 'auto' (Young/Daly from the measured stall and the instance's MTBF); 'off' (only at the end and when stopping: a crash loses everything). [default: auto]", show_default=False, rich_help_panel=CKPT)] = None,
        keep_hot: Annotated[int, typer.Option("--keep-hot", parser=o.number_for(RunSettings, "keep_hot", "2"), help="Checkpoints kept on the hot tier.", rich_help_panel=CKPT)] = 2,
        instance: Annotated[Optional[str], typer.Option("--instance", help="Instance type, for its price and MTBF (e.g. p4d.24xlarge).", rich_help_panel=COST)] = None,
        spot: Annotated[bool, typer.Option("--spot", help="Spot capacity: spot price, shorter MTBF.", rich_help_panel=COST)] = False,
        region: Annotated[Optional[str], typer.Option("--region", help="Region for the catalog price.", rich_help_panel=COST)] = None,
        usd_per_hour: Annotated[Optional[float], typer.Option("--usd-per-hour", parser=o.number_for(RunSettings, "usd_per_hour", "32.77"), help="Price per node-hour (overrides the catalog).", rich_help_panel=COST)] = None,
        budget_usd: Annotated[Optional[float], typer.Option("--budget-usd", parser=o.number_for(RunSettings, "budget_usd", "500"), help="Stop with a final checkpoint before spending more than this; start-up and shutdown are billed too (warnings at 50% and 80%).", rich_help_panel=COST)] = None,
        mtbf_hours: Annotated[Optional[float], typer.Option("--mtbf-hours", parser=o.number_for(RunSettings, "mtbf_h", "24"), help="The job's mean time between failures, for --ckpt-every auto. [default: catalog assumption]", rich_help_panel=COST)] = None,
        job: Annotated[Optional[Path], typer.Option("--job", help="Job spec (plan --save): model for MFU, instance, price, step-time estimate.", rich_help_panel=COST)] = None,
        scaling: Annotated[Optional[str], typer.Option("--scaling", help="Run briefly at each process count, e.g. 1,2,4,8, and report scaling efficiency and where time went.", rich_help_panel=MODES)] = None,
        scaling_steps: Annotated[int, typer.Option("--scaling-steps", parser=o.number("12", lo=3, lo_open=False, whole=True, hi=100000), help="Steps per --scaling run (the first 2 are warm-up).", rich_help_panel=MODES)] = 12,
        emit: Annotated[Optional[str], typer.Option("--emit", help="Print a launch file for this job instead of running: slurm, skypilot, torchrun, k8s (Kubeflow Trainer TrainJob), jobset or pcluster (AWS ParallelCluster).", rich_help_panel=MODES)] = None,
        image: Annotated[Optional[str], typer.Option("--image", help="k8s/jobset: container image with trainready and torch.", rich_help_panel=CLUSTER)] = None,
        queue: Annotated[Optional[str], typer.Option("--queue", help="k8s/jobset: Kueue LocalQueue; pcluster/slurm: Slurm queue (partition).", rich_help_panel=CLUSTER)] = None,
        service_account: Annotated[Optional[str], typer.Option("--service-account", help="k8s/jobset: the pods' ServiceAccount (IRSA / EKS Pod Identity for S3).", rich_help_panel=CLUSTER)] = None,
        aws_secret: Annotated[Optional[str], typer.Option("--aws-secret", help="k8s/jobset: Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, used by reference.", rich_help_panel=CLUSTER)] = None,
        shared_fs: Annotated[Optional[str], typer.Option("--shared-fs", help="pcluster: FSx for Lustre at /fsx: 'new' or an existing fs-... id.", rich_help_panel=CLUSTER)] = None,
        capacity_reservation: Annotated[Optional[str], typer.Option("--capacity-reservation", help="pcluster: a Capacity Block's reservation id (cr-...).", rich_help_panel=CLUSTER)] = None,
        workdir: Annotated[Optional[str], typer.Option("--workdir", metavar="DIR", help="With --emit: where the job runs: skypilot copies it to every node (default: . when the command names a file here), slurm --chdir, jobset's workingDir, torchrun's cd.", rich_help_panel=CLUSTER)] = None,
        env: Annotated[Optional[list[str]], typer.Option("--env", metavar="NAME=VALUE", help="With --emit: an environment variable the launch file sets on every node (repeat it); it wins over the instance's launch environment (EFA, NCCL).", rich_help_panel=CLUSTER)] = None,
        json_out: o.Json = False) -> None:
    from trainready.run.configure import RunOptions, configure

    opts = RunOptions(command=list(command or []), nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                      rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, max_restarts=max_restarts, hot=hot, archive=archive,
                      ckpt_every=ckpt_every, keep_hot=keep_hot, instance=instance, spot=spot, region=region,
                      usd_per_hour=usd_per_hour, budget_usd=budget_usd, mtbf_hours=mtbf_hours, run_dir=run_dir, job=job,
                      grace_s=grace, show_ranks=show_ranks, resume=resume)
    if resume and (emit is not None or scaling is not None):
        from trainready.errors import UsageError

        raise UsageError("--resume continues a run in --run-dir; --emit writes a launch file and --scaling runs fresh "
                         "points, neither resumes anything: leave out --resume")
    if log_to is not None and (emit is not None or scaling is not None):
        from trainready.errors import UsageError

        raise UsageError("--log-to exports the steps of a launch: --scaling runs throw-away points and --emit writes a "
                         "launch file (add --log-to to its `trainready run` line): leave out --log-to")
    from trainready.run.exporters import parse_log_to

    log_names = parse_log_to(log_to)  # unknown or not installed: exit 2 before anything starts
    cluster_opts = {"--image": image, "--queue": queue, "--service-account": service_account, "--aws-secret": aws_secret,
                    "--shared-fs": shared_fs, "--capacity-reservation": capacity_reservation}
    cluster_opts.update({"--workdir": workdir, "--env": env or None})
    if emit is None and any(v is not None for v in cluster_opts.values()):
        from trainready.errors import UsageError

        given = next(k for k, v in cluster_opts.items() if v is not None)
        raise UsageError(f"{given} goes with --emit: it describes the launch file, not this machine"
                         + ("; for a launch here, set the variable in your shell" if given == "--env" else ""))
    if emit is not None:
        from trainready.run.emit.cli import emit_for

        text = emit_for(emit, opts, workdir=workdir, env=env, image=image, queue=queue, service_account=service_account,
                        aws_secret=aws_secret, shared_fs=shared_fs, capacity_reservation=capacity_reservation)
        if json_out:
            emit_json({"schema_version": 1, "kind": emit, "text": text})
        else:
            out.file.write(text)
        return
    configured = configure(opts)
    if scaling is not None:
        from trainready.run.scaling import parse_counts, run_scaling

        from .render_run import render_scaling

        report = run_scaling(configured.spec, parse_counts(scaling), scaling_steps, quiet=json_out)
        emit_json(report) if json_out else render_scaling(out, report)
        raise typer.Exit(0 if report.ok else 1)
    from .render_run import launch_and_render

    configured.spec.config["log_to"] = log_names
    code = launch_and_render(configured, json_out=json_out, console=err if json_out else out, log_to=log_names)
    raise typer.Exit(code)


def report(run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory (--run-dir of trainready run).", show_default=False)],
           html: Annotated[Optional[Path], typer.Option("--html", metavar="FILE", help="Also write the report as one self-contained HTML page with charts (opens offline; needs trainready[report]).")] = None,
           live: Annotated[bool, typer.Option("--live", help="With --html: rewrite the page every 15 s while the run is going (the page reloads itself); ends when the run does.")] = False,
           force: Annotated[bool, typer.Option("--force", help="With --html: replace FILE even when it is not a page trainready wrote.")] = False,
           json_out: o.Json = False) -> None:
    from trainready.run.summary import summarize

    from .render_run import render_summary

    if html is not None or live:
        from .render_html import report_html

        summary = report_html(run_dir, html, live=live, console=err if json_out else out, force=force)
    else:
        summary = summarize(run_dir)
    from trainready.report.calibration import plan_check

    summary = summary.model_copy(update={"plan_check": plan_check(run_dir, summary)})
    emit_json(summary) if json_out else render_summary(out, summary)
