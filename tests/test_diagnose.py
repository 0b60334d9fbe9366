"""`trainready diagnose`: every rule against real captured logs (tests/fixtures/run/logs, sources in its
README.md), healthy logs that must give nothing, directories, the JSON report, exit codes, rendering,
the out-of-memory estimate for a job, and arbitrary input that must never raise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cloud_stubs import cli_run
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from trainready.cli import diagnose_cmd
from trainready.cli.main import app
from trainready.errors import UsageError
from trainready.io import redact
from trainready.plan.job import JobSpec
from trainready.run.diagnose import EVIDENCE_CHARS, MAX_EVIDENCE, DiagnosisReport, diagnose_files, diagnose_text

LOGS = Path(__file__).parent / "fixtures" / "run" / "logs"
REFERENCE = Path("/work/shared/reference/fixtures")
HEADER_KEYS = ("# SOURCE:", "# WHAT:", "# SYNTHETIC:", "# COMMAND:")


def found(name: str, job: JobSpec | None = None) -> dict:
    report = diagnose_files([LOGS / name], job=job)
    return {d.id: d for d in report.diagnoses}


EXPECTED = {
    "nccl_watchdog_timeout.log": {"nccl.watchdog-timeout"},
    "nccl_watchdog_timeout_desync.log": {"nccl.watchdog-timeout"},
    "nccl_watchdog_timeout_old.log": {"nccl.watchdog-timeout"},
    "nccl_socket_fallback_ec2.log": {"nccl.socket-fallback", "efa.ofi-init-failed"},
    "nccl_socket_fallback_ddp.log": {"nccl.socket-fallback", "efa.ofi-init-failed"},
    "efa_ofi_init_failed.log": {"efa.ofi-init-failed", "nccl.socket-fallback"},
    "efa_ofi_no_provider.log": {"efa.ofi-init-failed"},
    "nccl_shm_system_error.log": {"nccl.unhandled-system-error"},
    "nccl_shm_warn.log": {"nccl.unhandled-system-error"},
    "nccl_system_error_connect.log": {"nccl.unhandled-system-error"},
    "nccl_connect_refused_warn.log": {"nccl.unhandled-system-error"},
    "cuda_oom.log": {"cuda.oom"},
    "cuda_oom_fragmented.log": {"cuda.oom"},
    "cuda_oom_old_format.log": {"cuda.oom"},
    "cuda_oom_old_mib.log": {"cuda.oom"},
    "torchrun_sigkill.log": {"host.oom-killed"},
    "torchrun_sigkill_peer_sigterm.log": {"host.oom-killed"},
    "kernel_oom_killer.log": {"host.oom-killed"},
    "rdzv_port_in_use.log": {"rdzv.port-in-use"},
    "rdzv_port_in_use_old.log": {"rdzv.port-in-use"},
    "rdzv_unreachable.log": {"rdzv.unreachable"},
    "rdzv_unreachable_old.log": {"rdzv.unreachable"},
    "rdzv_timeout.log": {"rdzv.timeout"},
    "world_size_mismatch": {"dist.world-size-mismatch", "rdzv.timeout"},
    "nccl_invalid_rank.log": {"dist.world-size-mismatch"},
    "nccl_rank_checked_in_twice.log": {"dist.world-size-mismatch"},
    "nan_loss_pretrain.log": {"train.nan-loss"},
    "nan_loss_hf_trainer.log": {"train.nan-loss"},
    "nan_loss_telemetry.jsonl": {"train.nan-loss"},
    "nan_loss_json_nan.jsonl": {"train.nan-loss"},
    "torchrun_logdir": {"torchrun.child-failed"},
    "healthy_training.log": set(),
    "healthy_nccl_efa.log": set(),
    "healthy_nccl_tests_p5.log": set(),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fixture_gives_exactly_its_diagnoses(name):
    assert set(found(name)) == EXPECTED[name]


def documented_rules() -> dict[str, set[str]]:
    """docs/diagnose.md's rule table: rule id -> the names in its details column."""
    table = (Path(__file__).parents[1] / "docs" / "diagnose.md").read_text().split("## Rules", 1)[1].split("###", 1)[0]
    rows = [row.split(" | ") for row in table.splitlines() if row.startswith("| `")]
    return {row[0].strip("| `"): set(re.findall(r"`([a-z_]+)`", row[-1])) for row in rows}


def test_every_documented_rule_has_a_fixture_and_no_rule_is_undocumented():
    fired = set().union(*EXPECTED.values())
    assert fired == set(documented_rules())


@pytest.mark.parametrize("name", sorted(n for n, ids in EXPECTED.items() if ids))
def test_details_keys_are_documented(name):
    rules = documented_rules()
    for d in found(name).values():
        assert set(d.details) <= rules[d.id], f"{d.id}: document {sorted(set(d.details) - rules[d.id])} in docs/diagnose.md"


