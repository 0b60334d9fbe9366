"""`trainready check` given hostile or mistaken input: a received bundle is read as hostile (symlinks,
FIFOs, devices, huge files, terminal escapes: refused and named, never followed, never a hang), and
paths and option combinations that cannot mean anything are usage errors (exit 2) before any probe runs."""

import json
import os
import subprocess
import sys

import pytest
from check_bundles import BUNDLES, make_bundle

from trainready.check import checks  # noqa: F401  (register every check)
from trainready.check.analyze import analyze
from trainready.check.bundle import Bundle

ENV = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TRAINREADY_NO_IMDS": "1"}
LONG = "a" * 300  # longer than NAME_MAX (255): ENAMETOOLONG


def cli(*args, cwd=None, timeout=60):
    """The CLI; a hang (a FIFO read, /dev/zero) fails the test through the timeout."""
    proc = subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=timeout, cwd=cwd)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-2000:]
    return proc


def report(*args, code):
    proc = cli("check", *args, "--json")
    assert proc.returncode == code, (proc.returncode, proc.stderr[-1000:])
    data = json.loads(proc.stdout)
    return data, {c["id"]: c for c in data["checks"]}


def usage_error(proc, words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    return lines[0]


# ---------------------------------------------------------------- a received bundle is hostile input


def test_a_symlinked_instance_type_is_not_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:SECRET-HASH:19000:0:99999:7:::\n")
    directory = make_bundle("p4d", tmp_path)
    (directory / "instance-type.txt").unlink()
    (directory / "instance-type.txt").symlink_to(secret)
    data, by_id = report("--bundle", directory, code=0)
    assert data["instance_type"] is None
    assert by_id["gpu.count"]["reason"] == ("instance type unknown (instance-type.txt in the bundle not read: a symlink, "
                                            "not followed): cannot tell how many GPUs there should be")
    human = cli("check", "--bundle", directory)
    assert human.returncode == 0 and "SECRET" not in human.stdout + human.stderr
    assert human.stdout.startswith(f"trainready check: instance type unknown (bundle {directory})")


def test_probe_files_that_are_not_plain_files_are_unknown_with_the_reason(tmp_path):
    outside = tmp_path / "lscpu-elsewhere.txt"
    outside.write_text((BUNDLES / "p4d" / "lscpu.txt").read_text())
    directory = make_bundle("p4d", tmp_path)
    (directory / "lscpu.txt").unlink()
    (directory / "lscpu.txt").symlink_to(outside)
    (directory / "meminfo.txt").unlink()
    os.mkfifo(directory / "meminfo.txt")  # reading it would block forever
    (directory / "env.txt").unlink()
    (directory / "env.txt").symlink_to("/dev/zero")  # reading it would never end
    (directory / "mounts.txt").unlink()
    (directory / "mounts.txt").mkdir()
    data, by_id = report("--bundle", directory, code=0)
    skipped = {i: by_id[i]["reason"] for i in ("cpu.vcpu-per-gpu", "mem.host", "net.nccl-env", "storage.shared")}
    assert skipped == {
        "cpu.vcpu-per-gpu": "lscpu.txt in the bundle not read: a symlink, not followed",
        "mem.host": "meminfo.txt in the bundle not read: a FIFO (named pipe), not a plain file",
        "net.nccl-env": "env.txt in the bundle not read: a symlink, not followed; the NCCL log shows no harmful transport",
        "storage.shared": "mounts.txt in the bundle not read: a directory, not a plain file",
    }
    assert [by_id[i]["status"] for i in skipped] == ["skip", "skip", "warn", "skip"] and data["summary"]["fail"] == 0
    assert by_id["gpu.count"]["status"] == "pass"  # the plain files still speak


def test_files_past_their_size_cap_are_refused_from_their_size(tmp_path):
    directory = make_bundle("p4d", tmp_path)
    os.truncate(directory / "instance-type.txt", 300 << 20)  # sparse: costs no disk, would take a minute to read
    os.truncate(directory / "lscpu.txt", 5 << 20)
    os.truncate(directory / "nccl-debug.log", 65 << 20)
    data, by_id = report("--bundle", directory, code=0)
    assert data["instance_type"] is None
    assert "instance-type.txt in the bundle not read: too large: 314572800 bytes, more than the 256 bytes allowed " \
        "for instance-type.txt" in by_id["gpu.count"]["reason"]
    assert by_id["cpu.vcpu-per-gpu"] == {**by_id["cpu.vcpu-per-gpu"], "status": "skip", "reason":
                                         "lscpu.txt in the bundle not read: too large: 5242880 bytes, more than the "
                                         "4 MiB allowed for lscpu.txt"}
    bundle = Bundle.load(directory)
    assert bundle.refused["nccl-debug.log"] == "too large: 68157440 bytes, more than the 64 MiB allowed for nccl-debug.log"
    assert "kernel-xid.txt" in bundle.files  # a log under its (larger) cap is read


def test_only_the_known_file_names_are_read(tmp_path):
    directory = make_bundle("p4d", tmp_path)
    (directory / "core.dump").write_bytes(b"\0" * 1000)
    (directory / "notes.txt").write_text("hello\n")
    bundle = Bundle.load(directory)
    assert sorted(bundle.files) == sorted(p.name for p in (BUNDLES / "p4d").iterdir() if p.name != "manifest.json")


def test_a_refused_file_is_unknown_even_where_the_manifest_says_the_probe_ran(tmp_path):
    directory = make_bundle("p4d", tmp_path)
    (directory / "fi_info-p-efa.txt").unlink()
    os.mkfifo(directory / "fi_info-p-efa.txt")
    bundle = Bundle.load(directory)
    assert bundle.record("fi_info-p-efa.txt").exit_code == 0  # would read as "ran, printed nothing"
    assert bundle.probe_state("fi_info-p-efa.txt") == "unknown"
    assert bundle.why_missing("fi_info-p-efa.txt") == \
        "fi_info-p-efa.txt in the bundle not read: a FIFO (named pipe), not a plain file"


def _replace(path, make):
    path.unlink()
    make(path)


@pytest.mark.parametrize(("make", "reason"), [
    (lambda p: _replace(p, os.mkfifo), "a FIFO (named pipe), not a plain file"),
    (lambda p: _replace(p, lambda q: q.symlink_to("/dev/zero")), "a symlink, not followed"),
    (lambda p: os.truncate(p, 2 << 20), "too large: 2097152 bytes, more than the 1 MiB allowed for manifest.json"),
])
def test_a_manifest_that_cannot_be_read_safely_is_a_usage_error_not_a_hang(tmp_path, make, reason):
    directory = make_bundle("p4d", tmp_path)
    make(directory / "manifest.json")
    usage_error(cli("check", "--bundle", directory), f"error: cannot read {directory / 'manifest.json'}: {reason}")


def test_terminal_escapes_in_the_instance_type_are_not_an_instance_type(tmp_path):
    directory = make_bundle("p4d", tmp_path, replace={"instance-type.txt": "p4d\x1b]0;pwned\x07\x1b[31m.24xlarge\n"})
    data, by_id = report("--bundle", directory, code=0)
    assert data["instance_type"] is None
    assert by_id["gpu.count"]["expected"] == ("unknown (instance-type.txt holds no instance type name: "
                                              "'p4d\\x1b]0;pwned\\x07\\x1b[31m.24xlarge'; pass --instance TYPE)")
    human = cli("check", "--bundle", directory)
    assert human.returncode == 0 and "\x1b" not in human.stdout and "\x07" not in human.stdout
    assert "instance type unknown (bundle" in human.stdout


def test_an_instance_type_not_in_the_catalog_says_where_it_came_from():
    for source, words in (("live", "p9.unknown (detected on this machine) is not in the catalog"),
                          ("node7", "p9.unknown (from the bundle's instance-type.txt) is not in the catalog")):
        node = Bundle.load(BUNDLES / "p4d")
        node.files["instance-type.txt"], node.source = "p9.unknown\n", source
        result = analyze(node)
        gpu_count = next(f for f in result.checks if f.id == "gpu.count")
        assert result.instance_type == "p9.unknown" and words in gpu_count.expected


def test_a_bundle_path_that_is_a_fifo_says_what_it_is(tmp_path):
    fifo = tmp_path / "node7"
    os.mkfifo(fifo)
    line = usage_error(cli("check", "--bundle", fifo), f"error: bundle {fifo} is a FIFO (named pipe), not a directory (")
    assert "regular directory" not in line


def test_xid_advice_on_a_bundle_names_collect_and_the_bundles_machine(tmp_path):
    unreadable = "unreadable: dmesg: read kernel buffer failed: Operation not permitted\n"
    directory = make_bundle("p4d", tmp_path, replace={"kernel-xid.txt": unreadable})
    _, by_id = report("--bundle", directory, code=1)  # the Xid evidence is missing: not verified
    assert (by_id["gpu.xid"]["status"], by_id["gpu.xid"]["reason"], by_id["gpu.xid"]["advice"]) == (
        "skip", "kernel log was not readable on the bundle's machine ip-10-1-33-57 (dmesg needs root there)",
        "collect the bundle again as root there: sudo trainready check collect --out DIR")
    live = analyze(Bundle({"kernel-xid.txt": unreadable}, source="live"))
    xid = next(f for f in live.checks if f.id == "gpu.xid")
    assert (xid.reason, xid.advice) == ("kernel log not readable (dmesg needs root here)", "sudo trainready check")


# ---------------------------------------------------------------- paths and options that mean nothing


def test_an_empty_out_path_writes_nothing_here(tmp_path):
    usage_error(cli("check", "collect", "--out", "", cwd=tmp_path), "error: --out is an empty path: name a directory")
    assert list(tmp_path.iterdir()) == []
    usage_error(cli("check", "--bundle", "", cwd=tmp_path), "error: --bundle is an empty path: name a directory")


def test_names_too_long_for_the_file_system_are_usage_errors(tmp_path):
    usage_error(cli("check", "collect", "--out", tmp_path / LONG),
                f"error: cannot write the bundle to {tmp_path / LONG}: the path or one of its names is too long")
    usage_error(cli("check", "collect", "--out", tmp_path / LONG / "b"), "one of its names is too long for the file system")
    usage_error(cli("check", "--bundle", tmp_path / LONG),
                f"error: cannot read bundle directory {tmp_path / LONG}: the name is too long for the file system")


def test_cpu_only_and_an_instance_type_exclude_each_other():
    usage_error(cli("check", "--cpu-only", "--instance", "p4d.24xlarge"),
                "error: --cpu-only and --instance p4d.24xlarge exclude each other")
    usage_error(cli("check", "--bundle", BUNDLES / "cpu-only", "--cpu-only", "--instance", "p4d.24xlarge"),
                "exclude each other")


def test_measured_directories_must_exist_and_need_deep(tmp_path):
    missing, afile = tmp_path / "nonexist", tmp_path / "file"
    afile.write_text("x")
    usage_error(cli("check", "--deep", "--hot-dir", missing), f"error: --hot-dir {missing} does not exist")
    usage_error(cli("check", "--deep", "--shared-dir", afile), f"error: --shared-dir {afile} is not a directory")
    usage_error(cli("check", "collect", "--out", tmp_path / "b", "--deep", "--shared-dir", missing),
                f"error: --shared-dir {missing} does not exist")
    assert not (tmp_path / "b").exists()  # found before any probe ran
    usage_error(cli("check", "--hot-dir", tmp_path), f"error: --hot-dir {tmp_path} is measured only with --deep")
    usage_error(cli("check", "--bundle", BUNDLES / "p4d", "--deep", "--hot-dir", tmp_path),
                "error: --hot-dir and --shared-dir measure this machine")


# ---------------------------------------------------------------- --dataset's index.json


def test_a_local_index_json_that_is_a_fifo_is_not_read(tmp_path):
    data = tmp_path / "corpus"
    data.mkdir()
    for i in range(3):
        (data / f"{i}.txt").write_text("x")
    os.mkfifo(data / "index.json")
    _, by_id = report("--bundle", BUNDLES / "p4d", "--dataset", data, code=0)
    assert by_id["data.layout"]["status"] == "pass"
    assert by_id["data.layout"]["observed"].endswith("; index.json not read: not a plain file")


def test_the_manifests_words_are_shown_as_text_never_as_terminal_escapes(tmp_path):
    """hostname, command and error come from the bundle's writer: a finding quotes them with control
    characters escaped (\\x1b, line breaks), so a planted manifest cannot rewrite the terminal."""
    def plant(text):
        doc = json.loads(text)
        doc["hostname"] = "node\x1b[2J"
        for probe in doc["probes"]:
            if probe["file"] == "fi_info-p-efa.txt":
                probe.update(exit_code=1, command="fi_info\x1b]0;owned\x07 -p efa", error="boom\nfake: ok")
        return json.dumps(doc)

    directory = make_bundle("p4d", tmp_path, drop=["fi_info-p-efa.txt"], replace={"manifest.json": plant})
    why = Bundle.load(directory).why_missing("fi_info-p-efa.txt")
    assert "\x1b" not in why and "\n" not in why and "\x07" not in why, why
    assert "node\\x1b[2J" in why and "boom\\x0afake: ok" in why, why


def test_the_manifests_tool_version_is_shown_as_text(tmp_path):
    """A probe the manifest does not record is said to predate the collecting trainready, quoting the
    manifest's tool_version: the bundle writer's words too, escaped like the hostname."""
    def plant(text):
        doc = json.loads(text)
        doc["tool_version"] = "0.1\x1b]0;owned\x07\n"
        doc["probes"] = [p for p in doc["probes"] if p["file"] != "clocksource.txt"]
        return json.dumps(doc)

    directory = make_bundle("p4d", tmp_path, drop=["clocksource.txt"], replace={"manifest.json": plant})
    _, by_id = report("--bundle", directory, code=0)
    reason = by_id["cpu.clocksource"]["reason"]
    assert reason.endswith("(trainready 0.1\\x1b]0;owned\\x07\\x0a collected it)"), reason
