"""Checkpoints written by an attacker: nothing on a restore, verify, ls, pull or prune path runs
code. Each crafted pickle below creates a sentinel file when Python's pickle loads it (checked
first, so the corpus is live ammunition); planted in a checkpoint with the manifest rewritten to
match (checksums do not help: whoever writes the archive writes the manifest), none may create
its sentinel here, each is refused with an error naming the file, and restore falls back to the
previous checkpoint."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from trainready.store import CheckpointManager, CheckpointManagerOptions
from trainready.store.dcp_io import read_index
from trainready.store.errors import CheckpointError
from trainready.store.inspect import list_checkpoints, prune, pull, verify_checkpoints
from trainready.store.manifest import MANIFEST, FileEntry, Manifest, checkpoint_name

SRC = Path(__file__).resolve().parents[1] / "src"


# ---- a tiny pickle assembler (raw opcodes: payloads real objects could not express) ----------

def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def _g(module: str, name: str) -> bytes:  # STACK_GLOBAL
    return _s(module) + _s(name) + b"\x93"


def _call(func: bytes, *args: bytes) -> bytes:  # func(*args) via REDUCE
    return func + b"(" + b"".join(args) + b"tR"


def _p4(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


def _list(*items: bytes) -> bytes:
    return b"](" + b"".join(items) + b"e"


def corpus(sentinel_dir: Path) -> dict[str, bytes]:
    """name -> a pickle that creates sentinel_dir/<name> when unpickled."""
    out = {}

    def cmd(name: str) -> str:
        return f"touch {sentinel_dir / name}"

    def popen(name: str) -> bytes:
        return _list(_s("sh"), _s("-c"), _s(cmd(name)))

    fs, md = "torch.distributed.checkpoint.filesystem", "torch.distributed.checkpoint.metadata"
    chain = "torch._strobelight.cli_function_profiler.subprocess.Popen"
    out["dotted_filesystem_popen"] = _p4(_call(_g(fs, chain), popen("dotted_filesystem_popen")))
    out["dotted_filesystem_os_system"] = _p4(_call(_g(fs, "os.system"), _s(cmd("dotted_filesystem_os_system"))))
    out["dotted_metadata_popen"] = _p4(_call(_g(md, chain), popen("dotted_metadata_popen")))
    out["dotted_metadata_os_system"] = _p4(_call(_g(md, "os.system"), _s(cmd("dotted_metadata_os_system"))))
    out["dotted_torch_popen"] = _p4(_call(_g("torch", chain.removeprefix("torch.")), popen("dotted_torch_popen")))
    out["dotted_serialization_os"] = _p4(_call(_g("torch.serialization", "os.system"), _s(cmd("dotted_serialization_os"))))
    out["dotted_pathlib_os"] = _p4(_call(_g("pathlib", "os.system"), _s(cmd("dotted_pathlib_os"))))
    out["os_system"] = _p4(_call(_g("os", "system"), _s(cmd("os_system"))))
    out["posix_system"] = b"\x80\x02cposix\nsystem\n(" + _s(cmd("posix_system")) + b"tR."
    code = f"__import__('os').system({cmd('builtins_exec')!r})"
    out["builtins_exec"] = _p4(_call(_g("builtins", "exec"), _s(code)))
    code = f"__import__('os').system({cmd('builtins_eval')!r})"
    out["builtins_eval"] = _p4(_call(_g("builtins", "eval"), _s(code)))
    imported = _call(_g("builtins", "__import__"), _s("os"))
    system = _call(_g("builtins", "getattr"), imported, _s("system"))
    out["getattr_import_chain"] = _p4(system + b"(" + _s(cmd("getattr_import_chain")) + b"tR")
    out["protocol0_inst"] = b"(S'" + cmd("protocol0_inst").encode() + b"'\nios\nsystem\n."
    out["protocol0_obj"] = b"(cos\nsystem\nS'" + cmd("protocol0_obj").encode() + b"'\no."
    # NEWOBJ of an allowed class, BUILD {'__setstate__': os.system}, BUILD again: calls os.system(state)
    out["newobj_build_setstate"] = _p4(_g(md, "Metadata") + b")\x81" + b"}" + _s("__setstate__") + _g("os", "system")
                                      + b"sb" + _s(cmd("newobj_build_setstate")) + b"b")
    out["subprocess_popen"] = _p4(_call(_g("subprocess", "Popen"), popen("subprocess_popen")))
    out["subprocess_run"] = _p4(_call(_g("subprocess", "run"), popen("subprocess_run")))
    out["subprocess_check_output"] = _p4(_call(_g("subprocess", "check_output"), popen("subprocess_check_output")))
    out["subprocess_getoutput"] = _p4(_call(_g("subprocess", "getoutput"), _s(cmd("subprocess_getoutput"))))
    return out


# ---- checkpoints to plant them in ------------------------------------------------------------

def _state(value: float) -> dict:
    return {"model": {"w": torch.full((8, 4), value), "b": torch.arange(3)}}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    hot = tmp_path_factory.mktemp("base") / "hot"
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False, keep_hot=5)) as mgr:
        mgr.save(1, _state(1.0))
        mgr.save(2, _state(2.0))
    return hot


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> set[str]:
    """The payloads that create their sentinel under Python's own pickle.loads (in a child process)."""
    where = tmp_path_factory.mktemp("live")
    sentinels = where / "sentinels"
    sentinels.mkdir()
    payloads = corpus(sentinels)
    (where / "corpus.json").write_text(json.dumps({k: v.hex() for k, v in payloads.items()}))
    script = ("import json, pickle, sys\n"
              "for name, blob in json.load(open(sys.argv[1])).items():\n"
              "    try: pickle.loads(bytes.fromhex(blob))\n"
              "    except BaseException: pass\n")
    subprocess.run([sys.executable, "-c", script, str(where / "corpus.json")], timeout=120, check=True,
                   env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, capture_output=True)
    import time

    time.sleep(0.5)  # Popen payloads run their shell asynchronously
    return {p.name for p in sentinels.iterdir()}


