"""`--emit k8s` (a Kubeflow Trainer v2 TrainJob) and `--emit jobset` (a plain JobSet): the same job as
Kubernetes YAML, one pod per node, each running `trainready run` (so budget, telemetry, resume and the
no-orphan rules work inside the pod), which starts torchrun underneath. docs/emit.md explains every field.

No PyTorchJob: Trainer v2's TrainJob replaced it (Training Operator v1 is deprecated)."""

from __future__ import annotations

import math
import posixpath
import re

from trainready.errors import UsageError, printable

from ..settings import RunSettings
from .node import Node, env_sources, node_of, nproc, only_for, suggest_name, user_env
from .spec import EmitSpec
from .text import dump_yaml

TRAINER_API = "trainer.kubeflow.org/v1alpha1"  # Kubeflow Trainer v2.3.0 CRDs (tests/fixtures/crds/README.md)
JOBSET_API = "jobset.x-k8s.io/v1alpha2"  # JobSet v0.12.0
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue: pkg/controller/constants (v0.19)
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # JobSet puts it on every pod (a TrainJob's JobSet too)
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # well-known label the kubelet sets from the cloud
HOSTNAME_LABEL = "kubernetes.io/hostname"
# EKS labels each node with its place in the AWS network (layer 3 the closest; nodes sharing it are physically
# nearest): https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html
TOPOLOGY_LAYERS = (("topology.k8s.aws/network-node-layer-3", 100), ("topology.k8s.aws/network-node-layer-2", 50),
                   ("topology.k8s.aws/network-node-layer-1", 10))
GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA device plugin
EFA_RESOURCE = "vpc.amazonaws.com/efa"  # AWS EFA device plugin
# EFA pods ask for 2 MiB huge pages: the EKS guide's training pod requests hugepages-2Mi: 5120Mi (the EFA
# installer pre-allocates 5128 of them): https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html
HUGEPAGES = ("hugepages-2Mi", "5120Mi")
# NCCL keeps its intra-node buffers in /dev/shm and asks containers for --shm-size=1g (NCCL user guide,
# Troubleshooting > Shared memory); each worker process gets that much, DataLoader workers share it too.
SHM_GIB_PER_PROCESS = 1
# The pod asks for this share of the node's nominal memory: the kernel keeps a few % (MemTotal is below the
# nominal size), the kubelet reserves some and system DaemonSets run beside it; more than the node's
# allocatable memory would leave the pod unschedulable. No limit: the trainer may use all that is free.
MEMORY_REQUEST_SHARE = 0.85
# After SIGTERM `trainready run` gives the workers --grace seconds for the final checkpoint, then stops
# torchrun; Kubernetes must not SIGKILL the pod before that (its default is 30 s).
GRACE_MARGIN_S = 30
HOT_DEFAULT = "/mnt/trainready/ckpt"  # the hot-tier volume's mount when --hot is not given
IMAGE_PLACEHOLDER = "IMAGE_WITH_TRAINREADY_AND_TORCH"  # not a valid image name: a pod fails at once until replaced
NAME = "node"  # the replicated job and its container (the Trainer's torch runtime requires "node")
# torchrun's variables the Trainer sets in the "node" container (kubeflow/trainer pkg/constants, v2.3.0)
PET_VARS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# `trainready run` exits 1 (workers failed, --max-restarts used up), 2 (usage), 3 (internal), 4 (budget): a new
# pod would do no better, so these fail the job; anything else (a lost node, eviction, SIGTERM's 143) restarts it.
FINAL_EXIT_CODES = [1, 2, 3, 4]

_RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")


def render(kind: str, spec: EmitSpec) -> str:
    node = _check(kind, spec)
    name = spec.job_name
    hot = spec.hot or HOT_DEFAULT
    spec = spec.model_copy(update={"hot": hot})
    if kind == "k8s":
        docs = [_training_runtime(spec, name), _trainjob(spec, node, name)]
    else:
        docs = [_jobset(spec, node, name)]
    return _header(kind, spec, node, name) + dump_yaml(docs)


# ---------------------------------------------------------------- checks


