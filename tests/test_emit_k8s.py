"""`trainready run --emit k8s|jobset|pcluster`, checked against the real schemas: TrainJob, TrainingRuntime and
JobSet against their CRDs' OpenAPI v3 schemas (tests/fixtures/crds, strict as `kubectl apply` is), the pod
templates as batch/v1 Jobs through kubernetes-validate, the ParallelCluster config through aws-parallelcluster's
own marshmallow schema and its offline validators. Each pod's arguments go through trainready's own `run`
parser and the torchrun command line it builds through torchrun's parser, as the Slurm and SkyPilot emits do."""

from __future__ import annotations

import copy
import gzip
import hashlib
import os
import re
import shlex
import subprocess
from pathlib import Path
from unittest import mock

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml

from trainready.errors import UsageError
from trainready.run.emit import EmitSpec, emit
from trainready.run.emit.k8s import HUGEPAGES, IMAGE_PLACEHOLDER, QUEUE_LABEL
from trainready.run.launcher import LaunchSpec, torchrun_argv
from trainready.run.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "tests" / "fixtures" / "crds"
K8S_VERSIONS = ["1.31", kubernetes_validate.utils.latest_version()]  # oldest EKS-supported here, newest shipped
TRICKY = ["python", "train.py", "--msg", "hello world", "--home", "$HOME", "--ref", "$(PET_NNODES)", "--dd", "$$x",
          "--q", "it's \"quoted\"", "--nl", "line1\nline2"]


def spec(**kw) -> EmitSpec:
    base = dict(command=["python", "train.py", "--steps", "1000"], nnodes=4, instance="p5.48xlarge", job_name="run1",
                archive="s3://my-bucket/runs/run1", budget_usd=500, spot=False, max_restarts=2,
                service_account="trainer", queue="team-a", image="registry.example/trainready:1.0")
    base.update(kw)
    return EmitSpec(**base)


CASES = {
    "p5-4-nodes-all": dict(),
    "p4d-1-node-minimal": dict(nnodes=1, instance="p4d.24xlarge", queue=None, service_account=None, image=None,
                               archive=None, budget_usd=None),
    "g6e-2-nodes-secret-tricky": dict(nnodes=2, instance="g6e.48xlarge", service_account=None, aws_secret="aws-creds",
                                      command=TRICKY, nproc_per_node=4, hot="/nvme/ckpt", env={"NCCL_DEBUG": "WARN"}),
}


# ---------------------------------------------------------------- the schemas


def _readme_hashes() -> dict[str, str]:
    rows = re.findall(r"^\| `([^`]+\.yaml\.gz)` \|.*\| `([0-9a-f]{64})` \|$", (CRDS / "README.md").read_text(), re.M)
    return dict(rows)


def test_crd_fixtures_are_the_upstream_files():
    hashes = _readme_hashes()
    assert set(hashes) == {p.name for p in CRDS.glob("*.yaml.gz")} and len(hashes) == 3
    for name, digest in hashes.items():
        assert hashlib.sha256(gzip.decompress((CRDS / name).read_bytes())).hexdigest() == digest, name


def _strict(schema: object) -> object:
    """Refuse unknown fields, as the API server's strict field validation does (CRD schemas only prune them)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


_VALIDATORS: dict[tuple[str, str], jsonschema.Draft7Validator] = {}


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    key = (api_version, kind)
    if key not in _VALIDATORS:
        for path in CRDS.glob("*.yaml.gz"):
            crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            group, version = api_version.split("/")
            if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
                ver = next(v for v in crd["spec"]["versions"] if v["name"] == version and v["served"])
                _VALIDATORS[key] = jsonschema.Draft7Validator(_strict(ver["schema"]["openAPIV3Schema"]))
                break
        else:
            raise AssertionError(f"no CRD fixture for {kind} {api_version}")
    return _VALIDATORS[key]


_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_metadata(meta: dict) -> None:
    """What the API server checks of names and labels (apimachinery's IsQualifiedName / IsValidLabelValue)."""
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", meta["name"]) and len(meta["name"]) <= 63
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, name = key.rpartition("/")
        assert _LABEL_NAME.fullmatch(name) and (not prefix or _DNS_SUBDOMAIN.fullmatch(prefix)), key
        assert value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value)), value


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


# ---------------------------------------------------------------- from the emitted objects to pods


