"""Launch files for a `trainready run` job: `--emit slurm | skypilot | torchrun`.

`emit(kind, spec)` renders the text; it runs nothing and touches no file. The output is
stable (no dates, sorted environment), so the same spec always gives the same bytes and
an emitted file can be kept in git and diffed.

* slurm: an sbatch script; srun starts one `trainready run` launcher per node.
* skypilot: a SkyPilot task YAML whose `run` starts one `trainready run` per node.
* torchrun: one block of plain `python -m torch.distributed.run` per node, with the
  launcher's settings as `TRAINREADY_*` environment variables (no launcher involved).
* k8s / jobset: a Kubeflow Trainer v2 TrainJob, or a plain JobSet (emit_k8s.py).
* pcluster: an AWS ParallelCluster 3 cluster config for the job (emit_pcluster.py).

Every user-supplied word is shell-quoted (`shlex.quote`, or bash `$'...'` for control
characters), and YAML scalars are quoted where needed, so commands with spaces, quotes,
`$` or newlines reach the training process unchanged. See docs/emit.md.
"""

from __future__ import annotations

import math
import re
import shlex
import unicodedata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from trainready.errors import UsageError, printable

from .settings import node_run_dir

EmitKind = Literal["slurm", "skypilot", "torchrun", "k8s", "jobset", "pcluster"]
EMIT_KINDS: tuple[str, ...] = ("slurm", "skypilot", "torchrun", "k8s", "jobset", "pcluster")

HEAD_PLACEHOLDER = "HEAD_NODE_IP"
PIP_INSTALL = 'pip install "trainready[torch,s3]"'

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PYTHON_RE = re.compile(r"python(\d+(\.\d+)*)?")
_YAML_PLAIN_RE = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*")
_YAML_RESERVED = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}


