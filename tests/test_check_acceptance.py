"""`check` as an acceptance test (issue 16): sourced floors, the quick checks on real captures (gpud's
test data, GitHub issues) and marked synthetic variants of them, the `--deep` judgements (copies,
memory, P2P, collectives, pairwise bisection), DCGM, --fix, and parsers that never raise.

Fixtures: tests/fixtures/check/acceptance/ (each starts with `# source:` or `# synthetic:` lines)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from check_bundles import BUNDLES, make_bundle
from hypothesis import given, settings
from hypothesis import strategies as st

from trainready.catalog import load_catalog
from trainready.check import bisect, thresholds
from trainready.check.analyze import analyze
from trainready.check.bundle import Bundle, BundleManifest
from trainready.check.parsers import node
from trainready.check.parsers.system import parse_nccl_tests
from trainready.check.probes import Result, collect

HERE = Path(__file__).resolve().parent
ACC = HERE / "fixtures" / "check" / "acceptance"
REFERENCE = [HERE.parents[1] / "shared" / "reference" / "fixtures", HERE / "fixtures" / "check" / "reference"]
CATALOG = load_catalog()
SMI_Q = "nvidia-smi-q.txt"
H100_Q = "nvidia-smi-q_8xH100_535.161.08_power-brake.txt"
H100_PROCS_Q = "nvidia-smi-q_8xH100_535.183.01_processes.txt"


def body(name: str) -> str:
    """A fixture without its provenance header (the leading `# ` lines)."""
    lines = (ACC / name).read_text().split("\n")
    while lines and lines[0].startswith("# "):
        lines.pop(0)
    return "\n".join(lines)


def reference(name: str) -> str:
    path = next((d / name for d in REFERENCE if (d / name).is_file()), None)
    if path is None:
        pytest.skip(f"reference fixture {name} not available")
    return "\n".join(line for line in path.read_text().split("\n") if not line.startswith("# "))


def findings(directory: Path, **kw) -> dict:
    return {f.id: f for f in analyze(Bundle.load(directory), **kw).checks}


def p5(tmp_path: Path, **replace) -> dict:
    """The p5 fixture bundle with real H100 captures added (plus `replace`), analyzed."""
    files = {SMI_Q: body(H100_Q), "fabricmanager-status.txt": body("systemctl-status-nvidia-fabricmanager_active.txt"),
             "lspci-vvv.txt": body("lspci-vvv_HGX-H100_first-two-switches.txt")}
    files.update(replace)
    return findings(make_bundle("p5", tmp_path, replace=files))


def edit_q(text: str, section: int, key: str, value: str) -> str:
    """nvidia-smi -q with `key`'s value in GPU section `section` (0-based) replaced: a synthetic variant.
    `key` may name its block first: "Applications Clocks/Graphics" is the Graphics line after that header."""
    parts = re.split(r"(?m)^(?=GPU [0-9A-F]{8}:)", text)
    gpu = parts[section + 1]
    block, _, key = key.rpartition("/")
    start = re.search(rf"(?m)^\s+{re.escape(block)}\s*$", gpu).end() if block else 0
    edited = re.sub(rf"(?m)^(\s+{re.escape(key)}\s+: ).*$", lambda m: m.group(1) + value, gpu[start:], count=1)
    assert edited != gpu[start:], key
    parts[section + 1] = gpu[:start] + edited
    return "".join(parts)


# ---------------------------------------------------------------- thresholds: data with sources


def test_every_floor_names_its_source_and_the_aznhc_figures_are_the_floors():
    for floor in thresholds.floors():
        assert floor.source and ("aznhc" in floor.source or "dcgm" in floor.source or "adt" in floor.source), floor
    p4d, p4de, p5_, p5e = (CATALOG.instance(n) for n in ("p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge"))

    def th(kind, inst, nodes=1):
        return thresholds.threshold(kind, inst, CATALOG.gpu_of(inst), nodes)

    assert (th("all_reduce", p4d).floor_gbps, th("all_reduce", p4d).size_bytes) == (228.0, 8 << 30)
    assert (th("all_reduce", p4de).floor_gbps, th("all_reduce", p4de).size_bytes) == (228.0, 16 << 30)
    assert (th("all_reduce", p5_).floor_gbps, th("all_reduce", p5_).size_bytes) == (460.0, 16 << 30)
    assert th("all_reduce", p5e).floor_gbps == 431.0  # H200
    assert th("h2d", p4d).floor_gbps == 21.0 and th("d2h", p5_).floor_gbps == 48.0
    assert th("p2p", p4d).floor_gbps == 235.0 and th("p2p", p5_).floor_gbps == 335.0
    assert th("memory", p5_).floor_gbps == 1905.0
    assert not any(th(k, i).derived for k in ("all_reduce", "h2d", "p2p") for i in (p4d, p5_))


@pytest.mark.parametrize(("instance", "table", "size"), [
    ("p4de.24xlarge", "nccl-tests_all_reduce_perf_2x-p4de.24xlarge_16GPU_EFA.txt", 2 << 30),
    ("p5.48xlarge", "nccl-tests_all_reduce_perf_2x-p5.48xlarge_16GPU_EFA.txt", 16 << 30)])
def test_two_node_floors_are_ninety_percent_of_the_published_tables(instance, table, size):
    inst = CATALOG.instance(instance)
    floor = thresholds.threshold("all_reduce", inst, CATALOG.gpu_of(inst), nodes=2)
    measured = parse_nccl_tests(reference(table)).busbw_at(size)
    assert floor.size_bytes == size and floor.typical_gbps == pytest.approx(measured, abs=0.01)
    assert floor.floor_gbps == pytest.approx(0.9 * measured, abs=0.05)


def test_nodes_without_a_source_get_a_derived_figure_that_says_so():
    g5 = CATALOG.instance("g5.48xlarge")
    for kind in ("all_reduce", "h2d", "memory", "p2p", "all_to_all"):
        th = thresholds.threshold(kind, g5, CATALOG.gpu_of(g5))
        if kind == "memory":  # DCGM has an A10G floor
            assert not th.derived and th.floor_gbps == 362.7
            continue
        assert th.derived and "derived" in th.describe(), kind
    b200 = CATALOG.instance("p6-b200.48xlarge")
    assert thresholds.threshold("memory", b200, CATALOG.gpu_of(b200)).derived
    assert thresholds.threshold("all_reduce", None, None) is None


# ---------------------------------------------------------------- quick checks on real captures


def test_a_healthy_h100_node_from_real_captures_passes_the_new_checks(tmp_path):
    by_id = p5(tmp_path)
    for check_id in ("gpu.persistence", "gpu.clocks", "gpu.vbios", "gpu.gsp", "gpu.mig", "nvswitch.fabric", "pci.acs"):
        assert by_id[check_id].status == "pass", by_id[check_id]
    assert "96.00.74.00.0D (8 GPUs)" in by_id["gpu.vbios"].observed
    assert "GSP firmware 535.161.08 (8 GPUs)" in by_id["gpu.gsp"].observed
    assert "Completed (8 GPUs)" in by_id["nvswitch.fabric"].observed and "active" in by_id["nvswitch.fabric"].observed
    assert "1980 MHz" in by_id["gpu.clocks"].observed
    # the real lspci: the Gen5 switches above the GPUs have ACS off; only two root ports validate sources
    assert "0 redirecting, 0 source-validating" in by_id["pci.acs"].observed
    # the capture is from a node with HW Power Brake Slowdown active: -q shows it, the bundle's query CSV (from
    # another node) does not; a fact is judged from every source, so the brake fails gpu.throttle (issue 23)
    throttle = by_id["gpu.throttle"]
    assert throttle.status == "fail" and "HW Power Brake Slowdown" in throttle.observed, throttle
    assert "sources disagree" in throttle.reason


@pytest.mark.parametrize(("key", "value", "check_id", "status", "words"), [
    ("Persistence Mode", "Disabled", "gpu.persistence", "warn", "GPU 3"),
    ("Applications Clocks/Graphics", "1410 MHz", "gpu.clocks", "warn", "GPU 3 graphics 1410 of 1980 MHz"),
    ("VBIOS Version", "96.00.61.00.01", "gpu.vbios", "fail", "GPU 3 differ"),
    ("MIG Mode/Current", "Enabled", "gpu.mig", "fail", "MIG enabled on GPU 3"),
    ("GSP Firmware Version", "N/A", "gpu.gsp", "warn", "GSP off (1 GPUs)"),
    ("Fabric/State", "In Progress", "nvswitch.fabric", "fail", "GPU 3 (0000:5d:00): In Progress"),
])
def test_synthetic_faults_in_the_real_h100_capture(tmp_path, key, value, check_id, status, words):
    # SYNTHETIC variants: one value of GPU 3's section of the real capture changed
    by_id = p5(tmp_path, **{"nvidia-smi-q.txt": edit_q(body(H100_Q), 3, key, value)})
    finding = by_id[check_id]
    assert finding.status == status, finding
    assert words in finding.observed + finding.reason, finding


def test_mig_is_fine_when_asked_for(tmp_path):
    q = body(H100_Q)
    for gpu in range(8):
        q = edit_q(edit_q(q, gpu, "MIG Mode/Current", "Enabled"), gpu, "MIG Mode/Pending", "Enabled")
    directory = make_bundle("p5", tmp_path, replace={SMI_Q: q})
    assert findings(directory)["gpu.mig"].status == "fail"
    assert findings(directory, mig=True)["gpu.mig"].status == "pass"


def test_real_persistence_off_and_truncated_captures(tmp_path):
    titan = findings(make_bundle("g5", tmp_path, replace={SMI_Q: body("nvidia-smi-q_TitanV_560.35.03_persistence-off.txt")}))
    assert titan["gpu.persistence"].status == "warn" and "Disabled on GPU 0" in titan["gpu.persistence"].observed
    cut = findings(make_bundle("p5", tmp_path, replace={SMI_Q: body("nvidia-smi-q_8xH100_535.183.01_TRUNCATED.txt")}))
    assert cut["gpu.persistence"].observed == "Enabled on 1 of 1 GPUs"  # what is there is judged, nothing more


def test_fabric_manager_down_fails_an_nvswitch_node(tmp_path):
    failed = body("systemctl-status-nvidia-fabricmanager_failed_SYNTHETIC.txt")
    by_id = findings(make_bundle("p4d", tmp_path, replace={"fabricmanager-status.txt": failed}))
    assert by_id["nvswitch.fabric"].status == "fail" and "NV_WARN_NOTHING_TO_DO" in by_id["nvswitch.fabric"].reason
    missing = findings(make_bundle("p4d", tmp_path, replace={
        "fabricmanager-status.txt": "Unit nvidia-fabricmanager.service could not be found.\n"}))
    assert missing["nvswitch.fabric"].status == "fail" and "not installed" in missing["nvswitch.fabric"].reason
    # registered fabric, service down: a warning (the next reset will not register)
    by_id = p5(tmp_path, **{"fabricmanager-status.txt": failed})
    assert by_id["nvswitch.fabric"].status == "warn"
    g5 = findings(make_bundle("g5", tmp_path, replace={"fabricmanager-status.txt": failed}))
    assert g5["nvswitch.fabric"].status == "skip" and g5["nvswitch.fabric"].reason.startswith("not applicable: ")


@pytest.mark.parametrize(("name", "status", "words"), [
    ("dmesg_sxid-22013-non-fatal_nvtrust124.txt", "warn", "SXid 22013"),
    ("dmesg_sxid-12028_gpud338.txt", "warn", "SXid 12028 on nvidia-nvswitch1"),
])
def test_real_sxid_lines(tmp_path, name, status, words):
    by_id = findings(make_bundle("p5", tmp_path, replace={"kernel-xid.txt": body(name)}))
    assert by_id["nvswitch.sxid"].status == status and words in by_id["nvswitch.sxid"].observed, by_id["nvswitch.sxid"]


def test_fatal_sxid_and_the_fabric_manager_log(tmp_path):
    # SYNTHETIC: the nvtrust line with a code the Fabric Manager guide lists as fatal (12022, egress input ECC DBE)
    fatal = "[   38.2] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 12022, Data {0x0000002b}\n"
    assert findings(make_bundle("p5", tmp_path, replace={"kernel-xid.txt": fatal}))["nvswitch.sxid"].status == "fail"
    fm = findings(make_bundle("p5", tmp_path, replace={
        "fabricmanager-log.txt": body("fabricmanager-log_HGX-H100_nvswitch-non-fatal-12028.txt")}))["nvswitch.sxid"]
    assert fm.status == "warn" and "SXid 12028 on 00000000:86:00.0" in fm.observed


def test_gpu_processes_with_owners(tmp_path):
    # an old bundle (no own-PID record) whose -q lists processes: could be trainready's own probe, so a warning
    old = findings(make_bundle("p5", tmp_path, replace={SMI_Q: body(H100_PROCS_Q)}))["gpu.processes"]
    assert old.status == "warn" and "PID 1002127" in old.observed
    apps, ps = body("nvidia-smi-compute-apps_SYNTHETIC.csv"), body("ps_eo_d-state_SYNTHETIC.txt")
    new = findings(make_bundle("p5", tmp_path, replace={"nvidia-smi-compute-apps.csv": apps, "ps.txt": ps}))["gpu.processes"]
    assert new.status == "fail" and "PID 58130 (/usr/bin/python, user alice, 20322 MiB" in new.observed
    manifest = BundleManifest(hostname="n", own_pids=[58130, 2930819]).model_dump_json()
    ours = findings(make_bundle("p5", tmp_path, replace={"nvidia-smi-compute-apps.csv": apps, "manifest.json": manifest}))
    assert ours["gpu.processes"].status == "pass" and "2 of trainready's own" in ours["gpu.processes"].reason


def test_acs_redirect_on_a_switch_above_a_gpu_fails(tmp_path):
    lspci = body("lspci-vvv_HGX-H100_first-two-switches.txt")
    # SYNTHETIC: ACS turned on (as a BIOS default can) at the PEX890xx downstream port above GPU 19:00.0
    parsed = node.parse_lspci(lspci)
    above = [b for b, below in parsed.path_bridges() if any(e.address == "19:00.0" for e in below)]
    assert above, "the real capture has ACS-capable bridges above GPU 19:00.0"
    target = above[-1].address
    start = lspci.index(f"\n{target} ") + 1
    ctl = lspci.index("ACSCtl:", start)
    end = lspci.index("\n", ctl)
    on, off = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+", "SrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd-"
    redirected = lspci[:ctl] + f"ACSCtl:\t{on} EgressCtrl- DirectTrans-" + lspci[end:]
    acs = p5(tmp_path, **{"lspci-vvv.txt": redirected})["pci.acs"]
    assert acs.status == "fail" and target in acs.reason and "19:00.0" in acs.reason, acs
    validating = lspci[:ctl] + f"ACSCtl:\t{off} EgressCtrl- DirectTrans-" + lspci[end:]
    assert p5(tmp_path, **{"lspci-vvv.txt": validating})["pci.acs"].status == "warn"
    denied = "00:0c.0 PCI bridge: Intel Corporation Device 1bbc (rev 11)\n\tCapabilities: <access denied>\n"
    assert p5(tmp_path, **{"lspci-vvv.txt": denied})["pci.acs"].status == "skip"


@pytest.mark.parametrize(("files", "status", "words"), [
    ({}, "pass", "GDRDMA"),  # the p4d bundle's NCCL log shows GDRDMA
    ({"env.txt": "FI_EFA_USE_DEVICE_RDMA=0\n"}, "fail", "FI_EFA_USE_DEVICE_RDMA=0"),
    ({"nccl-debug.log": "", "uname.txt": "5.10.0-1029-aws\n"}, "fail", "5.10 < 5.12"),
    ({"nccl-debug.log": "", "uname.txt": "6.8.0-1015-aws\n"}, "pass", "dma-buf"),
    ({"nccl-debug.log": "", "modules.txt": "nvidia_peermem 16384 0 - Live 0x0\n"}, "pass", "nvidia_peermem loaded"),
])
def test_gpudirect_rdma(tmp_path, files, status, words):
    replace = {"modules.txt": body("modules_no-peermem_SYNTHETIC.txt"), **files}
    finding = findings(make_bundle("p4d", tmp_path, replace=replace))["net.gpudirect-rdma"]
    assert finding.status == status and words in finding.observed + finding.reason, finding


def test_kernel_log_link_flaps_io_errors_and_hung_tasks(tmp_path):
    flaps = findings(make_bundle("p5", tmp_path, replace={"kernel-log.txt": body("kernel-log_ib-link-flaps_SYNTHETIC.txt")}))
    assert flaps["net.link-flaps"].status == "fail" and "ib0: 6 link down" in flaps["net.link-flaps"].observed
    assert "ib3" in flaps["net.link-flaps"].observed and "rdmap16s28" in flaps["net.link-flaps"].observed
    for name in ("dmesg_nvme-io-error_propolis1156.txt", "kern-log_nvme-controller-down_ubuntu-rockchip155.txt"):
        io = findings(make_bundle("p5", tmp_path, replace={"kernel-log.txt": body(name)}))["storage.io-errors"]
        assert io.status == "fail" and "nvme0n1" in io.reason, (name, io)
    quiet = findings(make_bundle("p5", tmp_path, replace={"kernel-log.txt": body("kmsg_nvidia-peermem-errors.txt")}))
    assert quiet["net.link-flaps"].status == "pass" and quiet["storage.io-errors"].status == "pass"
    assert node.parse_kernel_events(body("kmsg_nvidia-peermem-errors.txt")).peermem_errors == 7
    unread = findings(make_bundle("p5", tmp_path, replace={"kernel-log.txt": "unreadable: dmesg: read kernel buffer failed\n"}))
    assert unread["net.link-flaps"].status == "skip" and "dmesg needs root" in unread["net.link-flaps"].reason


def test_host_settings(tmp_path):
    by_id = findings(make_bundle("p4d", tmp_path, replace={
        "ps.txt": body("ps_eo_d-state_SYNTHETIC.txt"), "cpufreq.txt": body("cpufreq_powersave_SYNTHETIC.txt"),
        "clocksource.txt": body("clocksource_xen_SYNTHETIC.txt"),
        "nvme-devices.txt": body("nvme-devices_p4d_7-of-8_SYNTHETIC.txt")}))
    assert by_id["proc.d-state"].status == "warn" and "PID 4411 mount.nfs (root)" in by_id["proc.d-state"].observed
    assert by_id["cpu.governor"].status == "warn" and "powersave (2 CPUs)" in by_id["cpu.governor"].observed
    assert by_id["cpu.clocksource"].status == "warn" and "echo tsc" in by_id["cpu.clocksource"].advice
    assert by_id["storage.nvme-count"].status == "fail" and "7 of 8" in by_id["storage.nvme-count"].reason
    fine = findings(make_bundle("p4d", tmp_path, replace={
        "cpufreq.txt": "absent: no cpufreq\n", "clocksource.txt": "current: tsc\navailable: tsc hpet\n"}))
    assert fine["cpu.governor"].status == "pass" and fine["cpu.clocksource"].status == "pass"


def test_a_bundle_collected_before_these_checks_still_works(tmp_path):
    # the p4d fixture bundle was collected by trainready 0.1.0, before issue 16: nothing new fails, and the
    # checks it cannot feed say so (never "probe did not run": its manifest shows what ran)
    from test_check import cli_report

    # (the fixture has the fabric manager's status since issue 23: dropped here, with its manifest record, as
    # 0.1.0 collected it) -- and the verdict says the fabric is not verified (exit 1), never "ready"
    def without_fabric_record(text: str) -> str:
        manifest = json.loads(text)
        manifest["probes"] = [p for p in manifest["probes"] if p["file"] != "fabricmanager-status.txt"]
        return json.dumps(manifest)

    old = make_bundle("p4d", tmp_path, drop=("fabricmanager-status.txt",), replace={"manifest.json": without_fabric_record})
    data, by_id = cli_report("--bundle", old, code=1)
    assert data["summary"]["fail"] == 0 and data["readiness"]["status"] == "not-verified"
    assert [u.split(":")[0] for u in data["readiness"]["unverified"]] == ["nvswitch.fabric"]
    for check_id in ("pci.acs", "cpu.governor", "net.link-flaps", "storage.nvme-count", "nvswitch.fabric"):
        assert by_id[check_id]["status"] == "skip" and "was not collected" in by_id[check_id]["reason"], by_id[check_id]
    assert by_id["gpu.persistence"]["status"] == "skip"  # its manifest lists nvidia-smi -q, the file is not there
    assert by_id["nvswitch.sxid"]["status"] == "pass"  # read from the kernel-xid.txt every bundle has


# ---------------------------------------------------------------- DCGM and --fix


def test_dcgm_json_into_findings(tmp_path):
    real = findings(make_bundle("p5", tmp_path, replace={"dcgm-diag.json": body("dcgmi-diag-r3-j_dcgm3_skips_dcgm139.json")}))
    assert real["gpu.dcgm"].status == "warn" and "5 skip" in real["gpu.dcgm"].observed
    report = analyze(Bundle.load(make_bundle("p5", tmp_path, replace={
        "dcgm-diag.json": (ACC / "dcgmi-diag-r2-j_dcgm4_pcie-fail_SYNTHETIC.json").read_text()})))
    by_id = {f.id: f for f in report.checks}
    assert by_id["gpu.dcgm"].status == "fail" and "DCGM 4.2.3" in by_id["gpu.dcgm"].observed
    assert by_id["dcgm.pcie"].status == "fail" and "GPU 1" in by_id["dcgm.pcie"].observed
    assert "5.1 GB/s" in by_id["dcgm.pcie"].reason
    assert by_id["dcgm.software"].status == "warn" and "Persistence mode for GPU 0" in by_id["dcgm.software"].reason
    assert "dcgm.memory" not in by_id  # passing tests stay in the summary
    assert findings(BUNDLES / "p5")["gpu.dcgm"].reason.startswith("not asked")


def test_dcgm_and_fix_through_fake_runners():
    from trainready.check.dcgm import run_dcgm
    from trainready.check.fix import apply_fixes

    bundle = Bundle({}, BundleManifest(), "live")
    run_dcgm(bundle, 1, runner=lambda argv, t: Result(None, "", "dcgmi: command not found", 0.0))
    assert "dcgm-diag.json" not in bundle.files and bundle.record("dcgm-diag.json").exit_code is None
    ctx_finding = {f.id: f for f in analyze(bundle).checks}["gpu.dcgm"]
    assert ctx_finding.status == "skip" and "dcgmi not available" in ctx_finding.reason
    bundle = Bundle({}, BundleManifest(), "live")
    run_dcgm(bundle, 2, runner=lambda argv, t: Result(226, '{"DCGM Diagnostic": {}}', "", 1.0))  # a failing test exits non-zero
    assert bundle.files["dcgm-diag.json"].startswith("{")
    ran = []
    fixed = apply_fixes(runner=lambda argv, t: ran.append(argv) or Result(0, "", "", 0.1))
    assert ran == [["nvidia-smi", "-pm", "1"], ["nvidia-smi", "-rac"]] and fixed.status == "pass"
    denied = apply_fixes(runner=lambda argv, t: Result(4, "", "Insufficient Permissions", 0.1))
    assert denied.status == "warn" and "sudo" in denied.advice and "Insufficient Permissions" in denied.reason


def test_dcgm_and_fix_are_usage_errors_where_they_cannot_apply():
    from test_check import cli

    for args, words in ((["--dcgm", "4"], "--dcgm 4: the DCGM diagnostic levels are 1"),
                        (["--bundle", str(BUNDLES / "p4d"), "--fix"], "--fix changes this machine"),
                        (["--bundle", str(BUNDLES / "p4d"), "--dcgm", "1"], "--dcgm 1 runs dcgmi on this machine")):
        proc = cli("check", *args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"error: {proc.stderr.strip()[7:]}"]
        assert words in proc.stderr, proc.stderr


# ---------------------------------------------------------------- probes: the new raw outputs


def test_collect_keeps_the_new_raw_outputs(tmp_path):
    order = []

    def runner(argv, timeout):
        order.append(argv[0] + (" " + argv[1] if len(argv) > 1 else ""))
        if argv[0] == "dmesg":
            return Result(0, "[1.0] ib0: lost carrier\n[2.0] NVRM: Xid (PCI:0000:10:1c): 79, GPU has fallen off the bus.\n"
                             "[3.0] usb 1-1: new device\n", "", 0.1)
        if argv[0] == "systemctl":  # inactive unit: exit 3, still the answer
            return Result(3, "   Active: inactive (dead)\n", "", 0.1)
        if argv[:2] == ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory"]:
            return Result(0, "gpu_bus_id, pid, process_name, used_gpu_memory [MiB]\n", "", 0.1)
        return Result(None, "", f"{argv[0]}: command not found", 0.0)

    bundle = collect(tmp_path / "b", runner=runner)
    assert bundle.files["kernel-log.txt"] == "[1.0] ib0: lost carrier\n"  # NIC lines kept, the rest not
    assert "Xid" in bundle.files["kernel-xid.txt"] and "ib0" not in bundle.files["kernel-xid.txt"]
    assert "inactive" in bundle.files["fabricmanager-status.txt"]
    assert order[-1].startswith("nvidia-smi --query-compute-apps")  # after the CUDA probe is gone
    assert bundle.manifest.own_pids and all(isinstance(p, int) for p in bundle.manifest.own_pids)
    saved = Bundle.load(tmp_path / "b")
    assert saved.manifest.own_pids == bundle.manifest.own_pids
    assert {"modules.txt", "cpufreq.txt", "clocksource.txt"} <= {p.file for p in saved.manifest.probes}


# ---------------------------------------------------------------- --deep judgements


def _deep(tmp_path, kind, deep, **kw):
    return findings(make_bundle(kind, tmp_path, replace={"deep.json": json.dumps(deep)}), deep=True, **kw)


def _rows(table: str) -> list[dict]:
    return [{"size_bytes": r.size_bytes, "busbw_gbps": r.busbw_gbps, "algbw_gbps": r.oop_algbw_gbps, "time_us": r.oop_time_us}
            for r in parse_nccl_tests(reference(table)).rows]


def test_two_real_p5_nodes_pass_and_a_slow_pair_fails(tmp_path):
    rows = _rows("nccl-tests_all_reduce_perf_2x-p5.48xlarge_16GPU_EFA.txt")
    good = {"nodes": 2, "allreduce": {"backend": "nccl", "world_size": 16, "rows": rows,
                                      "busbw_gbps": max(r["busbw_gbps"] for r in rows)}}
    found = _deep(tmp_path, "p5", good)["nccl.allreduce"]
    assert found.status == "pass" and "at 16 GiB" in found.observed and "487" in found.observed, found
    slow = json.loads(json.dumps(good))
    for row in slow["allreduce"]["rows"]:
        row["busbw_gbps"] *= 0.8  # SYNTHETIC: the same table 20% slower
    assert _deep(tmp_path, "p5", slow)["nccl.allreduce"].status == "fail"


@pytest.mark.parametrize(("rows", "status"), [
    ([{"size_bytes": 16 << 30, "busbw_gbps": 470.0}], "pass"),
    ([{"size_bytes": 16 << 30, "busbw_gbps": 455.0}], "fail"),  # aznhc's floor is 460 at 16 GiB
    ([{"size_bytes": 256 << 20, "busbw_gbps": 300.0}], "warn"),  # below, but measured at a smaller size
    ([{"size_bytes": 256 << 20, "busbw_gbps": 100.0}], "fail"),  # far below at any size
])
def test_single_node_h100_allreduce_against_aznhc(tmp_path, rows, status):
    deep = {"allreduce": {"backend": "nccl", "world_size": 8, "rows": rows, "busbw_gbps": rows[0]["busbw_gbps"]}}
    assert _deep(tmp_path, "p5", deep)["nccl.allreduce"].status == status


def test_copies_memory_and_p2p(tmp_path):
    copy = {"bytes": 256 << 20, "gpus": [{"index": i, "h2d_gbps": 24.5, "d2h_gbps": 25.0} for i in range(8)]}
    copy["gpus"][5]["h2d_gbps"] = 12.0  # SYNTHETIC: one GPU on a narrowed link
    memory = {"bytes": 1 << 30, "gpus": [{"index": i, "gbps": 1400.0} for i in range(8)]}
    pairs = [{"src": s, "dst": d, "gbps": 260.0, "peer_access": True} for s in range(8) for d in range(8) if s != d]
    for p in pairs:
        if 2 in (p["src"], p["dst"]):
            p["gbps"] = 120.0  # SYNTHETIC: GPU 2's NVLinks degraded
    by_id = _deep(tmp_path, "p4d", {"copy": copy, "memory": memory, "p2p": {"bytes": 256 << 20, "pairs": pairs}})
    assert by_id["gpu.h2d-d2h"].status == "fail" and "GPU 5 H2D 12.0" in by_id["gpu.h2d-d2h"].reason
    assert "aznhc" in by_id["gpu.h2d-d2h"].expected
    assert by_id["gpu.memory-bandwidth"].status == "pass" and "derived" in by_id["gpu.memory-bandwidth"].expected
    assert by_id["gpu.p2p"].status == "fail" and "common to all: GPU 2" in by_id["gpu.p2p"].reason
    skipped = _deep(tmp_path, "p4d", {"copy": {"skipped": "no CUDA device"}})["gpu.h2d-d2h"]
    assert skipped.status == "skip" and "no CUDA device" in skipped.reason


def test_other_collectives_and_gloo(tmp_path):
    rows = [{"size_bytes": 1 << 30, "busbw_gbps": 200.0}]
    deep = {kind: {"backend": "nccl", "world_size": 8, "rows": rows, "busbw_gbps": 200.0}
            for kind in ("all_gather", "reduce_scatter", "all_to_all")}
    by_id = _deep(tmp_path, "p4d", deep)
    for check_id in ("nccl.allgather", "nccl.reducescatter", "nccl.alltoall"):
        assert by_id[check_id].status == "pass" and "derived" in by_id[check_id].expected, by_id[check_id]
    gloo = _deep(tmp_path, "p4d", {"all_gather": {"backend": "gloo", "world_size": 2, "rows": rows, "busbw_gbps": 0.3}})
    assert gloo["nccl.allgather"].status == "skip"


# ---------------------------------------------------------------- pairwise bisection (pure)


def _measure(speed: dict[int, float], slow_links=frozenset()):
    """A fake pair test: busbw = the slower node's speed; a slow link halves it."""
    def measure(pairs):
        return [bisect.PairResult(a, b, min(speed[a], speed[b]) * (0.5 if (a, b) in slow_links else 1.0)) for a, b in pairs]
    return measure


