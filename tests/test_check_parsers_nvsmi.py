"""nvidia-smi parsers: every fixture parses to the expected values, and no input makes a parser raise."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainready.check.parsers import nvsmi
from trainready.check.parsers.nvsmi import (
    NvlinkStatus,
    QueryGpu,
    SmiQ,
    Topology,
    nvlink_count,
    parse_nvlink_status,
    parse_query_gpu,
    parse_smi_q,
    parse_topo,
)

FIXTURES = Path(__file__).parent / "fixtures" / "check"


def fixture(name: str) -> str:
    """A fixture's text without its leading "# SOURCE/MACHINE/COMMAND" lines (the body is verbatim output)."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("# "):
        lines.pop(0)
    return "".join(lines)


def names(pattern: str) -> list[str]:
    found = sorted(p.name for p in FIXTURES.glob(pattern))
    assert found, f"no fixture matches {pattern}"
    return found


TOPO = names("nvidia-smi-topo-m_*.txt")
NVLINK = names("nvidia-smi-nvlink-*.txt")
QUERY = names("nvidia-smi-query-gpu_*.csv")
SMI_Q = names("nvidia-smi-q_*.txt")


def pairs_with(topo: Topology, count: int) -> set[tuple[int, int]]:
    return {pair for pair, n in topo.nvlink_pairs().items() if n == count}


def no_internal_error(problems: list[str]) -> None:
    assert not [p for p in problems if p.startswith("internal parser error")], problems


# --------------------------------------------------------------------------------------------------
# topo -m


@pytest.mark.parametrize("name", TOPO)
def test_every_topo_fixture_parses(name):
    topo = parse_topo(fixture(name))
    assert len(topo.gpus) in (2, 4, 8)
    no_internal_error(topo.problems)
    n = len(topo.gpus)
    assert len(topo.nvlink_pairs()) == n * (n - 1) // 2
    assert all(topo.matrix[(i, i)] == "X" for i in range(n))
    if "TRUNCATED" not in name:
        assert topo.problems == [] and not topo.truncated


def test_topo_a100_nvswitch_all_28_pairs_nv12_and_nic_legend():
    topo = parse_topo(fixture("nvidia-smi-topo-m_8xA100-SXM4_NVSwitch_10xmlx5_NV12-PXB-SYS.txt"))
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.nvlink_pairs() == {(i, j): 12 for i in range(8) for j in range(i + 1, 8)}
    assert topo.nics == [f"NIC{i}" for i in range(10)]
    assert topo.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(10)}
    assert topo.nic_device("NIC9") == "mlx5_9"
    # each GPU pair shares a PCIe switch (PXB) with two NICs; NIC8/NIC9 serve no GPU
    assert [nic for (gpu, nic), token in sorted(topo.nic_matrix.items()) if gpu == 0 and token == "PXB"] == ["NIC0", "NIC1"]
    assert {topo.nic_matrix[(g, "NIC8")] for g in range(8)} == {"SYS"}
    # no "GPU NUMA ID" column on this older driver
    assert topo.cpu_affinity == {0: "48-63,176-191", 1: "48-63,176-191", 2: "16-31,144-159", 3: "16-31,144-159",
                                 4: "112-127,240-255", 5: "112-127,240-255", 6: "80-95,208-223", 7: "80-95,208-223"}
    assert topo.numa_affinity == {0: "3", 1: "3", 2: "1", 3: "1", 4: "7", 5: "7", 6: "5", 7: "5"}


V100_NV2 = {(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)}
V100_NV1 = {(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)}
V100_SYS = {(0, 5), (0, 6), (0, 7), (1, 4), (1, 6), (1, 7), (2, 4), (2, 5), (2, 7), (3, 4), (3, 5), (3, 6)}


def test_topo_v100_hybrid_cube_mesh():
    topo = parse_topo(fixture("nvidia-smi-topo-m_8xV100-SXM2-32GB_hybrid-cube-mesh_NV1-NV2-SYS.txt"))
    assert pairs_with(topo, 2) == V100_NV2
    assert pairs_with(topo, 1) == V100_NV1
    assert pairs_with(topo, 0) == V100_SYS
    assert {topo.matrix[pair] for pair in V100_SYS} == {"SYS"}
    # in a mesh (unlike NVSwitch) NV# per peer sums to the GPU's link count: V100 has 6, as nvlink -s shows
    per_gpu = {g: sum(n for pair, n in topo.nvlink_pairs().items() if g in pair) for g in range(8)}
    assert set(per_gpu.values()) == {6}
    assert topo.nic_names == {"NIC0": "mlx5_2"} and topo.nic_device("NIC0") == "mlx5_2"
    assert topo.numa_affinity == {g: "0" if g < 4 else "1" for g in range(8)}


