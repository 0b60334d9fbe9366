"""`trainready ckpt ls|verify|pull|prune` end to end, on checkpoints written by hand (files plus a
manifest, no CheckpointManager): JSON output, exit codes, and what ends up on disk."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainready.io import sha256_file
from trainready.store.manifest import MANIFEST, FileEntry, Manifest, checkpoint_name

FILES = {"__0_0.distcp": 3000, "__1_0.distcp": 2500, ".metadata": 300, "state/rank-00000.json": 120}
CORRUPT_FILE = "__1_0.distcp"


def cli(*args, env=None, timeout=60):
    proc = subprocess.run([sys.executable, "-m", "trainready", "ckpt", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **(env or {})})
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    return proc


def cli_json(*args, code=0, env=None):
    proc = cli(*args, "--json", env=env)
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
    (("pull", "{store}", "--to", "{tmp}/x"), ["--step"]),
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


# --- S3 (moto's standalone server) --------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def s3_env(tmp_path):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "HOME": str(tmp_path)}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("moto server did not start")
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket="ckpts")
        yield env, client
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def test_s3_archive(store, tmp_path, s3_env):
    env, client = s3_env
    for path in store.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "ckpts", f"run/{path.relative_to(store).as_posix()}")
    url = "s3://ckpts/run"
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
    pruned = cli_json("prune", url, "--keep", "1", env=env)
    assert pruned["deleted"] == names(100, 150, 200)
    left = {o["Key"].split("/")[1] for o in client.list_objects_v2(Bucket="ckpts", Prefix="run/")["Contents"]}
    assert left == set(names(300, 400)) | {"writer.json"}
    shutil.rmtree(tmp_path / "out")
    for args in (("ls",), ("verify",), ("prune", "--keep", "1")):  # a missing bucket is a wrong location, not an empty one
        proc = cli(*args[:1], "s3://no-such-bucket/run", *args[1:], env=env)
        assert proc.returncode == 2 and "does not exist" in proc.stderr, proc.stderr


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
