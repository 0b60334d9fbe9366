"""`trainready run --log-to tensorboard,mlflow,wandb`: real runs (gloo, CPU) whose exporters' files are
read back with each project's own reader: TensorBoard's EventAccumulator, MLflow's MlflowClient on the
SQLite store, and W&B's own protobuf records in the offline run's .wandb file."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from run_helpers import EXIT_FAST, SRC, TINY_GPT, digest, records, run, run_cmd

from trainready.errors import UsageError
from trainready.run.exporters import Exporter, ExportSink, parse_log_to, step_scalars

# the dev extra installs all three; found without importing them (mlflow alone takes seconds to import)
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("tensorboard", "mlflow", "wandb")),
                                reason="needs the tensorboard, mlflow and wandb extras (all in the dev extra)")

TINY = ("--d", "32", "--layers", "1", "--heads", "2", "--batch", "2", "--seq-len", "16")  # seconds, not minutes


# ---- each library's reader ------------------------------------------------------------------------

def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def mlflow_run(run_dir: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}")
    run_id = json.loads((run_dir / "exporters.json").read_text())["mlflow"]["run_id"]
    return client, client.get_run(run_id)


def wandb_records(path: Path):
    """The records of a .wandb file: LevelDB's log format (github.com/google/leveldb doc/log_format.md:
    32 KiB blocks, chunks of crc32 + length + type FULL/FIRST/MIDDLE/LAST) after W&B's 7-byte header
    (":W&B", magic 0xBEE1, version), each record a wandb.proto Record. wandb 0.31 has no Python
    reader any more (its core is Go), so this is the little the test needs, with W&B's own protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"{path}: bad chunk checksum at {pos}"
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            yield record


def wandb_history(run_dir: Path) -> list[tuple[str, list[dict]]]:
    """(run id, history rows) of each offline run, oldest first."""
    out = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
                for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]
        out.append((path.stem.removeprefix("run-"), rows))
    return out


def first_losses(run_dir: Path) -> dict[int, float]:
    """Each step's loss as first reported (a step computed again after a restore keeps its first values)."""
    first: dict[int, float] = {}
    for r in records(run_dir):
        if r["type"] == "step":
            first.setdefault(r["step"], r["metrics"]["loss"])
    return first


# ---- real runs ------------------------------------------------------------------------------------

FAULT = """
import sys
if sys.orig_argv[1:4] == ["-m", "trainready", "run"]:  # the launcher only
    from trainready.run import exporters
    original = exporters.WandbExporter.log
    def log(self, step, scalars, wall):
        if step >= 4:
            raise OSError(28, "No space left on device")
        return original(self, step, scalars, wall)
    exporters.WandbExporter.log = log
"""


