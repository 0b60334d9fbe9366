"""`trainready check`: fixture bundles of healthy and broken nodes (tests/fixtures/check/bundles, edits in
check_bundles.py), analyzed in-process and through the CLI; `check collect` and a live run on this machine."""

import json
import shutil
import subprocess
import sys

import pytest
from check_bundles import (
    BUNDLES,
    INSTANCE,
    NVLINK,
    QUERY,
    TOPO,
    VARIANTS,
    every_file,
    garbage,
    make_bundle,
    make_variant,
    query_set,
    truncated,
)

from trainready.check import checks  # noqa: F401  (register every check in CHECKS)
from trainready.check.analyze import analyze
from trainready.check.bundle import Bundle
from trainready.check.probes import COMMANDS
from trainready.check.registry import CHECKS

GPU_KINDS = ("p4d", "p5", "g5", "p3")
STATUSES = {"pass", "warn", "fail", "skip"}
# What every healthy bundle must pass: the checks its files feed.
KEY_IDS = ("gpu.count", "gpu.model", "gpu.driver", "gpu.ecc", "gpu.xid", "gpu.throttle", "gpu.pcie",
           "gpu.nvlink-topology", "gpu.nvlink-links", "cpu.vcpu-per-gpu", "mem.host", "storage.hot-tier",
           "storage.shared", "net.efa", "net.nccl-env", "cuda.runtime", "cuda.graphs")
CRASHED = "check could not run"
DEPENDS_ON_A_GPU = ("gpu.model", "gpu.driver", "gpu.ecc", "gpu.throttle", "gpu.pcie", "gpu.nvlink-topology",
                    "gpu.nvlink-links")  # registry.run_checks' reason when a check raised


def cli(*args, timeout=120):
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TRAINREADY_NO_IMDS": "1"}
    if "--bundle" in args:  # an analysis of files: the entry function in this process (issue 25)
        from cloud_stubs import cli_run

        proc = cli_run(*args, env=env)
        assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-2000:]
        return proc
    proc = subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-2000:]
    return proc


def cli_report(*args, code):
    """`check ARGS --json`, which must exit with `code`; the report and its findings by id."""
    proc = cli("check", *args, "--json")
    data = json.loads(proc.stdout)
    by_id = {c["id"]: c for c in data["checks"]}
    assert proc.returncode == code, (proc.returncode, {i: (c["status"], c["reason"]) for i, c in by_id.items()
                                                       if c["status"] == "fail"}, proc.stderr[-1000:])
    assert code == (1 if data["summary"]["fail"] or data["readiness"]["status"] == "not-verified" else 0)
    return data, by_id


NO_NVIDIA_SMI = shutil.which("nvidia-smi", path="/usr/bin:/bin") is None
needs_no_gpu = pytest.mark.skipif(not NO_NVIDIA_SMI, reason="this machine has nvidia-smi: its GPUs decide the answer")


def findings(directory, instance=None):
    report = analyze(Bundle.load(directory), instance)
    return report, {f.id: f for f in report.checks}


def assert_well_formed(data):
    assert data["schema_version"] == 2
    assert {"instance_type", "source", "readiness", "checks", "summary"} <= set(data)
    verdict = data["readiness"]
    assert verdict["status"] in ("ready", "not-ready", "not-verified") and verdict["text"]
    assert (verdict["status"] == "not-ready") == (data["summary"]["fail"] > 0)
    assert set(data["summary"]) == STATUSES and sum(data["summary"].values()) == len(data["checks"])
    for c in data["checks"]:
        assert {"id", "area", "status", "observed", "expected", "reason", "advice"} <= set(c)
        assert c["status"] in STATUSES
        if c["status"] in ("fail", "skip"):
            assert c["reason"], c
        if c["status"] == "fail":
            assert c["advice"], c
    assert {c["id"] for c in data["checks"] if not c["id"].startswith("dcgm.")} == set(CHECKS)


