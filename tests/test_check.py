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

from trainready.check import checks_deep, checks_gpu, checks_system  # noqa: F401  (register every check in CHECKS)
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
CRASHED = "check could not run"  # registry.run_checks' reason when a check raised


def cli(*args, timeout=120):
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TRAINREADY_NO_IMDS": "1"}
    proc = subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-2000:]
    return proc


def cli_report(*args):
    proc = cli("check", *args, "--json")
    assert proc.returncode in (0, 1), (proc.returncode, proc.stdout[-1000:], proc.stderr[-1000:])
    data = json.loads(proc.stdout)
    return proc.returncode, data, {c["id"]: c for c in data["checks"]}


def findings(directory, instance=None):
    report = analyze(Bundle.load(directory), instance)
    return report, {f.id: f for f in report.checks}


def assert_well_formed(data):
    assert data["schema_version"] == 1
    assert {"instance_type", "source", "checks", "summary"} <= set(data)
    assert set(data["summary"]) == STATUSES and sum(data["summary"].values()) == len(data["checks"])
    for c in data["checks"]:
        assert {"id", "area", "status", "observed", "expected", "reason", "advice"} <= set(c)
        assert c["status"] in STATUSES
        if c["status"] in ("fail", "skip"):
            assert c["reason"], c
        if c["status"] == "fail":
            assert c["advice"], c
    assert {c["id"] for c in data["checks"]} == set(CHECKS)


def no_crash(by_id):
    reasons = {i: f["reason"] if isinstance(f, dict) else f.reason for i, f in by_id.items()}
    crashed = {i: r for i, r in reasons.items() if CRASHED in r}
    assert not crashed, crashed


# ---------------------------------------------------------------- healthy nodes


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_healthy_bundle_passes(kind):
    code, data, by_id = cli_report("--bundle", BUNDLES / kind)
    assert_well_formed(data)
    no_crash(by_id)
    assert data["instance_type"] == INSTANCE[kind] and data["source"] == str(BUNDLES / kind)
    assert code == 0 and data["summary"]["fail"] == 0, {i: c["reason"] for i, c in by_id.items() if c["status"] == "fail"}
    not_passed = {i: (by_id[i]["status"], by_id[i]["reason"]) for i in KEY_IDS if by_id[i]["status"] != "pass"}
    assert not not_passed


def test_nvlink_topology_reasons_name_the_pattern():
    _, g5 = findings(BUNDLES / "g5")
    assert g5["gpu.nvlink-topology"].status == "pass" and "PCIe-only" in g5["gpu.nvlink-topology"].reason
    assert g5["gpu.nvlink-links"].status == "pass"  # A10G has no NVLink: nothing to be down
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
    "nvlink-inactive": {"gpu.nvlink-links": ["GPU3 link 4", "GPU3 link 5"]},
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
    code, data, by_id = cli_report("--bundle", directory)
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
    assert code == 1


def test_driver_error_instead_of_output(tmp_path):
    # what nvidia-smi prints (exit 9) when the driver is not loaded: the file is there, its content is an error
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.\n\n")
    directory = make_bundle("p4d", tmp_path, replace={QUERY: message, TOPO: message, NVLINK: message})
    _, by_id = findings(directory)
    no_crash(by_id)
    assert by_id["gpu.count"].status == "fail" and "0 GPUs" in by_id["gpu.count"].reason
    assert by_id["gpu.nvlink-topology"].status == "fail" and "NVIDIA-SMI has failed" in by_id["gpu.nvlink-topology"].reason
    # the files were collected: a reason must not claim the probe did not run
    wrong = {i: f.reason for i, f in by_id.items() if "not in the bundle" in f.reason}
    assert not wrong, wrong


@pytest.mark.parametrize(("mask", "status"), [("0x0000000000000001", "pass"),  # GPU idle
                                               ("0x0000000000000002", "pass"),  # applications clocks setting
                                               ("0x0000000000000048", "warn"),  # HW slowdown + HW thermal
                                               ("0x0000000000000080", "warn")])  # HW power brake
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


def test_cpu_only_bundle_skips_gpu_checks():
    code, data, by_id = cli_report("--bundle", BUNDLES / "cpu-only")
    assert_well_formed(data)
    no_crash(by_id)
    assert code == 0 and data["instance_type"] is None
    gpu = {i: c for i, c in by_id.items() if c["area"] == "gpu"}
    assert gpu and all(c["status"] == "skip" and c["reason"] for c in gpu.values()), gpu
    assert "nvidia-smi" in by_id["gpu.count"]["reason"]  # from the manifest: the command was not found
    assert by_id["cuda.runtime"]["status"] == "skip" and "CUDA" in by_id["cuda.runtime"]["observed"]
    ran = {i: c["status"] for i, c in by_id.items() if c["area"] in ("cpu", "mem", "storage") and not CHECKS[i][2]}
    assert ran and "skip" not in ran.values(), ran
    assert by_id["cpu.vcpu-per-gpu"]["status"] == "pass" and "2 vCPUs" in by_id["cpu.vcpu-per-gpu"]["observed"]
    assert by_id["mem.host"]["status"] == "pass" and "23 GiB" in by_id["mem.host"]["observed"]