def test_every_fixture_is_covered_and_documented():
    readme = (LOGS / "README.md").read_text()
    for path in LOGS.iterdir():
        if path.name != "README.md":
            assert path.name in EXPECTED, f"{path.name}: add it to EXPECTED"
            assert path.name in readme, f"{path.name}: list it in README.md"


def test_fixture_headers_name_a_source_and_trigger_nothing():
    for path in LOGS.rglob("*"):
        if path.suffix not in (".log", ".jsonl"):
            continue
        lines = path.read_text().splitlines()
        assert lines[0].startswith(("# SOURCE:", "# SYNTHETIC:")), path
        header = "\n".join(line for line in lines if line.startswith(HEADER_KEYS))
        assert diagnose_text(header) == [], f"{path}: its header lines match a rule"


# ------------------------------------------------------------------------ NCCL watchdog

def test_watchdog_timeout_details():
    d = found("nccl_watchdog_timeout.log")["nccl.watchdog-timeout"]
    assert d.severity == "error" and d.count == 3
    assert d.details["rank"] == 1 and d.details["ranks"] == "0,1,2"
    assert (d.details["collective"], d.details["seq"], d.details["timeout_ms"]) == ("ALLREDUCE", 808, 600000)
    assert d.details["lagging_rank"] is None and "missing from this list" in d.explanation
    assert any("TORCH_NCCL_TRACE_BUFFER_SIZE" in f for f in d.fixes)
    assert any("NCCL_DEBUG=INFO" in f for f in d.fixes)
    assert any("checkpoint" in f and "timeout" in f for f in d.fixes)


def test_watchdog_names_the_rank_that_is_behind():
    d = found("nccl_watchdog_timeout_desync.log")["nccl.watchdog-timeout"]
    assert d.details["lagging_rank"] == "7" and d.details["timeout_ms"] == 1800000
    assert "Rank 7" in d.explanation and "64088" in d.explanation
    assert d.fixes[0].startswith("Read the log of rank 7")
    old = found("nccl_watchdog_timeout_old.log")["nccl.watchdog-timeout"]
    assert old.details["ranks"] == "1,2,3,6,7" and old.details["seq"] == 469508


def test_watchdog_missing_rank_and_never_enqueued():
    nranks = "\n".join(f"h:1:2 [{r}] NCCL INFO comm 0x1 rank {r} nranks 4 cudaDev {r} - Init COMPLETE" for r in range(4))
    timeouts = "\n".join(f"[rank{r}]:[E1 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
                         f"timeout: WorkNCCL(SeqNum=42, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=60000) "
                         "ran for 60010 milliseconds before timing out." for r in (0, 1, 3))
    (d,) = diagnose_text(nranks + "\n" + timeouts)
    assert d.details["lagging_rank"] == "2" and d.details["world_size"] == 4
    enqueued = "[rank2]:[E1] [PG ID 0 PG GUID 0(default_pg) Rank 2] Timeout at NCCL work: 40, last enqueued NCCL work: 41"
    (d,) = diagnose_text(timeouts + "\n" + enqueued)
    assert d.details["lagging_rank"] == "2" and "never enqueued" in d.explanation
    other_group = "[rank0]:[E1] [PG ID 3 PG GUID 5 Rank 0] Timeout at NCCL work: 7, last enqueued NCCL work: 7"
    (d,) = diagnose_text(timeouts + "\n" + enqueued + "\n" + other_group)
    assert d.details["lagging_rank"] is None  # two process groups: their SeqNums do not compare


# ----------------------------------------------------------------- network / EFA / sockets

def test_socket_fallback_on_ec2():
    d = found("nccl_socket_fallback_ec2.log")
    fallback, ofi = d["nccl.socket-fallback"], d["efa.ofi-init-failed"]
    assert fallback.severity == "warning" and fallback.details["interface"] == "ens3"
    assert fallback.count == 7 and len(fallback.evidence) == MAX_EVIDENCE
    assert ofi.severity == "warning" and "libnccl-net.so" in ofi.explanation  # only "plugin not found" lines
    fixes = " ".join(fallback.fixes)
    assert "aws-ofi-nccl" in fixes and "FI_PROVIDER=efa" in fixes and "fi_info -p efa" in fixes
    assert "security group" in fixes and "itself" in fixes and "trainready check" in fixes
    assert "47780" not in fixes and "4778" not in json.dumps([x.model_dump() for x in d.values()])


