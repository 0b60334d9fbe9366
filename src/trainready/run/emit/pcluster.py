"""`--emit pcluster`: an AWS ParallelCluster 3 cluster config for the job's instance x nodes: one Slurm queue
with EFA, a cluster placement group (or a Capacity Block), the NVMe assembled as the hot tier, FSx for Lustre
as the shared tier with --shared-fs, and S3 access for an s3:// archive through the nodes' IAM role. The job
file to submit on it is `--emit slurm` with the same options (its --partition is --queue). docs/emit.md."""

from __future__ import annotations

import re

from trainready.errors import UsageError, printable

from .node import Node, env_sources, node_of, only_for, suggest_name, user_env
from .spec import EmitSpec
from .text import dump_yaml

# Queue and compute-resource names: aws-parallelcluster 3.16.1, pcluster/validators/cluster_validators.py
# (NAME_REGEX, NAME_MAX_LENGTH, and "default" is forbidden).
_PC_NAME = re.compile(r"[a-z][a-z0-9\-]*")
PC_NAME_MAX = 25
QUEUE_DEFAULT = "train"
OS = "alinux2023"  # ParallelCluster's official AMIs ship the NVIDIA driver, CUDA and the EFA installer
HEAD_NODE_TYPE = "m6i.2xlarge"  # the Slurm controller and login: no GPU; a choice, edit freely
SUBNET_PLACEHOLDER = "subnet-changeme"  # well-formed (subnet- and 8 characters), and no subnet has this id
HOT_DEFAULT = "/scratch"  # ParallelCluster's own default mount of the instance-store RAID 0
FSX_MOUNT = "/fsx"
# A new FSx for Lustre file system: PERSISTENT_2 keeps its data through a file-server failure (SCRATCH does
# not replicate it: FSx for Lustre user guide, "Deployment options"), 1200 GiB is the smallest size and
# 125 MB/s per TiB the lowest of PERSISTENT_2's throughputs 125/250/500/1000 (the guide's "Managing throughput
# capacity"; the FSx API's PerUnitStorageThroughput); Retain keeps the checkpoints when the cluster is deleted.
FSX_NEW = {"StorageCapacity": 1200, "DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125,
           "DeletionPolicy": "Retain"}
_FSX_ID = re.compile(r"fs-[0-9a-z]{17}")  # ParallelCluster's FsxLustreSettings FileSystemId pattern
_CR_ID = re.compile(r"cr-[0-9a-f]{17}")  # EC2 Capacity Reservation ids (a Capacity Block's too)


def render(spec: EmitSpec) -> str:
    node = _check(spec)
    return _header(spec, node) + dump_yaml([_config(spec, node)])


def _check(spec: EmitSpec) -> Node:
    only_for(spec, "pcluster", {"image": "--image (k8s, jobset)", "service_account": "--service-account (k8s, jobset)",
                                "aws_secret": "--aws-secret (k8s, jobset; ParallelCluster nodes reach S3 by their IAM "
                                              "role)"})
    node = node_of(spec, "pcluster")
    if node.cloud != "aws":
        raise UsageError(f"--emit pcluster: {node.instance} is a {node.cloud} instance; ParallelCluster runs on AWS")
    queue = spec.queue or QUEUE_DEFAULT
    if not _PC_NAME.fullmatch(queue) or len(queue) > PC_NAME_MAX or queue == "default":
        near = suggest_name(queue, PC_NAME_MAX, fallback=QUEUE_DEFAULT)
        raise UsageError(f"--queue {printable(queue)!r}: a ParallelCluster queue name is lowercase letters, digits and "
                         f"'-', starting with a letter, {PC_NAME_MAX} characters at most, not 'default', e.g. "
                         f"{'train' if near == 'default' else near!r}")
    if spec.shared_fs is not None and spec.shared_fs != "new" and not _FSX_ID.fullmatch(spec.shared_fs):
        raise UsageError(f"--shared-fs {printable(spec.shared_fs)!r}: 'new' (a new FSx for Lustre file system) or an "
                         "existing one's id, fs- and 17 letters or digits (e.g. fs-0123456789abcdef0)")
    if spec.capacity_reservation is not None:
        if not _CR_ID.fullmatch(spec.capacity_reservation):
            raise UsageError(f"--capacity-reservation {printable(spec.capacity_reservation)!r}: a Capacity Block's "
                             "reservation id is cr- and 17 hex digits (e.g. cr-0123456789abcdef0)")
        if spec.spot:
            raise UsageError("--capacity-reservation and --spot: a Capacity Block is reserved capacity, not spot; "
                             "give one of them")
    if spec.hot is not None and not spec.hot.startswith("/"):
        raise UsageError(f"--hot {printable(spec.hot)!r}: ParallelCluster mounts the NVMe at an absolute path "
                         f"(e.g. {HOT_DEFAULT})")
    return node


