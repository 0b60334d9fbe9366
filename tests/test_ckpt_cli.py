"""`trainready ckpt ls|verify|pull|prune` end to end, on checkpoints written by hand (files plus a
manifest, no CheckpointManager): JSON output, exit codes, and what ends up on disk."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainready.io import sha256_file
from trainready.store.manifest import MANIFEST, FileEntry, Manifest, checkpoint_name

FILES = {"__0_0.distcp": 3000, "__1_0.distcp": 2500, ".metadata": 300, "state/rank-00000.json": 120}
CORRUPT_FILE = "__1_0.distcp"
# Root ignores file permissions through two capabilities; without them, as the owner of the files the tests
# make, it is held to their mode bits. Dropping them (and not the uid) keeps the checkout readable: a clone in a
# private directory (mktemp -d, mode 0700) is out of another user's reach, its .venv and sources included.
NO_DAC_OVERRIDE = ["--bounding-set=-dac_override,-dac_read_search"]


def cli(*args, env=None, timeout=60, unprivileged=False, stdin=subprocess.DEVNULL, cwd=None):
    """Run `trainready ckpt ARGS` (stdin not a terminal, output in pipes). `unprivileged`: with file
    permissions in force (root ignores them: then without its DAC-override capabilities, through setpriv)."""
    in_process = all(k == "COLUMNS" or k.startswith("AWS_") for k in env or {})
    if in_process and not unprivileged and stdin is subprocess.DEVNULL:
        # nothing only a process of its own shows (its user, a terminal): the entry function in this process, seconds
        # faster (issue 25), seeing only the AWS variables given, as the process started with them would
        from cloud_stubs import cli_run

        aws = {k: v for k, v in (env or {}).items() if k != "COLUMNS"}
        proc = cli_run("ckpt", *args, columns=int((env or {}).get("COLUMNS", 200)), cwd=cwd, env=aws or None)
        return _checked(proc, args)
    prefix = []
    if unprivileged and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: file permissions cannot be tested")
        prefix = [setpriv, *NO_DAC_OVERRIDE]
    proc = subprocess.run([*prefix, sys.executable, "-m", "trainready", "ckpt", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=stdin, cwd=cwd,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **(env or {})})
    return _checked(proc, args)


def _checked(proc: subprocess.CompletedProcess, args: tuple) -> subprocess.CompletedProcess:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    if "--json" not in args:  # people never read Python's None
        assert not re.search(r"\bNone\b", proc.stdout + proc.stderr), proc.stdout + proc.stderr
    return proc


def cli_json(*args, code=0, env=None, unprivileged=False, cwd=None):
    proc = cli(*args, "--json", env=env, unprivileged=unprivileged, cwd=cwd)
    assert proc.returncode == code, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def write_ckpt(root: Path, step: int, *, generation: int = 1, commit: bool = True, files=None,
               node_files=None, nodes: int = 1) -> Path:
    """A checkpoint directory as the store lays it out: data files, then (if committed) the manifest."""
    name = checkpoint_name(step, generation)
    base = root / name
    entries = {}
    for rel, size in (files or FILES).items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        entries[rel] = FileEntry(path=rel, size=size, sha256=sha256_file(str(path)))
    if commit:
        every = sorted(entries.values(), key=lambda e: e.path)
        per_node = {n: [entries[p] for p in paths] for n, paths in node_files.items()} if node_files else {0: every}
        if node_files:  # the whole checkpoint, of which this directory holds one node's share
            every = sorted({e.path: e for es in per_node.values() for e in es}.values(), key=lambda e: e.path)
        manifest = Manifest(step=step, run_id="run-a", generation=generation, world_size=2 * nodes, nodes=nodes,
                            created_unix=time.time() - 3600, save_seconds=0.4, versions={"trainready": "0.1.0"},
                            files=every, node_files=per_node)
        (base / MANIFEST).write_bytes(manifest.to_bytes())
    return base


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def store(tmp_path) -> Path:
    """step 100 ok, 150 uncommitted (debris), 200 committed with one flipped byte, 300 ok (newest
    committed), 400 uncommitted (newer than the newest committed: maybe still being written)."""
    root = tmp_path / "ckpts"
    write_ckpt(root, 100)
    write_ckpt(root, 150, commit=False)
    flip_byte(write_ckpt(root, 200) / CORRUPT_FILE)
    write_ckpt(root, 300)
    write_ckpt(root, 400, commit=False, files={"__0_0.distcp": 1000})
    (root / "writer.json").write_text("{}")  # not a checkpoint: ignored
    return root


def names(*steps: int) -> list[str]:
    return [checkpoint_name(s, 1) for s in steps]


def test_ls_shows_committed_and_uncommitted(store):
    data = cli_json("ls", store)
    assert data["schema_version"] == 1 and data["url"] == str(store)
    ckpts = data["checkpoints"]
    assert [c["step"] for c in ckpts] == [100, 150, 200, 300, 400]
    assert [c["committed"] for c in ckpts] == [True, False, True, True, False]
    done = ckpts[0]
    assert done["run_id"] == "run-a" and done["world_size"] == 2 and done["files"] == len(FILES)
    assert done["size_bytes"] == sum(FILES.values()) and done["verified"] is None and done["tier"] == "local"
    assert done["created_unix"] > 0 and done["node"] is None and done["problem"] == ""
    debris = ckpts[1]
    assert debris["run_id"] is None and debris["files"] == len(FILES) and "no manifest" in debris["problem"]
    assert ckpts[4]["size_bytes"] == 1000
    table = cli("ls", store)
    assert table.returncode == 0
    for word in ("commit", "check", "(local)", "5.8 KiB", "run-a", "not committed"):
        assert word in table.stdout, table.stdout


def test_ls_verify_checks_sizes(store):
    data = cli_json("ls", store, "--verify")  # a flipped byte keeps the size: ls --verify cannot see it
    assert [c["verified"] for c in data["checkpoints"]] == [True, None, True, True, None]
    bad = store / names(100)[0] / "state" / "rank-00000.json"
    bad.write_bytes(bad.read_bytes()[:-1])
    data = cli_json("ls", store, "--verify", code=1)
    assert data["checkpoints"][0]["verified"] is False
    assert "state/rank-00000.json: 119 bytes, manifest says 120" in data["checkpoints"][0]["problem"]


def test_verify_names_the_corrupt_file(store):
    data = cli_json("verify", store, code=1)
    assert data["checksums"] is True and data["ok"] is False
    by_step = {c["step"]: c for c in data["checkpoints"]}
    assert set(by_step) == {100, 200, 300}  # committed ones only
    assert by_step[100]["ok"] and by_step[300]["ok"] and not by_step[200]["ok"]
    assert by_step[200]["problems"] == [f"{CORRUPT_FILE}: checksum mismatch (file changed since it was written)"]
    human = cli("verify", store)
    assert human.returncode == 1 and CORRUPT_FILE in human.stdout and names(200)[0] in human.stdout
    assert cli_json("verify", store, "--step", "300")["ok"] is True
    sizes_only = cli_json("verify", store, "--no-checksums")
    assert sizes_only["ok"] is True and sizes_only["checksums"] is False
    (store / names(300)[0] / ".metadata").unlink()
    assert cli_json("verify", store, "--step", "300", code=1)["checkpoints"][0]["problems"] == [".metadata: missing"]


def test_pull_copies_exactly_and_never_overwrites(store, tmp_path):
    dest = tmp_path / "pulled"
    result = cli_json("pull", store, "--step", "300", "--to", dest)
    name = names(300)[0]
    assert result["name"] == name and result["path"] == str(dest / name) and result["files"] == len(FILES)
    for rel in FILES:
        assert (dest / name / rel).read_bytes() == (store / name / rel).read_bytes()
    manifest = Manifest.from_bytes((dest / name / MANIFEST).read_bytes())
    assert manifest.step == 300 and manifest.node_files == {}  # a full copy
    assert sorted(os.listdir(dest)) == [name]  # no temporary directory left
    assert cli_json("verify", dest)["ok"] is True
    again = cli("pull", store, "--step", "300", "--to", dest)
    assert again.returncode == 2 and "already exists" in again.stderr
    # a corrupt checkpoint is refused, and nothing is left behind
    bad = cli("pull", store, "--step", "200", "--to", dest)
    assert bad.returncode == 1 and CORRUPT_FILE in bad.stderr
    assert sorted(os.listdir(dest)) == [name]


def test_prune_keeps_newest_and_removes_debris(store):
    before = sorted(os.listdir(store))
    dry = cli_json("prune", store, "--keep", "1", "--dry-run")
    assert dry["dry_run"] is True and dry["deleted"] == names(100, 150, 200)
    assert sorted(os.listdir(store)) == before
    human = cli("prune", store, "--keep", "2", "--dry-run")
    assert human.returncode == 0 and "would delete" in human.stdout and sorted(os.listdir(store)) == before
    done = cli_json("prune", store, "--keep", "1")
    assert done["deleted"] == names(100, 150, 200) and done["kept"] == names(300, 400) and done["broken"] == []
    assert sorted(os.listdir(store)) == sorted(names(300, 400) + ["writer.json"])
    again = cli_json("prune", store, "--keep", "1")
    assert again["deleted"] == [] and again["kept"] == names(300, 400)


def test_prune_never_trades_an_intact_checkpoint_for_a_broken_newer_one(tmp_path):
    root = tmp_path / "c"
    write_ckpt(root, 10)
    write_ckpt(root, 20)
    (root / names(20)[0] / ".metadata").unlink()  # the newest committed one is damaged
    r = cli_json("prune", root, "--keep", "1")
    assert r["broken"] == names(20) and r["deleted"] == [] and r["kept"] == names(10, 20)
    assert cli("prune", root, "--keep", "0").returncode == 2


def test_pull_takes_the_destination_as_cp_does(tmp_path):
    """issue 27: `ckpt pull URL DIR` failed with "Missing option '--to'"; the destination is also a positional."""
    root = tmp_path / "c"
    write_ckpt(root, 5, generation=1)
    r = cli_json("pull", root, tmp_path / "out")
    assert r["name"] == checkpoint_name(5, 1) and (tmp_path / "out" / checkpoint_name(5, 1)).is_dir()
    same = cli_json("pull", root, tmp_path / "again", "--to", tmp_path / "again")  # the same place twice is one
    assert same["name"] == checkpoint_name(5, 1)
    two = cli("pull", root, tmp_path / "a", "--to", tmp_path / "b")
    assert two.returncode == 2 and "two destinations" in two.stderr
    none = cli("pull", root)
    assert none.returncode == 2 and "no destination" in none.stderr and "Traceback" not in none.stderr


def test_newest_generation_is_pulled(tmp_path):
    root = tmp_path / "c"
    write_ckpt(root, 5, generation=1)
    write_ckpt(root, 5, generation=2)
    r = cli_json("pull", root, "--step", "5", "--to", tmp_path / "out")
    assert r["generation"] == 2 and r["name"] == checkpoint_name(5, 2)
    assert [c["generation"] for c in cli_json("verify", root, "--step", "5")["checkpoints"]] == [1, 2]


@pytest.mark.parametrize("args,words", [
    (("verify", "{store}", "--step", "250"), ["no checkpoint at step 250", "200 (before)", "300 (after)"]),
    (("pull", "{store}", "--step", "999", "--to", "{tmp}/x"), ["step 999", "300 (before)"]),
    (("pull", "{store}", "--step", "150", "--to", "{tmp}/x"), ["step 150", "not committed", "100 (before)", "200 (after)"]),
    (("ls", "{tmp}/nonexistent"), ["no such directory"]),
    (("verify", "{tmp}/nonexistent"), ["no such directory"]),
    (("prune", "{store}"), ["--keep"]),
    (("pull", "{store}", "--step", "300"), ["--to"]),
])
def test_usage_errors_exit_2(store, tmp_path, args, words):
    out = cli(*(a.format(store=store, tmp=tmp_path) for a in args))
    assert out.returncode == 2, out.stderr
    for word in words:
        assert word in out.stderr, out.stderr


def test_usage_error_json(store):
    err = cli_json("verify", store, "--step", "250", code=2)["error"]
    assert err["exit_code"] == 2 and "200 (before), 300 (after)" in err["message"]


def test_empty_location(tmp_path):
    assert cli_json("ls", tmp_path)["checkpoints"] == []
    r = cli_json("verify", tmp_path, code=1)
    assert r["ok"] is False and r["checkpoints"] == [] and "no committed checkpoint" in r["problem"]


def test_a_nodes_hot_tier_share(tmp_path):
    """A node's hot tier holds only its own files of a multi-node checkpoint: checked as such,
    and not pulled from there (the archive holds the whole checkpoint)."""
    root = tmp_path / "node1"
    files = {"__2_0.distcp": 800, "__3_0.distcp": 700, ".metadata": 90}
    base = write_ckpt(root, 7, files=files, nodes=2,
                      node_files={0: [".metadata"], 1: ["__2_0.distcp", "__3_0.distcp", ".metadata"]})
    manifest = Manifest.from_bytes((base / MANIFEST).read_bytes())
    zero = FileEntry(path="__0_0.distcp", size=5, sha256="0" * 64)  # node 0's file, not on this node
    manifest = manifest.model_copy(update={"files": [zero, *manifest.files],
                                           "node_files": {0: [zero, manifest.node_files[1][0]], 1: manifest.node_files[1]}})
    (base / MANIFEST).write_bytes(manifest.to_bytes())
    ckpt = cli_json("ls", root, "--verify")["checkpoints"][0]
    assert ckpt["node"] == 1 and ckpt["files"] == 3 and ckpt["verified"] is True and ckpt["nodes"] == 2
    assert cli_json("verify", root)["ok"] is True
    out = cli("pull", root, "--step", "7", "--to", tmp_path / "out")
    assert out.returncode == 2 and "node 1's share" in out.stderr


def test_file_url(store):
    data = cli_json("ls", f"file://{store}")
    assert [c["committed"] for c in data["checkpoints"]] == [True, False, True, True, False]
    assert data["checkpoints"][0]["tier"] == "archive"
    assert cli_json("verify", f"file://{store}", code=1)["checkpoints"][1]["problems"] == [f"{CORRUPT_FILE}: checksum mismatch"]


# --- S3 (moto's standalone server, tests/s3server.py via conftest) -------------------------------


@pytest.fixture
def s3_env(s3_bucket):
    """The AWS variables that point a `trainready` subprocess at the test server, a client, and
    the fresh bucket's name."""
    import boto3

    env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                      "AWS_DEFAULT_REGION")}
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"])
    return env, client, s3_bucket