def test_ofi_init_failure_and_the_fallback_it_causes():
    d = found("efa_ofi_init_failed.log")
    ofi = d["efa.ofi-init-failed"]
    assert ofi.severity == "error" and ofi.details["fell_back_to_socket"] == "yes"
    assert "empty list" in ofi.details["reason"] and "EFA device is not visible" in ofi.explanation
    assert "ncclCollNetPlugin" not in " ".join(e.text for e in ofi.evidence)  # harmless plugin INFO lines
    fixes = " ".join(ofi.fixes)
    assert "/opt/amazon/ofi-nccl/lib" in fixes and "/opt/aws-ofi-nccl/lib" in fixes and "FI_EFA_USE_DEVICE_RDMA=1" in fixes
    assert d["nccl.socket-fallback"].details["interface"] == "eth0"
    no_provider = found("efa_ofi_no_provider.log")["efa.ofi-init-failed"]
    assert no_provider.details["reason"] == "Couldn't find any optimal provider"


def test_socket_rules_stay_quiet_when_they_should():
    base = "h:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\nh:1:1 [0] NCCL INFO Using network Socket\n"
    assert {d.id for d in diagnose_text(base)} == {"nccl.socket-fallback"}
    single_node = base + "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0"
    assert diagnose_text(single_node) == []  # nothing leaves the node, sockets cost nothing
    old_single_node = base + "h:1:2 [0] NCCL INFO Channel 00 : 0[101c0] -> 1[101d0] via P2P/IPC/read"
    assert diagnose_text(old_single_node) == []
    with_ofi = base + "h:1:1 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)"
    assert diagnose_text(with_ofi) == []
    ib = "h:1:1 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so)\nh:1:1 [0] NCCL INFO Using network IB"
    assert diagnose_text(ib) == []  # InfiniBand clusters need no plugin
    (tcp,) = diagnose_text("h:1:1 [0] NCCL INFO NET/OFI Selected Provider is tcp (found 1 nics)\n"
                           "h:1:1 [0] NCCL INFO Using network AWS Libfabric")
    assert tcp.id == "nccl.socket-fallback" and tcp.details["provider"] == "tcp"


# ----------------------------------------------------------------- NCCL system error

def test_shm_system_error_quotes_the_last_error():
    d = found("nccl_shm_system_error.log")["nccl.unhandled-system-error"]
    assert d.details["shm"] == "yes" and d.details["shm_segment_mib"] == 7.0
    assert d.details["cause"].startswith("Error while creating shared memory segment /dev/shm/nccl-1YsMbG")
    assert "--shm-size" in d.fixes[0] and "--ipc=host" in d.fixes[0]
    warn = found("nccl_shm_warn.log")["nccl.unhandled-system-error"]
    assert warn.details["shm"] == "yes" and warn.count == 3  # two segments, one failed extension


def test_system_error_from_a_connection_points_at_the_network():
    d = found("nccl_system_error_connect.log")["nccl.unhandled-system-error"]
    assert d.details["cause"] == "socketStartConnect: Connect to 127.0.0.1<45069> failed : Software caused connection abort"
    assert d.details["shm"] == "no" and any("NCCL_SOCKET_IFNAME" in f for f in d.fixes)
    refused = found("nccl_connect_refused_warn.log")["nccl.unhandled-system-error"]
    assert refused.details["cause"] == "Connect to 10.38.10.112<21724> failed : Connection refused"
    assert refused.evidence[0].text.endswith("Connection refused")  # the WARN line is quoted as evidence


# ------------------------------------------------------------------------ CUDA OOM

def test_cuda_oom_numbers_new_format():
    d = found("cuda_oom.log")["cuda.oom"]
    assert {k: d.details[k] for k in ("tried_gib", "gpu", "total_gib", "free_gib", "allocated_gib",
                                      "reserved_unallocated_gib")} == {
        "tried_gib": 2.63, "gpu": 7, "total_gib": 79.11, "free_gib": 2.61, "allocated_gib": 48.15,
        "reserved_unallocated_gib": 3.49}
    assert d.details["ranks"] == "15"
    assert not d.fixes[0].startswith("Set PYTORCH_CUDA_ALLOC_CONF")  # 3.49 of 79 GiB is not fragmentation
    assert any("trainready estimate" in f for f in d.fixes)