def test_bisection_names_the_slow_node():
    speed = {n: 80.0 for n in range(8)}
    speed[5] = 30.0
    rounds, floor = bisect.plan_all(8, _measure(speed), 70.5)
    verdict = bisect.verdict(8, [r for rnd in rounds for r in rnd], floor)
    assert verdict.slow_nodes == [5] and not verdict.slow_links and not verdict.unresolved
    assert len(rounds) == 2 and rounds[0] == [bisect.PairResult(a, a + 1, 30.0 if 5 in (a, a + 1) else 80.0)
                                              for a in (0, 2, 4, 6)]


def test_bisection_names_a_slow_link_and_a_shared_cause():
    speed = {n: 80.0 for n in range(4)}
    rounds, floor = bisect.plan_all(4, _measure(speed, slow_links={(0, 1)}), 70.0)
    flat = [r for rnd in rounds for r in rnd]
    # round 1 clears 2 and 3; 0 and 1 are each measured with a cleared node and pass: the link is slow
    assert bisect.verdict(4, flat, floor).slow_links == [(0, 1)]
    slow_all = {n: 10.0 for n in range(4)}
    rounds, floor = bisect.plan_all(4, _measure(slow_all), 70.0)
    verdict = bisect.verdict(4, [r for rnd in rounds for r in rnd], floor)
    assert verdict.all_slow and not verdict.slow_nodes
    two = bisect.verdict(2, [bisect.PairResult(0, 1, 10.0)], 70.0)
    assert two.all_slow and two.unresolved == [0, 1]  # two nodes alone cannot say which