def merged_trainjob_pod(runtime: dict, trainjob: dict) -> dict:
    """The node Job the Trainer builds: the runtime's template, the TrainJob's trainer and its runtime patches,
    merged as the Trainer does (patch fields set, containers matched by name, volumes added)."""
    job_spec = copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"])
    pod = job_spec["template"]["spec"]
    trainer = trainjob["spec"]["trainer"]
    patch = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    patch_pod = copy.deepcopy(patch["template"]["spec"]["template"]["spec"])
    patch_containers = {c["name"]: c for c in patch_pod.pop("containers")}
    pod["volumes"] = pod.get("volumes", []) + patch_pod.pop("volumes")
    pod.update(patch_pod)
    for container in pod["containers"]:
        extra = patch_containers.get(container["name"], {})
        container["volumeMounts"] = container.get("volumeMounts", []) + extra.get("volumeMounts", [])
        if container["name"] == "node":
            container.update({k: trainer[k] for k in ("image", "command", "args") if k in trainer})
            container["env"] = trainer.get("env", [])
            container["resources"] = trainer["resourcesPerNode"]
    job_spec.update({"parallelism": trainer["numNodes"], "completions": trainer["numNodes"],
                     "completionMode": "Indexed"})
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{trainjob['metadata']['name']}-node-0"},
            "spec": job_spec}


def jobs_of(kind: str, docs: list[dict]) -> list[dict]:
    """The batch/v1 Jobs each emitted object stands for."""
    if kind == "k8s":
        runtime, trainjob = docs
        return [merged_trainjob_pod(runtime, trainjob)]
    (jobset,) = docs
    name = jobset["metadata"]["name"]
    return [{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-{r['name']}-0"},
             "spec": r["template"]["spec"]} for r in jobset["spec"]["replicatedJobs"]]