def no_crash(by_id):
    reasons = {i: f["reason"] if isinstance(f, dict) else f.reason for i, f in by_id.items()}
    crashed = {i: r for i, r in reasons.items() if CRASHED in r}
    assert not crashed, crashed


# ---------------------------------------------------------------- healthy nodes


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_healthy_bundle_passes(kind):
    data, by_id = cli_report("--bundle", BUNDLES / kind, code=0)
    assert_well_formed(data)
    no_crash(by_id)
    assert data["instance_type"] == INSTANCE[kind] and data["source"] == str(BUNDLES / kind)
    not_passed = {i: (by_id[i]["status"], by_id[i]["reason"]) for i in KEY_IDS if by_id[i]["status"] != "pass"
                  and not by_id[i]["reason"].startswith("not applicable: ")}
    assert not not_passed
    assert data["readiness"]["status"] == "ready" and not data["readiness"]["unverified"]


def test_nvlink_topology_reasons_name_the_pattern():
    _, g5 = findings(BUNDLES / "g5")
    assert g5["gpu.nvlink-topology"].status == "pass" and "PCIe-only" in g5["gpu.nvlink-topology"].reason
    links = g5["gpu.nvlink-links"]  # A10G has no NVLink: nothing to be down
    assert links.status == "skip" and links.reason == "not applicable: a10g has no NVLink"
    _, p3 = findings(BUNDLES / "p3")
    reason = p3["gpu.nvlink-topology"].reason
    assert p3["gpu.nvlink-topology"].status == "pass" and "cube-mesh" in reason and "no NVLink" in reason
    for kind, links in (("p4d", "12"), ("p5", "18"), ("p3", "6")):
        _, by_id = findings(BUNDLES / kind)
        assert by_id["gpu.nvlink-links"].status == "pass" and links in by_id["gpu.nvlink-links"].expected


def test_instance_option_overrides_the_bundle():
    # p4d hardware judged as the p5 it claims to be: NV12 is short of NV18, A100 is not H100
    report, by_id = findings(BUNDLES / "p4d", "p5.48xlarge")
    assert report.instance_type == "p5.48xlarge"
    assert by_id["gpu.model"].status == "fail"
    assert by_id["gpu.nvlink-topology"].status == "fail" and "want NV18" in by_id["gpu.nvlink-topology"].reason
    assert by_id["gpu.nvlink-links"].status == "fail" and "12 of 18" in by_id["gpu.nvlink-links"].reason
    assert by_id["net.efa"].status == "fail" and "4 of 32" in by_id["net.efa"].reason


# ---------------------------------------------------------------- broken nodes

# variant -> {check id that must fail: words its reason must contain}; every other check must not fail
BROKEN = {
    "gpu-missing": {"gpu.count": ["7 GPUs", "expected 8"], "cuda.runtime": ["7 of 8"]},
    "nvlink-inactive": {"gpu.nvlink-links": ["GPU3 links 4, 5 inactive"]},
    "nvlink-topo-nv6": {"gpu.nvlink-topology": ["GPU2-GPU5", "NV6", "NV12"]},
    "efa-absent": {"net.efa": ["0 of 4"]},
    "bad-env": {"net.nccl-env": ["NCCL_P2P_DISABLE=1", "NCCL_NET=Socket", "CUDA_LAUNCH_BLOCKING=1"]},
    "socket-fallback": {"net.nccl-env": ["NET/Socket"]},
    "nvme-unmounted": {"storage.hot-tier": ["/dev/nvme1n1", "/dev/nvme8n1"]},
    "ecc": {"gpu.ecc": ["GPU 5"]},
    "xid79": {"gpu.xid": ["Xid 79", "fallen off the bus"]},
}


def test_every_variant_has_an_expectation():
    assert set(BROKEN) == set(VARIANTS)


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_broken_variant_fails_the_right_check(variant, tmp_path):
    directory = make_variant(variant, tmp_path)
    data, by_id = cli_report("--bundle", directory, code=1)
    assert_well_formed(data)
    no_crash(by_id)
    expected = BROKEN[variant]
    got = {i: (c["status"], c["reason"]) for i, c in by_id.items() if i in expected}
    for check_id, words in expected.items():
        status, reason = got[check_id]
        assert status == "fail", (check_id, status, reason)
        missing = [w for w in words if w not in reason]
        assert not missing, (check_id, reason, missing)
    others = {i: c["reason"] for i, c in by_id.items() if c["status"] == "fail" and i not in expected}
    assert not others, others