def test_bisection_odd_count_and_relative_floor():
    speed = {n: 400.0 for n in range(5)}
    speed[4] = 100.0
    rounds, floor = bisect.plan_all(5, _measure(speed), None)  # no published figure: 75% of the median pair
    assert floor == pytest.approx(300.0)
    assert bisect.verdict(5, [r for rnd in rounds for r in rnd], floor).slow_nodes == [4]


@settings(deadline=None, max_examples=60)
@given(nodes=st.integers(3, 24), slow=st.data())
def test_bisection_finds_any_single_slow_node(nodes, slow):
    bad = slow.draw(st.integers(0, nodes - 1))
    speed = {n: 80.0 for n in range(nodes)}
    speed[bad] = 20.0
    rounds, floor = bisect.plan_all(nodes, _measure(speed), 70.0)
    verdict = bisect.verdict(nodes, [r for rnd in rounds for r in rnd], floor)
    assert verdict.slow_nodes == [bad] and not verdict.unresolved and len(rounds) <= bisect.MAX_ROUNDS
    for rnd in rounds:  # every round's pairs are disjoint, so they run at once
        members = [n for r in rnd for n in (r.a, r.b)]
        assert len(members) == len(set(members))


def test_pairwise_finding_from_deep_json(tmp_path):
    rounds = [[{"a": 0, "b": 1, "busbw_gbps": 78.0}, {"a": 2, "b": 3, "busbw_gbps": 30.0}],
              [{"a": 0, "b": 2, "busbw_gbps": 30.5}, {"a": 1, "b": 3, "busbw_gbps": 77.0}]]
    deep = {"nodes": 4, "pairwise": {"nodes": ["ip-a", "ip-b", "ip-c", "ip-d"], "size_bytes": 2 << 30,
                                     "floor_gbps": 70.5, "floor_source": "adt", "rounds": rounds}}
    found = _deep(tmp_path, "p4d", deep)["nccl.pairwise"]
    assert found.status == "fail" and "slow node 2 (ip-c)" in found.reason, found
    one = _deep(tmp_path, "p4d", {"nodes": 1})["nccl.pairwise"]
    assert one.status == "skip" and "one node" in one.reason