def test_cuda_oom_fragmentation_suggests_expandable_segments():
    d = found("cuda_oom_fragmented.log")["cuda.oom"]
    assert d.details["reserved_unallocated_gib"] == 9.35 and d.details["total_gib"] == 31.47
    assert d.fixes[0].startswith("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert "fragmentation" in d.explanation


def test_cuda_oom_old_formats():
    d = found("cuda_oom_old_format.log")["cuda.oom"]
    assert (d.details["tried_gib"], d.details["total_gib"], d.details["allocated_gib"], d.details["free_gib"]) == \
        (16.0, 47.54, 23.76, 6.3)
    assert d.details["reserved_unallocated_gib"] == 15.83  # 39.59 reserved - 23.76 allocated
    (nccl,) = diagnose_text("h:7:7 [3] enqueue.cc:1234 NCCL WARN Cuda failure 'out of memory'")
    assert nccl.id == "cuda.oom" and nccl.details["total_gib"] is None
    mib = found("cuda_oom_old_mib.log")["cuda.oom"]
    assert (mib.details["tried_gib"], mib.details["free_gib"], mib.details["total_gib"]) == (0.12, 0.02, 11.17)


def test_cuda_oom_with_a_job_shows_the_estimate_and_what_fits():
    job = JobSpec(model="llama-2-7b", instance="p4d.24xlarge", strategy="ddp", micro_batch=8, seq_len=4096)
    d = found("cuda_oom.log", job=job)["cuda.oom"]
    assert d.details["estimate_fits"] == "no" and d.details["estimate_capacity_gib"] == 40.0
    assert d.details["estimate_peak_gib"] > 40 and "The plan estimate agrees" in d.explanation
    assert d.details["fits_with"] and "strategy=fsdp" in d.details["fits_with"]
    assert d.fixes[0].startswith("Per the plan estimate these changes fit")
    assert "log's GPU has 79.11 GiB" in d.explanation  # this capture came from an 80 GB GPU, the job has 40 GB


def test_cuda_oom_with_a_job_that_fits_blames_what_the_estimate_does_not_model():
    job = JobSpec(model="gpt3-125m", instance="p4d.24xlarge", strategy="fsdp", micro_batch=1, seq_len=1024)
    d = found("cuda_oom_old_format.log", job=job)["cuda.oom"]
    assert d.details["estimate_fits"] == "yes" and "does not model" in d.explanation


def test_cuda_oom_with_a_job_the_estimate_rejects_says_why():
    job = JobSpec(model="llama-2-7b", instance="p4d.24xlarge", tp=3)
    d = found("cuda_oom.log", job=job)["cuda.oom"]
    assert d.details["estimate_error"] == "--tp 3 must divide the number of attention heads (32)"
    assert "estimate_peak_gib" not in d.details and "estimate_error" in documented_rules()["cuda.oom"]
    assert d.explanation.endswith("could not be estimated, so no plan estimate is shown: "
                                  "--tp 3 must divide the number of attention heads (32).")


# ----------------------------------------------------------------- how workers died

def test_sigkill_in_torchrun_summary_is_host_oom():
    d = found("torchrun_sigkill.log")["host.oom-killed"]
    assert (d.details["rank"], d.details["local_rank"], d.details["pid"]) == (0, 0, 14750)
    assert any("dmesg" in f for f in d.fixes) and any("dataloader" in f for f in d.fixes)


def test_root_cause_not_the_peer_torchrun_stopped():
    ids = found("torchrun_sigkill_peer_sigterm.log")
    d = ids["host.oom-killed"]
    assert (d.details["rank"], d.details["pid"]) == (1, 14113)  # rank 0's SIGTERM was torchrun cleaning up
    assert "torchrun.child-failed" not in ids


def test_kernel_oom_killer_lines():
    d = found("kernel_oom_killer.log")["host.oom-killed"]
    assert d.details["kernel_oom"] == "yes" and d.details["pid"] == 25315 and d.details["anon_rss_gib"] == 30.0
    assert "30 GiB" in d.explanation


def test_child_failed_reads_the_failed_ranks_stderr_in_a_log_dir():
    report = diagnose_files([LOGS / "torchrun_logdir"])
    assert len(report.files) == 5 and any(f.endswith("attempt_0/1/stderr.log") for f in report.files)
    (d,) = report.diagnoses
    assert d.id == "torchrun.child-failed" and d.severity == "warning"
    assert (d.details["rank"], d.details["local_rank"], d.details["exitcode"]) == (1, 1, 1)
    assert d.details["last_error"] == "ValueError: bad batch shape (4, 4097) for seq_len 4096"
    assert "1/stderr.log" in d.explanation


def test_child_failed_gives_way_to_a_specific_error():
    summary = (LOGS / "torchrun_logdir" / "torchrun_console.log").read_text()
    oom = (LOGS / "cuda_oom.log").read_text()
    assert {d.id for d in diagnose_text(summary + "\n" + oom)} == {"cuda.oom"}


# ------------------------------------------------------------------- rendezvous

def test_rendezvous_details():
    assert found("rdzv_port_in_use.log")["rdzv.port-in-use"].details["port"] == 29500
    assert found("rdzv_port_in_use_old.log")["rdzv.port-in-use"].details["port"] == 29500
    assert any("ss -ltnp | grep :29500" in f for f in found("rdzv_port_in_use.log")["rdzv.port-in-use"].fixes)
    assert found("rdzv_unreachable.log")["rdzv.unreachable"].details == {"host": "127.0.0.1", "port": 29613}
    assert found("rdzv_unreachable_old.log")["rdzv.unreachable"].details == {"host": "192.0.0.1", "port": 1234}
    assert found("rdzv_timeout.log")["rdzv.timeout"].evidence[-1].text.endswith("RendezvousTimeoutError")


def test_world_size_mismatch_across_node_logs():
    ids = found("world_size_mismatch")
    mismatch = ids["dist.world-size-mismatch"]
    assert mismatch.details["launch_mismatch"] == "min_nodes 2 vs 3; max_nodes 2 vs 3"
    assert {e.file.rsplit("/", 1)[-1] for e in mismatch.evidence} == {"node0.log", "node1.log"}
    assert ids["rdzv.timeout"].details == {"timeout_s": 11, "joined": 2, "expected": 3}
    assert found("nccl_invalid_rank.log")["dist.world-size-mismatch"].details["invalid_rank"] == "8/8"
    twice = found("nccl_rank_checked_in_twice.log")["dist.world-size-mismatch"]
    assert twice.details == {"duplicate_rank": 1, "world_size": 8}


# ------------------------------------------------------------------------ NaN loss

def test_nan_loss_first_step_and_last_finite_value():
    d = found("nan_loss_pretrain.log")["train.nan-loss"]
    assert d.details == {"first_step": 7000, "kind": "nan", "last_finite_loss": 4.294} and d.count == 5
    assert "step 7000" in d.explanation
    fixes = " ".join(d.fixes)
    assert "checkpoint" in fixes and "clipping" in fixes and "bf16" in fixes and "warmup" in fixes
    hf = found("nan_loss_hf_trainer.log")["train.nan-loss"]
    assert hf.count == 6 and hf.details["last_finite_loss"] == 5.6231


def test_nan_loss_in_json_telemetry():
    ours = found("nan_loss_telemetry.jsonl")["train.nan-loss"]
    assert ours.details == {"first_step": 130, "kind": "nan", "last_finite_loss": 2.902} and ours.count == 2
    plain = found("nan_loss_json_nan.jsonl")["train.nan-loss"]
    assert plain.details["first_step"] == 130 and plain.count == 2
    (inf,) = diagnose_text('{"step": 7, "loss": Infinity}')
    assert inf.details["kind"] == "inf" and inf.details["first_step"] == 7
    (flagged,) = diagnose_text('{"step": 9, "loss": null, "nonfinite": true}')
    assert flagged.details["first_step"] == 9


@pytest.mark.parametrize("line", [
    "best val loss: inf", "loss_scale: inf", "{'loss': 1.5, 'grad_norm': nan}", "nanoGPT loss 2.31",
    "inference loss 0.4", '{"loss": null, "nonfinite": ["grad_norm"]}', "[deepspeed] OVERFLOW! Skipping step. "
    "Attempted loss scale: 65536, reducing to 32768", "eval: loss=5.6120 ppl=273.5",
])
def test_no_nan_false_positives(line):
    assert diagnose_text(line) == []


@pytest.mark.parametrize("line", ["iter 6000: loss nan, time 1234.56ms", "lm loss: nan | loss scale: 1.0",
                                  "Loss is NaN, stopping training", "step 3 train/loss=-inf",
                                  "loss: tensor(nan, device='cuda:0')"])
def test_nan_loss_spellings(line):
    assert [d.id for d in diagnose_text(line)] == ["train.nan-loss"]


# ------------------------------------------------------------------- report shape

def test_errors_first_then_by_position():
    text = ("h:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\nh:1:1 [0] NCCL INFO Using network Socket\n"
            "step 1 loss: nan\nRuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 39.59 GiB total "
            "capacity; 37.00 GiB already allocated; 0.50 GiB free; 38.00 GiB reserved in total by PyTorch)")
    assert [d.id for d in diagnose_text(text)] == ["train.nan-loss", "cuda.oom", "nccl.socket-fallback"]


def test_healthy_reference_outputs_give_no_diagnosis():
    if not REFERENCE.is_dir():
        pytest.skip("shared reference fixtures not present")
    files = sorted(REFERENCE.glob("*.txt"))
    assert any("nccl-tests" in f.name for f in files)
    report = diagnose_files(files)
    assert report.diagnoses == [] and report.summary == f"no known problem found in {len(files)} files"


def test_missing_and_unusable_paths_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="missing.log: no such file"):
        diagnose_files([LOGS / "cuda_oom.log", tmp_path / "missing.log"])
    with pytest.raises(UsageError, match="has no \\*.log, \\*.txt, \\*.jsonl files"):
        diagnose_files([tmp_path])
    with pytest.raises(UsageError, match="no log file given"):
        diagnose_files([])