def test_driver_error_instead_of_output(tmp_path):
    # what nvidia-smi prints (exit 9) when the driver is not loaded: the file is there, its content is an error.
    # One root cause, one finding: gpu.count fails quoting nvidia-smi, the checks that need a GPU point at it.
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.\n\n")
    directory = make_bundle("p4d", tmp_path, replace={QUERY: message, TOPO: message, NVLINK: message})
    _, by_id = findings(directory)
    no_crash(by_id)
    count = by_id["gpu.count"]
    assert count.status == "fail" and "p4d.24xlarge has 8 GPUs" in count.reason and "NVIDIA-SMI has failed" in count.reason
    for check_id in DEPENDS_ON_A_GPU:
        assert (by_id[check_id].status, by_id[check_id].reason) == ("skip", "no GPU visible: see gpu.count"), check_id
    assert [i for i, f in by_id.items() if "NVIDIA-SMI has failed" in f.reason] == ["gpu.count"]
    # the files were collected: a reason must not claim the probe did not run
    wrong = {i: f.reason for i, f in by_id.items() if any(f"{n} not in the bundle" in f.reason for n in (QUERY, TOPO, NVLINK))}
    assert not wrong, wrong


@pytest.mark.parametrize(("mask", "status"), [("0x0000000000000001", "pass"),  # GPU idle
                                               ("0x0000000000000002", "pass"),  # applications clocks setting
                                               ("0x0000000000000048", "fail"),  # HW slowdown + HW thermal
                                               ("0x0000000000000080", "fail")])  # HW power brake
def test_throttle_reasons(tmp_path, mask, status):
    directory = make_bundle("p4d", tmp_path, replace={QUERY: query_set(2, "clocks_throttle_reasons.active", mask)})
    _, by_id = findings(directory)
    assert by_id["gpu.throttle"].status == status, (mask, by_id["gpu.throttle"])
    if status == "warn":
        assert "GPU 2" in by_id["gpu.throttle"].observed


def test_pcie_width_degraded_names_the_gpu(tmp_path):
    directory = make_bundle("p4d", tmp_path, replace={QUERY: query_set(6, "pcie.link.width.current", "8")})
    _, by_id = findings(directory)
    assert by_id["gpu.pcie"].status == "fail" and "GPU 6 x8 of x16" in by_id["gpu.pcie"].observed
    # the generation dropping at idle is no fault (g5's bundle idles at gen 1 of 4)
    _, g5 = findings(BUNDLES / "g5")
    assert g5["gpu.pcie"].status == "pass"


# ---------------------------------------------------------------- no GPU


def test_no_gpu_fails_once_unless_cpu_only():
    # `check && launch` must not launch on a node without GPU: gpu.count fails, with the one reason
    data, by_id = cli_report("--bundle", BUNDLES / "cpu-only", code=1)
    assert_well_formed(data)
    no_crash(by_id)
    assert data["instance_type"] is None
    assert {i for i, c in by_id.items() if c["status"] == "fail"} == {"gpu.count"}
    count = by_id["gpu.count"]
    assert count["observed"] == "no GPU visible" and "training needs a GPU" in count["reason"]
    assert "--cpu-only" in count["advice"]
    # ... said once, on the bundle's machine (named by the manifest), never "this machine"
    root = "nvidia-smi not available on the bundle's machine ip-172-31-9-40 (nvidia-smi: command not found)"
    assert root in count["reason"]
    assert [i for i, c in by_id.items() if "nvidia-smi not available" in c["reason"]] == ["gpu.count"]
    assert not [i for i, c in by_id.items() if "this machine" in c["reason"]]
    for check_id in DEPENDS_ON_A_GPU:
        assert (by_id[check_id]["status"], by_id[check_id]["reason"]) == ("skip", "no GPU visible: see gpu.count")
        assert by_id[check_id]["advice"] == ""
    cpu = by_id["cpu.vcpu-per-gpu"]  # nothing to divide by: unknown, not a pass
    assert cpu["status"] == "skip" and cpu["observed"] == "2 vCPUs" and "see gpu.count" in cpu["reason"]
    assert (by_id["cuda.runtime"]["status"], by_id["cuda.runtime"]["reason"]) == ("skip", "no GPU visible: see gpu.count")
    assert "CUDA not available" in by_id["cuda.runtime"]["observed"]
    assert by_id["mem.host"]["status"] == "pass" and "23 GiB" in by_id["mem.host"]["observed"]
    assert by_id["gpu.xid"]["status"] == "skip" and "dmesg needs root" in by_id["gpu.xid"]["reason"]