# ---------------------------------------------------------------- measurements on this machine (CPU)


def test_gpu_measurements_skip_without_cuda_and_collectives_run_on_gloo():
    from trainready.check import deep_gpu
    from trainready.check.deep import collectives_local

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("measures the CPU analogue")
    for measure in (deep_gpu.copy_bandwidth, deep_gpu.memory_bandwidth, deep_gpu.p2p_bandwidth):
        assert measure() == {"skipped": "no CUDA device"}
    results = collectives_local({"all_reduce": 2 << 20, "all_gather": 2 << 20, "reduce_scatter": 2 << 20,
                                 "all_to_all": 2 << 20})
    for kind, result in results.items():
        assert result["backend"] == "gloo" and result["world_size"] == 2, (kind, result)
        factor = deep_gpu.BUSBW_FACTOR[kind](2)
        for row in result["rows"]:  # nccl-tests' definitions
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
            assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / (row["time_us"] / 1e6) / 1e9)
        assert [r["size_bytes"] for r in result["rows"]] == [1 << 20, 2 << 20]


def test_message_sizes_follow_the_floor():
    from trainready.check.deep import plan_sizes

    plan = plan_sizes("p5.48xlarge", 1, "nccl")
    assert plan["all_reduce"] == 16 << 30 and plan["all_gather"] == 1 << 30  # aznhc measures 16 GiB on H100
    assert plan_sizes("p4d.24xlarge", 1, "nccl")["all_reduce"] == 8 << 30  # aznhc's 8 GiB fits a quarter of 40 GiB
    assert plan_sizes(None, 1, "gloo") == {k: 16 << 20 for k in thresholds.COLLECTIVES}