def upload(client, bucket: str, root: Path, prefix: str) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def keys(client, bucket: str) -> set[str]:
    return {o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])}


def test_s3_archive(store, tmp_path, s3_env):
    env, client, bucket = s3_env
    upload(client, bucket, store, "run")
    url = f"s3://{bucket}/run"
    data = cli_json("ls", url, "--verify", env=env)
    assert [c["committed"] for c in data["checkpoints"]] == [True, False, True, True, False]
    assert data["checkpoints"][3]["verified"] is True and data["checkpoints"][1]["files"] == len(FILES)
    report = cli_json("verify", url, env=env, code=1)
    assert [c["ok"] for c in report["checkpoints"]] == [True, False, True]
    assert report["checkpoints"][1]["problems"] == [f"{CORRUPT_FILE}: checksum mismatch"]
    pulled = cli_json("pull", url, "--step", "300", "--to", tmp_path / "out", env=env)
    for rel in FILES:
        assert (Path(pulled["path"]) / rel).read_bytes() == (store / names(300)[0] / rel).read_bytes()
    assert cli("pull", url, "--step", "200", "--to", tmp_path / "out", env=env).returncode == 1
    pruned = cli_json("prune", url, "--keep", "1", "--yes", env=env)
    assert pruned["deleted"] == names(100, 150, 200) and pruned["cancelled"] is False
    left = {k.split("/")[1] for k in keys(client, bucket)}
    assert left == set(names(300, 400)) | {"writer.json"}


