"""Issue 23, point by point, on real outputs (tests/fixtures/real/): every fact judged from whatever file
shows it, severity from the text, one root cause one finding, a verdict that says what it knows, and
outputs users already have (nccl-tests, dcgmi diag) given to `check`."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_check_real import REAL, body

from trainready.check.analyze import analyze
from trainready.check.bundle import Bundle

CHECK = Path(__file__).parent / "fixtures" / "check"
SRC = Path(__file__).parents[1] / "src" / "trainready" / "check"


def real(category: str, name: str) -> str:
    return body(REAL / category / name)


def judge(files: dict[str, str], instance: str | None = None, **options) -> tuple[object, dict]:
    report = analyze(Bundle(files, None, source="test"), instance, **options)
    return report, {f.id: f for f in report.checks}


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True, timeout=120)


REMAP_Q = real("nvsmi", "nvidia-smi-q_4xA100-SXM4-80GB_remap-pending_thamada.txt")


# ---------------------------------------------------------------- evidence, not gates


def test_smi_q_alone_judges_every_gpu_fact():
    # the 4x A100-80GB report with `Remapped Rows ... Pending: Yes` and no query CSV: every GPU check reads -q
    _, by_id = judge({"nvidia-smi-q.txt": REMAP_Q})
    ecc = by_id["gpu.ecc"]
    assert ecc.status == "fail" and "GPU 1 (0000:9e:00): a row remap is pending" in ecc.reason, ecc
    assert by_id["gpu.count"].observed == "4 GPUs reachable"
    for check_id in ("gpu.persistence", "gpu.mig", "gpu.throttle", "gpu.pcie", "gpu.model", "gpu.driver"):
        assert by_id[check_id].status != "skip", by_id[check_id]


def test_a_query_csv_of_other_fields_does_not_hide_what_smi_q_shows():
    csv = body(CHECK / "nvidia-smi-query-gpu_index-name-memtotal-cc-driver_4xA100.csv").split("\n", 3)[3]
    _, by_id = judge({"nvidia-smi-q.txt": REMAP_Q, "nvidia-smi-query-gpu.csv": csv})
    assert by_id["gpu.ecc"].status == "fail" and "pending" in by_id["gpu.ecc"].reason


def test_sources_that_disagree_are_a_finding():
    # two real outputs of different machines in one bundle: -q shows 4 GPUs, nvlink -s 8
    nvlink = real("nvsmi", "nvidia-smi-nvlink-s_8xA100-SXM4-80GB_healthy_gpud.txt")
    _, by_id = judge({"nvidia-smi-q.txt": REMAP_Q, "nvidia-smi-nvlink-s.txt": nvlink})
    count = by_id["gpu.count"]
    assert "sources disagree" in count.reason and "nvidia-smi -q shows 4" in count.reason, count


@pytest.mark.parametrize("instance", [None, "p3.16xlarge"])
def test_inactive_nvlinks_fail_with_or_without_an_instance(instance):
    links = real("nvsmi", "nvidia-smi-nvlink-s_7xV100-SXM2-32GB_inactive-links_azhpc.txt")
    _, by_id = judge({"nvidia-smi-nvlink-s.txt": links}, instance)
    finding = by_id["gpu.nvlink-links"]
    assert finding.status == "fail" and "GPU3 link" in finding.reason and "inactive" in finding.reason, finding


def test_fallen_off_the_bus_without_an_xid_token_fails():
    log = real("kernel", "dmesg_fallen-off-bus-no-xid-multiline_nvsentinel155.txt")
    _, by_id = judge({"kernel-xid.txt": log})
    xid = by_id["gpu.xid"]
    assert xid.status == "fail" and "GPU 0000:b3:00 lost: fallen off the bus" in xid.reason, xid


def test_severity_from_the_words_of_the_line():
    _, by_id = judge({"kernel-xid.txt": real("kernel", "journal_xid45-caused-by-previous-xid149-145_ogkm1150.txt")})
    assert by_id["gpu.xid"].status == "fail" and "caused by Xid 149" in by_id["gpu.xid"].reason
    _, fatal = judge({"kernel-xid.txt": real("kernel", "kmsg_xid149-netir-fatal-domain0019_gpud1174.txt")})
    assert fatal["gpu.xid"].status == "fail" and "GPU 0019:01:00" in fatal["gpu.xid"].reason
    _, nonfatal = judge({"kernel-xid.txt": real("kernel", "kmsg_xid145-rlw-nonfatal-domain0018_gpud1174.txt")})
    assert nonfatal["gpu.xid"].status == "warn" and "nonfatal" in nonfatal["gpu.xid"].reason
    _, app = judge({"kernel-xid.txt": real("kernel", "dmesg_xid13-43-app_gpud-testdata.txt")})
    assert app["gpu.xid"].status == "warn" and "application" in app["gpu.xid"].reason


def test_a_gpu_nvidia_smi_cannot_reach_fails_gpu_count():
    words = real("nvsmi", "nvidia-smi-L_unknown-error_nvidia-docker1553.txt")
    _, by_id = judge({"nvidia-smi.txt": words})
    count = by_id["gpu.count"]
    assert count.status == "fail" and "GPU 0000:09:00 lost: nvidia-smi cannot reach it" in count.reason, count


def test_hw_slowdown_at_382_mhz_fails_from_the_old_section_name():
    fragment = real("nvsmi", "nvidia-smi-q-PERFORMANCE-CLOCK_V100-SXM2-32GB_hw-power-brake-382MHz_l4rz.txt")
    _, by_id = judge({"nvidia-smi-q.txt": fragment})
    throttle = by_id["gpu.throttle"]
    assert throttle.status == "fail" and "HW Power Brake Slowdown" in throttle.observed and "382 MHz" in throttle.observed


def test_fabric_manager_per_platform():
    failed = real("fabric", "journal_fm-restart-failed-8xh20_nvtrust128.txt")
    _, p4d = judge({"fabricmanager-status.txt": failed}, "p4d.24xlarge")
    assert p4d["nvswitch.fabric"].status == "fail", p4d["nvswitch.fabric"]
    running = real("fabric", "systemctl-status_fm-active-nvl5-blackwell_bottlerocket142.txt")
    _, nvl5 = judge({"fabricmanager-status.txt": running})
    assert nvl5["nvswitch.fabric"].status == "pass"
    nothing = real("fabric", "journal_fm-nothing-to-do-a40-nvlink-bridge_gpu-operator610.txt")
    for instance in (None, "g5.48xlarge"):  # a bridge-only box, and a known instance without NVSwitch
        _, by_id = judge({"fabricmanager-status.txt": nothing}, instance)
        assert by_id["nvswitch.fabric"].status == "skip" and by_id["nvswitch.fabric"].reason.startswith("not applicable")
    # A100's `Fabric State: N/A` is normal: no failure, and no pass either without the service's state
    _, a100 = judge({"nvidia-smi-q.txt": REMAP_Q}, "p4de.24xlarge")
    assert a100["nvswitch.fabric"].status == "skip" and "N/A, which is normal" in a100["nvswitch.fabric"].reason
    # CUDA's "system not yet initialized" on an HGX node: the fabric is not ready
    error = real("fabric", "cuda-error_802-torch-warning-nd96asr-v4_lisa2823.txt")
    _, hgx = judge({"cuda-log.txt": error}, "p4d.24xlarge")
    assert hgx["nvswitch.fabric"].status == "fail" and "802" in hgx["nvswitch.fabric"].reason


def test_persistence_off_and_a_pcie_limited_line_are_judged():
    _, by_id = judge({"nvidia-smi-q.txt": real("nvsmi", "nvidia-smi-q_8xA100-SXM4-40GB_persistence-disabled_azhpc.txt")})
    assert by_id["gpu.persistence"].status == "warn"
    _, kernel = judge({"kernel-log.txt": real("kernel", "dmesg_pcie-limited-x4-nvidia-gpu_linux-surface374.txt")})
    assert kernel["gpu.pcie"].status == "warn" and "x4 of the x16" in kernel["gpu.pcie"].observed


def test_infiniband_judges_infiniband_ports_only():
    _, healthy = judge({"ibstat.txt": real("ib", "ibstat_H100-node_8xIB-NDR-active_4xEth-3down_gpud.txt")})
    assert healthy["net.infiniband"].status == "pass" and "Ethernet" in healthy["net.infiniband"].observed
    _, down = judge({"ibstat.txt": real("ib", "ibstat_mlx5_10-ConnectX7_IB-Down-Polling_guids-elided_gpud-pr482.txt")})
    assert down["net.infiniband"].status == "fail" and "Polling" in down["net.infiniband"].reason


def test_infiniband_ports_keep_the_parsers_records():
    """Issue 25: one port record per tool (parsers.system.IbPort, IbvPort), which judges `active`; the facts hold
    those records with their device and file, not a third copy of their fields."""
    from trainready.check.context import Context
    from trainready.check.facts import Facts
    from trainready.check.parsers import system

    devinfo = real("ib", "ibv_devinfo-vv_ConnectX6-dual-port_IB-port1-active_IB-port2-PORT_DOWN-DISABLED_ucx9908.txt")
    ports = Facts(Context(Bundle({"ibv_devinfo.txt": devinfo}, None, source="test"), None, None)).infiniband.ports
    assert all(isinstance(p.record, system.IbvPort) and p.source == "ibv_devinfo.txt" for p in ports)
    assert [(p.device, p.port, p.active, p.physical) for p in ports] == [("mlx5_0", 1, True, None),
                                                                          ("mlx5_1", 1, False, None)]
    _, by_id = judge({"ibv_devinfo.txt": devinfo})
    assert by_id["net.infiniband"].status == "fail" and "mlx5_1 port 1: PORT_DOWN" in by_id["net.infiniband"].reason
    # ibstat without its "Physical state" line: Active is up (a port is Active only over a link)
    assert system.IbPort(state="Active").active and not system.IbPort(state="Active", physical_state="Polling").active


# ---------------------------------------------------------------- one root cause, one verdict


def test_a_lost_gpu_is_one_failure_with_its_consequences_listed():
    paste = real("kernel", "dmesg_xid79-fallen-off-bus_akash209.txt")  # nvidia-smi's error and the kernel's Xid 79
    report, by_id = judge({"kernel-xid.txt": paste, "nvidia-smi.txt": paste}, "p4d.24xlarge")
    failed = [f.id for f in report.checks if f.status == "fail"]
    assert failed == ["gpu.xid"], failed
    assert "consequences: gpu.count" in by_id["gpu.xid"].reason
    assert by_id["gpu.count"].status == "skip" and by_id["gpu.count"].reason.startswith("consequence of the lost GPU")


def test_no_evidence_for_a_deciding_check_is_not_verified():
    healthy_log = real("kernel", "dmesg_healthy-hgx-h100-driver-load_gpud-testdata.txt")  # NVRM lines, no Xid
    report, _ = judge({"kernel-log.txt": healthy_log}, "p4d.24xlarge")
    assert report.readiness.status == "not-verified" and report.exit_code == 1
    assert {u.split(":")[0] for u in report.readiness.unverified} >= {"gpu.count", "gpu.ecc", "nvswitch.fabric"}
    assert "gpu.xid" in report.readiness.verified
    cpu = analyze(Bundle({"kernel-log.txt": healthy_log}, None, source="test"), cpu_only=True)
    assert cpu.readiness.status == "ready" and cpu.exit_code == 0


def test_not_verified_through_the_cli(tmp_path):
    (tmp_path / "kernel-xid.txt").write_text(real("kernel", "kmsg_healthy-nvswitch-open_gpud-testdata.txt"))
    (tmp_path / "instance-type.txt").write_text("p4d.24xlarge\n")
    proc = cli("check", "--bundle", tmp_path, "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and data["summary"]["fail"] == 0 and data["readiness"]["status"] == "not-verified"
    human = cli("check", "--bundle", tmp_path)
    assert human.returncode == 1 and "verdict: not verified: no evidence for" in " ".join(human.stdout.split())


# ---------------------------------------------------------------- outputs users already have


def test_nccl_tests_file_alone(tmp_path):
    ok = REAL / "nccl" / "nccl-tests_all_reduce_8xA100-80GB_1node_healthy_gcm.txt"
    plain = tmp_path / "all_reduce_perf.txt"
    plain.write_text(body(ok))
    proc = cli("check", "--nccl-tests", plain, "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and [c["id"] for c in data["checks"]] == ["nccl.allreduce"], proc.stdout
    assert data["checks"][0]["status"] == "pass" and "231.7 GB/s at 1 GiB" in data["checks"][0]["observed"]
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(real("nccl", "nccl-tests_all_reduce_2x1xGH200_slingshot_wrong-96-32_oob4-FAILED_nccltests369.txt"))
    proc = cli("check", "--nccl-tests", wrong, "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["checks"][0]["status"] == "fail"


def test_nccl_tests_judged_at_the_largest_size_not_the_average():
    # 2x p4d over EFA: the floor is at 2 GiB; the run stops at 1 GiB with 76 GB/s, its Avg bus bandwidth is far lower
    text = real("nccl", "nccl-tests_all_reduce_2x-p4d.24xlarge_EFA_healthy_aws-dlami-doc.txt")
    _, by_id = judge({"nccl-tests-all_reduce.txt": text}, "p4d.24xlarge")
    finding = by_id["nccl.allreduce"]
    assert finding.status == "pass" and "at 1 GiB" in finding.observed and "on 2 hosts" in finding.observed, finding


def test_dcgm_table_alone(tmp_path):
    skipped = tmp_path / "diag.txt"
    skipped.write_text(real("dcgm", "dcgmi-diag-r3_2xRTXPRO6000_level1-only-rest-skipped_gnosia93.txt"))
    proc = cli("check", "--dcgm-output", skipped, "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and data["checks"][0]["id"] == "gpu.dcgm"
    assert data["checks"][0]["status"] == "warn" and data["checks"][0]["reason"].startswith("incomplete")
    failed = tmp_path / "failed.txt"
    failed.write_text(real("dcgm", "dcgmi-diag-r3_8xH100_gpu-memory-fail-cuda-not-initialized_nccltests264.txt"))
    proc = cli("check", "--dcgm-output", failed, "--json")
    by_id = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert proc.returncode == 1 and by_id["dcgm.gpu-memory"]["status"] == "fail"


def test_single_file_usage_errors(tmp_path):
    missing = cli("check", "--nccl-tests", tmp_path / "nope.txt")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    unknown = tmp_path / "results.txt"
    unknown.write_text("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n")
    proc = cli("check", "--nccl-tests", unknown)
    assert proc.returncode == 2 and "cannot tell which collective" in proc.stderr and "all_reduce" in proc.stderr
    assert cli("check", "--nccl-tests", unknown, "--deep").returncode == 2


def test_help_names_the_files_users_already_have():
    text = " ".join(cli("check", "--help").stdout.split())
    for name in ("nccl-tests-<op>.txt", "dcgm-diag.txt", "nvidia-smi.txt", "--nccl-tests", "--dcgm-output"):
        assert name in text, name


# ---------------------------------------------------------------- the shape


def test_no_import_circle_in_check():
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        module = ".".join(path.relative_to(SRC.parent.parent).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        deps = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and getattr(block.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only:  # annotations only: not an import at run time
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                deps |= {target} | ({f"{target}.{a.name}" for a in node.names})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainready.check"):
                deps.add(node.module)
        graph[module] = deps - {module}
    known = set(graph)

    def visit(module: str, stack: list[str]) -> None:
        for dep in sorted(d for d in graph[module] if d in known):
            assert dep not in stack, " -> ".join([*stack[stack.index(dep):], dep])
            visit(dep, [*stack, dep])

    for module in sorted(known):
        visit(module, [module])


def test_a_check_names_itself_once():
    # ids live in the @check(...) line only: the registry stamps them on every result
    for path in (SRC / "checks").glob("*.py"):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check" and node.args:
                check_id = node.args[0].value
                assert text.count(f'"{check_id}"') == 1, (path.name, check_id)


# ---------------------------------------------------------------- hostile files (an attack on the redesign)

HOSTILE = {  # each once made a regex backtrack for seconds to hours, or crashed with exit 3
    "dcgm-diag.txt": "| Deployment | Pass" + " " * 3000 + "x\n",
    "nccl-tests-all_reduce.txt": "#  Rank  0 Group  0 Pid  1 on h device  0 [0x00] a" + " " * 90000 + "b\n",
    "nvidia-smi.txt": ("..  " + " " * 296 + "x\n") * 100,
    "cuda-log.txt": "NVLS" * (1 << 18),
    "kernel-log.txt": "GPU 00:00 " * 100000 + "\n",
    "cuda.json": '{"warnings":' + "[" * 100000 + "]" * 100000 + "}",
    "nvidia-smi-compute-apps.csv": "pid, process_name [" + "x" * 200000 + "\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_judged_quickly_and_never_crashes(name):
    # correctness, not timing: a regression here shows as a test that runs for minutes (bench/check_corpus.py times it)
    report, by_id = judge({name: HOSTILE[name]})
    assert not [f.id for f in report.checks if "check could not run" in f.reason]


def test_bidi_and_markup_from_files_are_text():
    log = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=\u202eevil[bold red]x[/], GPU has fallen off the bus.\n"
    report, by_id = judge({"kernel-xid.txt": log})
    text = json.dumps([f.model_dump() for f in report.checks], ensure_ascii=False)
    assert "\u202e" not in text and "\\u202e" in by_id["gpu.xid"].reason


def test_fabric_nothing_to_do_never_hides_gpus_that_report_a_fabric_state():
    q = real("nvsmi", "nvidia-smi-q_8xH100-80GB-HBM3_healthy-fabric-completed_thamada.txt")
    q = q.replace("State                             : Completed", "State                             : In Progress", 1)
    nothing = real("fabric", "journal_fm-nothing-to-do-no-nvswitch-2x4090_cubestudio29.txt")
    _, by_id = judge({"nvidia-smi-q.txt": q, "fabricmanager-status.txt": nothing})  # SYNTHETIC edit of one state
    assert by_id["nvswitch.fabric"].status == "fail"


def test_a_kernel_log_of_nic_lines_only_shows_no_xid():
    _, by_id = judge({"kernel-log.txt": "[ 1.0] eth0: Link is down\n"}, "p4d.24xlarge")
    assert by_id["gpu.xid"].status == "skip"


def test_dcgm_json_and_table_are_judged_together(tmp_path):
    passing = (CHECK / "acceptance" / "dcgmi-diag-r3-j_dcgm3_skips_dcgm139.json").read_text()
    passing = "\n".join(line for line in passing.splitlines() if not line.startswith("# "))
    failing = real("dcgm", "dcgmi-diag-r3_8xH100_gpu-memory-fail-cuda-not-initialized_nccltests264.txt")
    _, by_id = judge({"dcgm-diag.json": passing, "dcgm-diag.txt": failing})
    assert by_id["gpu.dcgm"].status == "fail" and "dcgm-diag.json and dcgm-diag.txt" in by_id["gpu.dcgm"].observed


@pytest.mark.parametrize(("name", "op"), [("allreduce.txt", "all_reduce"), ("All-Gather.log", "all_gather"),
                                          ("reducescatter.txt", "reduce_scatter"), ("reduce_perf.txt", "reduce")])
def test_the_collective_from_the_file_name(name, op):
    from trainready.check.inputs import nccl_op

    assert nccl_op("#  size count\n", name) == op


def test_checks_import_common_never_each_other():
    siblings = {p.stem for p in (SRC / "checks").glob("*.py")} - {"__init__", "common"}
    for path in (SRC / "checks").glob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module not in siblings, (path.name, node.module)