def test_cpu_only_without_manifest_says_the_files_are_missing(tmp_path):
    directory = make_bundle("cpu-only", tmp_path, drop=("manifest.json",))
    _, by_id = findings(directory)
    assert by_id["gpu.count"].status == "skip" and QUERY in by_id["gpu.count"].reason


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
    directory = make_bundle("p4d", tmp_path, replace=every_file("p4d", garbage(99)))
    code, data, by_id = cli_report("--bundle", directory)
    assert_well_formed(data)
    no_crash(by_id)


def test_damaged_manifest_is_a_usage_error(tmp_path):
    directory = make_bundle("p4d", tmp_path, replace={"manifest.json": b"\x00{not json"})
    proc = cli("check", "--bundle", directory, "--json")
    assert proc.returncode == 2 and "manifest.json" in proc.stdout + proc.stderr


def test_missing_bundle_directory(tmp_path):
    proc = cli("check", "--bundle", tmp_path / "nope", "--json")
    assert proc.returncode == 2 and "does not exist" in proc.stdout + proc.stderr


def test_unknown_instance_is_a_usage_error():
    for extra in (["--json"], []):
        proc = cli("check", "--bundle", BUNDLES / "p4d", "--instance", "p4d.24xlarg", *extra)
        assert proc.returncode == 2 and "Did you mean" in proc.stdout + proc.stderr
        assert "p4d.24xlarge" in proc.stdout + proc.stderr


def test_human_output():
    for kind, code in (("p4d", 0), ("cpu-only", 0)):
        proc = cli("check", "--bundle", BUNDLES / kind)
        assert proc.returncode == code and "gpu.count" in proc.stdout


# ---------------------------------------------------------------- this machine


def test_collect_then_analyze(tmp_path):
    out = tmp_path / "bundle"
    proc = cli("check", "collect", "--out", out)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["kind"] == "trainready.check-bundle"
    probes = {p["file"]: p for p in manifest["probes"]}
    assert set(COMMANDS) <= set(probes) and {"meminfo.txt", "mounts.txt", "env.txt"} <= set(probes)
    if shutil.which("nvidia-smi", path="/usr/bin:/bin") is None:
        assert probes[QUERY]["exit_code"] is None and probes[QUERY]["error"]
        assert not (out / QUERY).exists()
    code, data, by_id = cli_report("--bundle", out)
    assert_well_formed(data)
    no_crash(by_id)
    if shutil.which("nvidia-smi", path="/usr/bin:/bin") is None:
        assert by_id["gpu.count"]["status"] == "skip" and "nvidia-smi" in by_id["gpu.count"]["reason"]


def test_live_check_smoke():
    # TRAINREADY_NO_IMDS (set by cli) keeps instance detection off the network
    code, data, by_id = cli_report()
    assert_well_formed(data)
    no_crash(by_id)
    assert data["source"] == "live"


def test_pending_row_remap_and_remap_failure_from_smi_q(tmp_path):
    from pathlib import Path

    sample = (Path(__file__).parent / "fixtures" / "check" / "nvidia-smi-q_H100_550.txt").read_text()
    directory = make_bundle("p5", tmp_path, replace={"nvidia-smi-q.txt": sample})
    _, by_id = findings(directory)
    ecc = by_id["gpu.ecc"]
    assert ecc.status == "warn" and "GPU 2" in ecc.reason and "pending" in ecc.reason, ecc
    failed = sample.replace("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes", 1)
    assert failed != sample
    directory = make_bundle("p5", tmp_path, replace={"nvidia-smi-q.txt": failed})
    _, by_id = findings(directory)
    assert by_id["gpu.ecc"].status == "fail" and "no spare rows" in by_id["gpu.ecc"].reason


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
    code, _, by_id = cli_report("--bundle", BUNDLES / "p4d", "--model", "llama-2-70b", "--strategy", "zero3",
                                "--offload", "optimizer")
    assert by_id["mem.host"]["status"] == "pass" and "GiB fits" in by_id["mem.host"]["reason"]
    code, _, by_id = cli_report("--bundle", BUNDLES / "g5", "--instance", "g5.12xlarge", "--model", "llama-2-70b",
                                "--strategy", "zero3", "--offload", "optimizer")
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


def test_check_runs_without_torch(tmp_path):
    # torch blocked: the GPU/CUDA checks skip with why, the command still answers
    blocker = tmp_path / "torch.py"
    blocker.write_text("raise ImportError('torch blocked for this test')\n")
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TRAINREADY_NO_IMDS": "1", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "trainready", "check", "--json"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-1000:]
    found = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert found["cuda.runtime"]["status"] == "skip" and "torch" in found["cuda.runtime"]["reason"]


def test_unparsable_output_is_shown_in_the_finding():
    bundle = Bundle({"lscpu.txt": "garbage here\n", "meminfo.txt": "Mem: lots\n", "lsblk.json": "{not json"}, source="t")
    by_id = {f.id: f for f in analyze(bundle).checks}
    assert "garbage here" in by_id["cpu.vcpu-per-gpu"].reason
    assert "Mem: lots" in by_id["mem.host"].reason
    assert "{not json" in by_id["storage.hot-tier"].reason
