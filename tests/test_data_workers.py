"""DataLoader workers: the data package's errors keep their type when torch re-raises them from a
worker, and worker_context() starts workers from a forkserver that has torch preloaded."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from test_data_stream import corrupt, pack, texts
from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from trainready.data import CorruptShardError, MissingShardError, ShardedDataset, worker_context
from trainready.data.errors import ERRORS, CacheFullError, ShardError, worker_message
from trainready.data.format import IndexFieldError, shard_name
from trainready.data.workers import preload_modules

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's, not ours
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """300 samples in shards of 70, 90, 83 and 57: shard 1 corrupt (one flipped byte)."""
    root = tmp_path_factory.mktemp("damaged")
    pack(root, texts(300))
    corrupt(root, 1)
    return root


@pytest.mark.parametrize("loader_class", [DataLoader, StatefulDataLoader])
def test_a_corrupt_shard_in_a_worker_is_a_corrupt_shard_error(damaged, loader_class):
    ds = ShardedDataset(damaged, rank=0, world_size=1, shuffle=False)
    loader = loader_class(ds, batch_size=None, num_workers=2, multiprocessing_context=worker_context())
    with pytest.raises(CorruptShardError) as caught:  # worker 1 reads samples 150-299: shard 1's tail first
        for _ in loader:
            pass
    err = caught.value
    assert (err.name, err.url) == (shard_name(1), str(damaged / shard_name(1)))
    assert err.why.startswith("is corrupt: sha256 ")
    assert str(err).startswith(f"DataLoader worker 1: shard {shard_name(1)} ({damaged / shard_name(1)}) is corrupt: ")
    assert "\n" not in str(err) and "Traceback (most recent call last)" in err.worker_traceback
    skipping = ShardedDataset(damaged, rank=0, world_size=1, shuffle=False, on_corrupt="skip")
    got = list(loader_class(skipping, batch_size=None, num_workers=2, multiprocessing_context=worker_context()))
    assert len(got) == 300 - 90  # only shard 1's samples are lost


def test_a_missing_shard_in_a_worker_is_a_missing_shard_error(tmp_path):
    pack(tmp_path, texts(300))
    (tmp_path / shard_name(2)).unlink()
    ds = ShardedDataset(tmp_path, rank=0, world_size=1, shuffle=False)
    with pytest.raises(MissingShardError) as caught:
        list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=worker_context()))
    assert (caught.value.name, caught.value.url) == (shard_name(2), str(tmp_path / shard_name(2)))
    assert str(caught.value).startswith(f"DataLoader worker 1: shard {shard_name(2)} ")


def made(cls: type) -> BaseException:
    """One real instance of each error class, built as the code that raises it does."""
    if cls is CorruptShardError:
        return CorruptShardError(shard_name(2), "s3://b/ds/shards/shard-000002.tar", "sha256 abc where index.json says def")
    if cls is MissingShardError:
        return MissingShardError(shard_name(2), "s3://b/ds/shards/shard-000002.tar")
    if cls is ShardError:
        return ShardError(shard_name(2), "/data/ds/shards/shard-000002.tar", "is odd")
    if cls is CacheFullError:
        return CacheFullError("shard cache /c stayed full for 600s: 10 of 10 bytes in use")
    return IndexFieldError(("shards", 3, "name"), "x.tar", "listed twice")


@pytest.mark.parametrize("cls", [*ERRORS, IndexFieldError], ids=lambda c: c.__name__)
def test_every_error_class_survives_pickling_and_torchs_reraise(cls):
    original = made(cls)
    fields = {k: v for k, v in vars(original).items() if k != "worker_traceback"}
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is cls and str(copy) == str(original)
    assert {k: v for k, v in vars(copy).items() if k != "worker_traceback"} == fields
    try:
        raise original
    except cls:
        wrapped = ExceptionWrapper(sys.exc_info(), where="in DataLoader worker process 3")
    with pytest.raises(cls) as caught:  # exactly what the DataLoader does in the main process
        wrapped.reraise()
    assert type(caught.value) is cls and str(caught.value) == f"DataLoader worker 3: {original}"
    if isinstance(original, ShardError):
        assert (caught.value.name, caught.value.url, caught.value.why) == (original.name, original.url, original.why)
    assert pickle.loads(pickle.dumps(caught.value)).args == caught.value.args


def test_worker_message_leaves_other_text_alone():
    assert worker_message("shard x is odd", "ShardError") == ("shard x is odd", None)


def test_preload_list_names_the_data_stack_and_a_main_module(monkeypatch):
    names = preload_modules("my_collate")
    assert names[0] == "__main__" and names[-1] == "my_collate"
    assert {"torch", "torch.utils.data", "trainready.data.dataset", "torchdata.stateful_dataloader"} <= set(names)
    main = type(sys)("__main__")
    main.__spec__ = type("Spec", (), {"name": "pkg.train"})()
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert preload_modules()[:2] == ["__main__", "pkg.train"]  # `python -m pkg.train`: its imports, once


CHILD_SEES_TORCH = """
import multiprocessing, sys
from trainready.data import worker_context
context = worker_context() if sys.argv[1] == "preload" else multiprocessing.get_context("forkserver")
child = context.Process(target=exec, args=("import sys; sys.exit(0 if 'torch' in sys.modules else 7)",))
child.start(); child.join(); print(child.exitcode)
"""


@pytest.mark.parametrize(("mode", "exitcode"), [("preload", 0), ("bare", 7)])
def test_workers_start_with_torch_already_imported(mode, exitcode):
    """A worker from worker_context()'s forkserver has torch in memory before it runs anything; one from a
    bare forkserver does not (it imports torch itself, on every DataLoader iter())."""
    proc = subprocess.run([sys.executable, "-c", CHILD_SEES_TORCH, mode], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(exitcode)]


KILLED_OWNER = """
import multiprocessing.forkserver as forkserver, sys, time
from torch.utils.data import DataLoader
from trainready.data import ShardedDataset, worker_context