def test_every_step_once_in_each_backend_across_a_resume_and_a_failing_exporter(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)  # a --run-dir the user made, readable by all
    os.chmod(run_dir, 0o755)
    cmd = run_cmd(run_dir, "--ckpt-every", "4", "--log-to", "tensorboard,mlflow,wandb", steps=8, script_args=TINY)
    # launch 1 stops after 6 steps (0..5) with its newest checkpoint at step 3, and its W&B exporter fails
    # at step 4 (an injected disk-full error); launch 2 restores step 3, computes 4 and 5 again, then 6, 7
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FAULT)
    path = os.pathsep.join([EXIT_FAST, str(inject), str(SRC)])  # exit_fast runs the injected sitecustomize after it
    code, out = run(cmd, tmp_path, env={"TRAINREADY_MAX_STEPS": "6", "PYTHONPATH": path})
    assert code == 0, out[-3000:]  # training went on: all 6 steps, a clean stop
    assert [r["step"] for r in records(run_dir) if r["type"] == "step"] == list(range(6))
    assert out.count("warning: --log-to") == 1 and out.count("--log-to wandb failed after step 3") == 1, out[-3000:]
    assert "OSError: [Errno 28] No space left on device" in out and "training goes on" in out
    ids = json.loads((run_dir / "exporters.json").read_text())
    assert ids["wandb"]["last_step"] == 3 and ids["mlflow"]["last_step"] == ids["tensorboard"]["last_step"] == 5

    code, out2 = run(cmd, tmp_path)
    assert code == 0 and digest(out2), out2[-3000:]
    assert "warning: --log-to" not in out2
    steps = [r["step"] for r in records(run_dir) if r["type"] == "step"]
    assert steps == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7]  # what the exporters were fed
    expected = [loss for _, loss in sorted(first_losses(run_dir).items())]

    tb = tensorboard_scalars(run_dir, "train/loss")
    assert [s for s, _ in tb] == list(range(8))
    assert [v for _, v in tb] == pytest.approx(expected, rel=1e-6)  # float32 in event files
    assert [s for s, _ in tensorboard_scalars(run_dir, "ckpt/stall_s")] == [3, 7]
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one event file per launch

    client, ml = mlflow_run(run_dir)
    assert ml.info.run_id == ids["mlflow"]["run_id"] and ml.info.status == "FINISHED"
    history = client.get_metric_history(ml.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(8))  # one value per step: none twice
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == expected
    assert ml.data.tags["trainready.world_size"] == "1" and "perf/tokens_per_s" in ml.data.metrics

    runs = wandb_history(run_dir)
    assert [run_id for run_id, _ in runs] == [ids["wandb"]["run_id"]] * 2  # one offline run per launch, one id
    # launch 1 wrote steps 0..3 before it failed; launch 2 wrote 4 and 5 from telemetry.jsonl (their first
    # values), then 6 and 7: every step once, in order
    assert [[row["_step"] for row in rows] for _, rows in runs] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [row["train/loss"] for _, rows in runs for row in rows] == expected
    assert all(json.loads((run_dir / "exporters.json").read_text())[b]["last_step"] == 7
               for b in ("tensorboard", "mlflow", "wandb"))
    # issue 26: W&B records no metadata (the launcher's command line), git remote or code; the exporters'
    # directories are private even inside a 0755 --run-dir
    for path in (run_dir / "wandb").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"--log-to" not in data and b"--ckpt-every" not in data, path
    assert not list((run_dir / "wandb").rglob("wandb-metadata.json"))
    for name in ("wandb", "tensorboard", "mlflow", "logs"):
        assert (run_dir / name).stat().st_mode & 0o077 == 0, name
    # torchrun's per-rank logs (what the script prints) are private too, not 0755/0644 by the umask
    logs = [p for p in (run_dir / "logs").rglob("*") if p.is_file()]
    assert logs and all(p.stat().st_mode & 0o077 == 0 for p in logs), [(p, oct(p.stat().st_mode)) for p in logs]


def test_unknown_backend_is_refused_before_anything_starts(tmp_path):
    code, out = run([sys.executable, "-m", "trainready", "run", "--run-dir", str(tmp_path / "run"), "--log-to",
                     "tensorbord", "--", "python", str(TINY_GPT)], tmp_path, timeout=60)
    assert code == 2 and "Traceback" not in out, out
    assert "unknown backend 'tensorbord'" in out and "Valid: tensorboard, mlflow, wandb" in out
    assert "Did you mean: tensorboard" in out and not (tmp_path / "run").exists()


# ---- the sink on its own --------------------------------------------------------------------------

class Missing(Exporter):
    name, extra, modules = "missing", "missing", ("trainready_no_such_module",)


def test_parse_log_to():
    assert parse_log_to("wandb, TensorBoard,wandb") == ["wandb", "tensorboard"]
    assert parse_log_to(None) == []
    with pytest.raises(UsageError, match=r"needs trainready_no_such_module, not installed here: pip install "
                                         r"'trainready\[missing\]'"):
        parse_log_to("missing", {"missing": Missing})
    with pytest.raises(UsageError, match="separated by commas"):
        parse_log_to("mlflow,")


def test_step_scalars_put_a_lagged_split_on_its_own_step():
    record = {"step": 5, "split_step": 4, "step_s": None, "interval_s": 0.5, "data_s": 0.1, "comm_s": None,
              "tokens": 64, "nonfinite": ["step_s"], "ckpt": {"last_saved": 3, "saving": True},
              "metrics": {"loss": None, "nonfinite": ["loss"], "lr": 0.1, "odd name!": 2, "note": "text"}}
    (split_step, split), (step, own) = step_scalars(record)
    assert (split_step, split) == (4, {"time/data_s": 0.1})
    assert step == 5 and math.isnan(own.pop("perf/step_s")) and math.isnan(own.pop("train/loss"))
    assert own == {"perf/interval_s": 0.5, "perf/tokens": 64.0, "ckpt/last_saved": 3.0, "train/lr": 0.1,
                   "train/odd name_": 2.0}
    assert step_scalars({"step": 2, "split_step": 2, "data_s": 0.1}) == [(2, {"time/data_s": 0.1})]