def test_cpu_only_option_says_no_gpu_is_expected():
    data, by_id = cli_report("--bundle", BUNDLES / "cpu-only", "--cpu-only", code=0)
    assert_well_formed(data)
    # skip 15 + the 24 acceptance checks of issue 16, which this older bundle has no files for
    assert data["summary"] == {"pass": 3, "warn": 2, "fail": 0, "skip": 42}, {i: c["status"] for i, c in by_id.items()}
    count = by_id["gpu.count"]
    assert (count["status"], count["observed"], count["expected"]) == ("pass", "no GPU", "no GPU (--cpu-only)")
    for check_id in DEPENDS_ON_A_GPU:
        assert by_id[check_id]["reason"] == "CPU-only node (--cpu-only): no GPU to check"
    assert by_id["cpu.vcpu-per-gpu"]["reason"] == "CPU-only node (--cpu-only): no GPU to feed"
    # GPUs where --cpu-only says there are none: a warning, not silence
    data, by_id = cli_report("--bundle", BUNDLES / "p4d", "--cpu-only", code=0)
    assert by_id["gpu.count"]["status"] == "warn" and "but 8 are visible" in by_id["gpu.count"]["reason"]


def test_without_manifest_a_missing_file_is_unknown_not_absent(tmp_path):
    # no manifest: nothing says nvidia-smi is missing on that machine, so no GPU count is known
    directory = make_bundle("cpu-only", tmp_path, drop=("manifest.json",))
    report, by_id = findings(directory)
    assert by_id["gpu.count"].status == "skip" and QUERY in by_id["gpu.count"].reason
    assert "nothing else in the bundle counts GPUs" in by_id["gpu.count"].reason
    assert by_id["cpu.vcpu-per-gpu"].reason == "GPU count unknown (see gpu.count): vCPUs per GPU cannot be judged"
    assert not report.failed


def test_gpus_counted_from_every_file_there_is(tmp_path):
    # a container without nvidia-smi, where torch sees the GPUs: counted by torch, no failure
    gone = (QUERY, TOPO, NVLINK)
    report, by_id = findings(make_bundle("p5", tmp_path, drop=gone))
    assert by_id["gpu.count"].status == "pass" and "counted by torch (cuda.json)" in by_id["gpu.count"].reason
    assert by_id["gpu.model"].status == "skip" and not report.failed
    # nothing at all about GPUs in the bundle of a GPU instance: unknown (skip), never a failure
    report, by_id = findings(make_bundle("p5", tmp_path, drop=(*gone, "cuda.json")))
    assert by_id["gpu.count"].status == "skip" and "cannot count GPUs" in by_id["gpu.count"].reason
    assert not report.failed, {f.id: f.reason for f in report.checks if f.status == "fail"}