def _s3_bucket(archive: str | None) -> tuple[str, str] | None:
    if archive is None or not archive.startswith("s3://"):
        return None
    bucket, _, prefix = archive[len("s3://"):].partition("/")
    return (bucket, prefix.strip("/")) if bucket else None


def _queue(spec: EmitSpec, node: Node) -> dict:
    block = spec.capacity_reservation is not None
    resource: dict = {"Name": node.instance.replace(".", "-").lower()[:PC_NAME_MAX].rstrip("-"),
                      "InstanceType": node.instance}
    # A Capacity Block's instances are all static (MinCount = MaxCount, as ParallelCluster requires); otherwise
    # Slurm powers nodes up when the job is queued and down when idle.
    resource["MinCount"] = spec.nnodes if block else 0
    resource["MaxCount"] = spec.nnodes
    if node.efa:
        resource["Efa"] = {"Enabled": True}
    if block:
        resource["CapacityReservationTarget"] = {"CapacityReservationId": spec.capacity_reservation}
    # A cluster placement group keeps the nodes close; a Capacity Block is already placed together in an EC2
    # UltraCluster (EC2 API reference, CapacityBlock), and ParallelCluster skips the placement group for it.
    networking = {"SubnetIds": [SUBNET_PLACEHOLDER],
                  "PlacementGroup": {"Enabled": spec.nnodes > 1 and not block}}
    queue: dict = {"Name": spec.queue or QUEUE_DEFAULT,
                   "CapacityType": "CAPACITY_BLOCK" if block else "SPOT" if spec.spot else "ONDEMAND",
                   "Networking": networking, "ComputeResources": [resource]}
    if node.nvme_gb:
        queue["ComputeSettings"] = {"LocalStorage": {"EphemeralVolume": {"MountDir": spec.hot or HOT_DEFAULT}}}
    s3 = _s3_bucket(spec.archive)
    if s3 is not None:  # the archive's credentials: the compute nodes' instance role, never a key in the file
        access: dict = {"BucketName": s3[0], "EnableWriteAccess": True}
        if s3[1]:
            access["KeyName"] = s3[1] + "/*"
        queue["Iam"] = {"S3Access": [access]}
    return queue


def _config(spec: EmitSpec, node: Node) -> dict:
    config: dict = {}
    if spec.region is not None:
        config["Region"] = spec.region
    config["Image"] = {"Os": OS}
    config["HeadNode"] = {"InstanceType": HEAD_NODE_TYPE, "Networking": {"SubnetId": SUBNET_PLACEHOLDER}}
    config["Scheduling"] = {"Scheduler": "slurm", "SlurmQueues": [_queue(spec, node)]}
    if spec.shared_fs is not None:
        settings = dict(FSX_NEW) if spec.shared_fs == "new" else {"FileSystemId": spec.shared_fs}
        config["SharedStorage"] = [{"MountDir": FSX_MOUNT, "Name": "shared", "StorageType": "FsxLustre",
                                    "FsxLustreSettings": settings}]
    return config


def _header(spec: EmitSpec, node: Node) -> str:
    name = spec.job_name
    queue = spec.queue or QUEUE_DEFAULT
    lines = [
        f"Generated by trainready (`trainready run --emit pcluster`) for job {name}: an AWS ParallelCluster 3 "
        f"cluster of {spec.nnodes} x {node.instance}.",
        f"Create with: pcluster create-cluster --cluster-name {name} --cluster-configuration {name}-cluster.yaml",
        "Edit before creating:",
        f"  - replace {SUBNET_PLACEHOLDER} (head node and queue) with a subnet of your VPC, in the Availability Zone",
        "    of your capacity" + (" (the Capacity Block's zone);" if spec.capacity_reservation else ";"),
        "  - Region, if not given with --region; HeadNode.Ssh.KeyName to log in by SSH (or use SSM);",
    ]
    if spec.shared_fs is not None and spec.archive is not None and not spec.archive.startswith(("s3://", FSX_MOUNT)):
        lines.append(f"  - the FSx for Lustre file system is mounted at {FSX_MOUNT}: an --archive there is shared;")
    lines += [
        "Then, on the head node, submit the job file: the same `trainready run` options with --emit slurm",
        f"(queue {queue} is the cluster's Slurm partition{', given by --queue' if spec.queue else ''}): "
        f"sbatch {name}.sbatch",
    ]
    env = user_env(spec)
    if env:  # a cluster config holds no job environment: the job file sets it, as the same catalog says
        lines.append("The job file sets: " + ", ".join(f"{k}={v}" for k, v in env.items()) + ".")
        lines += [f"  {line}" for line in env_sources(spec)]
    if node.nvme_gb:
        hot = spec.hot or HOT_DEFAULT
        lines.append(f"The nodes' NVMe is one RAID 0 volume at {hot}" + (
            ": the hot tier (--hot)." if spec.hot else f": give --hot {hot} to keep the hot tier there."))
    return "".join(f"# {line}\n" for line in lines)