def rewrite(directory: Path, files: dict[str, bytes | None]) -> None:
    """Replace (bytes) or remove (None) files of a committed checkpoint and make its manifest match."""
    manifest = Manifest.from_bytes((directory / MANIFEST).read_bytes())
    for name, data in files.items():
        if data is None:
            (directory / name).unlink(missing_ok=True)
        else:
            (directory / name).write_bytes(data)

    def fix(entries: list[FileEntry]) -> list[FileEntry]:
        out = []
        for entry in entries:
            if entry.path in files:
                data = files[entry.path]
                if data is None:
                    continue
                entry = FileEntry(path=entry.path, size=len(data), sha256=hashlib.sha256(data).hexdigest())
            out.append(entry)
        for name, data in files.items():
            if data is not None and name not in {e.path for e in out}:
                out.append(FileEntry(path=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
        return out

    manifest = manifest.model_copy(update={"files": fix(manifest.files),
                                           "node_files": {n: fix(v) for n, v in manifest.node_files.items()}})
    (directory / MANIFEST).write_bytes(manifest.to_bytes())


def _plant(base: Path, tmp_path: Path, files: dict[str, bytes | None]) -> Path:
    hot = tmp_path / "hot"
    shutil.copytree(base, hot)
    rewrite(hot / checkpoint_name(2, 1), files)
    return hot


NAMES = sorted(corpus(Path("/x")))


def test_the_corpus_is_live_ammunition(live):
    assert live == set(NAMES), f"payloads that did nothing under pickle.loads: {sorted(set(NAMES) - live)}"


@pytest.mark.parametrize("name", NAMES)
def test_a_crafted_tensor_index_never_runs_and_restore_falls_back(name, base, tmp_path, caplog):
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    payload = corpus(sentinels)[name]
    # a checkpoint in the format before tensors.json: its index is .metadata, which is read as data
    hot = _plant(base, tmp_path, {"tensors.json": None, ".metadata": payload})
    with pytest.raises(CheckpointError, match=r"\.metadata"):
        read_index(hot / checkpoint_name(2, 1))
    loaded = _state(0.0)
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        result = mgr.restore_details(loaded)
    assert result.step == 1 and torch.equal(loaded["model"]["w"], _state(1.0)["model"]["w"])
    assert ".metadata" in result.skipped[0] and checkpoint_name(2, 1) in result.skipped[0]
    # the checkpoint tools never read the index: they must not run it either
    assert verify_checkpoints(str(hot)).ok
    assert [c.status for c in list_checkpoints(str(hot), verify=True).checkpoints][-2:] == ["committed"] * 2
    pull(str(hot), 2, tmp_path / "pulled")
    prune(str(hot), keep=1, dry_run=True)
    assert not list(sentinels.iterdir())


def test_archived_crafted_checkpoints_are_refused_after_download(base, tmp_path):
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    archive = _plant(base, tmp_path, {"tensors.json": None, ".metadata": corpus(sentinels)["dotted_filesystem_popen"]})
    loaded = _state(0.0)
    with CheckpointManager(tmp_path / "fresh-node", str(archive), options=CheckpointManagerOptions(async_save=False)) as mgr:
        result = mgr.restore_details(loaded)
    assert (result.step, result.tier) == (1, "archive") and "step-000000000002" in result.skipped[0]
    assert not list(sentinels.iterdir())


def test_a_crafted_dcp_metadata_beside_a_valid_json_index_is_never_read(base, tmp_path):
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    hot = _plant(base, tmp_path, {".metadata": corpus(sentinels)["os_system"]})
    loaded = _state(0.0)
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(loaded) == 2
    assert torch.equal(loaded["model"]["w"], _state(2.0)["model"]["w"]) and not list(sentinels.iterdir())


def test_checkpoints_from_before_the_json_index_still_restore(base, tmp_path):
    hot = _plant(base, tmp_path, {"tensors.json": None})  # DCP's own .metadata, decoded as data
    loaded = _state(0.0)
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(loaded) == 2
    assert torch.equal(loaded["model"]["w"], _state(2.0)["model"]["w"])
    assert torch.equal(loaded["model"]["b"], torch.arange(3))


def _record_with(pkl: bytes) -> bytes:
    """A torch.save record of a tensor whose data.pkl is replaced by `pkl`."""
    buf = io.BytesIO()
    torch.save(torch.ones(8, 4), buf)
    source = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = pkl if info.filename.endswith("data.pkl") else source.read(info)
            target.writestr(info.filename, data)
    return out.getvalue()


@pytest.mark.parametrize("name", ["os_system", "dotted_filesystem_popen", "newobj_build_setstate", "protocol0_inst"])
def test_a_crafted_tensor_record_never_runs(name, base, tmp_path):
    """The tensor data files hold torch.save records, each with a pickle; torch.load would run it."""
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    record = _record_with(corpus(sentinels)[name])
    index = json.loads((base / checkpoint_name(2, 1) / "tensors.json").read_bytes())
    for entry in index["storage"]:
        entry.update(file="__0_0.distcp", at=0, length=len(record))
    hot = _plant(base, tmp_path, {"__0_0.distcp": record, "tensors.json": json.dumps(index).encode()})
    loaded = _state(0.0)
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        result = mgr.restore_details(loaded)
    assert result.step == 1 and "__0_0.distcp" in result.skipped[0]
    assert not list(sentinels.iterdir())
    torch.load(io.BytesIO(record), weights_only=False)  # the same record under a naive loader: it runs
    import time

    time.sleep(0.3)
    assert list(sentinels.iterdir())


@pytest.mark.parametrize("change, why", [
    (lambda ix: ix["storage"][0].update(file="../../../../etc/passwd"), "file"),
    (lambda ix: ix["storage"][0].update(file="/etc/passwd"), "file"),
    (lambda ix: ix["storage"][0].update(length=1 << 40), "bytes"),
    (lambda ix: ix["storage"][0].update(at=-1), "at"),
    (lambda ix: ix["tensors"][next(iter(ix["tensors"]))].update(dtype="object"), "dtype"),
    (lambda ix: ix["tensors"][next(iter(ix["tensors"]))]["chunks"][0].update(sizes=[99, 99]), "outside"),
    (lambda ix: ix.update(schema_version=2), "schema_version"),
    (lambda ix: ix["storage"].append(dict(ix["storage"][0], fqn="ghost")), "ghost"),
])
def test_a_tensor_index_is_validated_field_by_field(change, why, base, tmp_path):
    index = json.loads((base / checkpoint_name(2, 1) / "tensors.json").read_bytes())
    change(index)
    hot = _plant(base, tmp_path, {"tensors.json": json.dumps(index).encode()})
    with pytest.raises(CheckpointError, match=why):
        read_index(hot / checkpoint_name(2, 1))
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(_state(0.0)) == 1


def test_a_symlinked_data_file_is_refused(base, tmp_path):
    hot = _plant(base, tmp_path, {})
    target = hot / checkpoint_name(2, 1) / "__0_0.distcp"
    outside = tmp_path / "outside.bin"
    shutil.copy(target, outside)
    target.unlink()
    target.symlink_to(outside)  # same bytes, same checksum: but a checkpoint never reads outside itself
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        result = mgr.restore_details(_state(0.0))
    assert result.step == 1 and "not a regular file" in result.skipped[0]


# ---- found by attacking the change: each of these hung, exhausted memory or reached outside ----

@pytest.fixture
def alarm():
    """A hang fails the test instead of the suite."""
    import signal

    def boom(*_):
        raise TimeoutError("hung")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_shared_references_in_a_legacy_index_cannot_expand_it(base, tmp_path, alarm):
    """A 1.3 KB .metadata whose MetadataIndex.index is a DAG of shared lists 40 levels deep."""
    import pickle

    from torch.distributed.checkpoint.metadata import MetadataIndex

    md = pickle.loads((base / checkpoint_name(2, 1) / ".metadata").read_bytes())
    dag: list = [0, 0]
    for _ in range(40):
        dag = [dag, dag]
    key = next(k for k in md.storage_data if k.fqn == "model/w")
    md.storage_data[MetadataIndex(key.fqn, key.offset, dag)] = md.storage_data.pop(key)
    hot = _plant(base, tmp_path, {"tensors.json": None, ".metadata": pickle.dumps(md, protocol=4)})
    with pytest.raises(CheckpointError, match=r"\.metadata"):
        read_index(hot / checkpoint_name(2, 1))


def test_an_index_cannot_make_restore_allocate_what_it_does_not_store(base, tmp_path):
    """A tensor the live state lacks is allocated from the index: 2 GiB declared, 1.5 KB stored."""
    index = json.loads((base / checkpoint_name(2, 1) / "tensors.json").read_bytes())
    first = index["storage"][0]
    index["tensors"]["model/huge"] = {"dtype": "float32", "size": [1 << 29], "requires_grad": False,
                                      "chunks": [{"offsets": [0], "sizes": [1 << 29]}]}
    index["storage"].append(dict(first, fqn="model/huge", offset=[0]))
    state = json.loads((base / checkpoint_name(2, 1) / "state.json").read_bytes())
    state["model"]["huge"] = {"__tensor__": "model/huge"}
    hot = _plant(base, tmp_path, {"tensors.json": json.dumps(index).encode(), "state.json": json.dumps(state).encode()})
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        result = mgr.restore_details(_state(0.0))
    assert result.step == 1 and "stores" in result.skipped[0]


def test_a_record_cannot_expand_into_more_elements_than_it_stores(tmp_path):
    from trainready.store.tensor_records import RecordError, read_record

    buf = io.BytesIO()
    torch.save(torch.ones(1).expand(1 << 20), buf)  # stride 0: one stored element viewed a million times
    buf.seek(0)
    with pytest.raises(RecordError, match="expanded"):
        read_record(buf)


def test_files_the_manifest_does_not_vouch_for_are_never_read(base, tmp_path, alarm):
    """A FIFO planted as tensors.json (unlisted, so verification never looks at it) hung restore."""
    import os

    hot = _plant(base, tmp_path, {"tensors.json": None})  # the manifest now lists no tensors.json
    os.mkfifo(hot / checkpoint_name(2, 1) / "tensors.json")
    loaded = _state(0.0)
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(loaded) == 2  # read through the listed .metadata, decoded as data
    assert torch.equal(loaded["model"]["w"], _state(2.0)["model"]["w"])


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_manifest_that_is_not_a_file_is_unreadable_not_a_hang(kind, base, tmp_path, alarm):
    import os

    hot = tmp_path / "hot"
    shutil.copytree(base, hot)
    manifest = hot / checkpoint_name(2, 1) / MANIFEST
    manifest.unlink()
    os.mkdir(manifest) if kind == "directory" else os.mkfifo(manifest)
    assert {c.name: c.status for c in list_checkpoints(str(hot)).checkpoints}[checkpoint_name(2, 1)] == "unreadable"
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(_state(0.0)) == 1


def test_a_symlinked_checkpoint_directory_is_never_read_or_deleted_through(base, tmp_path):
    """Location A's step-1 is a symlink to location B's: pruning A removed B's manifest."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(base, b)
    a.mkdir()
    shutil.copytree(base / checkpoint_name(2, 1), a / checkpoint_name(2, 1))
    shutil.copy(base / "writer.json", a / "writer.json")
    (a / checkpoint_name(1, 1)).symlink_to(b / checkpoint_name(1, 1))
    statuses = {c.name: c.status for c in list_checkpoints(str(a)).checkpoints}
    assert statuses[checkpoint_name(1, 1)] == "unreadable"
    prune(str(a), keep=1)
    assert (b / checkpoint_name(1, 1) / MANIFEST).exists()
    with CheckpointManager(a, options=CheckpointManagerOptions(async_save=False, keep_hot=1)) as mgr:
        mgr.save(3, _state(3.0))
        mgr.wait()
    assert (b / checkpoint_name(1, 1) / MANIFEST).exists()


def test_pull_never_follows_a_symlinked_file(base, tmp_path):
    hot = _plant(base, tmp_path, {})
    data = hot / checkpoint_name(2, 1) / "__0_0.distcp"
    data.unlink()
    data.symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="not a regular file"):
        pull(str(hot), 2, tmp_path / "to")


def test_generations_past_9999_stay_visible(tmp_path):
    from trainready.store.manifest import LEASE, Lease, parse_name

    hot = tmp_path / "hot"
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        run = mgr.run_id
    (hot / LEASE).write_text(Lease(run_id=run, generation=9999).model_dump_json())
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.generation == 10000
        mgr.save(5, _state(5.0))
    assert parse_name(checkpoint_name(5, 10000)) == (5, 10000) and parse_name("step-000000000005-g00001") is None
    with CheckpointManager(hot, options=CheckpointManagerOptions(async_save=False)) as mgr:
        assert mgr.restore(_state(0.0)) == 5