def _check(kind: str, spec: EmitSpec) -> Node:
    only_for(spec, kind, {"shared_fs": "--shared-fs (FSx for Lustre, --emit pcluster)",
                          "capacity_reservation": "--capacity-reservation (--emit pcluster; on EKS the node group or "
                                                  "Karpenter NodePool holds the reservation)"})
    if spec.head_host is not None:
        raise UsageError(f"--rdzv-endpoint: in --emit {kind} the pods find the rendezvous head by pod 0's DNS name; "
                         "leave the option out")
    node = node_of(spec, kind)
    name = spec.job_name
    longest_pod = f"{name}-{NAME}-0-{spec.nnodes - 1}-abcde"  # JobSet's own check: job, index, 5-letter suffix
    if not _RFC1035.fullmatch(name) or len(longest_pod) > 63:
        raise UsageError(f"job name {printable(name)!r}: Kubernetes needs a lowercase name (RFC 1035: letters, digits, "
                         f"'-', starting with a letter) short enough for pod names like {longest_pod!r} (63 "
                         f"characters at most), e.g. {suggest_name(name, 63 - len(longest_pod) + len(name))!r}")
    if spec.queue is not None and not (len(spec.queue) <= 63 and _DNS1123_SUBDOMAIN.fullmatch(spec.queue)):
        # Kueue checks the queue-name label as a DNS-1123 subdomain, and a label value holds 63 characters at most
        raise UsageError(f"--queue {printable(spec.queue)!r}: a Kueue LocalQueue name is lowercase letters, digits, '-' "
                         f"and '.', starting and ending with a letter or digit, 63 characters at most, e.g. "
                         f"{suggest_name(spec.queue, 63)!r}")
    for flag, value in (("--service-account", spec.service_account), ("--aws-secret", spec.aws_secret)):
        if value is not None and not (len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value)):
            raise UsageError(f"{flag} {printable(value)!r}: a Kubernetes object name is lowercase letters, digits, '-' and "
                             f"'.', starting and ending with a letter or digit, e.g. {suggest_name(value, 253)!r}")
    if spec.hot is not None and not spec.hot.startswith("/"):
        raise UsageError(f"--hot {printable(spec.hot)!r}: in a pod the hot tier is a volume mount, an absolute path "
                         f"(e.g. {HOT_DEFAULT})")
    if spec.hot is not None:  # the API server refuses two mounts at one path; '/' would hide the image
        norm = posixpath.normpath(spec.hot)
        if norm in ("/", "//") or norm == "/dev/shm" or norm.startswith("/dev/shm/"):
            raise UsageError(f"--hot {printable(spec.hot)!r}: the hot tier needs a directory of its own on the node's "
                             f"disk, not / or /dev/shm (the pod's shared memory mount), e.g. {HOT_DEFAULT}")
    if kind == "k8s":
        for var in PET_VARS:
            if var in spec.env:
                raise UsageError(f"environment variable {var} is the Trainer's own (it sets {', '.join(PET_VARS)})")
    return node


# ---------------------------------------------------------------- the pod


def _k8s_word(word: str) -> str:
    """Kubernetes expands $(VAR) in command and args and reads $$ as $: every $ of the user's words is doubled."""
    return word.replace("$", "$$")


def _args(spec: EmitSpec, *, nnodes: str, rank: str, procs: str, endpoint: str) -> list[str]:
    """`trainready run`'s options and the command, after `trainready`; the first four may be $(VAR) references."""
    rdzv_id = spec.rdzv_id if spec.rdzv_id is not None else spec.job_name
    head = ["run", "--nnodes", nnodes, "--node-rank", rank, "--nproc-per-node", procs, "--rdzv-endpoint", endpoint,
            "--rdzv-id", _k8s_word(rdzv_id)]
    return head + [_k8s_word(w) for w in spec.run_options] + ["--"] + [_k8s_word(w) for w in spec.command]


def _env(spec: EmitSpec) -> list[dict]:
    # Kubernetes expands $(VAR) in env[].value too (a value could pull in another variable, a Secret-backed one
    # included): escaped as the command words are
    env: list[dict] = [{"name": k, "value": _k8s_word(v)} for k, v in user_env(spec).items()]
    if spec.aws_secret is not None:  # credentials by reference: the Secret's keys, never their values
        for key, optional in (("AWS_ACCESS_KEY_ID", False), ("AWS_SECRET_ACCESS_KEY", False),
                              ("AWS_SESSION_TOKEN", True)):
            ref: dict = {"name": spec.aws_secret, "key": key}
            if optional:
                ref["optional"] = True
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return env


def _resources(spec: EmitSpec, node: Node) -> dict:
    limits: dict = {GPU_RESOURCE: node.gpus}
    if spec.nnodes > 1 and node.efa > 0:  # one node talks over NVLink only: no EFA devices, no huge pages
        limits[EFA_RESOURCE] = node.efa
        limits[HUGEPAGES[0]] = HUGEPAGES[1]
    out: dict = {"limits": limits}
    if node.ram_gib:  # huge pages also need a memory (or cpu) request
        out["requests"] = {"memory": f"{math.floor(node.ram_gib * MEMORY_REQUEST_SHARE)}Gi"}
    return out