def test_missing_s3_location(store, tmp_path, s3_env):
    """A missing bucket, no bucket at all, or a prefix with nothing under it looked like an empty
    location (exit 0, `prune` "deleted nothing"): each is exit 2 naming what is missing."""
    env, client, bucket = s3_env
    upload(client, bucket, store, "run-1")
    every = [("ls",), ("verify",), ("prune", "--keep", "1", "--yes"), ("prune", "--keep", "1", "--dry-run"),
             ("pull", "--to", tmp_path / "out")]
    missing = " (or is not visible with these credentials)"
    cases = [("s3://no-such-bucket/run-1", "bucket 'no-such-bucket' does not exist" + missing, every),
             (f"s3://{bucket}/run-2", f"nothing is stored under this prefix; nearest: s3://{bucket}/run-1",
              every[2:]),
             ("s3://", "no bucket in the URL (s3://BUCKET/prefix)", every[:3]),
             ("s3:///run-1", "no bucket in the URL (s3://BUCKET/prefix)", every[:1]),
             ("s3://no-such-bucket", "bucket 'no-such-bucket' does not exist" + missing, every[:1]),
             (f"s3://{bucket}/run-1/writer.json", "is a file, not a folder of checkpoints", every[:1])]
    for url, message, commands in cases:
        for cmd, *rest in commands:
            proc = cli(cmd, url, *rest, env=env)
            assert (proc.returncode, proc.stdout) == (2, ""), (cmd, url, proc.stdout, proc.stderr)
            assert proc.stderr == f"error: {url}: {message}\n", (cmd, url, proc.stderr)
    assert not (tmp_path / "out").exists()
    assert len(keys(client, bucket)) == sum(1 for p in store.rglob("*") if p.is_file())  # nothing deleted


def test_an_empty_bucket_is_an_empty_location(s3_env):
    env, _client, bucket = s3_env
    assert cli_json("ls", f"s3://{bucket}", env=env)["checkpoints"] == []
    assert cli("ls", f"s3://{bucket}", env=env).stdout == f"no checkpoints in s3://{bucket}\n"


