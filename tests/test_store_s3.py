"""The archive on S3 (moto's standalone server over HTTP on 127.0.0.1): commit protocol,
object checks, an outage during training, and no credentials in anything we write or log."""

import logging
import shutil
import time

import boto3
import pytest
import torch
from s3server import TcpProxy

from trainready.store import CheckpointManager
from trainready.store.manifest import MANIFEST, FileEntry, checkpoint_name, sha256_file
from trainready.store.tiers import ArchiveTier


def _objects(endpoint, bucket):
    listing = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def test_save_to_s3_then_restore_on_a_new_node(tmp_path, s3_bucket, moto):
    state = {"model": {"w": torch.arange(1000, dtype=torch.float32)}}
    with CheckpointManager(tmp_path / "hot", f"s3://{s3_bucket}/run-1", async_save=True) as mgr:
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


def test_multipart_objects_are_checked_against_their_etag(tmp_path, s3_bucket, monkeypatch):
    import trainready.store.tiers as tiers

    monkeypatch.setattr(tiers, "_S3_PART", 5 << 20)  # 12 MiB -> 3 parts
    local = tmp_path / "blob"
    local.write_bytes(bytes(range(256)) * (12 << 12))
    entry = FileEntry(path="blob", size=local.stat().st_size, sha256=sha256_file(str(local)))
    archive = ArchiveTier(f"s3://{s3_bucket}/x")
    archive.upload(local, "step-000000000001-g0001", entry)
    etag = archive.fs.info(f"{s3_bucket}/x/step-000000000001-g0001/blob")["ETag"].strip('"')
    assert etag.endswith("-3") and etag == tiers.s3_etag(local, entry.size)


def test_archive_outage_training_goes_on_and_uploads_catch_up(tmp_path, s3_bucket, moto, monkeypatch, caplog):
    proxy = TcpProxy(moto.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    url = f"s3://{s3_bucket}/run"
    try:
        with caplog.at_level(logging.WARNING, "trainready.store"):
            mgr = CheckpointManager(tmp_path / "hot", url, keep_hot=2, retry_initial_s=0.1, retry_max_s=0.5)
            mgr.save(1, {"model": {"w": torch.ones(100)}})
            mgr.wait(timeout_s=30)
            proxy.down()
            started = time.monotonic()
            for step in (2, 3, 4):
                mgr.save(step, {"model": {"w": torch.full((100,), float(step))}})
            assert time.monotonic() - started < 10, "saves must not wait for the archive"
            deadline = time.monotonic() + 30
            while mgr.status()["upload_failures"] < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert mgr.status()["upload_failures"] >= 2
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