def k8s_expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of $(VAR) in command and args: defined names are replaced, $$ is $, the rest stays."""
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("$(", i) and ")" in word[i:]:
            end = word.index(")", i)
            name = word[i + 2:end]
            out.append(env[name] if name in env else word[i:end + 1])
            i = end + 1
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def torchrun_args(argv: list[str]):
    """`trainready run ARGS` read by trainready's own parser, then the torchrun line it builds read by torchrun's."""
    from torch.distributed.run import get_args_parser

    from trainready.cli.main import app

    assert argv[:2] == ["trainready", "run"]
    params = typer.main.get_command(app).commands["run"].make_context("run", list(argv[2:])).params
    launch = LaunchSpec(command=params["command"], settings=RunSettings(run_dir=Path("runs/x")),
                        nproc_per_node=int(params["nproc_per_node"]), nnodes=params["nnodes"],
                        node_rank=params["node_rank"], rdzv_endpoint=params["rdzv_endpoint"],
                        rdzv_id=params["rdzv_id"], max_restarts=params["max_restarts"])
    line = torchrun_argv(launch)
    assert line[1:3] == ["-m", "torch.distributed.run"]
    return params, get_args_parser().parse_args(line[3:])


# ---------------------------------------------------------------- k8s and jobset


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["k8s", "jobset"])
def test_objects_validate_against_the_crds_and_kubernetes(kind, case):
    s = spec(**CASES[case])
    docs = docs_of(emit(kind, s))
    assert [d["kind"] for d in docs] == (["TrainingRuntime", "TrainJob"] if kind == "k8s" else ["JobSet"])
    for doc in docs:
        errors = sorted(crd_validator(doc["apiVersion"], doc["kind"]).iter_errors(doc), key=str)
        assert not errors, f"{doc['kind']}: {errors[0].message} at {list(errors[0].absolute_path)}"
        check_metadata(doc["metadata"])
        assert (doc["metadata"].get("labels", {}).get(QUEUE_LABEL)) == (s.queue if doc["kind"] != "TrainingRuntime"
                                                                          else None)
    for job in jobs_of(kind, docs):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(job, version, strict=True)


def test_validators_refuse_what_the_api_server_refuses():
    """The checks above can fail: a misspelt field, a wrong type, a bad exit-code operator."""
    docs = docs_of(emit("jobset", spec()))
    bad = copy.deepcopy(docs[0])
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelectr"] = {"a": "b"}
    assert list(crd_validator(bad["apiVersion"], "JobSet").iter_errors(bad))
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(jobs_of("jobset", [bad])[0], K8S_VERSIONS[-1], strict=True)
    bad = copy.deepcopy(docs[0])
    bad["spec"]["failurePolicy"]["maxRestarts"] = "3"
    assert list(crd_validator(bad["apiVersion"], "JobSet").iter_errors(bad))
    k8s = docs_of(emit("k8s", spec()))
    bad = copy.deepcopy(k8s[1])
    bad["spec"]["trainer"]["numNodes"] = "4"
    assert list(crd_validator(bad["apiVersion"], "TrainJob").iter_errors(bad))
    job = jobs_of("k8s", k8s)[0]
    job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["operator"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)


def _controller_env(kind: str, docs: list[dict], rank: int) -> dict[str, str]:
    """The variables the controllers add to pod `rank`: the Trainer's PET_* (torch plugin), or the Job's index."""
    if kind == "k8s":
        tj = docs[1]
        name = tj["metadata"]["name"]
        return {"PET_NNODES": str(tj["spec"]["trainer"]["numNodes"]),
                "PET_NPROC_PER_NODE": str(tj["spec"]["trainer"]["numProcPerNode"]), "PET_NODE_RANK": str(rank),
                "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29500"}
    return {"JOB_COMPLETION_INDEX": str(rank)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["k8s", "jobset"])
def test_pod_command_passes_trainready_and_torchrun_parsers(kind, case):
    s = spec(**CASES[case])
    docs = docs_of(emit(kind, s))
    container = next(c for c in jobs_of(kind, docs)[0]["spec"]["template"]["spec"]["containers"] if c["name"] == "node")
    declared = {e["name"]: e.get("value", "<from a Secret>") for e in container.get("env", [])}
    for rank in range(s.nnodes):
        env = {**declared, **_controller_env(kind, docs, rank)}
        argv = [k8s_expand(w, env) for w in container["command"] + container["args"]]
        params, args = torchrun_args(argv)
        assert params["command"] == s.command  # every word arrives as given: $, $(...), $$, quotes, newlines
        assert (args.nnodes, args.node_rank, args.nproc_per_node, args.max_restarts) == \
            (str(s.nnodes), rank, str(s.nproc_per_node or 8), s.max_restarts)
        assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", "run1-node-0-0.run1:29500", "run1")
        assert (params["hot"], params["archive"], params["budget_usd"]) == (s.hot or "/mnt/trainready/ckpt",
                                                                            s.archive, s.budget_usd)
        mount = next(m for m in container["volumeMounts"] if m["name"] == "hot")
        assert mount["mountPath"] == params["hot"]


def test_pod_resources_come_from_the_catalog():
    p5 = jobs_of("jobset", docs_of(emit("jobset", spec())))[0]["spec"]["template"]["spec"]
    res = p5["containers"][0]["resources"]
    assert res["limits"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32, HUGEPAGES[0]: HUGEPAGES[1]}
    assert res["requests"]["memory"] == "1740Gi"  # 0.85 x 2048 GiB
    assert p5["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    vols = {v["name"]: v["emptyDir"] for v in p5["volumes"]}
    assert vols["dshm"] == {"medium": "Memory", "sizeLimit": "8Gi"} and vols["hot"] == {"sizeLimit": "30400G"}
    anti = p5["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == {"jobset.sigs.k8s.io/jobset-name": "run1"}
    near = p5["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert near[0]["podAffinityTerm"]["topologyKey"] == "topology.k8s.aws/network-node-layer-3"
    assert p5["restartPolicy"] == "Never" and p5["terminationGracePeriodSeconds"] == 130
    assert p5["serviceAccountName"] == "trainer"
    p4d = docs_of(emit("k8s", spec(instance="p4d.24xlarge")))[1]["spec"]["trainer"]
    assert p4d["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == 4 and p4d["numProcPerNode"] == 8
    one = docs_of(emit("k8s", spec(nnodes=1)))[1]["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert one == {"nvidia.com/gpu": 8}  # one node: NVLink only, no EFA devices or huge pages to ask for


def test_restart_policy_matches_trainready_run():
    runtime, trainjob = docs_of(emit("k8s", spec(max_restarts=5)))
    jobset = docs_of(emit("jobset", spec(max_restarts=5)))[0]
    for js_spec in (runtime["spec"]["template"]["spec"], jobset["spec"]):
        assert js_spec["failurePolicy"]["maxRestarts"] == 5
        assert js_spec["failurePolicy"]["rules"] == [{"name": "launcherGaveUp", "action": "FailJobSet",
                                                      "onJobFailureReasons": ["PodFailurePolicy"]}]
        job = js_spec["replicatedJobs"][0]["template"]["spec"]
        assert job["backoffLimit"] == 0
        assert job["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [1, 2, 3, 4]
    args = trainjob["spec"]["trainer"]["args"]
    assert args[args.index("--max-restarts") + 1] == "5" and trainjob["spec"]["runtimeRef"]["name"] == "run1"


def test_secret_by_reference_and_placeholder_image():
    text = emit("jobset", spec(service_account=None, aws_secret="aws-creds", image=None))
    container = docs_of(text)[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert refs["AWS_ACCESS_KEY_ID"] == {"name": "aws-creds", "key": "AWS_ACCESS_KEY_ID"}
    assert refs["AWS_SESSION_TOKEN"]["optional"] is True
    # the credentials only by reference; the plain values are the instance's launch environment (EFA, NCCL)
    assert {e["name"] for e in container["env"] if "value" in e} <= {"NCCL_DEBUG", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA"}
    assert container["image"] == IMAGE_PLACEHOLDER and f"replace {IMAGE_PLACEHOLDER}" in text


@pytest.mark.parametrize("kind", ["k8s", "jobset", "pcluster"])
def test_output_is_stable_and_plain(kind):
    cluster = dict(image=None, service_account=None) if kind == "pcluster" else {}
    a, b = emit(kind, spec(env={"A": "1", "B": "2"}, **cluster)), emit(kind, spec(env={"B": "2", "A": "1"}, **cluster))
    assert a == b and a.startswith("# Generated by trainready") and "&id" not in a and "*id" not in a


# ---------------------------------------------------------------- pcluster

# aws-parallelcluster 3.16 still passes marshmallow 3's deprecated `default=`: its warning, not ours
pcluster_warning = pytest.mark.filterwarnings("ignore::marshmallow.warnings.RemovedInMarshmallow4Warning")


def pcluster_load(text: str):
    """ParallelCluster's own schema (aws-parallelcluster's marshmallow ClusterSchema) and its validators that need
    no AWS call, offline: moto answers AWS calls, and the one lookup moto lacks (describe_capacity_reservations)
    answers 'none known'. Returns the loaded config and the validators' errors."""
    from moto import mock_aws
    from pcluster.aws.ec2 import Ec2Client
    from pcluster.schemas.cluster_schema import ClusterSchema

    config = yaml.safe_load(text)
    region = {"AWS_DEFAULT_REGION": config.get("Region", "us-east-1")}  # the pcluster CLI's --region
    with mock.patch.dict(os.environ, region), mock_aws(), \
            mock.patch.object(Ec2Client, "describe_capacity_reservations", return_value=[]):
        loaded = ClusterSchema(cluster_name="run1").load(config)
        return loaded, pcluster_offline_errors(loaded)