def test_prune_deletes_only_its_own_prefix_when_the_url_has_glob_characters(store, s3_env):
    """fsspec's rm expands `*?[`: pruning s3://b/run[1] deleted run1's checkpoints and left run[1]'s."""
    env, client, bucket = s3_env
    upload(client, bucket, store, "run1")
    upload(client, bucket, store, "run[1]")
    before = {k for k in keys(client, bucket) if k.startswith("run1/")}
    result = cli_json("prune", f"s3://{bucket}/run[1]", "--keep", "1", "--yes", env=env)
    assert result["deleted"] == names(100, 150, 200)
    assert {k for k in keys(client, bucket) if k.startswith("run1/")} == before
    assert {k.split("/")[1] for k in keys(client, bucket) if k.startswith("run[1]/")} == {*names(300, 400), "writer.json"}


def test_prune_of_a_local_archive_url_with_glob_characters(store, tmp_path):
    for place in ("run1", "run[1]"):
        shutil.copytree(store, tmp_path / place)
    result = cli_json("prune", f"file://{tmp_path}/run[1]", "--keep", "1", "--yes")
    assert result["deleted"] == names(100, 150, 200)
    assert sorted(os.listdir(tmp_path / "run[1]")) == sorted([*names(300, 400), "writer.json"])
    assert sorted(os.listdir(tmp_path / "run1")) == sorted(os.listdir(store))


def test_progress_counts_every_byte_from_s3(store, tmp_path, s3_env):
    from trainready.store.inspect import pull, verify_checkpoints

    env, client, bucket = s3_env
    upload(client, bucket, store, "run")
    done, total = [], []
    pulled = pull(f"s3://{bucket}/run", None, tmp_path / "out", on_progress=done.append, on_total=total.append)
    assert pulled.step == 300 and total == [sum(FILES.values())] and sum(done) == sum(FILES.values())
    done, total = [], []
    report = verify_checkpoints(f"s3://{bucket}/run", on_progress=done.append, on_total=total.append)
    assert total == [3 * sum(FILES.values())] and sum(done) == total[0] and not report.ok


def test_text_from_disk_is_never_markup_or_terminal_control(tmp_path):
    """A run id or path with Rich markup or terminal escapes was rendered (or crashed the output)."""
    base = write_ckpt(tmp_path / "loc[x]", 100)
    manifest = json.loads((base / MANIFEST).read_text())
    manifest["run_id"] = "[red]x[/] \x1b]0;owned\x07"
    manifest["files"].append({"path": "a[/b]", "size": 1, "sha256": "0" * 64})
    manifest["node_files"]["0"].append({"path": "a[/b]", "size": 1, "sha256": "0" * 64})
    (base / MANIFEST).write_text(json.dumps(manifest))
    shown = cli("ls", tmp_path / "loc[x]", env={"COLUMNS": "80"})
    assert shown.returncode == 0 and "[red]x[/]" in shown.stdout and "\x1b" not in shown.stdout
    assert "loc[x]" in shown.stdout
    checked = cli("verify", tmp_path / "loc[x]", env={"COLUMNS": "80"})
    assert checked.returncode == 1 and "a[/b]: missing" in checked.stdout
    missing = cli("ls", tmp_path / "no[/such]")
    assert missing.returncode == 2 and "no[/such]" in missing.stderr


def test_ckpt_needs_no_torch(store):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from trainready.cli.main import app\n"
            f"app(['ckpt', 'verify', {str(store)!r}, '--step', '300', '--json'], standalone_mode=False)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


# --- locations, permissions, output --------------------------------------------------------------


@pytest.fixture
def shared_tmp():
    """A directory another user can reach (pytest's tmp_path is 0700 under root's own), for the
    tests that drop to an unprivileged user; permissions are restored before it is removed."""
    root = Path(tempfile.mkdtemp(prefix="trainready-ckpt-test-"))
    root.chmod(0o755)
    yield root
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(root)


