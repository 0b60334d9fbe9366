"""Parsers of system-command output for `trainready check`: real and synthetic fixtures, the
outputs of broken nodes (tool missing, permission denied, empty), and fuzzing that shows the
parsers never raise and always return their declared type."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainready.check.parsers import system as sp
from trainready.check.parsers.kernel import KernelGpuEvents, parse_kernel_gpu_events
from trainready.check.xid import catalog, judge
from trainready.check.parsers.system import (
    FiInfo,
    IbStat,
    IbvDevinfo,
    Lsblk,
    Lscpu,
    MemInfo,
    Mounts,
    NcclDebug,
    NcclTests,
)

OWN = Path(__file__).resolve().parent / "fixtures" / "check" / "system"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "fixtures"

FI_INFO_P4D = "fi_info-p-efa-t-FI_EP_RDM_p4d.24xlarge_AWSdocs_4xefa.txt"
IBSTAT_MLX4 = "ibstat_mlx4_FDR56_InfiniBand_active.txt"
NCCL_P4DE = "nccl-tests_all_reduce_perf_2x-p4de.24xlarge_16GPU_EFA.txt"
NCCL_P5 = "nccl-tests_all_reduce_perf_2x-p5.48xlarge_16GPU_EFA.txt"


def _body(text: str) -> str:
    """A shared fixture without its provenance header (the leading `# ` lines)."""
    lines = text.split("\n")
    while lines and lines[0].startswith("# "):
        lines.pop(0)
    return "\n".join(lines)


COPIES = Path(__file__).resolve().parent / "fixtures" / "check" / "reference"


def _shared_path(name: str) -> Path:
    return SHARED / name if (SHARED / name).is_file() else COPIES / name


def shared(name: str) -> str:
    path = _shared_path(name)
    if not path.is_file():
        pytest.skip(f"shared reference fixture not available: {path}")
    return _body(path.read_text())


def own(name: str) -> str:
    return (OWN / name).read_text()


# ---------------------------------------------------------------- fi_info


def test_fi_info_p4d_aws_docs():
    info = sp.parse_fi_info(shared(FI_INFO_P4D))
    assert info.problems == []
    assert info.providers == ["efa"]
    assert info.device_count == 4
    assert info.efa_devices == ["efa_0", "efa_1", "efa_2", "efa_3"]
    assert info.domains == ["efa_0-rdm", "efa_1-rdm", "efa_2-rdm", "efa_3-rdm"]
    assert len(info.fabrics) == 4 and info.fabrics[0] == "EFA-fe80::c6e:8fff:fef6:e7ff"
    assert info.versions == ["111.0"]
    assert {e.type for e in info.entries} == {"FI_EP_RDM"} and {e.protocol for e in info.entries} == {"FI_PROTO_EFA"}
    assert not info.command_missing and not info.no_data


def test_fi_info_new_style_counts_devices_not_endpoints():
    info = sp.parse_fi_info(own("fi_info_efa_4dev_rdm_dgrm.txt"))
    assert info.problems == []
    assert len(info.entries) == 8 and len(info.domains) == 8
    assert info.device_count == 4
    assert info.efa_devices == ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]
    assert info.fabrics == ["efa"] and info.versions == ["118.20"]
    assert {e.type for e in info.entries} == {"FI_EP_RDM", "FI_EP_DGRAM"}


@pytest.mark.parametrize("text", ["bash: fi_info: command not found", "sh: 1: fi_info: not found",
                                  "bash: /opt/amazon/efa/bin/fi_info: No such file or directory\n"])
def test_fi_info_command_missing(text):
    info = sp.parse_fi_info(text)
    assert info.command_missing and info.device_count == 0 and info.entries == []
    assert info.problems == [] and any("not installed" in n for n in info.notes)


def test_fi_info_no_data():
    info = sp.parse_fi_info("fi_getinfo: -61 (No data available)\n")
    assert info.no_data and info.device_count == 0 and not info.command_missing
    assert info.problems == [] and "-61" in info.notes[0]


def test_fi_info_other_providers_are_not_efa_devices():
    text = "provider: tcp;ofi_rxm\n    fabric: 10.0.0.0/24\n    domain: ens5\n    version: 1.0\n    type: FI_EP_RDM\n"
    info = sp.parse_fi_info(text)
    assert info.providers == ["tcp;ofi_rxm"] and info.device_count == 0


def test_fi_info_version_and_junk():
    info = sp.parse_fi_info("fi_info: 1.18.2amzn1.0\nlibfabric: 1.18.2amzn1.0\nlibfabric api: 1.18\n" + "x" * 500)
    assert info.libfabric_version == "1.18.2amzn1.0"
    assert len(info.problems) == 1 and info.problems[0].startswith("unrecognised fi_info line")
    assert info.problems[0].count("x") == 117 and info.problems[0].endswith('..."')


def test_fi_info_empty():
    info = sp.parse_fi_info("")
    assert info.device_count == 0 and info.problems == [] and info.notes == ["empty output"]
    assert sp.parse_fi_info(None) == info


# ---------------------------------------------------------------- ibstat


def test_ibstat_mlx4_fdr():
    stat = sp.parse_ibstat(shared(IBSTAT_MLX4))
    assert stat.problems == []
    (ca,) = stat.cas
    assert (ca.name, ca.type, ca.firmware, ca.num_ports) == ("mlx4_0", "MT4099", "2.42.5000", 1)
    (port,) = ca.ports
    assert (port.number, port.state, port.physical_state, port.rate_gbps, port.link_layer) == (
        1, "Active", "LinkUp", 56.0, "InfiniBand")
    assert port.active and port.base_lid == 1 and port.port_guid == "0x98039b0300dccab1"


def test_ibstat_mixed_states_and_roce():
    stat = sp.parse_ibstat(own("ibstat_mlx5_mixed.txt"))
    assert stat.problems == []
    assert [ca.name for ca in stat.cas] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    p0, p1, p2 = (ca.ports[0] for ca in stat.cas)
    assert p0.active and p0.rate_gbps == 200 and p0.link_layer == "InfiniBand"
    assert not p1.active and (p1.state, p1.physical_state) == ("Down", "Polling")
    assert p2.active and p2.link_layer == "Ethernet" and p2.rate_gbps == 100


def test_ibstat_missing_empty_and_bad_rate():
    missing = sp.parse_ibstat("bash: ibstat: command not found")
    assert missing.command_missing and missing.cas == [] and missing.problems == []
    assert sp.parse_ibstat("").cas == [] and sp.parse_ibstat("").problems == []
    bad = sp.parse_ibstat("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tRate: fast\n")
    assert bad.cas[0].ports[0].rate_gbps is None and bad.cas[0].ports[0].state == "Active"
    assert bad.problems == ['rate_gbps is not a number: "Rate: fast"']
    warn = sp.parse_ibstat("ibwarn: [1234] umad_init: can't read ABI version from /sys/class/infiniband_mad/abi_version (2)")
    assert warn.cas == [] and warn.problems == [] and warn.notes[0].startswith("ibstat said")


# ---------------------------------------------------------------- ibv_devinfo


def test_ibv_devinfo_efa():
    info = sp.parse_ibv_devinfo(own("ibv_devinfo_efa.txt"))
    assert info.problems == []
    assert [d.hca_id for d in info.devices] == ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]
    for device in info.devices:
        assert device.is_efa and device.transport == "unspecified" and device.transport_code == 4
        assert device.vendor_id == "0x1d0f" and device.phys_port_cnt == 1
        (port,) = device.ports
        assert port.active and port.state == "PORT_ACTIVE" and port.link_layer == "Unspecified" and port.active_mtu == 4096


def test_ibv_devinfo_mlx5():
    info = sp.parse_ibv_devinfo(own("ibv_devinfo_mlx5_ib.txt"))
    assert info.problems == []
    d0, d1, d2 = info.devices
    assert not any(d.is_efa for d in info.devices)
    assert (d0.transport, d0.transport_code, d0.fw_ver) == ("InfiniBand", 0, "28.39.1002")
    assert d0.ports[0].active and d0.ports[0].link_layer == "InfiniBand"
    assert d1.ports[0].state == "PORT_DOWN" and not d1.ports[0].active
    assert d2.ports[0].link_layer == "Ethernet" and d2.ports[0].active_mtu == 1024


def test_ibv_devinfo_no_devices_and_missing():
    none = sp.parse_ibv_devinfo("No IB devices found\n")
    assert none.devices == [] and none.problems == [] and "No IB devices found" in none.notes[0]
    missing = sp.parse_ibv_devinfo("bash: ibv_devinfo: command not found\n")
    assert missing.command_missing and missing.devices == [] and missing.problems == []


def test_ibv_devinfo_verbose_flag_lines_are_not_problems():
    flags = "\tdevice_cap_flags:\t\t0x21361c36\n\t\t\t\t\tBAD_PKEY_CNTR\n\t\t\t\t\tAUTO_PATH_MIG\n"
    text = own("ibv_devinfo_mlx5_ib.txt").replace("\tphys_port_cnt:", flags + "\tphys_port_cnt:", 1)
    assert sp.parse_ibv_devinfo(text).problems == []


# ---------------------------------------------------------------- lscpu


def test_lscpu_flat_p4d():
    cpu = sp.parse_lscpu(own("lscpu_p4d.txt"))
    assert cpu.problems == []
    assert (cpu.cpus, cpu.threads_per_core, cpu.cores_per_socket, cpu.sockets, cpu.numa_nodes) == (96, 2, 24, 2, 2)
    assert cpu.model_name == "Intel(R) Xeon(R) Platinum 8275CL CPU @ 3.00GHz" and cpu.architecture == "x86_64"
    assert cpu.numa_node_cpus == {"0": "0-23,48-71", "1": "24-47,72-95"}
    assert cpu.fields["On-line CPU(s) list"] == "0-95"  # not confused with CPU(s)


def test_lscpu_sectioned_p5():
    cpu = sp.parse_lscpu(own("lscpu_p5_sectioned.txt"))
    assert cpu.problems == []
    assert (cpu.cpus, cpu.threads_per_core, cpu.cores_per_socket, cpu.sockets, cpu.numa_nodes) == (192, 2, 48, 2, 2)
    assert cpu.model_name == "AMD EPYC 7R13 Processor"


def test_lscpu_json_and_odd_values():
    doc = {"lscpu": [{"field": "Architecture:", "data": "aarch64"}, {"field": "CPU(s):", "data": "64"},
                     {"field": "Vendor ID:", "data": "ARM", "children": [
                         {"field": "Model name:", "data": "Neoverse-N1"}, {"field": "Socket(s):", "data": "-"},
                         {"field": "Thread(s) per core:", "data": "1"}]}]}
    cpu = sp.parse_lscpu(json.dumps(doc))
    assert (cpu.cpus, cpu.architecture, cpu.model_name) == (64, "aarch64", "Neoverse-N1")
    assert (cpu.threads_per_core, cpu.sockets) == (1, None)
    assert cpu.problems == []
    bad = sp.parse_lscpu("CPU(s): lots\nno colon here\n")
    assert bad.cpus is None and len(bad.problems) == 2


# ---------------------------------------------------------------- meminfo


def test_meminfo_p4d():
    mem = sp.parse_meminfo(own("meminfo_p4d.txt"))
    assert mem.problems == []
    assert mem.total_bytes == 1176746508 * 1024 and mem.available_bytes == 1163019120 * 1024
    assert (mem.hugepages_total, mem.hugepages_free, mem.hugepage_size_bytes) == (1024, 1000, 2 * 1024 * 1024)
    assert mem.values["HugePages_Rsvd"] == 0 and mem.values["Active(anon)"] == 14520 * 1024


def test_meminfo_broken():
    mem = sp.parse_meminfo("MemTotal: 1024 kB\nMemAvailable: lots\ncat: /proc/meminfo: Permission denied\n")
    assert mem.total_bytes == 1024 * 1024 and mem.available_bytes is None and len(mem.problems) == 2
    assert sp.parse_meminfo("").notes == ["no meminfo fields found"]


# ---------------------------------------------------------------- lsblk


def test_lsblk_new_format_p4d():
    blk = sp.parse_lsblk_json(own("lsblk_p4d_mountpoints.json"))
    assert blk.problems == []
    names = [d.name for d in blk.devices]
    assert names[0] == "nvme0n1" and names[-1] == "loop0" and len(names) == 10
    store = [d for d in blk.devices if d.is_instance_store]
    assert len(store) == 8 and all(d.is_nvme and d.size_bytes == 1000 * 1000**3 for d in store)
    root = blk.devices[0]
    assert root.is_nvme and not root.is_instance_store and root.model == "Amazon Elastic Block Store"
    assert root.mountpoints == [] and root.children[0].mountpoints == ["/"] and root.children[0].fstype == "ext4"
    md = store[0].children[0]
    assert (md.name, md.type, md.mountpoints, md.fstype) == ("md0", "raid0", ["/opt/dlami/nvme"], "xfs")
    assert sum(1 for d in blk.walk() if d.name == "md0") == 8


def test_lsblk_old_string_format():
    blk = sp.parse_lsblk_json(own("lsblk_old_strings.json"))
    assert blk.problems == []
    root, store = blk.devices
    assert root.size_bytes == 214748364800 and root.children[0].mountpoints == ["/"] and root.children[1].mountpoints == []
    assert store.is_instance_store and store.size_bytes == 3800000000000


def test_lsblk_broken_inputs():
    truncated = own("lsblk_p4d_mountpoints.json")[:700]
    assert sp.parse_lsblk_json(truncated).devices == [] and sp.parse_lsblk_json(truncated).problems
    assert sp.parse_lsblk_json("lsblk: command not found").problems
    warned = sp.parse_lsblk_json('lsblk: dm-0: failed to get device path\n{"blockdevices": [{"name": "sda", "size": "1G"}]}')
    assert warned.devices[0].size_bytes is None and "run lsblk with -b" in warned.problems[0]
    assert warned.notes == ["lsblk said: lsblk: dm-0: failed to get device path"]
    odd = sp.parse_lsblk_json(json.dumps({"blockdevices": [
        5, {"size": 3}, {"name": "nvme0n1", "children": "x", "mountpoints": [None, "/a"]}]}))
    assert [d.name for d in odd.devices] == ["nvme0n1"] and odd.devices[0].mountpoints == ["/a"] and len(odd.problems) == 2
    assert sp.parse_lsblk_json('{"blockdevices": {}}').problems and sp.parse_lsblk_json("").problems == []


def test_lsblk_deep_nesting_is_cut_not_crashed():
    doc: dict = {"name": "leaf"}
    for i in range(40):
        doc = {"name": f"d{i}", "children": [doc]}
    blk = sp.parse_lsblk_json(json.dumps({"blockdevices": [doc]}))
    assert blk.devices[0].name == "d39" and any("deeper than" in p for p in blk.problems)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "type", "size", "model", "mountpoint", "mountpoints", "fstype", "children", "x"]),
        inner, max_size=6),
    max_leaves=30)


@settings(deadline=None, max_examples=80)
@given(devices=st.lists(json_values, max_size=5))
def test_lsblk_any_json_shape(devices):
    result = sp.parse_lsblk_json(json.dumps({"blockdevices": devices}))
    _assert_well_formed(result, Lsblk)
    for device in result.walk():
        assert isinstance(device.name, str) and all(isinstance(m, str) for m in device.mountpoints)


# ---------------------------------------------------------------- /proc/mounts


def test_mounts_fixture_and_find():
    mounts = sp.parse_mounts(own("proc_mounts_mixed.txt"))
    assert mounts.problems == [] and len(mounts.entries) == 15
    assert mounts.find("/mnt/efs/ckpt/step-100").mountpoint == "/mnt/efs"
    assert mounts.find("/mnt/efsX/data").mountpoint == "/"
    assert mounts.find("/fsx").fstype == "lustre" and mounts.find("/fsx/").fstype == "lustre"
    assert mounts.find("/mnt/my data/x").device == "/dev/nvme1n1"
    assert mounts.find("/opt/dlami/nvme/../nvme/cache").device == "/dev/md0"
    assert mounts.find("relative/path").mountpoint == "/"
    assert mounts.entries[-1].mountpoint == "/mnt/back\\slash"


def test_mounts_kinds_and_of_type():
    mounts = sp.parse_mounts(own("proc_mounts_mixed.txt"))
    by_mp = {e.mountpoint: e for e in mounts.entries}
    assert by_mp["/mnt/efs"].kind == "efs" and by_mp["/mnt/efs-tls"].kind == "efs"
    assert by_mp["/home"].kind == "nfs" and by_mp["/fsx"].kind == "lustre"
    assert by_mp["/mnt/s3-data"].kind == "s3" and by_mp["/mnt/s3fs"].kind == "s3"
    assert by_mp["/opt/dlami/nvme"].kind == "local" and by_mp["/proc"].kind == "other"
    mps = lambda entries: [e.mountpoint for e in entries]  # noqa: E731
    assert mps(mounts.of_type("efs")) == ["/mnt/efs", "/mnt/efs-tls"]
    assert mps(mounts.of_type(["nfs"])) == ["/mnt/efs", "/mnt/efs-tls", "/home"]  # a prefix: nfs4 too
    assert mps(mounts.of_type(("lustre", "mountpoint-s3", "fuse.s3fs"))) == ["/fsx", "/mnt/s3-data", "/mnt/s3fs"]
    assert mps(mounts.of_type("s3")) == ["/mnt/s3-data", "/mnt/s3fs"]
    assert mounts.of_type([]) == [] and mounts.of_type("") == []


def test_mounts_broken_lines():
    mounts = sp.parse_mounts("/dev/root / ext4 rw 0 0\n/dev/sdb /data\n")
    assert len(mounts.entries) == 1 and mounts.problems == ['mount line with fewer than 4 fields: "/dev/sdb /data"']
    assert sp.parse_mounts("").find("/x") is None
    assert sp.unescape_mount(r"/a\040b\011c\012d\134e") == "/a b\tc\nd\\e"


@settings(deadline=None, max_examples=60)
@given(path=st.text(max_size=40), prefixes=st.lists(st.text(max_size=6), max_size=3))
def test_mounts_helpers_total(path, prefixes):
    mounts = sp.parse_mounts(own("proc_mounts_mixed.txt"))
    found = mounts.find(path)
    assert found is None or isinstance(found, sp.MountEntry)
    assert isinstance(mounts.of_type(prefixes), list)


# ---------------------------------------------------------------- env


def test_env_fixture():
    env = sp.parse_env(own("env_slurm_node.txt"))
    assert env["EXTRA_ARGS"] == "--foo=bar --baz=qux" and env["EMPTY"] == "" and env["NCCL_IB_DISABLE"] == "1"
    assert env["FI_PROVIDER"] == "efa" and env["_"] == "/usr/bin/env" and env["PATH"].startswith("/opt/amazon/openmpi/bin")
    assert not any(k.startswith("BASH_FUNC") for k in env) and "eval" not in "".join(env.values())
    full = sp.parse_env_full(own("env_slurm_node.txt"))
    assert full.vars == env and full.problems == ['not a KEY=VALUE line: "this line is not an environment variable"']


def test_env_nul_separated_and_junk():
    assert sp.parse_env("A=1\0B=two\nlines\0C=x=y\0") == {"A": "1", "B": "two\nlines", "C": "x=y"}
    assert sp.parse_env("=nokey\n1BAD=x\nGOOD=1\nGOOD=2\r\n") == {"GOOD": "2"}
    assert sp.parse_env("") == {} and sp.parse_env(None) == {}
    # a function whose closing brace was lost must not swallow the variables after it
    assert sp.parse_env("BASH_FUNC_ml%%=() {  eval x\n    local a=1\nNEXT=1\n") == {"NEXT": "1"}
    assert sp.parse_env("BASH_FUNC_one%%=() {  :; }\nA=1\n") == {"A": "1"}


# ---------------------------------------------------------------- kernel log: Xid (parsers/kernel.py)


def test_xid_dmesg_fixture():
    log = parse_kernel_gpu_events(own("dmesg_xid.txt"))
    assert log.readable  # the AppArmor "Permission denied" record is a kernel message, not dmesg failing
    assert [e.code for e in log.xids] == [13, 13, 63, 79]
    fallen = log.xids[3]
    assert (fallen.bus, fallen.message) == ("0000:90:1c", "GPU has fallen off the bus.")
    assert [(x.bus, x.how) for x in log.lost] == [("0000:90:1c", "fallen off the bus (Xid 79)"),
                                                  ("0000:90:1c.0", "fallen off the bus")]  # the driver says it twice
    assert log.xids[0].message.startswith("Graphics SM Warp Exception")
    assert [(s.switch, s.bus, s.code) for s in log.sxids] == [("nvidia-nvswitch2", "0000:c5:00.0", 12028)] * 2
    assert log.problems == ['unreadable Xid line: "[10002.500000] NVRM: Xid (PCI:0000:10"']


def test_xid_journalctl_fixture():
    log = parse_kernel_gpu_events(own("journalctl_k_xid.txt"))
    assert log.readable and log.problems == []
    assert [judge(e).severity for e in log.xids] == ["fail", "warn", "fail"]  # 48, 94, 119
    assert [e.code for e in log.xids] == [48, 94, 119]


@pytest.mark.parametrize("text", ["dmesg: read kernel buffer failed: Operation not permitted\n",
                                  "No journal files were opened due to insufficient permissions.\n"])
def test_xid_unreadable(text):
    log = parse_kernel_gpu_events(text)
    assert not log.readable and log.xids == [] and log.notes


def test_xid_old_format_unknown_code_and_empty():
    log = parse_kernel_gpu_events("NVRM: Xid (0000:01:00): 31, Ch 00000010, engmask 00000101, intr 10000000\n"
                                  "NVRM: Xid (PCI:0000:01:00): 999, pid=1, name=x, something new\n")
    assert [(e.bus, e.code) for e in log.xids] == [("0000:01:00", 31), ("0000:01:00", 999)]
    assert judge(log.xids[1]).severity == "warn" and "not in NVIDIA's Xid catalog" in judge(log.xids[1]).why
    empty = parse_kernel_gpu_events("")
    assert empty.readable and empty.xids == [] and empty.notes == ["empty kernel log"]


def test_xid_154_recovery_action_decides():
    line = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)\n"
    event = parse_kernel_gpu_events(line).xids[0]
    assert event.recovery == "0x2 (Node Reboot Required)" and judge(event).severity == "fail"
    back = parse_kernel_gpu_events(line.replace("from 0x0 (None) to 0x2 (Node Reboot Required)", "from 0x2 (x) to 0x0 (None)"))
    assert judge(back.xids[0]).severity == "warn"


def test_xid_catalog_is_sourced():
    table = catalog()
    assert len(table) >= 100
    assert {c for c, x in table.items() if x.severity == "fail"} >= {48, 62, 64, 74, 79, 95, 119, 120}
    assert {c for c, x in table.items() if x.severity == "warn"} >= {13, 31, 43, 45, 109}
    assert all(x.name and x.source for x in table.values())


# ---------------------------------------------------------------- NCCL_DEBUG=INFO


def test_nccl_debug_efa_ok():
    log = sp.parse_nccl_debug(own("nccl-debug_efa_ok.log"))
    assert log.transport == "ofi" and log.network == "AWS Libfabric" and not log.plugin_missing
    assert (log.nccl_version, log.cuda_version) == ("2.18.5", "12.2")
    assert (log.ofi_plugin_version, log.ofi_provider, log.ofi_nics, log.libfabric_version) == ("1.7.4-aws", "efa", 4, "1.19")
    assert log.gdrdma and log.channels == 8 and log.ring and log.tree and log.nranks == 16 and log.init_complete
    assert any("Using network AWS Libfabric" in e for e in log.evidence) and log.problems == [] and log.warnings == []


def test_nccl_debug_socket_fallback():
    log = sp.parse_nccl_debug(own("nccl-debug_socket_fallback.log"))
    assert log.transport == "socket" and log.plugin_missing and log.network == "Socket"
    assert log.socket_interfaces == ["ens32:10.1.40.12<0>", "ens65:10.1.41.12<0>"] and log.ib_devices == []
    assert not log.gdrdma and log.channels == 2
    assert any("libnccl-net.so" in e for e in log.evidence) and any("Using network Socket" in e for e in log.evidence)


def test_nccl_debug_ib_and_new_plugin_wording():
    ib = sp.parse_nccl_debug(
        "n1:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.\n"
        "n1:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; OOB ib0:10.0.0.1<0>\n"
        "n1:1:2 [0] NCCL INFO Using network IB\n"
        "n1:1:2 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA\n")
    assert ib.transport == "ib" and ib.ib_devices == ["mlx5_0:1/IB", "mlx5_3:1/IB"] and ib.gdrdma
    assert ib.plugin_missing  # no external plugin, which on InfiniBand is fine; the check decides
    # NCCL tries libnccl-net.so, then the OFI plugin under its own name: a miss followed by a load is no miss
    ofi = sp.parse_nccl_debug("x [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.\n"
                              "x [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v8)\n"
                              "x [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)\n")
    assert ofi.transport == "ofi" and not ofi.plugin_missing and ofi.plugin_name == "Libfabric" and ofi.ofi_nics == 32
    comms = sp.parse_nccl_debug("x [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0\n"
                                "x [0] NCCL INFO comm 0x2 rank 0 nranks 8 cudaDev 0 busId 101c0 - Init COMPLETE\n")
    assert (comms.nranks, comms.nnodes) == (16, 2)  # the world, not the last tensor-parallel group


def test_nccl_debug_without_verdict_and_warnings():
    only_socket = sp.parse_nccl_debug("h:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>\n"
                                      "h:1:1 [0] NCCL WARN Call to connect returned Connection refused, retrying\n")
    assert only_socket.transport == "socket" and only_socket.warnings == [
        "NCCL WARN Call to connect returned Connection refused, retrying"]
    nothing = sp.parse_nccl_debug("epoch 1 loss 2.3\n")
    assert nothing.transport == "unknown" and not nothing.plugin_missing and nothing.notes


# ---------------------------------------------------------------- nccl-tests


@pytest.mark.parametrize("name, rows, last_busbw", [(NCCL_P4DE, 29, 78.33), (NCCL_P5, 32, 487.26)])
def test_nccl_tests_shared_tables(name, rows, last_busbw):
    result = sp.parse_nccl_tests(shared(name))
    assert result.problems == [] and len(result.rows) == rows
    first = result.rows[0]
    assert (first.size_bytes, first.count, first.dtype, first.redop, first.root) == (8, 2, "float", "sum", -1)
    assert result.rows[-1].busbw_gbps == last_busbw and result.max_busbw == last_busbw
    assert result.avg_busbw is None and result.nranks is None  # the README excerpt has neither line
    assert not any(r.has_wrong for r in result.rows)


def test_nccl_tests_p4de_values():
    result = sp.parse_nccl_tests(shared(NCCL_P4DE))
    row = result.rows[-1]
    assert row.size_bytes == 2147483648 and row.count == 536870912
    assert (row.oop_time_us, row.oop_algbw_gbps, row.oop_busbw_gbps, row.oop_wrong) == (51406, 41.78, 78.33, 0)
    assert (row.ip_time_us, row.ip_algbw_gbps, row.ip_busbw_gbps, row.ip_wrong) == (51406, 41.77, 78.33, 0)
    assert result.busbw_at(1073741824) == 76.86


def test_nccl_tests_full_output():
    result = sp.parse_nccl_tests(own("nccl-tests_all_reduce_perf_8xA100_single-node_full.txt"))
    assert result.problems == [] and len(result.rows) == 14
    assert result.avg_busbw == 187.8093 and result.nranks == 8 and result.out_of_bounds == 0
    assert result.busbw_at(8 << 30) == 230.03 and result.busbw_at(3) is None


def test_nccl_tests_old_format_all_gather_and_failures():
    old = sp.parse_nccl_tests(
        "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "  1073741824     268435456   float     sum    13150   81.65  142.89  5e-07    13142   81.70  142.98  5e-07\n")
    (row,) = old.rows
    assert row.redop == "sum" and row.root is None and row.oop_wrong == 5e-07 and not row.has_wrong
    gather = sp.parse_nccl_tests("     1048576         32768     float    none      -1    40.21   26.08   22.82      0"
                                 "    39.11   26.81   23.46    N/A\n")
    assert gather.rows[0].redop == "none" and gather.rows[0].root == -1 and gather.rows[0].ip_wrong is None
    failed = sp.parse_nccl_tests("ip-1: Test NCCL failure common.cu:958 'unhandled system error'\n 123 garbage row\n")
    assert failed.rows == [] and failed.failures and failed.problems == ['unreadable nccl-tests row: "123 garbage row"']
    wrong = sp.parse_nccl_tests("8 2 float sum -1 10.0 0.00 0.00 2 10.0 0.00 0.00 0\n")
    assert wrong.rows[0].has_wrong


# ---------------------------------------------------------------- never raise: fuzzing

ParserCase = tuple[Callable, type, list[str]]


def _own_texts(*names: str) -> list[str]:
    return [own(n) for n in names]


def _shared_texts(*names: str) -> list[str]:
    return [_body(_shared_path(n).read_text()) for n in names if _shared_path(n).is_file()]


PARSERS: dict[str, ParserCase] = {
    "fi_info": (sp.parse_fi_info, FiInfo, _own_texts("fi_info_efa_4dev_rdm_dgrm.txt") + _shared_texts(FI_INFO_P4D)),
    "ibstat": (sp.parse_ibstat, IbStat, _own_texts("ibstat_mlx5_mixed.txt") + _shared_texts(IBSTAT_MLX4)),
    "ibv_devinfo": (sp.parse_ibv_devinfo, IbvDevinfo, _own_texts("ibv_devinfo_efa.txt", "ibv_devinfo_mlx5_ib.txt")),
    "lscpu": (sp.parse_lscpu, Lscpu, _own_texts("lscpu_p4d.txt", "lscpu_p5_sectioned.txt")),
    "meminfo": (sp.parse_meminfo, MemInfo, _own_texts("meminfo_p4d.txt")),
    "lsblk": (sp.parse_lsblk_json, Lsblk, _own_texts("lsblk_p4d_mountpoints.json", "lsblk_old_strings.json")),
    "mounts": (sp.parse_mounts, Mounts, _own_texts("proc_mounts_mixed.txt")),
    "env": (sp.parse_env, dict, _own_texts("env_slurm_node.txt")),
    "xid": (parse_kernel_gpu_events, KernelGpuEvents, _own_texts("dmesg_xid.txt", "journalctl_k_xid.txt")),
    "nccl_debug": (sp.parse_nccl_debug, NcclDebug, _own_texts("nccl-debug_efa_ok.log", "nccl-debug_socket_fallback.log")),
    "nccl_tests": (sp.parse_nccl_tests, NcclTests,
                   _own_texts("nccl-tests_all_reduce_perf_8xA100_single-node_full.txt") + _shared_texts(NCCL_P4DE, NCCL_P5)),
}


def _assert_well_formed(result: object, kind: type) -> None:
    assert isinstance(result, kind)
    if kind is dict:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())  # type: ignore[union-attr]
        return
    problems = result.problems  # type: ignore[attr-defined]
    assert not any("internal parser error" in p for p in problems), problems
    assert len(problems) <= sp.MAX_PROBLEMS + 1
    for p in problems:
        if p.endswith('"') and ': "' in p:
            assert len(p[p.index(': "') + 3:-1]) <= sp.QUOTE_LIMIT
    result.model_dump_json()  # type: ignore[attr-defined]  # `trainready check --json` must be able to print it


@st.composite
def mangled(draw: st.DrawFn, texts: list[str]) -> str:
    """A fixture broken the ways real captures break: lines lost, cut short, bytes flipped, CRLF."""
    text = draw(st.sampled_from(texts))
    for op in draw(st.lists(st.sampled_from(["delete", "truncate", "replace", "crlf", "duplicate", "insert"]),
                            min_size=1, max_size=4)):
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
        elif op == "duplicate" and lines:
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(i, lines[i])
            text = "\n".join(lines)
        elif op == "insert":
            lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=200)))
            text = "\n".join(lines)
    return text


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(deadline=None, max_examples=40)
@given(data=st.data())
def test_mangled_fixtures_never_raise(name, data):
    parse, kind, texts = PARSERS[name]
    _assert_well_formed(parse(data.draw(mangled(texts))), kind)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(deadline=None, max_examples=40)
@given(text=st.text(max_size=400) | st.binary(max_size=200) | st.none())
def test_arbitrary_input_never_raises(name, text):
    parse, kind, _ = PARSERS[name]
    _assert_well_formed(parse(text), kind)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_crlf_and_bytes_read_like_lf_text(name):
    parse, _, texts = PARSERS[name]
    for text in texts:
        assert parse(text.replace("\n", "\r\n")) == parse(text)
        assert parse(text.encode()) == parse(text)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_hostile_inputs(name):
    parse, kind, _ = PARSERS[name]
    for text in ["\ud800 lone surrogate: x\n", "9" * 5000 + "\n", "x" * 200_000, "\n" * 10_000, "\0\0=\0", "{" * 5000,
                 "[" * 3000 + "]" * 3000, "CA 'x'\n" * 2000, "provider: efa\n" * 2000]:
        _assert_well_formed(parse(text), kind)


def test_parser_bug_is_reported_not_raised(monkeypatch):
    def broken(text: str) -> FiInfo:
        raise RuntimeError("bug")

    monkeypatch.setattr(sp, "_parse_fi_info", broken)
    info = sp.parse_fi_info("provider: efa")
    assert isinstance(info, FiInfo) and info.problems == ["internal parser error (RuntimeError); output not read"]