def pcluster_offline_errors(config) -> list[str]:
    """ParallelCluster's validators that need no AWS call: names, counts, EFA placement group."""
    from pcluster.validators import cluster_validators as v
    from pcluster.validators.common import FailureLevel

    out = []
    for queue in config.scheduling.queues:
        results = v.NameValidator().execute(name=queue.name)
        for res in queue.compute_resources:
            results += v.NameValidator().execute(name=res.name)
            results += v.ComputeResourceSizeValidator().execute(min_count=res.min_count, max_count=res.max_count,
                                                              capacity_type=queue.capacity_type)
            results += v.EfaPlacementGroupValidator().execute(  # called as SlurmQueue registers it
                efa_enabled=res.efa.enabled,
                placement_group_key=queue.get_placement_group_settings_for_compute_resource(res).get("key"),
                placement_group_disabled=queue.get_chosen_placement_group_setting_for_compute_resource(res).enabled
                is False, multi_az_enabled=len(queue.networking.subnet_ids) > 1,  # one subnet: one zone (no lookup)
                capacity_type=queue.capacity_type, queue_name=queue.name)
        out += [r.message for r in results if r.level == FailureLevel.ERROR]
    return out


PC_CASES = {
    "on-demand-4": dict(),
    "capacity-block-fsx-new": dict(capacity_reservation="cr-0123456789abcdef0", shared_fs="new", queue="gpu",
                                   hot="/scratch"),
    "spot-1-existing-fsx": dict(nnodes=1, spot=True, shared_fs="fs-0123456789abcdef0", region="us-west-2",
                                queue=None),
    "g6e-no-archive": dict(instance="g6e.48xlarge", nnodes=2, archive=None),
}