def _walk_modes(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_a_missing_local_location_is_a_usage_error(store, tmp_path):
    """Every command that takes a location says exit 2 for one that is not there (with the nearest
    directory when one looks like a typo); a file, or a path through a file, is no directory either."""
    (tmp_path / "a-file").write_text("x")
    missing = tmp_path / "ckpt"
    for cmd, *rest in [("ls",), ("verify",), ("pull", "--to", tmp_path / "out"), ("prune", "--keep", "1"),
                       ("prune", "--keep", "1", "--yes")]:
        proc = cli(cmd, missing, *rest)
        assert (proc.returncode, proc.stdout) == (2, ""), (cmd, proc.stdout, proc.stderr)
        assert proc.stderr == f"error: {missing}: no such directory; nearest: {tmp_path}/ckpts\n", proc.stderr
    cases = {f"file://{missing}": f"no such directory; nearest: file://{tmp_path}/ckpts",
             str(tmp_path / "a-file"): "not a directory",
             str(tmp_path / "a-file" / "x"): "no such directory (a parent is a file)"}
    for url, message in cases.items():
        proc = cli("prune", url, "--keep", "1")
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {url}: {message}\n")
    assert not (tmp_path / "out").exists()


def test_pull_to_a_directory_it_cannot_write_is_a_usage_error(store, shared_tmp, tmp_path):
    """`pull --to` a read-only directory exited 1, the code for a damaged checkpoint."""
    source = shared_tmp / "ckpts"
    shutil.copytree(store, source)
    _walk_modes(source)
    readonly = shared_tmp / "readonly"
    readonly.mkdir(mode=0o555)
    readonly.chmod(0o555)
    for target in (readonly, readonly / "sub"):
        proc = cli("pull", source, "--step", "300", "--to", target, unprivileged=True)
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr == f"error: cannot write to {target}: Permission denied\n"
    assert os.listdir(readonly) == []
    err = cli_json("pull", source, "--to", readonly, code=2, unprivileged=True)["error"]
    assert err == {"message": f"cannot write to {readonly}: Permission denied", "exit_code": 2}
    afile = tmp_path / "a-file"
    afile.write_text("x")
    for target in (afile, afile / "sub"):
        proc = cli("pull", store, "--step", "300", "--to", target)
        assert proc.returncode == 2 and proc.stderr == f"error: cannot write to {target}: not a directory\n"
    assert afile.read_text() == "x"


def test_one_unreadable_checkpoint_is_listed_under_its_own_name(store, shared_tmp):
    """A mode-000 checkpoint directory or a dangling symlink in a checkpoint's place: the others
    are listed as usual, that one as unreadable with its own name (the parent is readable)."""
    root = shared_tmp / "ckpts"
    shutil.copytree(store, root)
    _walk_modes(root)
    locked = root / names(200)[0]
    locked.chmod(0)
    (root / checkpoint_name(250, 1)).symlink_to(shared_tmp / "gone")
    statuses = {c["name"]: (c["status"], c["problem"])
                for c in cli_json("ls", root, unprivileged=True)["checkpoints"]}
    assert statuses == {names(100)[0]: ("committed", ""), names(150)[0]: ("uncommitted", "no manifest (never committed)"),
                        names(200)[0]: ("unreadable", "directory unreadable: Permission denied"),
                        checkpoint_name(250, 1): ("unreadable", "a symlink, not a checkpoint directory"),
                        names(300)[0]: ("committed", ""), names(400)[0]: ("uncommitted", "no manifest (never committed)")}
    human = cli("ls", root, unprivileged=True)
    assert human.returncode == 0 and human.stderr == ""
    assert f"  {names(200)[0]}: directory unreadable: Permission denied" in human.stdout
    assert f"  {checkpoint_name(250, 1)}: a symlink, not a checkpoint directory" in human.stdout
    assert "2 committed" in human.stdout and "2 unreadable (kept, never deleted automatically)" in human.stdout
    report = cli_json("verify", root, code=1, unprivileged=True)
    assert [(c["name"], c["ok"]) for c in report["checkpoints"]] == [
        (names(100)[0], True), (names(200)[0], False), (checkpoint_name(250, 1), False), (names(300)[0], True)]
    dry = cli_json("prune", root, "--keep", "1", "--dry-run", unprivileged=True)
    assert dry["deleted"] == names(100, 150) and dry["untouched"] == [names(200)[0], checkpoint_name(250, 1)]
    link = cli_json("ls", f"file://{root}")["checkpoints"][3]  # an archive URL sees the link the same way
    assert (link["name"], link["status"]) == (checkpoint_name(250, 1), "unreadable")


def test_an_unreadable_file_fails_that_checkpoint_not_the_command(store, shared_tmp, tmp_path):
    root = shared_tmp / "ckpts"
    shutil.copytree(store, root)
    _walk_modes(root)
    (root / names(300)[0] / ".metadata").chmod(0)
    (shared_tmp / "out").mkdir()
    (shared_tmp / "out").chmod(0o777)
    report = cli_json("verify", root, code=1, unprivileged=True)
    problems = {c["step"]: c["problems"] for c in report["checkpoints"]}
    assert problems[300] == [".metadata: unreadable (Permission denied)"] and problems[100] == []
    proc = cli("pull", root, "--step", "300", "--to", shared_tmp / "out", unprivileged=True)
    assert proc.returncode == 2
    assert proc.stderr == f"error: cannot read {root / names(300)[0] / '.metadata'}: Permission denied\n"
    assert os.listdir(shared_tmp / "out") == []


def test_ls_verify_says_it_checked_sizes_only(store):
    """`ls --verify` showed "ok" for a checkpoint with a flipped byte: it compares sizes only."""
    human = cli("ls", store, "--verify", env={"COLUMNS": "80"})
    assert human.returncode == 0
    row = next(line for line in human.stdout.splitlines() if line.split()[:1] == ["200"])
    assert "size ok" in row and " ok " not in row.replace("size ok", "")
    assert f"Checkpoints in {store} (local; sizes checked, no data read)" in " ".join(human.stdout.split())
    assert (f"sizes only: a changed byte keeps its size; `trainready ckpt verify {store}` compares every file's "
            "SHA-256") in " ".join(human.stdout.split())
    assert cli_json("ls", store, "--verify")["checked"] == "sizes"
    assert cli_json("ls", store)["checked"] == ""
    assert "sizes" not in cli("ls", store).stdout


def test_pull_defaults_to_the_newest_committed_checkpoint(store, tmp_path):
    assert "Step to copy. (default: the newest committed checkpoint)" in cli("pull", "-h").stdout
    result = cli_json("pull", store, "--to", tmp_path / "a")  # 400 is newer but not committed
    assert (result["step"], result["name"]) == (300, names(300)[0])
    human = cli("pull", store, "--to", tmp_path / "b")
    assert human.returncode == 0 and human.stderr == ""  # no progress bar in a pipe
    assert human.stdout.startswith(f"pulled {names(300)[0]} (step 300, the newest committed; 4 files")
    (store / names(300)[0] / CORRUPT_FILE).write_bytes(b"x" * 2500)  # the newest is damaged: which one is older
    bad = cli("pull", store, "--to", tmp_path / "c")
    assert bad.returncode == 1 and "(the newest committed; the one before it: --step 200)" in bad.stderr
    assert not (tmp_path / "c").exists()  # the pull created it: removed again
    empty = tmp_path / "empty"
    write_ckpt(empty, 5, commit=False)
    none = cli("pull", empty, "--to", tmp_path / "d")
    assert none.returncode == 2
    assert none.stderr == (f"error: no committed checkpoint in {empty} to pull (1 checkpoint directory, none "
                           "committed and usable: trainready ckpt ls)\n")


def _with_terminal_stdin(args, answer: bytes):
    """Run `trainready ckpt ARGS` with a terminal on stdin, type `answer`; stdout and stderr are pipes."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "trainready", "ckpt", *map(str, args)], stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        os.close(slave)
        os.write(master, answer)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    return proc.returncode, out, err


def test_prune_asks_before_deleting_from_an_archive(store):
    url = f"file://{store}"
    before = sorted(os.listdir(store))
    refused = cli("prune", url, "--keep", "1")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (f"error: prune deletes from the archive {url} for good and asks first, but stdin is not "
                              "a terminal: pass --yes (or --dry-run to see what it would delete)\n")
    assert cli_json("prune", url, "--keep", "1", "--dry-run")["deleted"] == names(100, 150, 200)
    assert sorted(os.listdir(store)) == before
    code, out, err = _with_terminal_stdin(["prune", url, "--keep", "1", "--json"], b"n\n")
    assert code == 0 and json.loads(out)["cancelled"] is True and json.loads(out)["deleted"] == names(100, 150, 200)
    assert err == (f"prune would delete 3 from {url} (for good):\n" + "".join(f"  {n}\n" for n in names(100, 150, 200))
                   + f"Delete these 3 from {url}? [y/N] ")
    assert sorted(os.listdir(store)) == before
    code, out, _err = _with_terminal_stdin(["prune", url, "--keep", "1"], b"\x04")  # end of input: no
    assert code == 0 and "not confirmed: nothing was deleted" in out and sorted(os.listdir(store)) == before
    code, out, _err = _with_terminal_stdin(["prune", url, "--keep", "1"], b"y\n")
    assert code == 0 and out.startswith("deleted 3: ")
    assert sorted(os.listdir(store)) == sorted(names(300, 400) + ["writer.json"])
    assert cli("prune", url, "--keep", "1").returncode == 2  # nothing left to delete: a script still needs --yes
    assert cli_json("prune", url, "--keep", "1", "--yes")["deleted"] == []


def test_progress_counts_every_byte(store, tmp_path):
    from trainready.store.inspect import pull, verify_checkpoints

    done, total = [], []
    pulled = pull(str(store), None, tmp_path / "out", on_progress=done.append, on_total=total.append)
    assert pulled.step == 300 and total == [sum(FILES.values())] and sum(done) == total[0]
    done, total = [], []
    verify_checkpoints(str(store), on_progress=done.append, on_total=total.append)
    assert total == [3 * sum(FILES.values())] and sum(done) == total[0]
    done, total = [], []
    verify_checkpoints(str(store), checksums=False, on_progress=done.append, on_total=total.append)
    assert done == [] and total == []  # sizes only: nothing is read


def _with_terminal_stderr(args) -> tuple[int, str, bytes]:
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "trainready", "ckpt", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read().decode()
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, out, seen


def test_progress_bar_on_a_terminal_only(tmp_path):
    root = tmp_path / "big"
    write_ckpt(root, 5, files={"__0_0.distcp": 24 << 20, ".metadata": 10})
    code, out, seen = _with_terminal_stderr(["pull", root, "--to", tmp_path / "out"])
    assert code == 0 and out.startswith(f"pulled {checkpoint_name(5, 1)}")
    assert b"pulling" in seen and b"25.2/25.2 MB" in seen
    code, out, seen = _with_terminal_stderr(["verify", root])
    assert code == 0 and b"verifying (SHA-256)" in seen and b"25.2/25.2 MB" in seen
    code, out, seen = _with_terminal_stderr(["verify", root, "--json"])
    assert code == 0 and json.loads(out)["ok"] is True and seen == b""


def test_names_with_brackets_and_unicode_print_as_written(tmp_path):
    """`ckpt ls '/tmp/[x]'` must name and list [x], not x; run ids print as written."""
    for place in ("x", "[x]"):
        write_ckpt(tmp_path / place, 100 if place == "x" else 7)
    base = tmp_path / "[x]" / checkpoint_name(7, 1)
    manifest = json.loads((base / MANIFEST).read_text())
    manifest["run_id"] = "[bold]run[/] 训练-é"
    (base / MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "[x]" / "writer.json").write_text(json.dumps({"run_id": "[bold]run[/] 训练-é", "generation": 1}))
    for url in (tmp_path / "[x]", f"file://{tmp_path}/[x]"):
        shown = cli("ls", url)
        assert shown.returncode == 0 and shown.stdout.startswith(f"Checkpoints in {url} (")
        rows = [row.split() for row in shown.stdout.splitlines() if row.startswith(" ") and row.strip()]
        steps = [row[0] for row in rows if row[0].isdigit()]
        assert steps == ["7"] and "[bold]run[/] 训练-é" in shown.stdout
    assert cli_json("ls", tmp_path / "[x]")["checkpoints"][0]["run_id"] == "[bold]run[/] 训练-é"
    pruned = cli("prune", tmp_path / "[x]", "--keep", "1", "--dry-run")
    assert pruned.returncode == 0 and pruned.stdout.startswith("would delete 0: nothing\nkept 1: ")
    missing = cli("ls", tmp_path / "[y]")
    assert missing.stderr == f"error: {tmp_path}/[y]: no such directory; nearest: {tmp_path}/[x]\n"


def test_prune_output_without_a_lease_never_says_none(tmp_path):
    root = tmp_path / "c"
    write_ckpt(root, 10)
    (root / checkpoint_name(20, 1)).mkdir()
    (root / checkpoint_name(20, 1) / MANIFEST).write_text("{not json")
    proc = cli("prune", root, "--keep", "1")
    assert proc.returncode == 0
    assert ("never deleted automatically (unreadable manifest, fenced commit, or of another run than run-a): "
            f"{checkpoint_name(20, 1)}") in proc.stdout


def test_a_damaged_lease_is_said_in_the_listing(store):
    problem = f"{store}/writer.json is damaged (run_id: Field required (+1 more))"  # the fixture's is "{}"
    assert cli_json("ls", store)["lease_problem"] == problem
    (store / "writer.json").write_text("{torn")
    shown = cli("ls", store)
    assert shown.returncode == 0
    assert (f"warning: {store}/writer.json is damaged (top level: Invalid JSON: key must be a string at line 1 "
            "column 2) (a job rebuilds it at its next start)") in " ".join(shown.stdout.split())


def test_unreadable_manifests_say_what_is_wrong(tmp_path):
    """A manifest without schema_version read "manifest schema_version None"."""
    root = tmp_path / "c"
    cases = {1: ("{}", "manifest has no schema_version (this trainready reads 1)"),
             2: ("[1]", "manifest is a JSON list, not an object"),
             3: ('{"schema_version": 7}', "manifest schema_version 7, this trainready reads 1"),
             4: ('{"schema_version": 1}', "step: Field required (+9 more)")}
    for step, (text, _why) in cases.items():
        (root / checkpoint_name(step, 1)).mkdir(parents=True)
        (root / checkpoint_name(step, 1) / MANIFEST).write_text(text)
    listed = cli_json("ls", root)["checkpoints"]
    assert [(c["status"], c["problem"]) for c in listed] == [("unreadable", f"manifest unreadable: {why}")
                                                             for _text, why in cases.values()]
    human = cli("ls", root)  # (cli() fails any human output with a Python None in it)
    assert human.returncode == 0 and "4 unreadable" in human.stdout


def test_plain_dcp_example_in_docs(tmp_path, monkeypatch):
    """docs/store.md's example loads a checkpoint the manager saved with plain DCP: every tensor,
    the optimizer's param_groups, the scheduler and the data position come back."""
    torch = pytest.importorskip("torch")
    from trainready.store import CheckpointManager, CheckpointManagerOptions, Position, training_state

    doc = (Path(__file__).resolve().parents[1] / "docs" / "store.md").read_text()
    block = re.search(r"```python\n(.*?)```", doc.split("## Reading a checkpoint without trainready", 1)[1], re.S)

    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
        return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 10)

    model, optimizer, scheduler = build(0)
    for _ in range(3):
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    monkeypatch.chdir(tmp_path)
    with CheckpointManager(options=CheckpointManagerOptions(async_save=False), hot="pulled") as mgr:
        mgr.save(1500, training_state(model, optimizer, scheduler, position=Position(epoch=1, index=40960)))
    index = json.loads((tmp_path / "pulled" / checkpoint_name(1500, 1) / "tensors.json").read_text())["tensors"]
    assert sorted(index) == sorted([f"model/{k}" for k in model.state_dict()]
                                   + [f"optimizer/state/{k}/{s}" for k in model.state_dict()
                                      for s in ("step", "exp_avg", "exp_avg_sq")])
    fresh = dict(zip(("model", "optimizer", "scheduler"), build(1), strict=True))
    exec(compile(block.group(1), "docs/store.md", "exec"), fresh)
    for (name, want), got in zip(model.state_dict().items(), fresh["model"].state_dict().values(), strict=True):
        assert torch.equal(want, got), name
    want, got = optimizer.state_dict(), fresh["optimizer"].state_dict()
    for param, stats in want["state"].items():
        for stat_name, value in stats.items():
            assert torch.equal(value, got["state"][param][stat_name]), (param, stat_name)
    assert got["param_groups"] == want["param_groups"] and got["param_groups"][0]["betas"] == (0.8, 0.95)
    assert fresh["scheduler"].state_dict() == scheduler.state_dict()
    assert fresh["position"] == {"epoch": 1, "index": 40960, "extra": {}}