def test_odd_bytes_and_huge_lines_are_read(tmp_path):
    path = tmp_path / "odd.log"
    path.write_bytes(b"\xff\xfe\x00garbage\r\n" + b"x" * 200_000 + b"\n" + b"\x00" * 10 + b"\nloss: nan\n")
    (d,) = diagnose_files([path]).diagnoses
    assert d.evidence[0].line == 4  # the 200 kB line still counts as one line


# --------------------------------------------------------------------------- CLI

def trainready(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command as a user runs it (through cli.main: its error and JSON-error paths), in this process."""
    return cli_run(*args, columns=300, cwd=cwd)


def test_cli_json_and_exit_codes():
    runner = CliRunner()
    bad = runner.invoke(app, ["diagnose", str(LOGS / "nccl_watchdog_timeout.log"), "--json"])
    assert bad.exit_code == 1, bad.output
    report = DiagnosisReport.model_validate_json(bad.stdout)
    assert report.schema_version == 1 and report.kind == "trainready-diagnose"
    assert json.loads(bad.stdout)["diagnoses"][0]["details"]["collective"] == "ALLREDUCE"
    good = runner.invoke(app, ["diagnose", str(LOGS / "healthy_training.log"), "--json"])
    assert good.exit_code == 0 and DiagnosisReport.model_validate_json(good.stdout).diagnoses == []
    warn_only = runner.invoke(app, ["diagnose", str(LOGS / "torchrun_logdir")])
    assert warn_only.exit_code == 1 and "torchrun: a worker process failed" in warn_only.stdout


def test_cli_missing_file_exits_2_without_traceback(tmp_path):
    proc = trainready("diagnose", str(tmp_path / "nope.log"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"error: cannot read log file {tmp_path / 'nope.log'}: no such file or directory\n"


def test_cli_with_job_file(tmp_path):
    from trainready.plan.job import save_job

    job = tmp_path / "job.toml"
    save_job(JobSpec(model="llama-2-7b", instance="p4d.24xlarge", strategy="ddp", micro_batch=8, seq_len=4096), job)
    result = CliRunner().invoke(app, ["diagnose", str(LOGS / "cuda_oom.log"), "--job", str(job), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["diagnoses"][0]["details"]["estimate_capacity_gib"] == 40.0


BRACKETED = ("[rank0]:[E1 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=42, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=60000) ran for 60010 "
             "milliseconds before timing out. [/x] [bold]x[/bold] :smile: [link=http://a]b[/link]")


def test_brackets_in_log_text_and_file_names_print_as_written(tmp_path):
    logdir = tmp_path / "[bold]r["  # a file name that is also Rich markup: `[bold]r[/x].log`
    logdir.mkdir()
    log = logdir / "x].log"
    log.write_text(BRACKETED + "\n")
    human = trainready("diagnose", str(log))
    assert human.returncode == 1 and human.stderr == ""
    assert f"read: {log}\n" in human.stdout
    assert f"  {log}:1  {BRACKETED[:157]}..." in human.stdout  # the evidence line, cut at 160 characters
    assert "error: NCCL collective timed out: a rank never joined it  [nccl.watchdog-timeout]\n" in human.stdout
    as_json = trainready("diagnose", str(log), "--json")
    assert as_json.returncode == 1 and as_json.stderr == ""
    report = json.loads(as_json.stdout)
    assert report["files"] == [str(log)]
    assert report["diagnoses"][0]["evidence"] == [{"file": str(log), "line": 1, "text": BRACKETED[:EVIDENCE_CHARS]}]


@pytest.mark.parametrize("name", ["[/x].log", "[bold]a.log", "[rank0]:.log"])
def test_missing_file_with_brackets_is_named_as_written(tmp_path, name):
    missing = tmp_path / name
    message = f"cannot read log file {missing}: no such file or directory"
    human = trainready("diagnose", str(missing))
    assert (human.returncode, human.stdout, human.stderr) == (2, "", f"error: {message}\n")
    as_json = trainready("diagnose", str(missing), "--json")
    assert (as_json.returncode, as_json.stderr) == (2, f"error: {message}\n")
    assert json.loads(as_json.stdout) == {"schema_version": 1, "error": {"message": message, "exit_code": 2}}


def test_render_fits_80_columns_without_trailing_spaces():
    console = Console(record=True, width=80, highlight=False, markup=False)
    report = diagnose_files([LOGS / "nccl_socket_fallback_ec2.log", LOGS / "cuda_oom_fragmented.log"])
    diagnose_cmd.render_diagnoses(console, report)
    lines = console.export_text().splitlines()
    assert max(len(x) for x in lines) <= 80 and [x for x in lines if x != x.rstrip()] == []
    assert any(x.startswith("   - Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") for x in lines)
    assert "  [0]ens3:172.31.10.182<0>" in "\n".join(lines)  # a long evidence line continues indented


def test_render_prints_log_text_literally():
    console = Console(record=True, width=200, highlight=False)
    report = diagnose_files([LOGS / "nccl_watchdog_timeout.log", LOGS / "nccl_socket_fallback_ec2.log"])
    diagnose_cmd.render_diagnoses(console, report)
    text = console.export_text()
    assert "error: NCCL collective timed out" in text and "warning: NCCL fell back to TCP sockets" in text
    assert f"{LOGS / 'nccl_watchdog_timeout.log'}:3  [rank1]:[E626" in text  # brackets are not Rich markup
    assert " - Record what every rank was doing" in text and "... and 2 more" in text
    assert text.rstrip().endswith(report.summary)


# ------------------------------------------------------------------- never raises

SNIPPETS = [
    "Root Cause (first observed failure):", "Failures:", "[0]:", "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -9 (pid: 12)", "  host      : x", "  error_file: <N/A>", "=" * 40,
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=", "[Rank 3] Watchdog caught collective operation timeout",
    "last enqueued NCCL work: 9", "nranks 99999999999999999999", "CUDA out of memory. Tried to allocate 1.2.3 GiB",
    "Tried to allocate 5 TiB (GPU 0; 1 GiB total capacity; 2 GiB already allocated; 0 bytes free; 1 GiB cached)",
    "Last error:", "NCCL WARN ", "unhandled system error", "shared memory segment /dev/shm/x (size 99)", "loss: nan",
    '"loss":null,"nonfinite":["loss"]', "Starting elastic_operator with launch configs:", "  min_nodes   : 2",
    "Timed out after 5 seconds waiting for clients. 1/2 clients joined.", "nNodes 1", "via NET/Socket",
    "NET/Socket : Using [0]eth0:1.2.3.4<0>", "NET/OFI Selected Provider is tcp", "NCCL WARN NET/OFI x",
    "Invalid rank requested : 9/8", "rank 1 of 8 ranks has already checked in", "RendezvousClosedError",
    "failed (exitcode: -9) local_rank: 0 (pid: 1)", "Out of memory: Killed process 1 (python) anon-rss:1kB",
    "ValueError: x", "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE", "server socket has failed to bind",
    "client socket has timed out after 1s while trying to connect to (h, 1)", "step 12 ", "(3/4)", "\x00", "\ufffd",
    "9" * 5000, "SeqNum=" + "9" * 5000, "  exitcode  : -" + "9" * 5000 + " (pid: 1)", "Tried to allocate 1e400 GiB",
]
log_lines = st.one_of(st.text(max_size=80), st.sampled_from(SNIPPETS),
                      st.tuples(st.sampled_from(SNIPPETS), st.text(max_size=20), st.sampled_from(SNIPPETS)).map("".join))


RULE_IDS = set().union(*EXPECTED.values())


def check_report_invariants(diagnoses, lines: list[str], source: str) -> None:
    """What holds for any input: known rule ids, evidence that quotes real lines of the input in order."""
    for d in diagnoses:
        assert d.id in RULE_IDS and d.severity in ("error", "warning")
        assert d.count >= len(d.evidence) >= 1 and len(d.evidence) <= MAX_EVIDENCE
        assert [e.line for e in d.evidence] == sorted(e.line for e in d.evidence)
        for e in d.evidence:
            assert e.file == source and 1 <= e.line <= len(lines)
            assert len(e.text) <= EVIDENCE_CHARS
            assert e.text == redact(lines[e.line - 1].strip())[:EVIDENCE_CHARS]  # the line itself
    assert [d.severity for d in diagnoses] == sorted((d.severity for d in diagnoses), key=lambda s: s != "error")


@given(st.lists(log_lines, max_size=40).map("\n".join))
def test_arbitrary_text_gives_well_formed_diagnoses(text):
    check_report_invariants(diagnose_text(text), text.split("\n"), "<text>")


@given(st.binary(max_size=2000))
def test_arbitrary_bytes_in_a_file_give_a_well_formed_report(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "arbitrary.log"
    path.write_bytes(data)
    report = diagnose_files([path])
    assert report.files == [str(path)] and report.summary.endswith(
        "in 1 file" if not report.diagnoses else f"({', '.join(d.id for d in report.diagnoses)})")
    lines = data.decode("utf-8", errors="replace").split("\n")
    check_report_invariants(report.diagnoses, [x.rstrip("\r") for x in lines], str(path))


# --------------------------------------------------------------------------- issue 12, second review

def trainready_in(*args: str, stdin=subprocess.DEVNULL, input: bytes | None = None, pass_fds=()) -> subprocess.CompletedProcess:
    """`trainready ARGS` with the given standard input (bytes out, decoded)."""
    proc = subprocess.run([sys.executable, "-m", "trainready", *args], capture_output=True, timeout=120,
                          stdin=stdin if input is None else None, input=input, pass_fds=pass_fds,
                          env={**os.environ, "COLUMNS": "300", "TRAINREADY_DEBUG": ""})
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def test_a_name_too_long_is_a_usage_error(tmp_path):
    """`diagnose <300-character name>` was an internal error (ENAMETOOLONG from is_dir())."""
    name = str(tmp_path / ("x" * 300))
    proc = trainready_in("diagnose", name)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: cannot read log file {name}: File name too long\n")


def test_logs_can_be_piped_in(tmp_path):
    """`diagnose -`, `diagnose /dev/stdin` and bash's `diagnose <(cmd)` were refused "not a regular file"."""
    oom = (LOGS / "cuda_oom.log").read_bytes()
    piped = trainready_in("diagnose", "-", "--json", input=oom)
    assert piped.returncode == 1, piped.stderr
    report = json.loads(piped.stdout)
    assert report["files"] == ["<stdin>"] and [d["id"] for d in report["diagnoses"]] == ["cuda.oom"]
    assert report["diagnoses"][0]["evidence"][0]["file"] == "<stdin>"
    assert json.loads(trainready_in("diagnose", "/dev/stdin", "--json", input=oom).stdout)["files"] == ["/dev/stdin"]
    read, write = os.pipe()  # what <(cmd) passes: /dev/fd/N, a pipe whose writer is done
    with os.fdopen(write, "wb") as writer:
        writer.write(oom[:60000])
    try:
        fd = trainready_in("diagnose", f"/dev/fd/{read}", "--json", pass_fds=(read,))
    finally:
        os.close(read)
    assert fd.returncode == 1 and json.loads(fd.stdout)["diagnoses"][0]["id"] == "cuda.oom", fd.stderr
    read, write = os.pipe()  # <(true): nothing written, the writer gone: an empty log, at once
    os.close(write)
    try:
        empty = trainready_in("diagnose", f"/dev/fd/{read}", pass_fds=(read,))
    finally:
        os.close(read)
    assert (empty.returncode, empty.stderr) == (0, "")
    assert empty.stdout.splitlines()[-1] == "no known problem found in 1 file"
    healthy = trainready_in("diagnose", "-", input=b"step 1 loss 2.3\n")
    assert (healthy.returncode, healthy.stdout) == (0, "read: <stdin>\n\nno known problem found in 1 file\n")


def test_a_named_fifo_is_read_until_its_writer_closes_it(tmp_path):
    import threading

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)

    def writer():
        with open(fifo, "wb") as out:  # blocks until the reader opens it
            out.write((LOGS / "cuda_oom.log").read_bytes())

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    proc = trainready_in("diagnose", str(fifo), "--json")
    thread.join(timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["diagnoses"][0]["id"] == "cuda.oom"


def test_a_fifo_nobody_writes_is_an_error_not_a_hang(tmp_path, monkeypatch):
    import trainready.run.diagnose as diagnose_module

    monkeypatch.setattr(diagnose_module, "FIFO_WAIT_S", 0.2)
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError) as caught:
        diagnose_files([fifo])
    assert str(caught.value) == (f"cannot read log file {fifo}: a FIFO that no writer opened within 0.2 s (a pipe is "
                                 "read until its writer closes it)")


def test_devices_directories_and_empty_paths_are_still_refused(tmp_path):
    for device in ("/dev/null", "/dev/zero"):
        proc = trainready_in("diagnose", device)
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            2, "", f"error: cannot read log file {device}: not a regular file, pipe or directory (a device or socket)\n")
    proc = trainready_in("diagnose", str(tmp_path))
    assert (proc.returncode, proc.stderr) == (2, f"error: {tmp_path}: directory has no *.log, *.txt, *.jsonl files to read\n")
    empty = trainready_in("diagnose", "")  # an unset shell variable: never the current directory
    assert (empty.returncode, empty.stderr) == (2, "error: log file '' is empty: name a log file or directory (an empty "
                                                   "path is never taken to mean the current directory; write . for "
                                                   "that, - for standard input)\n")
    job = trainready_in("diagnose", str(LOGS / "cuda_oom.log"), "--job", "")
    assert (job.returncode, job.stderr) == (2, "error: --job is empty: name a job file (plan --save writes one)\n")