@pcluster_warning
@pytest.mark.parametrize("case", sorted(PC_CASES))
def test_pcluster_config_loads_with_parallelclusters_schema(case):
    s = spec(image=None, service_account=None, **PC_CASES[case])
    config, errors = pcluster_load(emit("pcluster", s))
    assert errors == []
    (queue,) = config.scheduling.queues
    (res,) = queue.compute_resources
    assert (res.instance_type, res.max_count, queue.name) == (s.instance, s.nnodes, s.queue or "train")
    assert res.efa.enabled is True
    block = s.capacity_reservation is not None
    assert queue.capacity_type.value == ("CAPACITY_BLOCK" if block else "SPOT" if s.spot else "ONDEMAND")
    assert res.min_count == (s.nnodes if block else 0)  # a Capacity Block: MinCount = MaxCount
    assert queue.networking.placement_group.enabled is (s.nnodes > 1 and not block)
    if block:
        assert res.capacity_reservation_target.capacity_reservation_id == s.capacity_reservation
    assert queue.compute_settings.local_storage.ephemeral_volume.mount_dir == (s.hot or "/scratch")
    storage = config.shared_storage or []
    assert [(st.mount_dir, st.shared_storage_type.value) for st in storage] == \
        ([("/fsx", "fsx")] if s.shared_fs else [])  # ParallelCluster names the FsxLustre type "fsx"


@pcluster_warning
def test_pcluster_schema_and_validators_refuse_bad_configs():
    from marshmallow import ValidationError

    text = emit("pcluster", spec(image=None, service_account=None, capacity_reservation="cr-0123456789abcdef0"))
    with pytest.raises(ValidationError):
        pcluster_load(text.replace("CAPACITY_BLOCK", "CAPACITY_BLOK"))
    with pytest.raises(ValidationError):
        pcluster_load(text.replace("SubnetIds:", "SubnetIdz:"))
    _, errors = pcluster_load(text.replace("MinCount: 4", "MinCount: 2"))
    assert any("same value of min count" in m for m in errors)


def test_pcluster_s3_access_by_role_and_the_job_file_to_go_with_it():
    s = spec(image=None, service_account=None, queue="gpu")
    doc = yaml.safe_load(emit("pcluster", s))
    assert doc["Scheduling"]["SlurmQueues"][0]["Iam"] == {"S3Access": [
        {"BucketName": "my-bucket", "EnableWriteAccess": True, "KeyName": "runs/run1/*"}]}
    slurm = emit("slurm", EmitSpec(command=s.command, nnodes=s.nnodes, instance=s.instance, queue="gpu",
                                   archive=s.archive))
    assert "#SBATCH --partition=gpu" in slurm.splitlines()
    srun = next(line for line in slurm.replace("\\\n", " ").splitlines() if line.startswith("srun "))
    words = shlex.split(srun.split("' trainready ", 1)[1])
    _, args = torchrun_args(["trainready", "run", "--nnodes", "4", "--node-rank", "3", *words])
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("4", 3, "8")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kind, fields, message", [
    ("k8s", dict(nproc_per_node=16), "--nproc-per-node 16: p5.48xlarge has 8 GPUs"),
    ("jobset", dict(gpus_per_node=16), "GPUs per node 16: p5.48xlarge has 8 GPUs"),
    ("pcluster", dict(nproc_per_node=9, image=None, service_account=None), "at most 8 processes"),
    ("k8s", dict(instance="p3.16xlarge"), "p3.16xlarge has no EFA interfaces (catalog)"),
    ("pcluster", dict(instance="p3.16xlarge", image=None, service_account=None), "instance with EFA: p3dn.24xlarge"),
    ("jobset", dict(queue="Team_A"), "--queue 'Team_A': a Kueue LocalQueue name"),
    ("k8s", dict(queue="a" * 64), "63 characters at most"),
    ("pcluster", dict(queue="team.a", image=None, service_account=None), "a ParallelCluster queue name"),
    ("pcluster", dict(queue="default", image=None, service_account=None), "not 'default'"),
    ("k8s", dict(job_name="Run_1"), "RFC 1035"),
    ("jobset", dict(job_name="r" * 50), "63 characters at most"),
    ("k8s", dict(instance=None), "--emit k8s needs --instance"),
    ("k8s", dict(instance="p5.48xlarg"), "p5.48xlarge"),  # the catalog's "did you mean"
    ("k8s", dict(hot="nvme/ckpt"), "an absolute path"),
    ("k8s", dict(env={"PET_NNODES": "2"}), "the Trainer's own"),
    ("jobset", dict(service_account="Bad Name"), "non-empty word"),
    ("jobset", dict(aws_secret="Creds"), "--aws-secret 'Creds'"),
    ("k8s", dict(shared_fs="new"), "--shared-fs (FSx for Lustre, --emit pcluster) does not apply to --emit k8s"),
    ("jobset", dict(capacity_reservation="cr-0123456789abcdef0"), "does not apply to --emit jobset"),
    ("k8s", dict(head_host="10.0.0.1"), "leave the option out"),
    ("pcluster", dict(image="x", service_account=None), "--image (k8s, jobset) does not apply"),
    ("pcluster", dict(capacity_reservation="cr-12", image=None, service_account=None), "17 hex digits"),
    ("pcluster", dict(capacity_reservation="cr-0123456789abcdef0", spot=True, image=None, service_account=None),
     "not spot"),
    ("pcluster", dict(shared_fs="fs-12", image=None, service_account=None), "'new' (a new FSx"),
    ("pcluster", dict(instance="a3-highgpu-8g", nnodes=1, image=None, service_account=None), "runs on AWS"),
])
def test_bad_input_is_a_usage_error(kind, fields, message):
    with pytest.raises(UsageError, match=re.escape(message)) as err:
        emit(kind, spec(**fields))
    assert err.value.exit_code == 2