def test_efa_judged_from_every_file_present(tmp_path):
    # fi_info listing the efa provider proves libfabric is installed, with or without efa-software.txt
    _, by_id = findings(make_bundle("p5", tmp_path, drop=("efa-software.txt",)))
    efa = by_id["net.efa"]
    assert efa.status == "warn" and "libfabric found" in efa.observed and "aws-ofi-nccl unknown" in efa.observed
    assert "could not tell the aws-ofi-nccl plugin" in efa.reason and "efa-software.txt not in the bundle" in efa.reason
    # p4d's NCCL log shows NCCL running over the plugin: that settles it
    _, by_id = findings(make_bundle("p4d", tmp_path, drop=("efa-software.txt",)))
    assert by_id["net.efa"].status == "pass" and "aws-ofi-nccl found" in by_id["net.efa"].observed
    # fi_info ran (the manifest says so) but the software listing says absent: fi_info wins
    lib = "/opt/amazon/efa/lib/libfabric.so"
    _, by_id = findings(make_bundle("p4d", tmp_path, replace={
        "efa-software.txt": lambda t: t.replace(f"present {lib}", f"absent {lib}")}))
    assert by_id["net.efa"].status == "pass" and "libfabric found" in by_id["net.efa"].observed
    # no device listing at all: the count is unknown, not zero
    _, by_id = findings(make_bundle("p5", tmp_path, drop=("fi_info-p-efa.txt", "sys-class-infiniband.txt")))
    efa = by_id["net.efa"]
    assert efa.status == "warn" and efa.observed.startswith("? EFA device(s)") and "EFA device count" in efa.reason
    # evidence of absence still fails: the software listing says neither is there, and no fi_info output or
    # NCCL log says otherwise
    _, by_id = findings(make_bundle("p5", tmp_path, drop=("fi_info-p-efa.txt",),
                                    replace={"efa-software.txt": lambda t: t.replace("present", "absent")}))
    assert by_id["net.efa"].status == "fail" and "libfabric and the aws-ofi-nccl plugin not found" in by_id["net.efa"].reason


def test_fstab_client_presence_is_not_assumed(tmp_path):
    fstab = "fs-0abc.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh /data lustre defaults,noatime,_netdev 0 0\n"
    _, by_id = findings(make_bundle("p4d", tmp_path, replace={"fstab.txt": fstab}))
    shared = by_id["storage.shared"]  # /data in fstab, not mounted: a fact; the client: unknown, not "present"
    assert shared.status == "fail" and "kernel client unknown" in shared.observed and "client present" not in shared.observed


# ---------------------------------------------------------------- damaged input


@pytest.mark.parametrize("kind", [*GPU_KINDS, "cpu-only"])
def test_garbage_and_truncated_files_never_crash(kind, tmp_path):
    edits = [garbage(seed) for seed in range(6)] + [truncated(f) for f in (0.0, 0.3, 0.5, 0.9)]
    for edit in edits:
        # every file damaged; then every file but instance-type.txt, so the checks that know the node run too
        for replace in (every_file(kind, edit),
                        {k: v for k, v in every_file(kind, edit).items() if k != "instance-type.txt"}):
            _, by_id = findings(make_bundle(kind, tmp_path, replace=replace))
            assert set(by_id) == set(CHECKS) and all(f.status in STATUSES for f in by_id.values())
            no_crash(by_id)


def test_garbage_bundle_through_the_cli(tmp_path):
    # every file garbage, instance-type.txt too: nothing is known, so nothing fails (and nothing crashes), and
    # the verdict says the node is not verified (exit 1), never ready
    directory = make_bundle("p4d", tmp_path, replace=every_file("p4d", garbage(99)))
    data, by_id = cli_report("--bundle", directory, code=1)
    assert data["summary"]["fail"] == 0 and data["readiness"]["status"] == "not-verified"
    assert_well_formed(data)
    no_crash(by_id)
    assert by_id["gpu.count"]["status"] == "warn" and "instance type unknown" in by_id["gpu.count"]["reason"]


def test_damaged_manifest_is_a_usage_error(tmp_path):
    directory = make_bundle("p4d", tmp_path, replace={"manifest.json": b"\x00{not json"})
    proc = cli("check", "--bundle", directory, "--json")
    assert proc.returncode == 2 and "manifest.json" in proc.stdout + proc.stderr