def test_topo_pcie_only_has_no_nvlink():
    topo = parse_topo(fixture("nvidia-smi-topo-m_8GPU_PCIe-only_NODE-SYS_noNVLink.txt"))
    assert pairs_with(topo, 0) == set(topo.nvlink_pairs()) and len(topo.nvlink_pairs()) == 28
    assert topo.matrix[(0, 3)] == "NODE" and topo.matrix[(0, 4)] == "SYS"
    assert topo.nics == [] and topo.nic_names == {}
    assert topo.cpu_affinity[4] == "64-127,192-255" and topo.numa_affinity[4] == "1"


def test_topo_rtx5090_phb_and_the_blank_cell_before_gpu_numa_id():
    # rows end "0-63<TAB>0<TAB><TAB>N/A": one more cell than the header has columns
    topo = parse_topo(fixture("nvidia-smi-topo-m_2xRTX5090_PHB.txt"))
    assert topo.matrix == {(0, 0): "X", (0, 1): "PHB", (1, 0): "PHB", (1, 1): "X"}
    assert topo.nvlink_pairs() == {(0, 1): 0}
    assert topo.cpu_affinity == {0: "0-63", 1: "0-63"} and topo.numa_affinity == {0: "0", 1: "0"}


def test_topo_4xa100_with_one_roce_nic():
    topo = parse_topo(fixture("nvidia-smi-topo-m_4xA100-SXM4-80GB_NV12_1NIC-rocep.txt"))
    assert pairs_with(topo, 12) == {(i, j) for i in range(4) for j in range(i + 1, 4)}
    assert topo.nics == ["NIC0"] and topo.nic_names == {"NIC0": "rocep49s0"}
    assert {topo.nic_matrix[(g, "NIC0")] for g in range(4)} == {"SYS"}
    assert topo.cpu_affinity[3] == "32-63,96-127" and topo.numa_affinity[3] == "1"


def test_topo_hgx_h100_nv18_nic_rows_without_trailing_tabs():
    topo = parse_topo(fixture("nvidia-smi-topo-m_HGX-H200-or-H100_8GPU_NV18_12xmlx5_full.txt"))
    assert set(topo.nvlink_pairs().values()) == {18}
    assert len(topo.nics) == 12 and topo.nic_device("NIC11") == "mlx5_11"
    assert topo.nic_matrix[(7, "NIC11")] == "PXB"


def test_topo_truncated_dgx_h100_keeps_the_rows_it_has():
    topo = parse_topo(fixture("nvidia-smi-topo-m_DGX-H100_8xH100_12NIC_TRUNCATED.txt"))
    assert topo.truncated
    assert any("NIC6, NIC7, NIC8, NIC9, NIC10, NIC11" in p for p in topo.problems)
    assert any("NIC Legend" in p for p in topo.problems)  # the legend was cut off too
    assert set(topo.nvlink_pairs().values()) == {18} and len(topo.nvlink_pairs()) == 28
    assert len(topo.nics) == 12 and topo.nic_names == {}
    assert topo.nic_matrix[(0, "NIC0")] == "PXB" and topo.cpu_affinity[7] == "56-111,168-223"