def cli(*args: str) -> subprocess.CompletedProcess:
    from cloud_stubs import cli_run  # `run --emit` writes a file and starts nothing: in this process (issue 25)

    proc = cli_run("run", *args, env={})
    assert "Traceback" not in proc.stderr
    return proc


def test_cli_emits_and_refuses_with_exit_2():
    ok = cli("--emit", "jobset", "--nnodes", "2", "--instance", "p4d.24xlarge", "--queue", "team-a", "--image", "r/t:1",
             "--run-dir", "runs/My_Run.v2", "--", "python", "train.py")
    assert ok.returncode == 0, ok.stderr
    (jobset,) = docs_of(ok.stdout)
    assert jobset["metadata"] == {"name": "my-run-v2", "labels": {QUEUE_LABEL: "team-a"}}  # named after --run-dir
    for args, message in [
        (("--emit", "k8s", "--nnodes", "3", "--instance", "p3.16xlarge"), "no EFA interfaces"),
        (("--emit", "pcluster", "--instance", "p5.48xlarge", "--queue", "Bad_Queue"), "ParallelCluster queue name"),
        (("--emit", "skypilot", "--queue", "a"), "--queue does not apply to --emit skypilot"),
        (("--queue", "a"), "--queue goes with --emit"),
    ]:
        proc = cli(*args, "--", "python", "train.py")
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


def test_docs_examples_match_the_code():
    """docs/emit.md shows the real output of its cluster examples."""
    doc = (ROOT / "docs" / "emit.md").read_text()
    base = dict(command=["python", "train.py", "--config", "configs/7b.yaml"], nnodes=2, instance="p5.48xlarge",
                archive="s3://my-bucket/run1", ckpt_every="auto", budget_usd=500, job_name="run1", max_restarts=3)
    k8s = EmitSpec(**base, image="123456789012.dkr.ecr.us-east-1.amazonaws.com/trainready:1.0", queue="team-a",
                   service_account="trainer")
    for kind in ("k8s", "jobset"):
        assert emit(kind, k8s) in fenced_blocks(doc), f"docs/emit.md: the {kind} example is out of date"
    pc = EmitSpec(**base, region="us-east-1", hot="/scratch", shared_fs="new",
                  capacity_reservation="cr-0123456789abcdef0")
    assert emit("pcluster", pc) in fenced_blocks(doc), "docs/emit.md: the pcluster example is out of date"