def test_missing_bundle_directory(tmp_path):
    proc = cli("check", "--bundle", tmp_path / "nope", "--json")
    assert proc.returncode == 2 and f"bundle directory {tmp_path / 'nope'} does not exist" in proc.stderr
    assert "does not exist" in json.loads(proc.stdout)["error"]["message"]


def test_a_path_that_is_not_a_bundle_is_a_usage_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello\n")
    cases = {
        empty: f"{empty} is not a bundle: no manifest.json and none of the probe files",
        tmp_path / "empty" / "notes.txt": "is a file, not a directory",
        BUNDLES / "p4d" / "manifest.json": f"pass the directory that holds it ({BUNDLES / 'p4d'})",
    }
    import tarfile

    archive = tmp_path / "node7.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(BUNDLES / "p4d", arcname="node7")
    cases[archive] = "an archive, not a directory: unpack it first"
    for path, words in cases.items():
        proc = cli("check", "--bundle", path)
        assert proc.returncode == 2 and words in proc.stderr, (path, proc.returncode, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == "", proc.stderr


def test_unknown_instance_is_a_usage_error():
    for extra in (["--json"], []):
        proc = cli("check", "--bundle", BUNDLES / "p4d", "--instance", "p4d.24xlarg", *extra)
        assert proc.returncode == 2 and "Did you mean" in proc.stdout + proc.stderr
        assert "p4d.24xlarge" in proc.stdout + proc.stderr


def test_human_output():
    for kind, extra, code in (("p4d", [], 0), ("cpu-only", [], 1), ("cpu-only", ["--cpu-only"], 0)):
        proc = cli("check", "--bundle", BUNDLES / kind, *extra)
        assert proc.returncode == code and "gpu.count" in proc.stdout
        assert f"(bundle {BUNDLES / kind})" in proc.stdout and "None" not in proc.stdout
    assert "1 fail, 2 warn, 2 pass, 42 skip  -> not ready: fix the failures first" in cli(
        "check", "--bundle", BUNDLES / "cpu-only").stdout


def test_80_columns_never_cut_a_check_id():
    for kind in ("p4d", "cpu-only"):
        proc = subprocess.run([sys.executable, "-m", "trainready", "check", "--bundle", str(BUNDLES / kind)],
                              capture_output=True, text=True, timeout=120,
                              env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "TRAINREADY_NO_IMDS": "1"})
        assert proc.returncode == (0 if kind == "p4d" else 1)
        assert max(len(line) for line in proc.stdout.splitlines()) <= 80
        shown = {line.split("\u2502")[2].strip() for line in proc.stdout.splitlines() if line.count("\u2502") >= 3}
        assert set(CHECKS) <= shown, set(CHECKS) - shown


def test_torch_advice_prints_whole(tmp_path):
    # the extra in brackets is text, not markup: it must reach the terminal as written
    no_torch = json.dumps({"torch": None, "cuda_available": False, "reason": "torch is not installed"})
    directory = make_bundle("p4d", tmp_path, replace={"cuda.json": no_torch})
    for columns, words in (("200", "pip install 'trainready[torch]' (or your own CUDA build of torch)"),
                           ("80", "'trainready[torch]'")):
        proc = subprocess.run([sys.executable, "-m", "trainready", "check", "--bundle", str(directory)],
                              capture_output=True, text=True, timeout=120,
                              env={"COLUMNS": columns, "PATH": "/usr/bin:/bin", "TRAINREADY_NO_IMDS": "1"})
        assert proc.returncode == 0 and words in proc.stdout, proc.stdout


# ---------------------------------------------------------------- this machine