OLD_DRIVER_SPACES = """\
        GPU0    GPU1    GPU2    GPU3    mlx5_0  mlx5_1  CPU Affinity    NUMA Affinity
GPU0     X      PIX     NODE    NODE    SYS     SYS     0-17,36-53      0
GPU1    PIX      X      NODE    NODE    SYS     SYS     0-17,36-53      0
GPU2    NODE    NODE     X      PIX     SYS     SYS     0-17,36-53      0
GPU3    NODE    NODE    PIX      X      SYS     SYS     0-17,36-53      0
mlx5_0  SYS     SYS     SYS     SYS      X      PIX
mlx5_1  SYS     SYS     SYS     SYS     PIX      X

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_topo_old_driver_mlx5_columns_copied_with_spaces():
    # Layout of a driver-470 capture pasted from a terminal: mlx5_N columns, no NIC legend, tabs turned to spaces.
    topo = parse_topo(OLD_DRIVER_SPACES)
    assert topo.problems == [] and not topo.truncated
    assert topo.nics == ["mlx5_0", "mlx5_1"] and topo.nic_device("mlx5_1") == "mlx5_1"
    assert topo.matrix[(0, 1)] == "PIX" and topo.nic_matrix[(3, "mlx5_0")] == "SYS"
    assert topo.cpu_affinity[2] == "0-17,36-53" and topo.numa_affinity[2] == "0"


def test_topo_blank_cpu_affinity_cell_is_not_shifted():
    # seen on an H100 host (driver 545): CPU Affinity printed blank, NUMA Affinity in its own cell
    text = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV18\t\t0\t\tN/A\nGPU1\tNV18\t X \t1\t1\t\tN/A\n")
    topo = parse_topo(text)
    assert topo.problems == []
    assert topo.cpu_affinity == {1: "1"} and topo.numa_affinity == {0: "0", 1: "1"}


def test_topo_row_cut_mid_line_is_truncated():
    text = fixture("nvidia-smi-topo-m_8xA100-SXM4_NVSwitch_10xmlx5_NV12-PXB-SYS.txt")
    cut = text[:text.index("GPU3\tNV12\tNV12") + 14]
    topo = parse_topo(cut)
    assert topo.truncated
    assert any("row GPU3 has 2 of 18 cells" in p for p in topo.problems)
    assert topo.matrix[(3, 1)] == "NV12" and (3, 2) not in topo.matrix and (2, 3) in topo.matrix


@pytest.mark.parametrize("text, expect", [
    ("", "empty output"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "no topo header"),
    ("GPU0\t X \tNV12\n", "no topo header"),
])
def test_topo_without_a_header(text, expect):
    topo = parse_topo(text)
    assert topo.gpus == [] and topo.matrix == {} and expect in topo.problems[0]


def test_topo_ansi_bold_header_of_old_drivers():
    topo = parse_topo("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\x1b[0m\nGPU0\t X \tNV2\t0-9\nGPU1\tNV2\t X \t0-9\n")
    assert topo.problems == [] and topo.nvlink_pairs() == {(0, 1): 2}


def test_topo_asymmetric_matrix_is_a_problem():
    topo = parse_topo("\tGPU0\tGPU1\nGPU0\t X \tNV12\nGPU1\tNV11\t X \n")
    assert any("GPU0->GPU1 is NV12 but GPU1->GPU0 is NV11" in p for p in topo.problems)


@pytest.mark.parametrize("token, count", [("NV12", 12), ("NV1", 1), ("NV18", 18), (" NV2 ", 2), ("SYS", 0),
                                          ("X", 0), ("PIX", 0), ("NV", 0), ("nv4", 0), ("", 0), (None, 0)])
def test_nvlink_count(token, count):
    assert nvlink_count(token) == count


def _same_topology(a: Topology, b: Topology) -> bool:
    return dataclasses.replace(a, problems=[]) == dataclasses.replace(b, problems=[])


@pytest.mark.parametrize("name", TOPO)
def test_topo_same_result_with_crlf_or_spaces_for_tabs(name):
    text = fixture(name)
    reference = parse_topo(text)
    assert parse_topo(text.replace("\n", "\r\n")) == reference
    assert _same_topology(parse_topo(text.replace("\t", "    ")), reference)


# --------------------------------------------------------------------------------------------------
# nvlink -s


@pytest.mark.parametrize("name, gpus, links, speed, model", [
    ("nvidia-smi-nvlink-s_4xA100-SXM4-80GB_12links.txt", 4, 12, 25.0, "NVIDIA A100-SXM4-80GB"),
    ("nvidia-smi-nvlink-s_8xV100-SXM2-32GB_6links.txt", 8, 6, 25.781, "Tesla V100-SXM2-32GB"),
])
def test_nvlink_fixtures(name, gpus, links, speed, model):
    status = parse_nvlink_status(fixture(name))
    assert status.problems == []
    assert sorted(status.gpus) == list(range(gpus))
    for gpu in status.gpus.values():
        assert gpu.name == model and gpu.uuid and gpu.uuid.startswith("GPU-")
        assert [link.id for link in gpu.links] == list(range(links))
        assert {link.speed_gbps for link in gpu.links} == {speed} and gpu.active_links == links
    assert status.gpus[0].uuid == ("GPU-e04968e9-3302-841c-b00f-f388d7a8f56f" if gpus == 4
                                   else "GPU-2b5fbbe0-802e-d2fd-c501-69ec52b11bb7")


def test_nvlink_snipped_h100_keeps_the_links_shown_and_names_the_snips():
    status = parse_nvlink_status(fixture("nvidia-smi-nvlink-status_8xH100_18links_SNIPPED.txt"))
    assert sorted(status.gpus) == list(range(8))
    for gpu in status.gpus.values():
        assert gpu.name == "NVIDIA H100 80GB HBM3"
        assert [(link.id, link.speed_gbps, link.active) for link in gpu.links] == [
            (0, 26.562, True), (1, 26.562, True), (17, 26.562, True)]
    assert len(status.problems) == 8 and all("<snip>" in p for p in status.problems)


def test_nvlink_inactive_and_unknown_links():
    text = ("GPU 0: NVIDIA H100 PCIe (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"
            "\t Link 2: N/A\n\t Link 3: 25 GB/s\nGPU 1: NVIDIA A10G (UUID: GPU-2)\n")
    status = parse_nvlink_status(text)
    links = status.gpus[0].links
    assert [(link.id, link.speed_gbps, link.active) for link in links] == [
        (0, 26.562, True), (1, None, False), (2, None, False), (3, 25.0, True)]
    assert status.gpus[0].active_links == 2
    assert status.gpus[1].links == [] and status.gpus[1].name == "NVIDIA A10G"  # PCIe-only GPU: no link lines
    assert len(status.problems) == 1 and "link 2" in status.problems[0]


@pytest.mark.parametrize("text, expect", [
    ("", "empty output"),
    ("\t Link 0: 25 GB/s\n", "link line before any GPU line"),
    ("NVML: Unable to retrieve NVLink information as all links are inActive", "no 'GPU n: name"),
])
def test_nvlink_nothing_to_read(text, expect):
    status = parse_nvlink_status(text)
    assert status.gpus == {} and any(expect in p for p in status.problems)


def test_nvlink_repeated_lines():
    status = parse_nvlink_status("GPU 0: A (UUID: GPU-1)\n Link 0: 25 GB/s\n Link 0: <inactive>\nGPU 0: A (UUID: GPU-1)\n")
    assert status.gpus[0].links[0].active and len(status.problems) == 2


# --------------------------------------------------------------------------------------------------
# --query-gpu CSV


def test_query_gpu_fixture():
    query = parse_query_gpu(fixture("nvidia-smi-query-gpu_index-name-memtotal-cc-driver_4xA100.csv"))
    assert query.problems == []
    assert query.fields == ["index", "name", "memory.total", "compute_cap", "driver_version"]
    assert query.units == {"memory.total": "MiB"}
    assert [row.index for row in query.rows] == [0, 1, 2, 3]
    row = query.rows[3]
    assert (row.name, row.memory_total_mib, row.driver_version) == ("NVIDIA A100-SXM4-80GB", 81920, "580.105.08")
    assert row.get("compute_cap") == "8.0" and row.get("memory.total [MiB]") == "81920 MiB"
    assert row.raw["memory.total"] == "81920 MiB"


CHECK_QUERY = """\
index, name, memory.total [MiB], driver_version, pcie.link.gen.current, pcie.link.gen.max, \
pcie.link.width.current, pcie.link.width.max, clocks_event_reasons.active, \
ecc.errors.uncorrected.volatile.total, ecc.errors.uncorrected.aggregate.total
0, NVIDIA H100 80GB HBM3, 81559, 550.90.07, 5, 5, 16, 16, 0x0000000000000001, 0, 0
1, NVIDIA H100 80GB HBM3, 81559, 550.90.07, 1, 5, 8, 16, 0x0000000000000048, [N/A], N/A
2, NVIDIA H100 80GB HBM3, 81559, 550.90.07, 5, 5, 16, 16, [Not Supported], 2, [Unknown Error]
"""


def test_query_gpu_nounits_na_values_and_the_renamed_throttle_field():
    # the fields `trainready check` asks for; drivers >= 535 print clocks_throttle_reasons.* as clocks_event_reasons.*
    query = parse_query_gpu(CHECK_QUERY)
    assert query.problems == [] and len(query.rows) == 3
    first, second, third = query.rows
    assert first.memory_total_mib == 81559 and query.units["memory.total"] == "MiB"
    assert second.get("clocks_throttle_reasons.active") == "0x0000000000000048"
    assert second.get("clocks_event_reasons.active") == "0x0000000000000048"
    assert second.get("pcie.link.width.current") == "8" and second.get("PCIE.LINK.GEN.CURRENT") == "1"
    assert second.get("ecc.errors.uncorrected.volatile.total") is None
    assert second.raw["ecc.errors.uncorrected.volatile.total"] == "[N/A]"
    assert second.get("ecc.errors.uncorrected.aggregate.total") is None
    assert third.get("clocks_throttle_reasons.active") is None and third.raw["clocks_event_reasons.active"] == "[Not Supported]"
    assert third.get("ecc.errors.uncorrected.aggregate.total") is None and third.get("no.such.field") is None


def test_query_gpu_old_field_name_found_under_the_new_one_too():
    row = parse_query_gpu("index, clocks_throttle_reasons.active\n0, 0x0000000000000004\n").rows[0]
    assert row.get("clocks_event_reasons.active") == "0x0000000000000004"


@pytest.mark.parametrize("text, expect", [
    ("", "empty output"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
     "driver is installed and running.\n", "not a --query-gpu CSV header"),
    ("No devices were found\n", "not a --query-gpu CSV header"),
])
def test_query_gpu_error_output(text, expect):
    query = parse_query_gpu(text)
    assert query.rows == [] and expect in query.problems[0]
    assert len(query.problems[0]) < 200  # the quote is trimmed


def test_query_gpu_short_row_and_odd_values():
    query = parse_query_gpu("index, name, memory.total [MiB]\n0, NVIDIA A10G\n1, NVIDIA A10G, 22.5 GiB\n2, X, lots\n")
    assert len(query.problems) == 1 and "2 cells for 3 header fields" in query.problems[0]
    assert query.rows[0].memory_total_mib is None and query.rows[0].name == "NVIDIA A10G"
    assert query.rows[1].memory_total_mib == 23040
    assert query.rows[2].memory_total_mib is None


# --------------------------------------------------------------------------------------------------
# -q


def test_smi_q_a100_535_healthy():
    report = parse_smi_q(fixture("nvidia-smi-q_8xA100_535.txt"))
    assert report.problems == []
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == ("535.183.01", "12.2", 8)
    assert [g.bus_id for g in report.gpus][:2] == ["00000000:10:1C.0", "00000000:10:1D.0"]
    assert [g.index for g in report.gpus] == list(range(8))
    for gpu in report.gpus:
        assert gpu.product_name == "NVIDIA A100-SXM4-40GB" and gpu.ecc_mode == "Enabled"
        assert gpu.ecc == nvsmi.EccCounts(0, 0, 0, 0)
        assert gpu.retired_pages == nvsmi.RetiredPages()  # N/A on Ampere: rows are remapped instead
        assert gpu.remapped_rows == nvsmi.RemappedRows(0, 0, False, False)
        assert gpu.clock_reasons["Idle"] and gpu.active_clock_reasons == []
        assert gpu.pcie == nvsmi.PcieLink(gen_max=4, gen_current=4, gen_host_max=4, width_max=16, width_current=16)
        assert gpu.fields["Remapped Rows/Bank Remap Availability Histogram/Max"] == "640 bank(s)"


def test_smi_q_h100_550_faults():
    report = parse_smi_q(fixture("nvidia-smi-q_H100_550.txt"))
    assert report.problems == []
    assert (report.driver_version, report.cuda_version, len(report.gpus)) == ("550.90.07", "12.4", 8)
    ecc_gpu, throttled, narrow = report.gpus[2], report.gpus[5], report.gpus[6]
    # 550 splits SRAM Uncorrectable into Parity and SEC-DED; the sums cover both and DRAM
    assert ecc_gpu.ecc == nvsmi.EccCounts(volatile_correctable=3, volatile_uncorrectable=2,
                                          aggregate_correctable=14, aggregate_uncorrectable=2)
    assert ecc_gpu.remapped_rows == nvsmi.RemappedRows(correctable=0, uncorrectable=2, pending=True, failure_occurred=False)
    assert throttled.active_clock_reasons == ["HW Slowdown", "HW Power Brake Slowdown"]
    assert throttled.clock_reasons["Idle"] is False
    assert (narrow.pcie.width_current, narrow.pcie.width_max, narrow.pcie.gen_current) == (8, 16, 5)
    healthy = [g for g in report.gpus if g.index not in (2, 5, 6)]
    assert all(g.ecc == nvsmi.EccCounts(0, 0, 0, 0) and not g.active_clock_reasons for g in healthy)
    assert all(g.fields["Fabric/State"] == "Completed" and g.fields["Fabric/Status"] == "Success" for g in report.gpus)


def test_smi_q_v100_470_old_layout():
    report = parse_smi_q(fixture("nvidia-smi-q_4xV100_470.txt"))
    assert report.problems == [] and report.driver_version == "470.182.03" and len(report.gpus) == 4
    thermal, sbe, _, dbe = report.gpus
    assert thermal.active_clock_reasons == ["SW Thermal Slowdown"]  # section still "Clocks Throttle Reasons"
    assert sbe.ecc.aggregate_correctable == 3 and sbe.retired_pages == nvsmi.RetiredPages(1, 0, False)
    assert dbe.ecc == nvsmi.EccCounts(volatile_correctable=0, volatile_uncorrectable=1, aggregate_correctable=0,
                                      aggregate_uncorrectable=1)
    assert dbe.retired_pages == nvsmi.RetiredPages(single_bit=0, double_bit=1, pending=True)
    assert all(g.remapped_rows == nvsmi.RemappedRows() for g in report.gpus)  # "Remapped Rows : N/A" on Volta
    assert all(g.ecc_mode == "Enabled" for g in report.gpus)  # spelled "Ecc Mode" by this driver
    assert thermal.pcie == nvsmi.PcieLink(gen_max=3, gen_current=3, width_max=16, width_current=16)


Q_384 = """\
==============NVSMI LOG==============