# --- issue 12, second review ---------------------------------------------------------------------


def test_an_empty_location_or_target_never_means_the_current_directory(store, tmp_path):
    """`cd ckpts; ckpt prune '' --keep 3` pruned the current directory (an unset shell variable);
    `ls ''` listed it, `pull --to ''` copied into it."""
    before = sorted(os.listdir(store))
    empty = ("error: empty location '': name a checkpoint directory or URL (an empty path is never taken to mean "
             "the current directory; write . for that)\n")
    for cmd, *rest in [("ls",), ("ls", "--verify"), ("verify",), ("prune", "--keep", "1"),
                       ("prune", "--keep", "1", "--yes"), ("pull", "--to", tmp_path / "out")]:
        for url in ("", "file://"):
            proc = cli(cmd, url, *rest, cwd=store)
            assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", empty.replace("''", repr(url))), (
                cmd, url, proc.stdout, proc.stderr)
    proc = cli("pull", store, "--to", "", cwd=store)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("error: --to is empty: name the directory to copy into (an empty path is never taken to "
                           "mean the current directory; write . for that)\n")
    assert sorted(os.listdir(store)) == before and not (tmp_path / "out").exists()
    assert [c["step"] for c in cli_json("ls", ".", cwd=store)["checkpoints"]] == [100, 150, 200, 300, 400]