def _volumes(spec: EmitSpec, node: Node) -> tuple[list[dict], list[dict]]:
    """/dev/shm in memory, and the hot tier: a local ephemeral volume (emptyDir) on the node's disk."""
    shm: dict = {"medium": "Memory", "sizeLimit": f"{nproc(spec, node) * SHM_GIB_PER_PROCESS}Gi"}
    hot: dict = {}
    if node.nvme_gb:
        hot["sizeLimit"] = f"{math.floor(node.nvme_gb)}G"  # the instance's NVMe, decimal GB (catalog)
    volumes = [{"name": "dshm", "emptyDir": shm}, {"name": "hot", "emptyDir": hot}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "hot", "mountPath": spec.hot}]
    return volumes, mounts


def _placement(spec: EmitSpec, node: Node, name: str) -> dict:
    """nodeSelector, affinity (one pod per node; near each other where EKS labels the network), tolerations."""
    mine = {"matchLabels": {JOBSET_NAME_LABEL: name}}
    affinity: dict = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": mine, "topologyKey": HOSTNAME_LABEL}]}}
    if spec.nnodes > 1:
        affinity["podAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": weight, "podAffinityTerm": {"labelSelector": mine, "topologyKey": key}}
            for key, weight in TOPOLOGY_LAYERS]}
    return {"nodeSelector": {INSTANCE_TYPE_LABEL: node.instance}, "affinity": affinity,
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]}


def _pod_settings(spec: EmitSpec, node: Node, name: str) -> dict:
    out = _placement(spec, node, name)
    if spec.service_account is not None:
        out["serviceAccountName"] = spec.service_account
    grace = RunSettings.model_fields["grace_s"].default  # what `trainready run` waits by default
    out["terminationGracePeriodSeconds"] = math.ceil(grace) + GRACE_MARGIN_S
    return out


def _failure_policy(spec: EmitSpec) -> dict:
    """JobSet: a job failed by the pod failure policy (the launcher's final exit codes) ends the JobSet; any other
    failure (node lost, pod evicted or preempted) recreates all pods, up to --max-restarts times."""
    return {"maxRestarts": spec.restarts,
            "rules": [{"name": "launcherGaveUp", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]}


def _job_failure(extra: dict) -> dict:
    """batch/v1 Job settings: no pod is retried on its own (a torchrun group restarts together)."""
    template = extra.pop("template")
    return {**extra, "backoffLimit": 0, "podFailurePolicy": {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": NAME, "operator": "In", "values": FINAL_EXIT_CODES}}]},
        "template": template}


def _image(spec: EmitSpec) -> str:
    return spec.image or IMAGE_PLACEHOLDER


# ---------------------------------------------------------------- TrainJob


def _training_runtime(spec: EmitSpec, name: str) -> dict:
    """The namespaced runtime the TrainJob names: only what a TrainJob cannot say, the failure and restart policy."""
    return {
        "apiVersion": TRAINER_API, "kind": "TrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": spec.nnodes, "torch": {}},
            "template": {"spec": {
                "failurePolicy": _failure_policy(spec),
                "replicatedJobs": [{
                    "name": NAME, "replicas": 1,
                    "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": _job_failure({"template": {"spec": {
                            "restartPolicy": "Never", "containers": [{"name": NAME, "image": _image(spec)}]}}}),
                    },
                }],
            }},
        },
    }


def _trainjob(spec: EmitSpec, node: Node, name: str) -> dict:
    volumes, mounts = _volumes(spec, node)
    args = _args(spec, nnodes="$(PET_NNODES)", rank="$(PET_NODE_RANK)", procs="$(PET_NPROC_PER_NODE)",
                 endpoint="$(PET_MASTER_ADDR):$(PET_MASTER_PORT)")
    trainer: dict = {"image": _image(spec), "command": ["trainready"], "args": args}
    env = _env(spec)
    if env:
        trainer["env"] = env
    trainer.update({"numNodes": spec.nnodes, "numProcPerNode": nproc(spec, node),
                    "resourcesPerNode": _resources(spec, node)})
    pod = {**_pod_settings(spec, node, name), "volumes": volumes,
           "containers": [{"name": NAME, "volumeMounts": mounts}]}
    metadata: dict = {"name": name}
    if spec.queue is not None:
        metadata["labels"] = {QUEUE_LABEL: spec.queue}
    return {
        "apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata,
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": name},
            "trainer": trainer,
            "runtimePatches": [{"manager": "trainready", "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": NAME, "template": {"spec": {"template": {"spec": pod}}}}]}}}}],
        },
    }