Timestamp                           : Sun Mar 11 00:01:39 2018
Driver Version                      : 384.111

Attached GPUs                       : 1
GPU 00000000:01:00.0
    Product Name                    : Tesla P100-PCIE-16GB
    Clocks Throttle Reasons
        Idle                        : Not Active
        Applications Clocks Setting : Active
        SW Power Cap                : Active
    ECC Errors
        Volatile
            Single Bit
                Device Memory       : 2
                Register File       : 1
            Double Bit
                Device Memory       : N/A
    Retired Pages
        Single Bit ECC              : 2
        Double Bit ECC              : 0
        Pending                     : Yes
"""


def test_smi_q_old_driver_without_cuda_version_or_totals():
    report = parse_smi_q(Q_384)
    assert report.problems == [] and report.cuda_version is None and report.driver_version == "384.111"
    gpu = report.gpus[0]
    assert gpu.active_clock_reasons == ["SW Power Cap"]  # Applications Clocks Setting is not a slowdown
    assert gpu.ecc.volatile_correctable == 3 and gpu.ecc.volatile_uncorrectable is None  # no Total: summed
    assert gpu.retired_pages.pending is True


def test_smi_q_event_reason_counters_are_not_reasons():
    text = ("GPU 00000000:07:00.0\n    Clocks Event Reasons\n        SW Thermal Slowdown : Not Active\n"
            "    Clocks Event Reasons Counters\n        SW Thermal Slowdown : 123456 us\n        Sync Boost : 0 us\n")
    gpu = parse_smi_q(text).gpus[0]
    assert gpu.clock_reasons == {"SW Thermal Slowdown": False} and gpu.active_clock_reasons == []


def test_smi_q_cut_short_and_odd_values():
    text = fixture("nvidia-smi-q_8xA100_535.txt")
    cut = text[:text.index("GPU 00000000:20:1C.0")]
    report = parse_smi_q(re.sub(r"(Uncorrectable Error +: )0", r"\1lots", cut, count=1))
    assert len(report.gpus) == 2
    assert any("2 GPU sections for 8 attached GPUs" in p for p in report.problems)
    assert any("expected a count" in p and "lots" in p for p in report.problems)
    assert report.gpus[0].remapped_rows.uncorrectable is None and report.gpus[1].remapped_rows.uncorrectable == 0


@pytest.mark.parametrize("text, expect", [
    ("", "empty output"),
    ("No devices were found\n", "no 'GPU 00000000:07:00.0' section"),
])
def test_smi_q_no_gpu(text, expect):
    report = parse_smi_q(text)
    assert report.gpus == [] and expect in report.problems[0]


# --------------------------------------------------------------------------------------------------
# Never raise, always the declared type


def conforms(value: object, hint: object) -> bool:
    """Deep isinstance against a (resolved) type hint: dataclasses, list/dict/tuple, unions, None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
    if origin is tuple:
        return isinstance(value, tuple) and len(value) == len(args) and all(map(conforms, value, args))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return isinstance(value, hint) and all(conforms(getattr(value, f.name), hints[f.name])
                                               for f in dataclasses.fields(hint))
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)  # type: ignore[arg-type]


