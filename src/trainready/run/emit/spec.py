"""What one `trainready run --emit` job is (EmitSpec) and the checks every engine shares; the engines render it
(slurm.py, skypilot.py, torchrun.py, k8s.py, pcluster.py), and emit/__init__.py picks one by name."""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from trainready.errors import UsageError, printable
from trainready.io import has_url_credentials, is_secret_name, redact

EmitKind = Literal["slurm", "skypilot", "torchrun", "k8s", "jobset", "pcluster"]
EMIT_KINDS: tuple[str, ...] = ("slurm", "skypilot", "torchrun", "k8s", "jobset", "pcluster")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


RESTARTS_MULTI_OR_SPOT = 3
"""docs/emit.md's recommendation for a job that spans nodes or runs on spot capacity."""


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
    max_restarts: int | None = None
    """None: `restarts`' default (3 for a multi-node or spot job, 0 for one on-demand node)."""
    hot: str | None = None
    archive: str | None = None
    ckpt_every: int | Literal["auto", "off"] | None = "auto"  # as `trainready run`: resumable by default
    usd_per_hour: float | None = None
    budget_usd: float | None = None
    run_dir: str | None = None
    # Cluster settings of the k8s, jobset and pcluster kinds (k8s.py, pcluster.py say what each does).
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
        validate(self)
        return self

    @property
    def restarts(self) -> int:
        """Worker restarts after a failure: as given, else RESTARTS_MULTI_OR_SPOT for a multi-node or spot job (a
        lost node or a reclaimed instance costs a restart from the newest checkpoint, not the job), else 0 (one
        on-demand node: a failure there is usually the script's, which a restart repeats)."""
        if self.max_restarts is not None:
            return self.max_restarts
        return RESTARTS_MULTI_OR_SPOT if self.nnodes > 1 or self.spot else 0

    @property
    def restarts_line(self) -> str:
        """What each launch file says about its restarts (a comment): the number and where it came from."""
        if self.max_restarts is not None:
            return f"restarts after a failure: {self.restarts} (--max-restarts)"
        why = "a multi-node or spot job" if self.restarts else "one on-demand node"
        return (f"restarts after a failure: {self.restarts}, the default for {why} (docs/emit.md); "
                f"set --max-restarts to change it")

    @property
    def run_options(self) -> list[str]:
        """The `trainready run` options every node repeats, in a fixed order."""
        opts: list[str] = []
        if self.job is not None:
            opts += ["--job", self.job]
        opts += ["--max-restarts", str(self.restarts)]
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


# ---------------------------------------------------------------- validation


def validate(spec: EmitSpec) -> None:
    """A usage error (exit 2) for what no engine can render."""
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
    if spec.max_restarts is not None and spec.max_restarts < 0:
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
        if value is not None and has_control(value):  # a newline would break out of a header comment
            raise UsageError(f"{flag} '{printable(value)}' holds a control character (a line break, a tab, a "
                             f"bidirectional override): give a path without one")
    secret_advice = ("a launch file is kept, shared and committed: pass credentials as environment the cluster "
                     "provides (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, an instance role, --aws-secret for k8s), "
                     "not in a URL")
    for flag, value in (("--archive", spec.archive), ("--hot", spec.hot), ("--job", spec.job),
                        ("--run-dir", spec.run_dir), ("workdir", spec.workdir)):
        if value is not None and has_url_credentials(value, any_host=True):
            raise UsageError(f"{flag} '{printable(redact(value))}' holds credentials (user:password@): {secret_advice}")
    for word in spec.command:
        if has_url_credentials(word):
            raise UsageError(f"the training command's word '{printable(redact(word))}' holds credentials "
                             f"(user:password@): {secret_advice}")
    for name, value in spec.env.items():
        if has_url_credentials(value):
            raise UsageError(f"environment variable {name} holds credentials (user:password@): {secret_advice}")
    derived = spec.worker_env
    for name in spec.env:
        if not _ENV_NAME_RE.fullmatch(name):
            raise UsageError(f"environment variable name {name!r} is not valid (letters, digits and '_', not "
                             "starting with a digit)")
        if name in derived:
            raise UsageError(f"environment variable {name} is set by the launcher options; set the option instead")
        # a launch file is kept, shared and committed: no key, token or password in it, by name or by look
        if is_secret_name(name) or redact(spec.env[name]) != spec.env[name]:
            raise UsageError(f"environment variable {name}: its value looks like a secret (a key, token or password), "
                             f"and a launch file is kept, shared and committed: give it to the nodes another way (an "
                             f"instance role, the cluster's own environment, --aws-secret for k8s/jobset)")
        if spec.aws_secret is not None and name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            raise UsageError(f"environment variable {name} comes from --aws-secret {spec.aws_secret}: not both")


_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def has_control(text: str) -> bool:
    """Control characters (C0, C1 with U+0085), line and paragraph separators, and bidirectional overrides
    (which make a path read differently from what it is); other Unicode, no-break spaces and joiners included,
    is fine in a path."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in _BIDI_CONTROLS for c in text)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
