"""`trainready check --dataset URL` (check/dataset_scan.py): a bounded listing of the training data
becomes the data.layout finding: many small objects warn, a packed dataset passes, a missing URL is
a usage error (exit 2)."""

import json

import pytest
from check_bundles import BUNDLES

from trainready.check.dataset_scan import dataset_finding, scan_dataset
from trainready.data.pack import pack
from trainready.errors import UsageError


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    """2,000 files of 1,000-2,999 bytes (median 1,999.5), in two subdirectories."""
    root = tmp_path_factory.mktemp("small")
    for i in range(2000):
        sub = root / ("a" if i % 2 else "b")
        sub.mkdir(exist_ok=True)
        (sub / f"{i:05d}.txt").write_bytes(b"x" * (1000 + i))
    (root / ".hidden-tmp").write_bytes(b"ignored")
    return root


def cli(*args):
    from cloud_stubs import cli_run  # the entry function in this process (issue 25)

    proc = cli_run(*args, env={"TRAINREADY_NO_IMDS": "1"})
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-2000:]
    return proc


def test_many_small_local_files_warn_with_counts_and_median(small_dir):
    scan = scan_dataset(str(small_dir))
    assert (scan.objects_seen, scan.sampled, scan.packed, scan.remote) == (2000, False, False, False)
    assert scan.median_size_bytes == 1999 and scan.small_objects == 2000 and scan.small_share == 1.0
    assert scan.total_bytes_seen == sum(range(1000, 3000)) and scan.extensions == {".txt": 2000}
    finding = dataset_finding(scan, str(small_dir))
    assert finding.id == "data.layout" and finding.status == "warn", finding
    assert "2,000 objects" in finding.observed and "median 2.0 KiB" in finding.observed
    assert "starve GPUs" in finding.reason
    assert f"trainready data pack {small_dir} --out {small_dir}-packed" in finding.advice


def test_the_listing_bound_is_respected_and_reported(small_dir):
    scan = scan_dataset(str(small_dir), max_objects=100)
    assert (scan.objects_seen, scan.sampled, scan.stopped_by) == (100, True, "max_objects")
    assert "100+ objects (sampled the first 100 of the listing)" in dataset_finding(scan).observed
    exact = scan_dataset(str(small_dir), max_objects=2000)  # exactly the bound: all seen, nothing left out
    assert (exact.objects_seen, exact.sampled) == (2000, False)


def test_a_packed_dataset_passes(small_dir, tmp_path):
    pack(small_dir, str(tmp_path / "packed"), "text", 1 << 20)
    scan = scan_dataset(str(tmp_path / "packed"))
    assert scan.packed and scan.index_complete and scan.index_samples == 2000 and scan.index_shards >= 3
    assert scan.objects_seen == scan.index_shards + 1 and ".tar" in scan.extensions  # shards + index.json
    finding = dataset_finding(scan)
    assert finding.status == "pass" and f"lists {scan.index_shards} shards, 2,000 samples" in finding.observed, finding


def test_an_unfinished_pack_and_a_foreign_index(small_dir, tmp_path):
    out = tmp_path / "packed"
    pack(small_dir, str(out), "text", 1 << 20)
    index = json.loads((out / "index.json").read_text())
    (out / "index.json").write_text(json.dumps({**index, "complete": False}))
    finding = dataset_finding(scan_dataset(str(out)))
    assert finding.status == "warn" and "INCOMPLETE" in finding.observed and "resumes" in finding.advice
    (out / "index.json").write_text(json.dumps({"kind": "something-else"}))
    scan = scan_dataset(str(out))
    assert not scan.packed and scan.index_problem is None
    (out / "index.json").write_text(json.dumps({**index, "shards": "nope"}))
    scan = scan_dataset(str(out))
    assert not scan.packed and "not a valid trainready index" in scan.index_problem


def test_small_s3_objects_warn_and_the_bound_holds(s3_bucket):
    from trainready.io import open_url

    fs, _ = open_url(f"s3://{s3_bucket}")
    fs.pipe({f"{s3_bucket}/corpus/part{i % 3}/{i:04d}.jsonl": b'{"text": "hi"}\n' * (10 + i) for i in range(300)})
    fs.pipe_file(f"{s3_bucket}/corpus-other/x.jsonl", b"{}\n")  # a sibling prefix is not part of the dataset
    url = f"s3://{s3_bucket}/corpus"
    scan = scan_dataset(url)
    assert (scan.objects_seen, scan.sampled, scan.remote, scan.packed) == (300, False, True, False)
    assert scan.extensions == {".jsonl": 300} and scan.small_objects == 300
    finding = dataset_finding(scan, url)
    assert finding.status == "warn" and "300 objects" in finding.observed and "GET" in finding.reason, finding
    assert f"--format jsonl --out {url}-packed" in finding.advice
    bounded = scan_dataset(url, max_objects=100)
    assert (bounded.objects_seen, bounded.sampled) == (100, True)
    with pytest.raises(UsageError, match="nothing exists"):
        scan_dataset(f"s3://{s3_bucket}/no-such-prefix")
    with pytest.raises(UsageError, match="no-such-bucket"):
        scan_dataset("s3://no-such-bucket-trainready/data")


def test_large_objects_pass(tmp_path):
    for i in range(3):
        (tmp_path / f"big{i}.bin").write_bytes(b"\0" * (2 << 20))
    finding = dataset_finding(scan_dataset(str(tmp_path)))
    assert finding.status == "pass" and "median 2.0 MiB" in finding.observed


def test_cli_adds_the_finding_and_a_missing_url_is_exit_2(small_dir):
    proc = cli("check", "--bundle", BUNDLES / "p4d", "--dataset", small_dir, "--json")
    assert proc.returncode == 0, proc.stderr[-1000:]  # a healthy node; many small files only warn
    layout = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}["data.layout"]
    assert layout["status"] == "warn" and layout["area"] == "data" and "2,000 objects" in layout["observed"]
    proc = cli("check", "--dataset", "/nonexistent", "--json")
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-1000:])
    assert "/nonexistent" in json.loads(proc.stdout)["error"]["message"]
