"""The archive on S3 (moto's standalone server over HTTP on 127.0.0.1): commit protocol,
object checks, an outage during training, and no credentials in anything we write or log."""

import logging
import shutil
import time

import boto3
import pytest
import torch
from s3server import TcpProxy

from trainready.io import sha256_file
from trainready.store import ArchiveUnavailableError, CheckpointManager, CheckpointManagerOptions
from trainready.store.manifest import MANIFEST, FileEntry, checkpoint_name
from trainready.store.tiers import ArchiveTier


def _objects(endpoint, bucket):
    listing = boto3.client("s3", **({"endpoint_url": endpoint} if endpoint else {})).list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def test_save_to_s3_then_restore_on_a_new_node(tmp_path, s3_bucket, moto):
    state = {"model": {"w": torch.arange(1000, dtype=torch.float32)}}
    with CheckpointManager(tmp_path / "hot", f"s3://{s3_bucket}/run-1",
                           options=CheckpointManagerOptions(async_save=True)) as mgr:
        mgr.save(7, state)
    keys = _objects(moto.url, s3_bucket)
    name = checkpoint_name(7, 1)
    assert f"run-1/{name}/{MANIFEST}" in keys and f"run-1/{name}/__0_0.distcp" in keys and "run-1/writer.json" in keys
    shutil.rmtree(tmp_path / "hot")
    loaded = {"model": {"w": torch.zeros(1000)}}
    with CheckpointManager(tmp_path / "hot", f"s3://{s3_bucket}/run-1") as mgr:
        result = mgr.restore_details(loaded)
    assert (result.step, result.tier) == (7, "archive")
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])


def test_multipart_objects_are_proven_by_their_sha256_checksums(tmp_path, s3_bucket):
    local = tmp_path / "blob"
    local.write_bytes(bytes(range(256)) * (12 << 12))
    entry = FileEntry(path="blob", size=local.stat().st_size, sha256=sha256_file(local))
    archive = ArchiveTier(f"s3://{s3_bucket}/x")
    archive.part_size = 5 << 20  # 12 MiB -> 3 parts, each sent with its SHA-256
    assert archive.upload(local, "step-000000000001-g0001", entry) == "sha256"
    head = boto3.client("s3").head_object(Bucket=s3_bucket, Key="x/step-000000000001-g0001/blob", ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-3") and head["ChecksumSHA256"]


def _kms_bucket(s3_bucket):
    boto3.client("s3").put_bucket_encryption(Bucket=s3_bucket, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]})


def test_a_bucket_with_default_kms_encryption_archives_and_restores(tmp_path, s3_bucket, moto, caplog):
    """Its ETags are not MD5s (tests/moto_s3.py gives moto S3's rule): every upload failed its
    predicted-ETag check, and was then accepted on retry by size alone (or, after three, training
    died). Now each object is proven by its SHA-256 checksum, the first time."""
    _kms_bucket(s3_bucket)
    url = f"s3://{s3_bucket}/run"
    with caplog.at_level(logging.WARNING, "trainready.store"):
        with CheckpointManager(tmp_path / "hot", url,
                               options=CheckpointManagerOptions(retry_initial_s=0.05, retry_max_s=0.2)) as mgr:
            for step in (1, 2, 3):
                mgr.save(step, {"model": {"w": torch.full((1000,), float(step))}})
                mgr.wait(timeout_s=30)
            assert mgr.status().upload_check == "sha256"
    assert "failed" not in caplog.text, caplog.text
    assert f"run/{checkpoint_name(3, 1)}/{MANIFEST}" in _objects(moto.url, s3_bucket)
    loaded = {"model": {"w": torch.zeros(1000)}}
    with CheckpointManager(tmp_path / "other-node", url) as mgr:
        assert mgr.restore_details(loaded).tier == "archive"
    assert torch.equal(loaded["model"]["w"], torch.full((1000,), 3.0))