# ---------------------------------------------------------------- parsers never raise


def _texts(*names: str) -> list[str]:
    return [body(n) for n in names]


PARSERS = {
    "compute_apps": (node.parse_compute_apps, _texts("nvidia-smi-compute-apps_SYNTHETIC.csv")),
    "q_processes": (node.parse_smi_q_processes, _texts(H100_PROCS_Q, "nvidia-smi-q_8xRTX4090_535.154.05_processes.txt")),
    "ps": (node.parse_ps, _texts("ps_eo_d-state_SYNTHETIC.txt")),
    "fm_status": (node.parse_fabricmanager_status, _texts("systemctl-status-nvidia-fabricmanager_active.txt",
                                                          "systemctl-status-nvidia-fabricmanager_failed_SYNTHETIC.txt")),
    "fm_log": (node.parse_fabricmanager_log, _texts("fabricmanager-log_HGX-H100_nvswitch-non-fatal-12028.txt")),
    "lspci": (node.parse_lspci, [body("lspci-vvv_HGX-H100_first-two-switches.txt")[:20000]]),
    "modules": (node.parse_modules, _texts("modules_no-peermem_SYNTHETIC.txt")),
    "cpufreq": (node.parse_cpufreq, _texts("cpufreq_powersave_SYNTHETIC.txt")),
    "clocksource": (node.parse_clocksource, _texts("clocksource_xen_SYNTHETIC.txt")),
    "nvme": (node.parse_nvme_devices, _texts("nvme-devices_p4d_7-of-8_SYNTHETIC.txt")),
    "kernel": (node.parse_kernel_events, _texts("kernel-log_ib-link-flaps_SYNTHETIC.txt", "dmesg_nvme-io-error_propolis1156.txt",
                                                "kmsg_nvidia-peermem-errors.txt", "dmesg_xid-119-gsp-timeout.txt")),
    "dcgm": (node.parse_dcgm_diag, _texts("dcgmi-diag-r3-j_dcgm3_skips_dcgm139.json",
                                          "dcgmi-diag-r2-j_dcgm4_pcie-fail_SYNTHETIC.json")),
}