def _damaged_store(root: Path) -> None:
    """steps 20 and 80 intact; 40's manifest is torn JSON; 60 is a symlink to a checkpoint elsewhere."""
    for step in (20, 40, 80):
        write_ckpt(root, step)
    write_ckpt(root.parent / "elsewhere", 60)
    (root / checkpoint_name(60, 1)).symlink_to(root.parent / "elsewhere" / checkpoint_name(60, 1))
    (root / checkpoint_name(40, 1) / MANIFEST).write_text("{")


def test_damage_is_exit_1_wherever_it_is_found(tmp_path):
    """`verify` exited 1 for a torn manifest or a symlinked checkpoint but `verify --step 60` on the
    symlink exited 2 ("not committed"), and `ls --verify` exited 0: damage is exit 1 everywhere;
    exit 2 is for a step with no checkpoint at all."""
    root = tmp_path / "h2"
    _damaged_store(root)
    link, torn = checkpoint_name(60, 1), checkpoint_name(40, 1)
    report = cli_json("verify", root, code=1)
    assert [(c["step"], c["ok"], c["status"]) for c in report["checkpoints"]] == [
        (20, True, "committed"), (40, False, "unreadable"), (60, False, "unreadable"), (80, True, "committed")]
    for step, name, problem in [(60, link, "a symlink, not a checkpoint directory"),
                                (40, torn, "manifest unreadable: Expecting property name enclosed in double quotes: "
                                           "line 1 column 2 (char 1)")]:
        named = cli_json("verify", root, "--step", step, code=1)
        assert [(c["name"], c["ok"], c["problems"]) for c in named["checkpoints"]] == [(name, False, [problem])]
        assert named["ok"] is False
        proc = cli("pull", root, "--step", step, "--to", tmp_path / "out")
        assert (proc.returncode, proc.stdout) == (1, "")
        assert proc.stderr == (f"error: step {step} in {root} is damaged ({name}: {problem}); nothing was pulled; "
                               "nearest committed steps: 20 (before), 80 (after)\n")
    assert cli("verify", root, "--step", 60).returncode == 1  # human output too
    listed = cli_json("ls", root, "--verify", code=1)["checkpoints"]
    assert [(c["step"], c["verified"]) for c in listed] == [(20, True), (40, False), (60, False), (80, True)]
    human = cli("ls", root, "--verify")
    assert human.returncode == 1 and "2 unreadable" in human.stdout
    assert [line.split()[3] for line in human.stdout.splitlines() if line.split()[:1] in (["40"], ["60"])] == [
        "damaged", "damaged"]
    assert cli("ls", root).returncode == 0  # without --verify nothing is checked
    missing = cli("verify", root, "--step", 50)
    assert (missing.returncode, missing.stderr) == (
        2, f"error: no checkpoint at step 50 in {root}; nearest committed steps: 20 (before), 80 (after)\n")
    assert not (tmp_path / "out").exists()