if __name__ == "__main__":
    loader = DataLoader(ShardedDataset(sys.argv[1], rank=0, world_size=1, shuffle=False), batch_size=None,
                        num_workers=2, multiprocessing_context=worker_context())
    it = iter(loader)
    next(it)
    print(forkserver._forkserver._forkserver_pid, *(w.pid for w in it._workers), flush=True)
    time.sleep(600)
"""


def test_workers_and_their_forkserver_end_when_the_training_process_is_killed(tmp_path):
    """A forkserver-started worker is the forkserver's child, so torch's watchdog (is my parent alive?) never fired
    and the forkserver waited on its workers: a SIGKILLed training process left all of them running (about 250 MB
    each), one more set after every restart. Each worker now watches the process that started it."""
    from run_helpers import alive, wait_for

    pack(tmp_path / "ds", texts(300))
    (tmp_path / "train.py").write_text(KILLED_OWNER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "train.py"), str(tmp_path / "ds")], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3 and all(alive(p) for p in pids), pids
    finally:
        proc.kill()
        proc.wait(timeout=30)
    wait_for(lambda: not any(alive(p) for p in pids), 20, f"forkserver and workers {pids} to exit after the kill")


def _pickled_in_a_process_that_exits(root: str) -> bytes:
    return pickle.dumps(ShardedDataset(root, rank=0, world_size=1, shuffle=False))


def test_a_dataset_pickled_by_a_process_that_is_gone_still_feeds_fork_workers(tmp_path):
    """Review: a pid carried inside the pickled dataset tied fork-started workers to the process that pickled it
    (a pool, torch.save, an mp.Queue producer): they exited with 1 when it was gone. Workers watch the process
    that started them instead."""
    import multiprocessing

    pack(tmp_path, texts(300))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        blob = pool.apply(_pickled_in_a_process_that_exits, (str(tmp_path),))
    ds = pickle.loads(blob)
    for context in ("fork", worker_context()):
        assert len(list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context))) == 300