def _well_formed(result) -> None:
    assert not any("internal parser error" in p for p in result.problems), result.problems
    result.model_dump_json()


@st.composite
def mangled(draw, texts: list[str]) -> str:
    text = draw(st.sampled_from(texts))
    for op in draw(st.lists(st.sampled_from(["delete", "truncate", "replace", "crlf", "insert"]), min_size=1, max_size=4)):
        lines = text.split("\n")
        if op == "delete" and lines:
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "\n".join(lines)
        elif op == "truncate":
            text = text[: draw(st.integers(0, len(text)))]
        elif op == "replace" and text:
            i = draw(st.integers(0, len(text) - 1))
            text = text[:i] + draw(st.characters()) + text[i + 1:]
        elif op == "crlf":
            text = text.replace("\n", "\r\n")
        elif op == "insert":
            lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=200)))
            text = "\n".join(lines)
    return text


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(deadline=None, max_examples=30)
@given(data=st.data())
def test_new_parsers_never_raise_on_mangled_captures(name, data):
    parse, texts = PARSERS[name]
    _well_formed(parse(data.draw(mangled(texts))))


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(deadline=None, max_examples=30)
@given(text=st.text(max_size=400) | st.binary(max_size=200) | st.none())
def test_new_parsers_never_raise_on_anything(name, text):
    _well_formed(PARSERS[name][0](text))


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_new_parsers_on_hostile_input(name):
    for text in ["\ud800 x\n", "9" * 5000 + "\n", "x" * 200_000, "\n" * 10_000, "{" * 5000, "[" * 3000 + "]" * 3000,
                 "ACSCtl: " + "SrcValid+ " * 5000, "ib0: lost carrier\n" * 3000, '{"tests": ' * 2000]:
        _well_formed(PARSERS[name][0](text))