class EmitSpec(BaseModel):
    """One job, as `trainready run --emit KIND` renders it."""

    model_config = ConfigDict(extra="forbid")

    command: list[str]
    """The training command after `--`, e.g. ["python", "train.py", "--steps", "1000"]."""
    nnodes: int = 1
    nproc_per_node: int | None = None
    """Processes per node; None: the GPU count (of `gpus_per_node` or the instance), else one per GPU found."""
    rdzv_port: int = 29500
    rdzv_id: str | None = None
    """None: $SLURM_JOB_ID for slurm, the job name elsewhere."""
    job_name: str = "trainready"
    head_host: str | None = None
    """torchrun only: the head node's address; None: HEAD_NODE_IP placeholder (localhost for one node)."""
    instance: str | None = None
    gpu_name: str | None = None
    """SkyPilot accelerator name, e.g. "A100-80GB" (see `sky show-gpus`)."""
    gpus_per_node: int | None = None
    spot: bool = False
    cloud: str | None = None
    region: str | None = None
    workdir: str | None = None
    env: dict[str, str] = {}
    # The launcher's own options, rendered by `run_options` / `worker_env`.
    job: str | None = None
    max_restarts: int = 3
    hot: str | None = None
    archive: str | None = None
    ckpt_every: int | Literal["auto", "off"] | None = "auto"  # as `trainready run`: resumable by default
    usd_per_hour: float | None = None
    budget_usd: float | None = None
    run_dir: str | None = None
    # Cluster settings of the k8s, jobset and pcluster kinds (emit_k8s.py, emit_pcluster.py say what each does).
    image: str | None = None
    """k8s/jobset: the container image holding trainready and torch; None: a placeholder to replace."""
    queue: str | None = None
    """k8s/jobset: the Kueue LocalQueue; pcluster (and slurm's --partition): the Slurm queue."""
    service_account: str | None = None
    """k8s/jobset: the pods' ServiceAccount (IRSA or EKS Pod Identity grants the archive's S3 access)."""
    aws_secret: str | None = None
    """k8s/jobset: a Secret holding AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (optionally AWS_SESSION_TOKEN)."""
    shared_fs: str | None = None
    """pcluster: FSx for Lustre as the shared tier: "new", or an existing file system's id (fs-...)."""
    capacity_reservation: str | None = None
    """pcluster: an EC2 Capacity Block's reservation id (cr-...)."""

    @field_validator("ckpt_every", mode="before")
    @classmethod
    def _ckpt_every(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.lower() in ("auto", "off"):
                return text.lower()
            if text.lstrip("-").isdigit():
                return int(text)
            raise UsageError(f"--ckpt-every must be a number of steps, 'auto' or 'off' (got {value!r})")
        return value

    @model_validator(mode="after")
    def _check(self) -> EmitSpec:
        _validate(self)
        return self

    @property
    def run_options(self) -> list[str]:
        """The `trainready run` options every node repeats, in a fixed order."""
        opts: list[str] = []
        if self.job is not None:
            opts += ["--job", self.job]
        opts += ["--max-restarts", str(self.max_restarts)]
        for flag, value in (("--hot", self.hot), ("--archive", self.archive), ("--ckpt-every", self.ckpt_every),
                            ("--instance", self.instance)):
            if value is not None:
                opts += [flag, str(value)]
        if self.spot:
            opts.append("--spot")
        for flag, value in (("--usd-per-hour", self.usd_per_hour), ("--budget-usd", self.budget_usd)):
            if value is not None:
                opts += [flag, _number(value)]
        if self.run_dir is not None:
            opts += ["--run-dir", self.run_dir]
        return opts

    @property
    def worker_env(self) -> dict[str, str]:
        """The same settings as the `TRAINREADY_*` variables the launcher gives its workers."""
        out: dict[str, str] = {}
        out["TRAINREADY_NNODES"] = str(self.nnodes)
        for name, value in (("HOT", self.hot), ("ARCHIVE", self.archive), ("CKPT_EVERY", self.ckpt_every),
                            ("INSTANCE", self.instance)):
            if value is not None:
                out["TRAINREADY_" + name] = str(value)
        if self.spot:
            out["TRAINREADY_SPOT"] = "1"
        for name, value in (("USD_PER_HOUR", self.usd_per_hour), ("BUDGET_USD", self.budget_usd)):
            if value is not None:
                out["TRAINREADY_" + name] = _number(value)
        if self.run_dir is not None:
            out["TRAINREADY_RUN_DIR"] = self.run_dir
        return out


def build_spec(**fields: object) -> EmitSpec:
    """`EmitSpec(**fields)`, with pydantic's type errors turned into a UsageError (exit 2)."""
    try:
        return EmitSpec(**fields)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "spec"
            parts.append(f"{loc}={err.get('input')!r}: {err['msg']}")
        raise UsageError("invalid launch spec: " + "; ".join(parts)) from None


def emit(kind: EmitKind, spec: EmitSpec) -> str:
    """The launch file of `kind` for `spec`, as text ending in a newline."""
    _validate(spec)  # also covers specs made with model_construct or changed after creation
    if kind == "slurm":
        return _slurm(spec)
    if kind == "skypilot":
        return _skypilot(spec)
    if kind == "torchrun":
        return _torchrun(spec)
    if kind in ("k8s", "jobset"):
        from .emit_k8s import emit_k8s

        return emit_k8s(kind, spec)
    if kind == "pcluster":
        from .emit_pcluster import emit_pcluster

        return emit_pcluster(spec)
    raise UsageError(f"unknown --emit kind {kind!r}: choose one of {', '.join(EMIT_KINDS)}")


# ---------------------------------------------------------------- validation


def _validate(spec: EmitSpec) -> None:
    if not spec.command:
        raise UsageError("no training command: give it after `--`, e.g. `trainready run --emit slurm -- python train.py`")
    if spec.command[0] == "" or spec.command[0].startswith("-"):
        raise UsageError(f"the training command must start with a program (python, a script), not {spec.command[0]!r}")
    if spec.nnodes < 1:
        raise UsageError(f"--nnodes must be at least 1 (got {spec.nnodes})")
    if spec.nproc_per_node is not None and spec.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1 (got {spec.nproc_per_node})")
    if spec.gpus_per_node is not None and spec.gpus_per_node < 1:
        raise UsageError(f"GPUs per node must be at least 1 (got {spec.gpus_per_node})")
    if not 1 <= spec.rdzv_port <= 65535:
        raise UsageError(f"rendezvous port must be in 1..65535 (got {spec.rdzv_port})")
    if spec.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more (got {spec.max_restarts})")
    if isinstance(spec.ckpt_every, int) and spec.ckpt_every < 1:
        raise UsageError(f"--ckpt-every must be at least 1 step, or 'auto' (got {spec.ckpt_every})")
    for flag, value in (("--usd-per-hour", spec.usd_per_hour), ("--budget-usd", spec.budget_usd)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"{flag} must be a number more than 0 (got {value})")
    if not _NAME_RE.fullmatch(spec.job_name):
        raise UsageError(f"job name {spec.job_name!r} must be 1-63 letters, digits, '.', '_' or '-', starting with "
                         "a letter or digit")
    for flag, value in (("--rdzv-id", spec.rdzv_id), ("head host", spec.head_host), ("--instance", spec.instance),
                        ("GPU name", spec.gpu_name), ("cloud", spec.cloud), ("region", spec.region),
                        ("--image", spec.image), ("--queue", spec.queue), ("--service-account", spec.service_account),
                        ("--aws-secret", spec.aws_secret), ("--shared-fs", spec.shared_fs),
                        ("--capacity-reservation", spec.capacity_reservation)):
        if value is not None and (not value or any(c.isspace() or not c.isprintable() for c in value)):
            raise UsageError(f"{flag} {value!r} must be a non-empty word without spaces")
    for flag, value in (("--job", spec.job), ("--hot", spec.hot), ("--archive", spec.archive),
                        ("--run-dir", spec.run_dir), ("workdir", spec.workdir)):
        if value is not None and not value:
            raise UsageError(f"{flag} must not be empty")
        if value is not None and _has_control(value):  # a newline would break out of a header comment
            raise UsageError(f"{flag} '{printable(value)}' holds a control character (a line break, a tab, a "
                             f"bidirectional override): give a path without one")
    derived = spec.worker_env
    for name in spec.env:
        if not _ENV_NAME_RE.fullmatch(name):
            raise UsageError(f"environment variable name {name!r} is not valid (letters, digits and '_', not "
                             "starting with a digit)")
        if name in derived:
            raise UsageError(f"environment variable {name} is set by the launcher options; set the option instead")


# ---------------------------------------------------------------- helpers


_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _has_control(text: str) -> bool:
    """Control characters (C0, C1 with U+0085), line and paragraph separators, and bidirectional overrides
    (which make a path read differently from what it is); other Unicode, no-break spaces and joiners included,
    is fine in a path."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in _BIDI_CONTROLS for c in text)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


_BASH_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def sh_quote(word: str) -> str:
    """One shell word: `shlex.quote`, or bash's $'...' where it holds control characters.

    $'...' keeps every emitted command on lines of its own (a raw newline inside quotes
    would break YAML block scalars and line-oriented editing).
    """
    if all(c.isprintable() for c in word):
        return shlex.quote(word)
    out = []
    for c in word:
        if c in _BASH_ESCAPES:
            out.append(_BASH_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return "$'" + "".join(out) + "'"


def _sh_join(words: list[str]) -> str:
    return " ".join(sh_quote(w) for w in words)


def _yaml_scalar(text: str) -> str:
    """A YAML string scalar: plain when unambiguous, else double-quoted with escapes."""
    if _YAML_PLAIN_RE.fullmatch(text) and text.lower() not in _YAML_RESERVED:
        return text
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif ord(c) <= 0xFF:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def _continued(first: str, rest: list[str], indent: str = "  ") -> list[str]:
    """`first \\` then each of `rest` on its own indented line, joined by backslashes."""
    lines = [first]
    for part in rest:
        lines[-1] += " \\"
        lines.append(indent + part)
    return lines


def _pairs(words: list[str]) -> list[str]:
    """Options as display lines: `--flag value` together, a bare `--flag` alone."""
    lines: list[str] = []
    i = 0
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            lines.append(f"{sh_quote(words[i])} {sh_quote(words[i + 1])}")
            i += 2
        else:
            lines.append(sh_quote(words[i]))
            i += 1
    return lines


def _gpus_per_node(spec: EmitSpec) -> int | None:
    """GPUs on one node: as given, else the instance's count from the catalog, else unknown."""
    if spec.gpus_per_node is not None:
        return spec.gpus_per_node
    if spec.instance is None:
        return None
    from trainready.catalog import load_catalog

    try:
        return load_catalog().instance(spec.instance).gpu_count
    except UsageError:  # not in the catalog: SkyPilot or the cluster may still know it
        return None


def _nproc(spec: EmitSpec) -> int | None:
    return spec.nproc_per_node if spec.nproc_per_node is not None else _gpus_per_node(spec)


def _export_lines(env: dict[str, str]) -> list[str]:
    return [f"export {name}={sh_quote(value)}" for name, value in env.items()]


def _user_env(spec: EmitSpec) -> dict[str, str]:
    return {name: spec.env[name] for name in sorted(spec.env)}


# ---------------------------------------------------------------- slurm


def _slurm(spec: EmitSpec) -> str:
    name = spec.job_name
    gpus = _gpus_per_node(spec)
    if gpus is None:
        gpus = spec.nproc_per_node
    nproc = _nproc(spec)
    rdzv_id = sh_quote(spec.rdzv_id) if spec.rdzv_id is not None else '"$SLURM_JOB_ID"'
    lines = [
        "#!/bin/bash",
        f"# Generated by trainready (`trainready run --emit slurm`) for job {name}.",
        f"# Submit with: sbatch {name}.sbatch",
        "# Edit before submitting:",
        "#   - add the #SBATCH lines your cluster needs: --partition, --account, --time, and",
        "#     --cpus-per-task=<cores per node> if Slurm would pin the launcher to one core;",
    ]
    if gpus is not None:
        lines.append("#   - --gpus-per-node needs the GPUs set up as a GRES: drop that line where they are not;")
    lines += [
        "#   - activate the environment that has trainready and torch (the `source` line);",
        "#   - the exports (NCCL, EFA settings) for your network.",
        "# srun starts one `trainready run` launcher per node; each runs torchrun",
        "# (torch.distributed.run) underneath, and the nodes meet by c10d rendezvous on the",
        "# first node of the allocation.",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={spec.nnodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpus is not None:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    if spec.queue is not None:  # the ParallelCluster queue of --emit pcluster, or any Slurm partition
        lines.append(f"#SBATCH --partition={spec.queue}")
    lines += [
        "#SBATCH --exclusive",
        f"#SBATCH --output={name}-%j.out",
        "",
        "set -euo pipefail",
        "",
        "# source /path/to/venv/bin/activate",
        "",
        "# The first node hosts the rendezvous. (sed, not head -n1: under pipefail, head closing",
        "# the pipe early can kill the script with SIGPIPE.)",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
    ]
    env = _user_env(spec)
    if env:
        lines += _export_lines(env)
    lines += [
        "",
        "# SLURM_NODEID differs from node to node, so it is expanded on each node (inside bash -c).",
    ]
    rest = []
    # unknown GPU count: one worker per GPU the node has ('gpu'), never trainready run's local default of 1
    rest.append(f"--nproc-per-node {nproc if nproc is not None else 'gpu'}")
    rest += [f'--rdzv-endpoint "$head_node:{spec.rdzv_port}"', f"--rdzv-id {rdzv_id}"]
    rest += _pairs(spec.run_options)
    rest.append("-- " + _sh_join(spec.command))
    first = ("srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c "
             "'exec trainready run --nnodes \"$SLURM_NNODES\" --node-rank \"$SLURM_NODEID\" \"$@\"' trainready")
    lines += _continued(first, rest)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- skypilot


def _skypilot(spec: EmitSpec) -> str:
    name = spec.job_name
    gpus = _gpus_per_node(spec)
    if gpus is None:
        gpus = spec.nproc_per_node
    if spec.gpu_name is not None and gpus is None:
        raise UsageError(f"GPU name {spec.gpu_name} given without a count: give --nproc-per-node or an --instance "
                         "whose GPU count is known")
    lines = [
        f"# Generated by trainready (`trainready run --emit skypilot`) for job {name}.",
        f"# Launch with: sky launch -c {name} {name}.yaml",
        f"#   (spot capacity with automatic recovery: sky jobs launch -n {name} {name}.yaml)",
        "# Edit before launching:",
        "#   - resources: instance_type or accelerators (`sky show-gpus`), cloud and region;",
        "#     SkyPilot 0.10+ prefers `infra: aws/us-east-1` to cloud/region (both are read);",
        "#   - setup: how trainready and torch get installed (keep an image's own CUDA torch);",
        "#   - envs: NCCL/EFA settings for your network.",
        "# Every node runs one `trainready run` launcher, which starts torchrun",
        "# (torch.distributed.run) underneath; the nodes meet by c10d rendezvous on the first",
        "# node listed in SKYPILOT_NODE_IPS.",
        f"name: {_yaml_scalar(name)}",
        f"num_nodes: {spec.nnodes}",
    ]
    resources = []
    if spec.cloud is not None:
        resources.append(f"cloud: {_yaml_scalar(spec.cloud)}")
    if spec.region is not None:
        resources.append(f"region: {_yaml_scalar(spec.region)}")
    if spec.instance is not None:
        resources.append(f"instance_type: {_yaml_scalar(spec.instance)}")
    if spec.gpu_name is not None:
        resources.append(f"accelerators: {{{_yaml_scalar(spec.gpu_name)}: {gpus}}}")
    if spec.spot:
        resources.append("use_spot: true")
    if resources:
        lines.append("resources:")
        lines += ["  " + r for r in resources]
    else:
        lines += ["# resources:", "#   accelerators: {A100-80GB: 8}"]
    if spec.workdir is not None:
        lines.append(f"workdir: {_yaml_scalar(spec.workdir)}")
    env = _user_env(spec)
    if env:
        lines.append("envs:")
        lines += [f"  {k}: {_yaml_scalar(v)}" for k, v in env.items()]
    lines += ["setup: |", f"  {PIP_INSTALL}"]
    nproc = str(spec.nproc_per_node) if spec.nproc_per_node is not None else '"$SKYPILOT_NUM_GPUS_PER_NODE"'
    rdzv_id = spec.rdzv_id if spec.rdzv_id is not None else name
    run = ['head_node=$(echo "$SKYPILOT_NODE_IPS" | head -n1)']
    rest = [
        '--nnodes "$SKYPILOT_NUM_NODES"',
        '--node-rank "$SKYPILOT_NODE_RANK"',
        f"--nproc-per-node {nproc}",
        f'--rdzv-endpoint "$head_node:{spec.rdzv_port}"',
        f"--rdzv-id {sh_quote(rdzv_id)}",
        *_pairs(spec.run_options),
        "-- " + _sh_join(spec.command),
    ]
    run += _continued("trainready run", rest)
    lines.append("run: |")
    lines += ["  " + line for line in run]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- torchrun


def _torchrun_program(command: list[str]) -> tuple[str, list[str]]:
    """The python that runs torch.distributed.run, and the words after torchrun's options."""
    first = command[0]
    if _PYTHON_RE.fullmatch(first.rsplit("/", 1)[-1]):
        rest = command[1:]
        if rest and not rest[0].startswith("-"):
            return first, rest  # python train.py ARGS -> torchrun ... train.py ARGS
        if len(rest) >= 2 and rest[0] == "-m" and not rest[1].startswith("-"):
            return first, rest  # python -m pkg.train ARGS -> torchrun ... -m pkg.train ARGS
        return first, ["--no-python", *command]  # interpreter flags (python -u ...): run it as is
    return "python", ["--no-python", *command]


def _head(spec: EmitSpec) -> str:
    """The rendezvous host torchrun blocks name: given, localhost for one node, else the placeholder."""
    return spec.head_host or ("localhost" if spec.nnodes == 1 else HEAD_PLACEHOLDER)


def _torchrun_options(spec: EmitSpec, node_rank: int) -> list[tuple[str, str]]:
    nproc = _nproc(spec)
    head = _head(spec)
    return [
        ("--nnodes", str(spec.nnodes)),
        ("--nproc-per-node", str(nproc) if nproc is not None else "gpu"),
        ("--node-rank", str(node_rank)),
        ("--rdzv-backend", "c10d"),
        ("--rdzv-endpoint", f"{head}:{spec.rdzv_port}"),
        ("--rdzv-id", spec.rdzv_id if spec.rdzv_id is not None else spec.job_name),
        ("--max-restarts", str(spec.max_restarts)),
    ]


def _torchrun_long_options() -> list[str] | None:
    """torchrun's own long options, from the installed torch; None without torch (nothing to check)."""
    try:
        from torch.distributed.run import get_args_parser
    except ImportError:
        return None
    return [flag for action in get_args_parser()._actions for flag in action.option_strings if flag.startswith("--")]


def _check_torchrun_ambiguity(tail: list[str]) -> None:
    """Refuse script arguments that plain torchrun would reject before starting anything.

    torchrun's argparse classifies every word of its command line, the script's arguments too, and
    stops at one that abbreviates two of its own options (`--d`: --dir? --dynamo?...). `trainready run`
    avoids this with its shim; a plain torchrun block cannot, so say so now rather than on the node."""
    options = _torchrun_long_options()
    if not options:
        return
    for word in tail[1:]:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if not name.startswith("--") or name == "--" or name in options:
            continue
        matches = [flag for flag in options if flag.startswith(name)]
        if len(matches) > 1:
            shown = list(dict.fromkeys(flag.replace("_", "-") for flag in matches))  # torchrun has both spellings
            raise UsageError(
                f"script argument {name!r} abbreviates several torchrun options ({', '.join(shown[:4])}"
                f"{', ...' if len(shown) > 4 else ''}), so plain torchrun would refuse the command: spell the "
                "script's option out in full, or use --emit slurm / skypilot, which start `trainready run` and are "
                "not affected")


def _torchrun(spec: EmitSpec) -> str:
    head = _head(spec)
    python, tail = _torchrun_program(spec.command)
    _check_torchrun_ambiguity(tail)
    lines = [
        f"# Generated by trainready (`trainready run --emit torchrun`) for job {spec.job_name}.",
        f"# Plain torchrun (torch.distributed.run), no trainready launcher: run block R on node R, {spec.nnodes} "
        "in all.",
        "# Edit before running:",
    ]
    if head == HEAD_PLACEHOLDER:
        lines.append(f"#   - replace {HEAD_PLACEHOLDER} with the address of node 0, reachable from every node;")
    lines += [
        "#   - activate the environment that has torch (and trainready, for trainready.init());",
        "#   - the exports (NCCL, EFA settings) for your network.",
        "# The launcher's settings reach the workers as the TRAINREADY_* variables below, which",
        "# trainready.init() reads just as it would under `trainready run`.",
        "# With c10d rendezvous torchrun assigns the final ranks; --node-rank is informational.",
    ]
    env = {**_user_env(spec), **spec.worker_env}
    for rank in range(spec.nnodes):
        where = f"host {head}: the rendezvous head" if rank == 0 else "another host, one block per host"
        lines += ["", f"# node {rank} of {spec.nnodes} (run on {where})"]
        node_env = dict(env)
        if spec.run_dir is not None and spec.nnodes > 1:  # the directory `trainready run` uses on this node
            node_env["TRAINREADY_RUN_DIR"] = str(node_run_dir(Path(spec.run_dir), spec.nnodes, rank))
        lines += _export_lines(node_env)
        rest = [f"{flag} {sh_quote(value)}" for flag, value in _torchrun_options(spec, rank)]
        rest.append(_sh_join(tail))
        lines += _continued(f"{sh_quote(python)} -m torch.distributed.run", rest)
    return "\n".join(lines) + "\n"
