"""`check` and its bundles keep secrets and files private: the storage probe never follows a
planted symlink, bundles are redacted once in the bundle writer, and written 0700/0600 (or as
TRAINREADY_FILE_MODE says)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from trainready.check import deep
from trainready.check.bundle import Bundle, BundleManifest, ProbeRecord, shareable
from trainready.check.probes import Result, collect

FSTAB = ("# <file system> <mount point> <type> <options>\n"
         "//fs.corp/share /mnt/share cifs username=alice,password=Hunter2secret,uid=1000 0 0\n"
         "//fs.corp/other /mnt/other cifs credentials=/root/.smbcred,vers=3.0 0 0\n"
         "fs-1.fsx.us-east-1.amazonaws.com@tcp:/abc /fsx lustre defaults,noatime 0 0\n")


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # group mode must not depend on the tester's umask
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---------------------------------------------------------------- check --deep storage probe


def test_storage_probe_never_follows_a_planted_symlink(tmp_path, monkeypatch):
    outside = tmp_path / "precious"
    outside.write_text("do not clobber me")
    shared = tmp_path / "shared"
    shared.mkdir()
    # a neighbour plants symlinks at the names the probe uses: the old fixed name and (forced) the new one
    planted = [shared / f".trainready-bw-{os.getpid()}", shared / ".trainready-bw-forced"]
    for link in planted:
        link.symlink_to(outside)
    monkeypatch.setattr(deep, "_scratch_name", lambda: ".trainready-bw-forced", raising=False)
    result = deep.storage_bandwidth(shared, size_mib=16)
    assert outside.read_text() == "do not clobber me"
    assert "skipped" in result and "exists" in result["skipped"]
    assert all(link.is_symlink() for link in planted)  # not ours: left alone


def test_storage_probe_uses_a_unique_name_and_removes_its_file(tmp_path):
    assert deep._scratch_name() != deep._scratch_name()
    outside = tmp_path / "precious"
    outside.write_text("do not clobber me")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / f".trainready-bw-{os.getpid()}").symlink_to(outside)
    result = deep.storage_bandwidth(shared, size_mib=16)
    assert result["bytes"] == 16 << 20 and result["write_gbps"] > 0 and result["read_gbps"] > 0
    assert outside.read_text() == "do not clobber me"
    assert [p.name for p in shared.iterdir()] == [f".trainready-bw-{os.getpid()}"]


def test_storage_probe_falls_back_to_buffered_io_where_o_direct_is_refused(tmp_path, monkeypatch):
    real = deep.fcntl.fcntl

    def refuse_direct(fd, cmd, arg=0):
        if cmd == deep.fcntl.F_SETFL and arg & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")  # what tmpfs and some network filesystems answer
        return real(fd, cmd, arg)

    monkeypatch.setattr(deep.fcntl, "fcntl", refuse_direct)
    result = deep.storage_bandwidth(tmp_path, size_mib=16)
    assert result["direct_io"] is False and result["read_gbps"] > 0
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- bundles: redacted and private


def _collect(out, monkeypatch, environ=None):
    monkeypatch.setenv("HF_TOKEN", "hf_liveSecretValue42")

    def runner(argv, timeout_s):
        if argv[0] == "lscpu":  # a probe's output that happens to quote a secret
            return Result(0, "Model name: test\nproxy https://bob:pr0xyPass@proxy.corp:3128 hf_liveSecretValue42\n", "", 0.0)
        return Result(None, "", f"{argv[0]}: command not found (token=mgrErr0r55)", 0.0)

    real_read = __import__("trainready.check.probes", fromlist=["_read"])._read
    monkeypatch.setattr("trainready.check.probes._read", lambda path: FSTAB if path == "/etc/fstab" else real_read(path))
    env = environ or {"NCCL_SOCKET_IFNAME": "eth0", "TORCH_HOME": "https://carol:t0rchPass@cache.corp/torch",
                      "NCCL_SECRET_KEY": "dropped-anyway"}
    return collect(out, runner=runner, instance_type="p4d.24xlarge", environ=env)


SECRETS = ("Hunter2secret", "pr0xyPass", "hf_liveSecretValue42", "t0rchPass", "mgrErr0r55", "dropped-anyway")


def test_collect_redacts_every_file_it_writes(tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    bundle = _collect(out, monkeypatch)
    fstab = (out / "fstab.txt").read_text()
    assert "password=***" in fstab and "Hunter2secret" not in fstab
    assert "credentials=***" in fstab  # the path of a credentials file says where the secret is
    assert "/fsx lustre defaults,noatime" in fstab  # the rest stays as it was: the checks still read it
    for path in out.iterdir():
        text = path.read_text()
        assert not [s for s in SECRETS if s in text], path.name
    json.loads((out / "manifest.json").read_text())
    for text in bundle.files.values():  # the live bundle a `check` analyses is redacted too
        assert not [s for s in SECRETS if s in text]


def test_bundle_is_private_by_default(tmp_path, monkeypatch, umask_022):
    monkeypatch.delenv("TRAINREADY_FILE_MODE", raising=False)
    out = tmp_path / "bundle"
    _collect(out, monkeypatch)
    assert _mode(out) == 0o700
    assert {path.name: _mode(path) for path in out.iterdir()} == {path.name: 0o600 for path in out.iterdir()}


def test_bundle_modes_follow_trainready_file_mode(tmp_path, monkeypatch, umask_022):
    monkeypatch.setenv("TRAINREADY_FILE_MODE", "group")
    out = tmp_path / "bundle"
    _collect(out, monkeypatch)
    assert _mode(out) == 0o750
    assert {_mode(path) for path in out.iterdir()} == {0o640}


def test_bundle_writer_replaces_a_planted_symlink_instead_of_following_it(tmp_path):
    outside = tmp_path / "precious"
    outside.write_text("keep")
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "fstab.txt").symlink_to(outside)
    Bundle({"fstab.txt": FSTAB}, BundleManifest(probes=[ProbeRecord(file="fstab.txt", command="fstab.txt")])).save(out)
    assert outside.read_text() == "keep"
    assert not (out / "fstab.txt").is_symlink() and "Hunter2secret" not in (out / "fstab.txt").read_text()


def test_deep_json_written_by_collect_goes_through_the_writer(tmp_path):
    bundle = Bundle({"deep.json": json.dumps({"shared": {"skipped": "could not test https://u:deepPass1@nfs/x"}})})
    bundle.save(tmp_path, ["deep.json"])
    text = (tmp_path / "deep.json").read_text()
    assert "deepPass1" not in text and json.loads(text)["shared"]["skipped"].startswith("could not test")


def test_redacted_json_stays_json():
    # masking `password=abc\"...` in the JSON text would swallow the backslash of an escaped quote:
    # the writer then redacts each string value instead
    text = json.dumps({"cmd": 'mount -o password=abc"def', "password": "abc123"})
    out = shareable("cuda.json", text)
    data = json.loads(out)
    assert "abc" not in out and data["cmd"].startswith("mount -o password=***")
    assert shareable("lscpu.txt", "password=abc\n") == "password=***\n"