def test_an_unreadable_checkpoint_directory_named_by_step_is_damage(store, shared_tmp):
    root = shared_tmp / "ckpts"
    shutil.copytree(store, root)
    _walk_modes(root)
    (root / names(200)[0]).chmod(0)
    report = cli_json("verify", root, "--step", 200, code=1, unprivileged=True)
    assert [(c["name"], c["problems"]) for c in report["checkpoints"]] == [
        (names(200)[0], ["directory unreadable: Permission denied"])]
    assert cli_json("ls", root, "--verify", code=1, unprivileged=True)["checkpoints"][2]["verified"] is False


def test_prune_with_an_unknown_run_id_is_a_usage_error(store):
    """`prune --run-id nope` said "would delete 0" with exit 0: a typo looked like nothing to do."""
    before = sorted(os.listdir(store))
    for extra in ((), ("--dry-run",)):
        proc = cli("prune", store, "--keep", "1", "--run-id", "run-b", *extra)
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr == (f"error: --run-id 'run-b': no checkpoint of that run in {store}; runs found: 'run-a' "
                               "(nearest: 'run-a')\n")
    proc = cli("prune", store, "--keep", "1", "--run-id", "nope")
    assert proc.stderr == f"error: --run-id 'nope': no checkpoint of that run in {store}; runs found: 'run-a'\n"
    empty = cli("prune", store, "--keep", "1", "--run-id", "")
    assert (empty.returncode, empty.stderr) == (2, "error: --run-id '' is empty: name the run whose checkpoints to "
                                                   "prune, or leave it out for the run the writer lease names\n")
    assert sorted(os.listdir(store)) == before
    assert cli_json("prune", store, "--keep", "1", "--run-id", "run-a")["deleted"] == names(100, 150, 200)


@pytest.mark.parametrize("cmd", [("ls",), ("verify",), ("prune", "--keep", "1", "--yes"), ("pull", "--to", "out")])
def test_an_invalid_bucket_name_is_one_line(cmd, tmp_path):
    """botocore's "Parameter validation failed:" with its regexes was passed through."""
    cmd, *rest = cmd
    env = {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    proc = subprocess.run([sys.executable, "-m", "trainready", "ckpt", cmd, "s3://Bad_Bucket!/x", *rest],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL,
                          env={"PATH": "/usr/bin:/bin", **env})
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == ("error: s3://Bad_Bucket!/x: invalid bucket name 'Bad_Bucket!': S3 bucket names are 3-63 "
                           "characters of lowercase letters, digits, dots and hyphens, starting and ending with a "
                           "letter or digit\n")
    assert os.listdir(tmp_path) == []


def test_bucket_names():
    from trainready.errors import UsageError
    from trainready.io.urls import bucket_name_problem, validate_bucket

    for url in ("s3://my-bucket/x", "s3://Old_Bucket/x", "s3a://b.c-1", "file:///x", "gs://Any_Thing!/x",
                "s3://arn:aws:s3:us-west-2:123456789012:accesspoint/ap/x"):
        validate_bucket(url)  # botocore sends these (or they are no S3 URL at all)
    for url, why in [("s3://a!b/x", "invalid bucket name 'a!b'"), ("s3://x\x1b[2J/k", r"invalid bucket name 'x\x1b[2J'"),
                     (f"s3://{'a' * 256}", "invalid bucket name"), ("s3:///x", "no bucket in the URL")]:
        with pytest.raises(UsageError, match=re.escape(why)):
            validate_bucket(url)
    assert [bucket_name_problem(b) == "" for b in ("my-bucket", "a.b.c", "Old_Bucket", "ab", "a..b", "1.2.3.4",
                                                   "-ab")] == [True, True, False, False, False, False, False]


def test_ls_never_folds_a_run_id(tmp_path):
    """At 80 columns a 12-character run id folded onto two lines while other columns kept padding."""
    root = tmp_path / "r"
    for step in (20, 40, 1_000_000):
        base = write_ckpt(root, step, nodes=4)
        manifest = Manifest.from_bytes((base / MANIFEST).read_bytes()).model_copy(update={"run_id": "d249b2ce2f64"})
        (base / MANIFEST).write_bytes(manifest.to_bytes())
    for columns, dropped in [(80, ""), (60, "not shown in 60 columns: check, files"),
                             (50, "not shown in 50 columns: check, files, age, gen")]:
        human = cli("ls", root, env={"COLUMNS": str(columns)})
        assert human.returncode == 0
        rows = [line for line in human.stdout.splitlines() if line.split()[:1] in (["20"], ["40"], ["1,000,000"])]
        assert len(rows) == 3 and all(line.rstrip().endswith("d249b2ce2f64") for line in rows), human.stdout
        assert max(map(len, human.stdout.splitlines())) <= columns, human.stdout
        assert dropped in " ".join(human.stdout.split())
    verified = cli("ls", root, "--verify", env={"COLUMNS": "80"})
    assert all("size ok" in line and line.rstrip().endswith("d249b2ce2f64")
               for line in verified.stdout.splitlines() if line.split()[:1] == ["40"])


def test_a_failed_pull_removes_the_directories_it_created(store, tmp_path):
    """A pull that failed its checksum check left an empty --to directory (and its parents) behind."""
    target = tmp_path / "new" / "a" / "b"
    proc = cli("pull", store, "--step", 200, "--to", target)
    assert proc.returncode == 1 and "checksum mismatch" in proc.stderr
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    assert cli("pull", store, "--step", 200, "--to", tmp_path / "mine" / "sub").returncode == 1
    assert os.listdir(tmp_path / "mine") == []  # it existed before: kept
    assert cli("pull", store, "--step", 200, "--to", tmp_path / "mine").returncode == 1
    assert (tmp_path / "mine").is_dir()
    assert cli_json("pull", store, "--step", 300, "--to", target)["path"] == str(target / names(300)[0])