@pytest.mark.parametrize("kind", ["k8s", "jobset"])
def test_env_values_and_odd_words_come_back_as_written(kind):
    """Kubernetes expands $(VAR) in env[].value as in args: a value must not pull in another variable (a
    Secret-backed one included); and U+0085/U+2028 must not come back from the YAML as line breaks."""
    spec = EmitSpec(command=["python", "tr\u0085ain.py", "--tag", "a\u2028b"], nnodes=2, instance="p4d.24xlarge",
                    env={"LEAK": "$(AWS_SECRET_ACCESS_KEY)", "PLAIN": "1"})
    docs = [d for d in yaml.safe_load_all(emit(kind, spec)) if d]

    def strings(node):
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    found = strings(docs)
    assert "$$(AWS_SECRET_ACCESS_KEY)" in found and "$(AWS_SECRET_ACCESS_KEY)" not in found
    assert "tr\x85ain.py" in found and "a\u2028b" in found


@pytest.mark.parametrize("kind", ["slurm", "skypilot", "torchrun", "k8s", "jobset", "pcluster"])
def test_paths_with_control_characters_are_refused_by_every_engine(kind):
    for field in ("hot", "run_dir", "archive"):
        value = "/scratch\nrm -rf /" if field != "archive" else "s3://bucket/a\u0085b"
        with pytest.raises(UsageError, match="holds a control character"):
            emit(kind, EmitSpec(command=["python", "train.py"], nnodes=2, instance="p4d.24xlarge", **{field: value}))


# ---------------------------------------------------------------- issue 27: every kind, 2 x p4d, as a user writes it

EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_DEBUG": "INFO"}


def cli_emit(kind: str, *opts: str, cwd: Path | None = None) -> tuple[int, str, str]:
    from cloud_stubs import invoke

    old = os.getcwd()
    os.chdir(cwd or old)
    try:
        return invoke("run", "--emit", kind, "--nnodes", "2", "--instance", "p4d.24xlarge", *opts, "--", "python",
                      "train.py")
    finally:
        os.chdir(old)


def exported(text: str) -> dict[str, str]:
    return {name: value.strip("'\"") for name, value in re.findall(r"^\s*export (\w+)=(\S+)", text, re.M)}


@pcluster_warning
@pytest.mark.parametrize("kind", ["slurm", "torchrun", "skypilot", "k8s", "jobset", "pcluster"])
def test_every_kind_for_two_p4d_nodes_validates_and_carries_the_efa_environment(kind, tmp_path):
    """issue 27: no emitted file carried the EFA settings plan's launch line prints. Each kind, written by the CLI for
    2 x p4d.24xlarge, passes its engine's own check (bash -n for the scripts, SkyPilot's task schema, the JobSet /
    Trainer CRDs and Kubernetes' schemas, ParallelCluster's ClusterSchema) and sets FI_PROVIDER=efa,
    FI_EFA_USE_DEVICE_RDMA=1 (GPUDirect RDMA on p4d) and NCCL_DEBUG=INFO, each with its source in a comment."""
    from test_emit import skypilot_errors

    (tmp_path / "train.py").write_text("print(1)\n")
    code, text, err = cli_emit(kind, cwd=tmp_path)
    assert code == 0, err[-500:]
    assert "FI_EFA_USE_DEVICE_RDMA=1: GPUDirect RDMA" in text and "Source: AWS EC2 user guide" in text
    if kind in ("slurm", "torchrun"):
        assert subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0
        assert EFA_ENV.items() <= exported(text).items(), exported(text)
    elif kind == "skypilot":
        assert skypilot_errors(text) == []
        assert EFA_ENV.items() <= yaml.safe_load(text)["envs"].items()
    elif kind in ("k8s", "jobset"):
        docs = docs_of(text)
        for doc in docs:
            assert not list(crd_validator(doc["apiVersion"], doc["kind"]).iter_errors(doc))
        for job in jobs_of(kind, docs):
            kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)
        env = [e for doc in docs for e in _all_env(doc)]
        assert EFA_ENV.items() <= {e["name"]: e.get("value") for e in env}.items(), env
    else:  # a cluster config starts no job: it names what its job file (--emit slurm) sets
        loaded, errors = pcluster_load(text)
        assert loaded is not None and errors == []
        assert "The job file sets: FI_EFA_USE_DEVICE_RDMA=1, FI_PROVIDER=efa, NCCL_DEBUG=INFO." in text


def _all_env(node) -> list[dict]:
    if isinstance(node, dict):
        return [*node.get("env", []), *[e for v in node.values() for e in _all_env(v)]]
    if isinstance(node, list):
        return [e for v in node for e in _all_env(v)]
    return []