class Recorder(Exporter):
    name = "recorder"
    seen: list[tuple[int, tuple[str, ...]]] = []

    def open(self, run_dir, state, resumed_after):
        state.setdefault("opened", 0)
        state["opened"] += 1

    def log(self, step, scalars, wall):
        Recorder.seen.append((step, tuple(sorted(scalars))))


class Raising(Recorder):
    name = "raising"

    def log(self, step, scalars, wall):
        if step == 2:
            raise RuntimeError("library error")


class Stuck(Recorder):
    name = "stuck"
    release = threading.Event()

    def log(self, step, scalars, wall):
        Stuck.release.wait(30)


def _step(step: int, loss: float) -> dict:
    return {"type": "step", "t": time.time(), "step": step, "interval_s": 0.1, "metrics": {"loss": loss}}


def test_sink_skips_recomputed_steps_drops_a_failing_backend_and_never_blocks(tmp_path):
    Recorder.seen = []
    backends = {"recorder": Recorder, "raising": Raising, "stuck": Stuck}
    warnings: list[str] = []
    sink = ExportSink(["recorder", "raising", "stuck"], tmp_path, warnings.append, backends)
    started = time.monotonic()
    for step in [0, 1, 2, 3, 2, 3, 4]:  # 2 and 3 again: computed again after a restore
        sink.feed([_step(step, 1.0 / (step + 1))])
        if step == 1:
            sink.feed([{"type": "ckpt", "t": time.time(), "step": 1, "stall_s": 0.2}])
    sink.feed([_step(s, 0.0) for s in range(5, 2005)])
    # the launcher's loop only queues: waiting for the stuck backend would take its 30 s (a bound in seconds
    # would fail on a busy machine, where this took 10 s once)
    assert time.monotonic() - started < 20 and not Stuck.release.is_set()
    sink.close("finished", timeout_s=2.0)
    Stuck.release.set()
    assert [s for s, _ in Recorder.seen] == [0, 1, 1, 2, 3, 4, *range(5, 2005)]
    assert Recorder.seen[2] == (1, ("ckpt/stall_s",))
    assert sum("--log-to raising failed after step" in w and "library error" in w for w in warnings) == 1, warnings
    assert any("--log-to stuck did not finish writing within 2 s" in w for w in warnings)
    state = json.loads((tmp_path / "exporters.json").read_text())
    assert state["recorder"] == {"opened": 1, "last_step": 2004, "last_ckpt": 1}
    assert state["raising"] == {"opened": 1, "last_step": 1, "last_ckpt": 1}  # closed cleanly after step 1

    Recorder.seen = []  # the next launch: nothing written twice, the state's ids kept
    sink = ExportSink(["recorder"], tmp_path, warnings.append, backends)
    sink.feed([_step(2004, 0.0), _step(2005, 0.0)])
    sink.close("finished")
    assert [s for s, _ in Recorder.seen] == [2005]
    assert json.loads((tmp_path / "exporters.json").read_text())["recorder"]["opened"] == 2


def test_a_broken_or_planted_state_file_is_read_as_unknown_never_trusted(tmp_path):
    import os

    from trainready.run.exporters import _load_state

    path = tmp_path / "exporters.json"
    os.mkfifo(path)  # a FIFO in its place must not hang the launcher
    assert _load_state(path) == {}
    path.unlink()
    path.write_text(json.dumps({"schema_version": 1, "wandb": {"run_id": "../../etc", "last_step": "9", "x": [1]},
                                "mlflow": {"run_id": "0123abcd" * 4, "experiment_id": "1", "last_step": 7,
                                           "last_ckpt": -3, "opened": 2},
                                "tensorboard": "not a dict"}))
    assert _load_state(path) == {"wandb": {}, "mlflow": {"run_id": "0123abcd" * 4, "experiment_id": "1",
                                                         "last_step": 7, "opened": 2}}
    path.write_text("[1, 2]")
    assert _load_state(path) == {}
    path.write_bytes(b"{" + b" " * (2 << 20) + b"}")  # past the size cap
    assert _load_state(path) == {}
    path.write_bytes(b'{"wandb": ' + b"[" * 200_000)  # 200 KB, under the cap, nested past json's C stack guard
    assert _load_state(path) == {}
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"mlflow": {"last_step": 1}}))
    assert _load_state(path) == {}  # a symlink is not followed