# ---------------------------------------------------------------- JobSet


def _jobset(spec: EmitSpec, node: Node, name: str) -> dict:
    volumes, mounts = _volumes(spec, node)
    head = f"{name}-{NAME}-0-0.{name}"  # pod 0's hostname.subdomain: JobSet's headless service (DNS hostnames)
    args = _args(spec, nnodes=str(spec.nnodes), rank="$(JOB_COMPLETION_INDEX)", procs=str(nproc(spec, node)),
                 endpoint=f"{head}:{spec.rdzv_port}")
    container: dict = {"name": NAME, "image": _image(spec), "command": ["trainready"], "args": args}
    if spec.workdir is not None:  # a directory inside the image (nothing is copied from here)
        if not spec.workdir.startswith("/"):
            raise UsageError(f"--workdir {printable(spec.workdir)!r}: a container's working directory is an absolute "
                             "path inside the image (the container runtime refuses a relative one), e.g. /workspace")
        container["workingDir"] = spec.workdir
    env = _env(spec)
    if env:
        container["env"] = env
    container.update({"resources": _resources(spec, node), "volumeMounts": mounts})
    pod = {"restartPolicy": "Never", **_pod_settings(spec, node, name), "volumes": volumes, "containers": [container]}
    metadata: dict = {"name": name}
    if spec.queue is not None:
        metadata["labels"] = {QUEUE_LABEL: spec.queue}
    job = _job_failure({"parallelism": spec.nnodes, "completions": spec.nnodes, "completionMode": "Indexed",
                        "template": {"spec": pod}})
    return {
        "apiVersion": JOBSET_API, "kind": "JobSet", "metadata": metadata,
        "spec": {
            "failurePolicy": _failure_policy(spec),
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [{"name": NAME, "replicas": 1, "template": {"spec": job}}],
        },
    }


def _header(kind: str, spec: EmitSpec, node: Node, name: str) -> str:
    what = ("a Kubeflow Trainer v2 TrainJob (and the TrainingRuntime it names)" if kind == "k8s"
            else "a JobSet")
    lines = [
        f"Generated by trainready (`trainready run --emit {kind}`) for job {name}: {what}.",
        f"Launch with: kubectl apply -n NAMESPACE -f {name}.yaml",
        "Edit before launching:",
    ]
    if spec.image is None:
        lines.append(f"  - replace {IMAGE_PLACEHOLDER} with an image that has trainready and torch (--image);")
    if spec.archive is None:
        lines.append("  - no --archive: checkpoints stay on the pods' local disk; a replaced pod starts over;")
    elif spec.archive.startswith("s3://") and spec.service_account is None and spec.aws_secret is None:
        lines.append("  - S3 access for the archive: --service-account (IRSA / EKS Pod Identity) or --aws-secret;")
    elif not spec.archive.startswith("s3://"):
        lines.append("  - the archive path must be shared storage mounted in every pod (add the volume);")
    if kind == "k8s":
        lines.append("  - needs Kubeflow Trainer v2 (2.3 or later) with JobSet installed in the cluster;")
    else:
        lines.append("  - needs the JobSet controller (v0.12 or later) installed in the cluster;")
    if spec.nnodes > 1 and node.efa:
        lines.append(f"  - nodes need the NVIDIA and EFA device plugins ({node.efa} x {EFA_RESOURCE} per node here);")
    if spec.queue is not None:
        lines += [f"  - Kueue: LocalQueue {spec.queue} must exist, and its ClusterQueue must cover every resource",
                  "    the pods request (or Kueue's configuration excludes them: resources.excludeResourcePrefixes);"]
    lines += [
        *[f"env {line}" for line in env_sources(spec)],
        f"One pod per {node.instance} node runs `trainready run`, which starts torchrun underneath; the nodes meet",
        "by c10d rendezvous on pod 0. The hot tier is a local ephemeral volume (emptyDir) on the node's disk:",
        "put the kubelet's ephemeral storage on the instance-store NVMe (e.g. Karpenter instanceStorePolicy: RAID0).",
        f"{spec.restarts_line[0].upper()}{spec.restarts_line[1:]}.",
    ]
    return "".join(f"# {line}\n" for line in lines)