@given(text=st.text(max_size=300))
@settings(deadline=None, max_examples=50)
def test_settings_from_any_smi_q_never_raise(text):
    from trainready.check.parsers.nvsmi import parse_smi_q

    for s in node.gpu_settings(parse_smi_q(text)):
        s.model_dump_json()
    assert node.kernel_release(text) is None or len(node.kernel_release(text)) == 2


def _pairwise_rank(rank: int, world: int, port: int, out) -> None:
    import os

    import torch.distributed as dist

    from trainready.check.deep import pairwise_in_world

    os.environ.update(LOCAL_WORLD_SIZE="1")
    store = dist.TCPStore("127.0.0.1", port, world_size=world, is_master=False)  # the test process hosts it
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    result = pairwise_in_world(None, 1 << 20, local=1, iters=2)
    if rank == 0:
        out.put(result)
    dist.barrier()
    dist.destroy_process_group()


def test_pairwise_rounds_run_across_four_gloo_nodes():
    # four processes stand in for four nodes (one rank each): every rank plans the same rounds
    torch_mp = pytest.importorskip("torch.multiprocessing")
    from torch.distributed import TCPStore

    # hosted here on a port bound and kept, as torchrun's agent does (a free port can be taken before rank 0 binds it)
    store = TCPStore("127.0.0.1", 0, world_size=4, is_master=True, wait_for_workers=False)
    ctx = torch_mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    torch_mp.start_processes(_pairwise_rank, args=(4, store.port, queue), nprocs=4, join=True, start_method="spawn")
    result = queue.get()
    first = result["rounds"][0]
    assert [(r["a"], r["b"]) for r in first] == [(0, 1), (2, 3)] and all(r["busbw_gbps"] > 0 for r in first)
    assert len(result["nodes"]) == 4 and result["size_bytes"] == 1 << 20
    assert result["floor_source"].startswith("75% of the median pair") and result["floor_gbps"] > 0
    assert len(result["rounds"]) <= bisect.MAX_ROUNDS