def test_collect_then_analyze(tmp_path):
    out = tmp_path / "bundle"
    proc = cli("check", "collect", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"bundle written to {out}: ")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["kind"] == "trainready.check-bundle"
    probes = {p["file"]: p for p in manifest["probes"]}
    assert set(COMMANDS) <= set(probes) and {"meminfo.txt", "mounts.txt", "env.txt"} <= set(probes)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # the write test left nothing behind
    if NO_NVIDIA_SMI:
        assert probes[QUERY]["exit_code"] is None and probes[QUERY]["error"]
        assert not (out / QUERY).exists()
        data, by_id = cli_report("--bundle", out, code=1)
        assert_well_formed(data)
        no_crash(by_id)
        assert by_id["gpu.count"]["status"] == "fail" and "nvidia-smi not available on the bundle's machine" in \
            by_id["gpu.count"]["reason"]
        cli_report("--bundle", out, "--cpu-only", code=0)


@pytest.mark.parametrize(("where", "words"), [
    ("/proc/trainready-test/b", "cannot write the bundle to /proc/trainready-test/b: /proc does not allow creating"),
    ("FILE/sub", "cannot write the bundle to FILE/sub: FILE is a file, not a directory"),
    ("FILE", "cannot write the bundle to FILE: it is a file, not a directory"),
])
def test_collect_to_a_path_we_cannot_write_is_a_usage_error(tmp_path, where, words):
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    where, words = where.replace("FILE", str(blocker)), words.replace("FILE", str(blocker))
    proc = cli("check", "collect", "--out", where)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {words}"), lines
    assert blocker.read_text() == "x"


def test_collect_checks_the_directory_before_any_probe_runs(tmp_path, monkeypatch):
    import errno

    from trainready.check import bundle as bundle_module
    from trainready.check.probes import collect
    from trainready.errors import UsageError

    def read_only(path, **_kw):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(bundle_module, "make_dir", read_only)
    ran = []
    with pytest.raises(UsageError) as caught:
        collect(tmp_path / "b", runner=lambda argv, timeout: ran.append(argv))
    assert str(caught.value) == (f"cannot write the bundle to {tmp_path / 'b'}: permission denied on {tmp_path / 'b'} "
                                 "(choose a directory you can write to)")
    assert ran == []

    def read_only_fs(path, **_kw):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(bundle_module, "make_dir", read_only_fs)
    with pytest.raises(UsageError, match="is on a read-only file system"):
        Bundle({"lscpu.txt": "x"}).save(tmp_path / "c")


def test_collect_reports_progress_per_probe():
    from trainready.check.probes import PROBE_COUNT, Result, collect

    ticks = []
    bundle = collect(None, runner=lambda argv, timeout: Result(None, "", "not here", 0.0), on_progress=ticks.append)
    assert ticks == [1] * PROBE_COUNT and bundle.source == "live"


@needs_no_gpu
def test_live_check_without_gpu_fails_unless_cpu_only():
    # TRAINREADY_NO_IMDS (set by cli) keeps instance detection off the network
    data, by_id = cli_report(code=1)
    assert_well_formed(data)
    no_crash(by_id)
    assert data["source"] == "live"
    assert {i for i, c in by_id.items() if c["status"] == "fail"} == {"gpu.count"}
    assert "nvidia-smi not available on this machine" in by_id["gpu.count"]["reason"]
    data, by_id = cli_report("--cpu-only", code=0)
    assert by_id["gpu.count"]["status"] == "pass"


def test_pending_row_remap_and_remap_failure_from_smi_q(tmp_path):
    from pathlib import Path

    sample = (Path(__file__).parent / "fixtures" / "check" / "nvidia-smi-q_H100_550.txt").read_text()
    directory = make_bundle("p5", tmp_path, replace={"nvidia-smi-q.txt": sample})
    _, by_id = findings(directory)
    ecc = by_id["gpu.ecc"]
    assert ecc.status == "fail" and "GPU 2" in ecc.reason and "pending" in ecc.reason, ecc  # reset first (issue 23)
    failed = sample.replace("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes", 1)
    assert failed != sample
    directory = make_bundle("p5", tmp_path, replace={"nvidia-smi-q.txt": failed})
    _, by_id = findings(directory)
    assert by_id["gpu.ecc"].status == "fail" and "no spare row" in by_id["gpu.ecc"].reason