def test_an_object_left_by_an_earlier_attempt_is_trusted_by_content_not_size(tmp_path, s3_bucket):
    """A torn earlier upload left an object of the right size and the wrong bytes: a retry that
    skips objects by size archives it, and restoring from the archive then fails."""
    state = {"model": {"w": torch.arange(1000, dtype=torch.float32)}}
    with CheckpointManager(tmp_path / "probe", options=CheckpointManagerOptions(async_save=False)) as mgr:
        mgr.save(7, state)
    good = tmp_path / "probe" / checkpoint_name(7, 1) / "__0_0.distcp"
    s3 = boto3.client("s3")
    with CheckpointManager(tmp_path / "hot", f"s3://{s3_bucket}/run",
                           options=CheckpointManagerOptions(async_save=False)) as mgr:
        s3.put_object(Bucket=s3_bucket, Key=f"run/{checkpoint_name(7, 1)}/__0_0.distcp", Body=b"\0" * good.stat().st_size)
        mgr.save(7, state)
    stored = s3.get_object(Bucket=s3_bucket, Key=f"run/{checkpoint_name(7, 1)}/__0_0.distcp")["Body"].read()
    assert stored == good.read_bytes()


class _StoreThatLies:
    """An S3 filesystem whose HeadObject reports a checksum other than the one sent."""

    protocol = ("s3",)

    def __init__(self):
        self.calls = []

    def split_path(self, path):
        bucket, key = path.split("/", 1)
        return bucket, key, None

    def call_s3(self, method, **kwargs):
        self.calls.append(method)
        if method == "head_object":
            return {"ContentLength": 4, "ChecksumSHA256": "AAAA"}
        return {"ETag": '"x"'}

    def invalidate_cache(self, path=None):
        pass


def test_an_object_that_does_not_match_what_was_sent_is_an_integrity_error(tmp_path):
    from trainready.io import IntegrityError, SourceChangedError, upload_checked

    local = tmp_path / "f"
    local.write_bytes(b"abcd")
    fs = _StoreThatLies()
    with pytest.raises(IntegrityError, match="does not match"):
        upload_checked(fs, local, "b/k", sha256_file(local), 4)
    assert fs.calls == ["put_object", "head_object"]
    with pytest.raises(SourceChangedError):  # the local file is not what the manifest recorded
        upload_checked(fs, local, "b/k", "0" * 64, 4)


def test_a_mismatching_upload_is_retried_and_never_stops_training(tmp_path, s3_bucket, monkeypatch):
    from trainready.io import IntegrityError

    real = ArchiveTier.upload
    failures = []

    def flaky(self, local, name, entry):
        if len(failures) < 4:
            failures.append(name)
            raise ArchiveUnavailableError(f"archive: {name}/{entry.path}: {IntegrityError('stored checksum differs')}")
        return real(self, local, name, entry)

    monkeypatch.setattr(ArchiveTier, "upload", flaky)
    with CheckpointManager(tmp_path / "hot", f"s3://{s3_bucket}/run",
                           options=CheckpointManagerOptions(retry_initial_s=0.05, retry_max_s=0.1)) as mgr:
        mgr.save(1, {"model": {"w": torch.ones(10)}})
        mgr.wait(timeout_s=30)
        mgr.save(2, {"model": {"w": torch.ones(10)}})  # a fatal upload error used to be raised here
        mgr.wait(timeout_s=30)
    assert len(failures) == 4 and mgr.status().archived_step == 2


def test_two_writers_racing_for_a_prefix_never_share_a_generation(tmp_path, s3_bucket, monkeypatch):
    """Both read the archive lease before either writes it: with check-then-write both took the
    same generation; with If-Match on the lease's ETag one loses, reads again and takes the next."""
    import threading

    from trainready.store.tiers import HotTier

    url = f"s3://{s3_bucket}/run"
    with CheckpointManager(tmp_path / "first", url, run_id="r1"):
        pass
    both_read = threading.Barrier(2, timeout=30)
    real_read = ArchiveTier.read_lease
    waited = set()

    def read_then_wait(self):
        state = real_read(self)
        if threading.current_thread().name not in waited:
            waited.add(threading.current_thread().name)
            both_read.wait()
        return state

    monkeypatch.setattr(ArchiveTier, "read_lease", read_then_wait)
    generations, errors = {}, []

    def claim(name):
        try:
            mgr = CheckpointManager(tmp_path / name, url, options=CheckpointManagerOptions(async_save=False),
                                    run_id="r1")
            generations[name] = mgr.generation
            mgr.close()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(n,), name=n) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and sorted(generations.values()) == [2, 3]
    lease = real_read(ArchiveTier(url)).lease
    assert lease.generation == 3 and HotTier(tmp_path / "a").read_lease().lease.generation in (2, 3)