PARSERS = {
    "topo": (parse_topo, Topology, TOPO),
    "nvlink": (parse_nvlink_status, NvlinkStatus, NVLINK),
    "query": (parse_query_gpu, QueryGpu, QUERY),
    "smi_q": (parse_smi_q, SmiQ, SMI_Q),
}
ALL_TEXTS = [fixture(n) for n in TOPO + NVLINK + QUERY + SMI_Q]
OWN_TEXTS = {kind: [fixture(n) for n in files] for kind, (_, _, files) in PARSERS.items()}


def check_result(kind: str, text: str) -> None:
    parse, declared, _ = PARSERS[kind]
    result = parse(text)
    assert conforms(result, declared), result
    no_internal_error(result.problems)
    assert len(result.problems) <= nvsmi.MAX_PROBLEMS
    if kind == "topo":
        assert conforms(result.nvlink_pairs(), dict[tuple[int, int], int])
    elif kind == "query":
        for row in result.rows:
            assert conforms((row.index, row.memory_total_mib), tuple[int | None, int | None])
    elif kind == "nvlink":
        assert all(isinstance(gpu.active_links, int) for gpu in result.gpus.values())


@pytest.mark.parametrize("kind", PARSERS)
def test_every_parser_takes_every_fixture(kind):
    for text in ALL_TEXTS:  # other tools' output fed in by mistake must not crash a parser either
        check_result(kind, text)