def test_workdir_and_env_reach_every_kind_that_has_them(tmp_path):
    """issue 27: `run --emit skypilot` wrote no workdir (train.py never reached the nodes) and no envs; only Python's
    EmitSpec could. --workdir (skypilot's default: . when the command names a file here) and --env NAME=VALUE."""
    (tmp_path / "train.py").write_text("print(1)\n")
    _, sky, _ = cli_emit("skypilot", "--env", "WANDB_MODE=offline", "--env", "NCCL_DEBUG=WARN", cwd=tmp_path)
    doc = yaml.safe_load(sky)
    assert doc["workdir"] == "." and doc["envs"]["WANDB_MODE"] == "offline" and doc["envs"]["NCCL_DEBUG"] == "WARN"
    _, elsewhere, _ = cli_emit("skypilot", cwd=tmp_path.parent)  # train.py is not here: it is on the nodes
    assert "workdir" not in yaml.safe_load(elsewhere)
    for kind, mark in (("slurm", "#SBATCH --chdir=/srv/code"), ("torchrun", "cd -- /srv/code || exit 1"),
                       ("jobset", "workingDir: /srv/code"), ("skypilot", None)):
        code, text, err = cli_emit(kind, "--workdir", "/srv/code", "--env", "A_B=1", cwd=tmp_path)
        assert code == 0 and (mark in text if mark else yaml.safe_load(text)["workdir"] == "/srv/code"), (kind, err)
        env = exported(text) if kind in ("slurm", "torchrun") else yaml.safe_load(text)["envs"] if kind == "skypilot" \
            else {e["name"]: e.get("value") for doc in docs_of(text) for e in _all_env(doc)}
        assert env.get("A_B") == "1", (kind, env)
    for kind, opt in (("k8s", "--workdir"), ("pcluster", "--workdir"), ("pcluster", "--env")):
        code, _, err = cli_emit(kind, opt, "/x" if opt == "--workdir" else "A=1", cwd=tmp_path)
        assert code == 2 and f"{opt} does not apply to --emit {kind}" in err, err
    code, _, err = cli_emit("slurm", "--env", "1BAD=x", cwd=tmp_path)
    assert code == 2 and "give NAME=VALUE" in err
    code, _, err = cli_emit("slurm", "--env", "A=1", "--env", "A=2", cwd=tmp_path)
    assert code == 2 and "given twice" in err
    from cloud_stubs import invoke

    code, _, err = invoke("run", "--env", "A=1", "--", "python", "train.py")
    assert code == 2 and "--env goes with --emit" in err


def fenced_blocks(markdown: str) -> list[str]:
    """Each ``` block of a page, whole: an example must be one block exactly (not a part of a longer, stale one)."""
    return [m.group(1) for m in re.finditer(r"^```[a-z]*\n(.*?)^```$", markdown, re.M | re.S)]


def test_hostile_env_and_workdir_values_are_refused_or_written_safely(tmp_path):
    """A second review: --env wrote secrets verbatim into launch files (only user:password@ URLs were refused);
    an #SBATCH --chdir with a quote, '#' or backslash became another directory; torchrun's `cd -P` went home; a
    JobSet took a relative workingDir the container runtime refuses."""
    (tmp_path / "train.py").write_text("print(1)\n")
    for pair in ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789",
                 "DB_PASSWORD=hunter2hunter2", "SOMETHING=hf_abcdefghijklmnopqrstuvwxyz0123456789"):
        for kind in ("slurm", "skypilot", "torchrun", "jobset"):
            code, out, err = cli_emit(kind, "--env", pair, cwd=tmp_path)
            secret = pair.partition("=")[2]
            assert code == 2 and "looks like a secret" in err and secret not in out + err, (kind, pair, err)
    code, _, err = cli_emit("jobset", "--aws-secret", "creds", "--env", "AWS_ACCESS_KEY_ID=AKIAEXAMPLE", cwd=tmp_path)
    assert code == 2, err
    for bad in ("/srv/it's", "/srv/a#b", "/srv/a\\b", "/srv/a b"):
        code, _, err = cli_emit("slurm", "--workdir", bad, cwd=tmp_path)
        assert code == 2 and "#SBATCH line cannot hold" in err, (bad, err)
    code, text, _ = cli_emit("torchrun", "--workdir", "-P", cwd=tmp_path)
    assert code == 0 and "cd -- -P || exit 1" in text
    code, _, err = cli_emit("jobset", "--workdir", "code", cwd=tmp_path)
    assert code == 2 and "absolute path inside the image" in err