@pytest.mark.parametrize(("name", "gpus", "driver", "reasons"), [
    (H100_Q, 8, "535.161.08", ["HW Slowdown", "HW Power Brake Slowdown"]),
    (H100_PROCS_Q, 8, "535.183.01", []),
    ("nvidia-smi-q_8xRTX4090_535.154.05_processes.txt", 8, "535.154.05", []),
    ("nvidia-smi-q_TitanV_560.35.03_persistence-off.txt", 1, "560.35.03", []),
])
def test_the_nvidia_smi_q_parser_reads_real_captures(name, gpus, driver, reasons):
    # until issue 16 the -q fixtures were synthetic; these are real nodes' output (gpud's test data)
    from trainready.check.parsers.nvsmi import parse_smi_q

    q = parse_smi_q(body(name))
    assert (len(q.gpus), q.attached_gpus, q.driver_version, q.problems) == (gpus, gpus, driver, [])
    assert q.gpus[0].active_clock_reasons == reasons
    assert q.gpus[0].pcie.width_current == q.gpus[0].pcie.width_max == 16
    cut = parse_smi_q(body("nvidia-smi-q_8xH100_535.183.01_TRUNCATED.txt"))
    assert len(cut.gpus) == 1 and "1 GPU sections for 8 attached GPUs" in cut.problems[0]