# Characters the formats are made of, so generated text reaches past the first "not a header" line.
FORMAT_ALPHABET = st.sampled_from(list("GPUNICXSYDEHBLV0123456789 \t\n\r:,.-<>[]()/=xkinactveMiBs") +
                                  ["GPU0", "GPU1", "NV12", "Link 0: ", "GB/s", "<inactive>", "CPU Affinity", "N/A",
                                   "[N/A]", "    ", "        ", " : ", "Total", "Double Bit", "ECC Errors", "Volatile",
                                   "GPU 00000000:07:00.0\n", "Remapped Rows", "Clocks Event Reasons", "Active", "index, "])


@pytest.mark.parametrize("kind", PARSERS)
@settings(deadline=None)
@given(text=st.one_of(st.text(), st.lists(FORMAT_ALPHABET, max_size=200).map("".join)))
def test_arbitrary_text_never_raises(kind, text):
    check_result(kind, text)


@st.composite
def mangled(draw: st.DrawFn, texts: list[str]) -> str:
    """A fixture with lines deleted or repeated, cut at a random byte, characters replaced, tabs<->spaces, CRLF."""
    text = draw(st.sampled_from(texts))
    for op in draw(st.lists(st.sampled_from(["delete", "repeat", "cut", "replace", "tabs", "spaces", "crlf"]),
                            min_size=1, max_size=4)):
        lines = text.splitlines(keepends=True)
        if op in ("delete", "repeat") and lines:
            k = draw(st.integers(0, len(lines) - 1))
            lines[k:k + 1] = [] if op == "delete" else [lines[k], lines[k]]
            text = "".join(lines)
        elif op == "cut":
            text = text[:draw(st.integers(0, len(text)))]
        elif op == "replace" and text:
            for _ in range(draw(st.integers(1, 5))):
                k = draw(st.integers(0, len(text) - 1))
                text = text[:k] + draw(st.characters()) + text[k + 1:]
        elif op == "tabs":
            text = text.replace("\t", " " * draw(st.integers(1, 8)))
        elif op == "spaces":
            text = re.sub(r" {2,}", "\t", text)
        elif op == "crlf":
            text = text.replace("\n", "\r\n")
    return text


@pytest.mark.parametrize("kind", PARSERS)
@settings(deadline=None)
@given(data=st.data())
def test_mangled_fixtures_never_raise(kind, data):
    check_result(kind, data.draw(mangled(OWN_TEXTS[kind])))
