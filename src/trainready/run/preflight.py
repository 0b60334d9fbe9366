"""Checks before any worker starts: a bad command, price, budget or archive is a clear
message (exit 2), not a crash ten minutes into a paid run."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from trainready.errors import UsageError, closest
from trainready.io import redact

from .launcher import PYTHONS

S3_TIMEOUT_S = 3


@dataclass(frozen=True, slots=True)
class Price:
    usd_per_hour: float | None  # per node
    source: str


def check_torch(nproc_per_node: int | str) -> None:
    """torchrun is torch's: without torch nothing can start; 'gpu' needs a GPU."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError("trainready run needs PyTorch: pip install 'trainready[torch]' (or your CUDA build of torch)")
    if nproc_per_node == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--nproc-per-node gpu: no CUDA GPU is visible here; give a number of processes")


def check_command(command: list[str]) -> None:
    if not command:
        raise UsageError("no training command: put it after `--`, e.g. trainready run -- python train.py")
    first = command[0]
    if os.path.basename(first) in PYTHONS or first in PYTHONS:
        args = command[1:]
        if not args:
            raise UsageError(f"`{first}` with no script: give the training script, e.g. -- python train.py")
        if args[0] == "-m":
            if len(args) < 2:
                raise UsageError("`python -m` needs a module name")
            return
        if args[0].startswith("-"):
            raise UsageError(f"python option {args[0]!r} before the script is not supported by torchrun; "
                             "use `-- python script.py ...` or `-- python -m module ...`")
        script = Path(args[0])
        if not script.is_file():
            here = script.parent if str(script.parent) not in ("", ".") else Path(".")
            near = closest(script.name, [p.name for p in here.glob("*.py")]) if here.is_dir() else []
            hint = f" Did you mean: {', '.join(str(here / n) for n in near)}?" if near else ""
            raise UsageError(f"training script {str(script)!r} does not exist (looked in {Path.cwd()}).{hint}")
        return
    if shutil.which(first) is None and not Path(first).is_file():
        raise UsageError(f"command {first!r} not found on PATH")


def resolve_price(instance: str | None, spot: bool, usd_per_hour: float | None, region: str | None) -> Price:
    if usd_per_hour is not None:
        return Price(usd_per_hour, "--usd-per-hour")
    if instance is None:
        return Price(None, "none")
    from trainready.catalog import load_catalog

    catalog = load_catalog()
    inst = catalog.instance(instance)  # unknown names raise with "did you mean"
    if region is not None:  # a typo is a usage error naming the nearest regions, not "no price"
        region = catalog.region(region, inst, need_price=True)
    model = "spot" if spot else "on-demand"
    price = inst.price_for(model, region)
    if price is None or price.usd_per_hour is None:
        raise UsageError(f"no {model} price for {inst.name}{' in ' + region if region else ''} in the catalog: "
                         "give --usd-per-hour")
    suspect = " (marked suspect in the catalog)" if price.suspect else ""
    return Price(price.usd_per_hour, f"catalog: {inst.name} {model} in {price.region}, as of {price.as_of}{suspect}")


def check_budget(budget_usd: float | None, price: Price, nnodes: int, step_s: float | None, step_source: str) -> None:
    """`step_s`: one step's time from the plan (--job) or from this run's earlier launches."""
    if budget_usd is None:
        return
    if price.usd_per_hour is None:
        raise UsageError("--budget-usd needs a price: give --instance TYPE (catalog price) or --usd-per-hour X")
    from .budget import KILL_S, MARGIN, usd_per_second

    per_s = usd_per_second(price.usd_per_hour, nnodes)

    if step_s is not None and budget_usd < per_s * step_s:
        raise UsageError(f"--budget-usd {budget_usd:g} is below the cost of one step: {step_s:.2f} s/step ({step_source}) "
                         f"x ${price.usd_per_hour:g}/h x {nnodes} node(s) = ${per_s * step_s:.2f}")
    if budget_usd <= per_s * KILL_S * MARGIN:  # start-up is billed: this would not even start and stop
        raise UsageError(f"--budget-usd {budget_usd:g} buys {budget_usd / per_s:.1f} s at ${price.usd_per_hour:g}/h x "
                         f"{nnodes} node(s): not even enough to start the workers and stop them again")


def measured_step_s(run_dir: Path) -> float | None:
    """Median step time of this run's earlier launches, if any."""
    from .run_dir import RunDir
    from .telemetry import median_step_s

    return median_step_s(RunDir(run_dir).read_records())


def check_archive(url: str | None) -> None:
    """An s3:// archive must be reachable with credentials; a path must be creatable."""
    if not url:
        return
    if url.startswith("s3://"):
        _check_s3(url)
        return
    if "://" in url and not url.startswith("file://"):
        return  # another fsspec protocol: the manager reports problems on first use
    path = Path(url.removeprefix("file://"))
    parent = next((p for p in [path, *path.parents] if p.exists()), None)
    if parent is None or not os.access(parent, os.W_OK):
        raise UsageError(f"--archive {redact(url)}: cannot create it ({redact(parent or path)} is not writable)")


def _check_s3(url: str) -> None:
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError
    except ImportError:
        raise UsageError("--archive s3://... needs boto3 and s3fs: pip install 'trainready[s3]'") from None
    bucket = url[len("s3://"):].split("/", 1)[0]
    shown, shown_bucket = redact(url), redact(bucket)  # every message below: the URL may carry credentials
    if not bucket:
        raise UsageError(f"--archive {shown}: no bucket name")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    where = f" at {redact(endpoint)}" if endpoint else ""
    config = Config(connect_timeout=S3_TIMEOUT_S, read_timeout=S3_TIMEOUT_S, retries={"max_attempts": 1})
    try:
        client = boto3.client("s3", endpoint_url=endpoint, config=config)
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError:
        raise UsageError(f"--archive {shown}: no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                         "AWS_PROFILE, or run on an instance with an IAM role)") from None
    except EndpointConnectionError:
        raise UsageError(f"--archive {shown}: cannot reach the S3 endpoint{where or ' (default AWS endpoint)'}: "
                         "check the network, AWS_ENDPOINT_URL_S3 and the region") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket"):
            raise UsageError(f"--archive {shown}: bucket {shown_bucket!r} does not exist{where}") from None
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise UsageError(f"--archive {shown}: access denied to bucket {shown_bucket!r}{where} ({code}): check the "
                             "credentials and the bucket policy") from None
        raise UsageError(f"--archive {shown}: {redact(str(exc))}") from None
    except BotoCoreError as exc:
        raise UsageError(f"--archive {shown}: {redact(str(exc))}") from None


def check_rendezvous(nnodes: int, node_rank: int, endpoint: str | None) -> None:
    if nnodes < 1:
        raise UsageError(f"--nnodes {nnodes}: must be >= 1")
    if not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank {node_rank}: must be in 0..{nnodes - 1} for --nnodes {nnodes}")
    if nnodes > 1 and not endpoint:
        raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the first node's address, the same on every node)")
    if endpoint:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT, e.g. 10.0.0.1:29500")