def test_restore_never_prefers_a_commit_made_by_a_fenced_writer(tmp_path, s3_bucket):
    """Writer 1 goes on after writer 2 took the prefix over (a zombie) and commits a newer step in
    the instant between its fence check and its commit. That commit is never restored."""
    url = f"s3://{s3_bucket}/run"
    state = lambda v: {"model": {"w": torch.full((4,), float(v))}}  # noqa: E731
    old = CheckpointManager(tmp_path / "old", url, options=CheckpointManagerOptions(async_save=False))
    old.save(5, state(5))
    old.wait()
    # generation 2 fences generation 1
    new = CheckpointManager(tmp_path / "new", url, options=CheckpointManagerOptions(async_save=False))
    old._replicator.check_fence = lambda: None  # the zombie's check passed just before the takeover
    old._replicator.on_archived = lambda name: None
    old.save(10, state(10))
    old.wait()
    old.close()
    names = {k.rsplit("/", 2)[-2] for k in _objects(None, s3_bucket) if k.endswith(MANIFEST)}
    assert checkpoint_name(10, 1) in names  # it did reach the archive
    loaded = state(0)
    result = new.restore_details(loaded)
    assert result.step == 5 and float(loaded["model"]["w"][0]) == 5.0
    assert any(checkpoint_name(10, 1) in s and "fenced" in s for s in result.skipped)
    new.close()
    from trainready.store.inspect import list_checkpoints

    statuses = {c.name: c.status for c in list_checkpoints(url).checkpoints}
    assert statuses[checkpoint_name(10, 1)] == "fenced" and statuses[checkpoint_name(5, 1)] == "committed"
    with CheckpointManager(tmp_path / "third", url) as third:  # a later writer keeps the fence
        assert third.restore(state(0)) == 5


def test_archive_outage_training_goes_on_and_uploads_catch_up(tmp_path, s3_bucket, moto, monkeypatch, caplog):
    proxy = TcpProxy(moto.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    url = f"s3://{s3_bucket}/run"
    try:
        with caplog.at_level(logging.WARNING, "trainready.store"):
            mgr = CheckpointManager(tmp_path / "hot", url,
                                    options=CheckpointManagerOptions(keep_hot=2, retry_initial_s=0.1, retry_max_s=0.5))
            mgr.save(1, {"model": {"w": torch.ones(100)}})
            mgr.wait(timeout_s=30)
            proxy.down()
            started = time.monotonic()
            for step in (2, 3, 4):
                mgr.save(step, {"model": {"w": torch.full((100,), float(step))}})
            assert time.monotonic() - started < 10, "saves must not wait for the archive"
            deadline = time.monotonic() + 30
            while mgr.status().upload_failures < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert mgr.status().upload_failures >= 2
            with pytest.raises(Exception, match="not finished"):
                mgr.wait(timeout_s=1)
            proxy.up()
            mgr.wait(timeout_s=60)
            mgr.close()
        assert f"run/{checkpoint_name(4, 1)}/{MANIFEST}" in _objects(moto.url, s3_bucket)
        assert "testing-secret" not in caplog.text
        hot_step2 = tmp_path / "hot" / checkpoint_name(2, 1)
        assert not hot_step2.exists()  # retired from hot only once a newer one reached the archive
        for path in (tmp_path / "hot").rglob("*.json"):
            assert "testing-secret" not in path.read_text()
    finally:
        proxy.close()