def test_hot_tier_free_space_against_the_jobs_checkpoints(tmp_path):
    from trainready.check.context import JobNeeds
    from trainready.check.parsers.system import parse_df

    df = ("Filesystem Type 1B-blocks Avail Mounted on\n/dev/root ext4 214748364800 107374182400 /\n"
          "/dev/md0 xfs 7680000000000 300000000000 /scratch\n")
    directory = make_bundle("p4d", tmp_path, replace={"df.txt": df})
    tight = analyze(Bundle.load(directory), job=JobNeeds(checkpoint_gib=200, keep_checkpoints=2))
    hot = {f.id: f for f in tight.checks}["storage.hot-tier"]
    assert hot.status == "fail" and "279 GiB free on /scratch" in hot.reason and "600 GiB" in hot.reason, hot
    roomy = analyze(Bundle.load(directory), job=JobNeeds(checkpoint_gib=50, keep_checkpoints=2))
    assert {f.id: f for f in roomy.checks}["storage.hot-tier"].status == "pass"
    for junk in ("", "\x00\xff garbage", df[:40], "a b c d e f\n" * 3):
        assert isinstance(parse_df(junk).entries, list)


def test_model_options_check_host_ram_for_offload():
    _, by_id = cli_report("--bundle", BUNDLES / "p4d", "--model", "llama-2-70b", "--strategy", "zero3",
                          "--offload", "optimizer", code=0)
    assert by_id["mem.host"]["status"] == "pass" and "GiB fits" in by_id["mem.host"]["reason"]
    _, by_id = cli_report("--bundle", BUNDLES / "g5", "--instance", "g5.12xlarge", "--model", "llama-2-70b",
                          "--strategy", "zero3", "--offload", "optimizer", code=1)
    assert by_id["mem.host"]["status"] == "fail" and "needs" in by_id["mem.host"]["reason"], by_id["mem.host"]
    proc = cli("check", "--bundle", BUNDLES / "cpu-only", "--model", "llama-2-7b")
    assert proc.returncode == 2 and "--instance" in proc.stderr


def test_slow_nvlink_and_unmounted_lustre_are_named(tmp_path):
    directory = make_bundle("p4d", tmp_path, replace={
        NVLINK: lambda text: text.replace("Link 7: 25 GB/s", "Link 7: 12.5 GB/s", 1),
        "fstab.txt": "fs-0abc.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh /data lustre defaults,noatime,_netdev 0 0\n",
        "filesystems.txt": "nodev\tsysfs\n\text4\n\txfs\nnodev\tnfs4\n",
    })
    _, by_id = findings(directory)
    links = by_id["gpu.nvlink-links"]
    assert links.status == "fail" and "link 7 at 12.5 GB/s" in links.reason, links
    shared = by_id["storage.shared"]
    assert shared.status == "fail" and "/data" in shared.observed and "no kernel support for lustre" in shared.observed


@needs_no_gpu
def test_check_runs_without_torch(tmp_path):
    # torch blocked: the GPU/CUDA checks skip with why, the command still answers
    blocker = tmp_path / "torch.py"
    blocker.write_text("raise ImportError('torch blocked for this test')\n")
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TRAINREADY_NO_IMDS": "1", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "trainready", "check", "--cpu-only", "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1000:]
    found = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert found["cuda.runtime"]["status"] == "skip" and found["cuda.runtime"]["reason"] == "torch is not installed"
    assert found["cuda.runtime"]["advice"] == "pip install 'trainready[torch]' (or your own CUDA build of torch)"


def test_unparsable_output_is_shown_in_the_finding():
    bundle = Bundle({"lscpu.txt": "garbage here\n", "meminfo.txt": "Mem: lots\n", "lsblk.json": "{not json"}, source="t")
    by_id = {f.id: f for f in analyze(bundle).checks}
    assert "garbage here" in by_id["cpu.vcpu-per-gpu"].reason
    assert "Mem: lots" in by_id["mem.host"].reason
    assert "{not json" in by_id["storage.hot-tier"].reason
