"""`trainready data pack`: every sample exactly once, in source order, in shards that respect
--shard-size; the index matches the shard bytes; S3 works; other readers (webdataset) read the
shards; a pack killed at a fault point resumes to the same bytes an uninterrupted pack writes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from trainready.cli import data_cmd
from trainready.data.format import INDEX, DataIndex, decode, iter_members
from trainready.data.index_io import load_index, shard_url
from trainready.data.pack import pack
from trainready.errors import UsageError

SRC_DIR = str(Path(__file__).resolve().parents[1] / "src")
# the console script's entry function, in a process of its own (for what only a fresh process shows)
CLI = "import sys; from trainready.cli import main\nsys.argv = ['trainready', 'data', *sys.argv[1:]]; main.run()"
PACK = ("import sys; from pathlib import Path; from trainready.data.pack import pack\n"
        "pack(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]))")


def data_cli(*args: str, cwd: Path | None = None, columns: int = 200) -> subprocess.CompletedProcess:
    """`trainready data ARGS` through the console script's entry function, in this process (issue 25)."""
    from cloud_stubs import cli_run

    return cli_run("data", *args, cwd=cwd, columns=columns)


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRAINREADY_FAULT"}
    return {**env, "PYTHONPATH": SRC_DIR + os.pathsep + env.get("PYTHONPATH", ""), "COLUMNS": "200", **extra}


def text_tree(root: Path, n: int = 300) -> list[bytes]:
    """n small files in nested directories, plus hidden ones that must be ignored; returns the
    file contents in the order packing must take them (sorted relative POSIX path)."""
    rng = random.Random(0)
    files = {}
    for i in range(n):
        rel = f"part-{i % 7}/sub{i % 3}/doc-{i:04d}.txt" if i % 5 else f"top-{i:04d}.md"
        files[rel] = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / ".hidden.txt").write_bytes(b"never packed")
    (root / ".cache").mkdir()
    (root / ".cache" / "x.txt").write_bytes(b"never packed")
    return [files[rel] for rel in sorted(files)]


def read_back(out: Path) -> tuple[DataIndex, list[tuple[str, bytes]]]:
    """The index, checked against the shard files, and every member in index order."""
    index = DataIndex.model_validate_json((out / INDEX).read_bytes())
    members, ordinal = [], 0
    for shard in index.shards:
        data = (out / shard.name).read_bytes()
        assert len(data) == shard.bytes and hashlib.sha256(data).hexdigest() == shard.sha256
        in_shard = list(iter_members(io.BytesIO(data)))
        assert len(in_shard) == shard.samples and shard.first_sample == ordinal
        ordinal += shard.samples
        members += in_shard
    return index, members


def tar_size(payloads: list[int]) -> int:
    """A shard file's size, counted from the tar format: per member a 512-byte header and its data
    padded to 512 bytes; then two zero blocks, and the whole padded to a 10 KiB record."""
    members = sum(512 + -(-n // 512) * 512 for n in payloads)
    return -(-(members + 1024) // 10240) * 10240


def check_shard_sizes(index: DataIndex, members: list[tuple[str, bytes]], limit: int) -> None:
    """Each shard file is at most `limit` bytes, tar headers included (unless it is one oversized
    sample), and is closed only because the next sample would not fit."""
    at = 0
    for i, shard in enumerate(index.shards):
        payload = [len(data) for _, data in members[at:at + shard.samples]]
        at += shard.samples
        assert shard.bytes == tar_size(payload)
        assert shard.bytes <= limit or shard.samples == 1
        if i + 1 < len(index.shards):
            assert tar_size([*payload, len(members[at][1])]) > limit


@pytest.fixture(scope="module")
def text_src(tmp_path_factory) -> tuple[Path, list[bytes]]:
    root = tmp_path_factory.mktemp("text-src")
    return root, text_tree(root)


@pytest.fixture(autouse=True)
def _no_fault(monkeypatch):
    monkeypatch.delenv("TRAINREADY_FAULT", raising=False)


def test_text_tree_every_file_once_in_order(text_src, tmp_path):
    src, expected = text_src
    result = pack(src, str(tmp_path / "ds"), "text", 20 << 10)
    index, members = read_back(tmp_path / "ds")
    assert [name for name, _ in members] == [f"{i:012d}.txt" for i in range(len(expected))]
    assert [data for _, data in members] == expected
    check_shard_sizes(index, members, 20 << 10)
    assert index.complete and index.tokens_counted_as == "bytes" and index.source.files == 300
    assert result.status == "packed" and result.shards_written == result.shards_total == len(index.shards) > 5
    assert result.samples_total == 300 and result.tokens_total == sum(map(len, expected)) == index.total_tokens
    assert result.bytes_total == sum(p.stat().st_size for p in (tmp_path / "ds" / "shards").iterdir())
    assert sorted(os.listdir(tmp_path / "ds" / "shards")) == [f"shard-{i:06d}.tar" for i in range(len(index.shards))]


def test_oversized_sample_gets_a_shard_of_its_own(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name, size in [("a", 10), ("b", 10), ("c", 12_000), ("d", 10), ("e", 10)]:
        (src / name).write_bytes(b"x" * size)
    pack(src, str(tmp_path / "ds"), "text", 10240)
    index, members = read_back(tmp_path / "ds")
    assert [(s.samples, s.bytes) for s in index.shards] == [(2, 10240), (1, 20480), (2, 10240)]
    check_shard_sizes(index, members, 10240)


def test_jsonl_lines_are_samples_and_other_files_are_skipped(tmp_path):
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "a.jsonl").write_bytes(b'\xef\xbb\xbf{"t": 1}\n\n{"t": 2}\r\n   \n')
    (src / "b" / "c.json").write_bytes(b'{"t": 3}\n[4, "x"]')   # no newline at the end
    (src / "b" / "notes.txt").write_text("not data")
    result = pack(src, str(tmp_path / "ds"), "jsonl", 1 << 20)
    index, members = read_back(tmp_path / "ds")
    assert [name for name, _ in members] == [f"{i:012d}.json" for i in range(4)]
    assert [decode("jsonl", data) for _, data in members] == [{"t": 1}, {"t": 2}, {"t": 3}, [4, "x"]]
    assert members[1][1] == b'{"t": 2}'
    assert result.skipped_files == 1 and result.skipped_examples == ["b/notes.txt"]
    assert index.tokens_counted_as == "bytes" and index.total_tokens == sum(len(d) for _, d in members)


def test_jsonl_single_file_and_bad_line(tmp_path):
    good = tmp_path / "one.jsonl"
    good.write_text('{"a": 1}\n{"a": 2}\n')
    assert pack(good, str(tmp_path / "ds"), "jsonl", 1000).samples_total == 2
    bad = tmp_path / "bad" / "x.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(UsageError, match=rf"{bad}:3: not valid JSON"):
        pack(bad.parent, str(tmp_path / "ds2"), "jsonl", 1000)


@pytest.mark.parametrize("mmap", [False, True])
def test_tokens_1d_and_2d(tmp_path, monkeypatch, mmap):
    if mmap:  # big files are memory-mapped: take that path for these small ones too
        monkeypatch.setattr("trainready.data.pack.MMAP_OVER", 0)
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    one = rng.integers(0, 65535, 300, dtype=np.uint16)
    two = rng.integers(0, 65535, (5, 64)).astype(">u2")   # big-endian on disk: still uint16
    empty_rows = np.zeros((0, 8), dtype=np.uint16)
    np.save(src / "a.npy", one)
    np.save(src / "b.npy", np.asfortranarray(two))
    np.save(src / "c.npy", empty_rows)
    (src / "README.md").write_text("skipped")
    result = pack(src, str(tmp_path / "ds"), "tokens", 1024)
    index, members = read_back(tmp_path / "ds")
    arrays = [decode("tokens", data) for _, data in members]
    assert len(arrays) == 6 and [name for name, _ in members][-1] == "000000000005.npy"
    np.testing.assert_array_equal(arrays[0], one)
    for row, got in zip(two, arrays[1:], strict=True):
        np.testing.assert_array_equal(got, row)
        assert got.dtype == np.dtype("<u2")
    assert index.token_dtype == "uint16" and index.tokens_counted_as == "tokens"
    assert result.tokens_total == 300 + 5 * 64 and result.skipped_files == 1
    check_shard_sizes(index, members, 1024)


@pytest.mark.parametrize(("arrays", "message"), [
    ({"a.npy": np.zeros(4, np.int64)}, r"a\.npy: dtype int64 is not a token id type"),
    ({"a.npy": np.zeros(4, np.uint16), "b.npy": np.zeros(4, np.uint32)}, r"b\.npy: dtype uint32, but a\.npy is uint16"),
    ({"a.npy": np.zeros((2, 2, 2), np.uint16)}, r"a\.npy: a 3-D array"),
])
def test_tokens_bad_arrays(tmp_path, arrays, message):
    for name, array in arrays.items():
        np.save(tmp_path / name, array)
    with pytest.raises(UsageError, match=message):
        pack(tmp_path, str(tmp_path.parent / f"{tmp_path.name}-ds"), "tokens", 1000)


def test_webdataset_reads_our_shards(text_src, tmp_path):
    import webdataset as wds

    src, expected = text_src
    pack(src, str(tmp_path / "ds"), "text", 16 << 10)
    index, _ = load_index(str(tmp_path / "ds"))[:2]
    urls = [shard_url(str(tmp_path / "ds"), s.name) for s in index.shards]
    seen = [(s["__key__"], s["txt"]) for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
    assert seen == [(f"{i:012d}", data) for i, data in enumerate(expected)]


def test_s3_pack_matches_local_bytes(text_src, tmp_path, s3_bucket):
    src, _ = text_src
    url = f"s3://{s3_bucket}/ds"
    result = pack(src, url, "text", 32 << 10)
    local = pack(src, str(tmp_path / "ds"), "text", 32 << 10)
    index, fs, root = load_index(url)
    assert index.complete and result.shards_total == local.shards_total == len(index.shards)
    local_index, _ = read_back(tmp_path / "ds")
    assert index == local_index
    for shard in index.shards:
        assert fs.cat_file(shard_url(root, shard.name)) == (tmp_path / "ds" / shard.name).read_bytes()
    assert pack(src, url, "text", 32 << 10).status == "already packed"


def test_s3_missing_bucket_is_a_usage_error(text_src, s3_bucket):
    src, _ = text_src
    url = f"s3://{s3_bucket}-missing/ds"
    with pytest.raises(UsageError, match=rf"{url}: writing index.json failed"):
        pack(src, url, "text", 32 << 10)
    with pytest.raises(UsageError, match=f"nothing exists at {url}"):
        load_index(url)


def _pack_killed_at(fault: str, src: Path, url: str, size: int) -> None:
    proc = subprocess.run([sys.executable, "-c", PACK, str(src), url, "text", str(size)], capture_output=True, text=True,
                          timeout=60, env=subprocess_env(TRAINREADY_FAULT=fault))
    assert proc.returncode == -9, proc.stderr


@pytest.mark.parametrize(("fault", "committed"), [("data.shard_uploaded#3", 2), ("data.index_written#2", 2)])
def test_killed_pack_resumes_to_the_same_bytes(text_src, tmp_path, fault, committed):
    src, _ = text_src
    _pack_killed_at(fault, src, str(tmp_path / "ds"), 20 << 10)
    interrupted = DataIndex.model_validate_json((tmp_path / "ds" / INDEX).read_bytes())
    assert len(interrupted.shards) == committed and not interrupted.complete
    resumed = pack(src, str(tmp_path / "ds"), "text", 20 << 10)
    assert resumed.status == "resumed" and resumed.resumed_from_shard == committed
    clean = pack(src, str(tmp_path / "clean"), "text", 20 << 10)
    assert resumed.shards_written == clean.shards_total - committed
    assert (tmp_path / "ds" / INDEX).read_bytes() == (tmp_path / "clean" / INDEX).read_bytes()
    assert sorted(os.listdir(tmp_path / "ds" / "shards")) == sorted(os.listdir(tmp_path / "clean" / "shards"))
    for name in os.listdir(tmp_path / "clean" / "shards"):
        assert (tmp_path / "ds" / "shards" / name).read_bytes() == (tmp_path / "clean" / "shards" / name).read_bytes()
    _, members = read_back(tmp_path / "ds")
    assert [n for n, _ in members] == [f"{i:012d}.txt" for i in range(300)]


def test_killed_s3_pack_resumes(text_src, tmp_path, s3_bucket):
    src, _ = text_src
    url = f"s3://{s3_bucket}/ds"
    _pack_killed_at("data.shard_uploaded#3", src, url, 16 << 10)
    assert len(load_index(url)[0].shards) == 2
    assert pack(src, url, "text", 16 << 10).resumed_from_shard == 2
    pack(src, str(tmp_path / "clean"), "text", 16 << 10)
    assert load_index(url)[0] == read_back(tmp_path / "clean")[0]


def test_changed_source_and_restart(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"{i:02d}.txt").write_bytes(b"y" * 50)
    out = str(tmp_path / "ds")
    pack(src, out, "text", 200)
    (src / "20.txt").write_bytes(b"new")
    with pytest.raises(UsageError, match="SRC changed since packing started: use --restart or a new --out"):
        pack(src, out, "text", 200)
    with pytest.raises(UsageError, match="packed as --format text, not jsonl"):
        pack(src / "20.txt", out, "jsonl", 200)
    result = pack(src, out, "text", 20 << 10, restart=True)   # 2 shards, not 20: the old ones must go
    assert result.status == "packed" and result.samples_total == 21
    index, members = read_back(tmp_path / "ds")
    assert sorted(os.listdir(tmp_path / "ds" / "shards")) == [s.name.split("/")[-1] for s in index.shards]
    assert members[-1][1] == b"new"


def test_packing_twice_is_idempotent(text_src, tmp_path):
    src, _ = text_src
    pack(src, str(tmp_path / "ds"), "text", 50 << 10)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "ds").rglob("*")}
    again = pack(src, str(tmp_path / "ds"), "text", 50 << 10)
    assert again.status == "already packed" and again.shards_written == 0 and again.samples_total == 300
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "ds").rglob("*")} == before
    with pytest.raises(UsageError, match="--shard-size 51200 bytes, not 61440"):
        pack(src, str(tmp_path / "ds"), "text", 60 << 10)


def test_bad_sources(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "only-txt").mkdir()
    (tmp_path / "only-txt" / "a.txt").write_text("x")
    (tmp_path / "f.txt").write_text("x")
    cases = [(tmp_path / "missing", "text", "does not exist"), (tmp_path / "empty", "text", "has no files"),
             (tmp_path / "only-txt", "jsonl", r"no \*\.jsonl/\*\.json files .*skipped 1 other files, e\.g\. a\.txt"),
             (tmp_path / "f.txt", "text", "is a file; --format text packs a directory")]
    for src, fmt, message in cases:
        with pytest.raises(UsageError, match=message):
            pack(src, str(tmp_path / "ds"), fmt, 100)
    with pytest.raises(UsageError, match="is inside SRC"):
        pack(tmp_path / "only-txt", str(tmp_path / "only-txt" / "ds"), "text", 100)


def test_load_index_errors(tmp_path):
    with pytest.raises(UsageError, match="nothing exists at"):
        load_index(str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="exists but has no index.json"):
        load_index(str(tmp_path))
    (tmp_path / INDEX).write_text('{"kind": "something-else"}')
    with pytest.raises(UsageError, match="is not a trainready dataset index"):
        load_index(str(tmp_path))


@pytest.mark.parametrize(("text", "size"), [("256MiB", 256 << 20), ("64MB", 64_000_000), ("1GiB", 1 << 30),
                                            ("1000000", 1_000_000), ("1.5 KiB", 1536), ("2m", 2 << 20)])
def test_parse_size(text, size):
    assert data_cmd.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "12 parsecs", "-5MB", "0", "MiB"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="e.g. 256MiB"):
        data_cmd.parse_size(text)


@pytest.mark.parametrize(("text", "size"), [("5TiB", 5 << 40), ("1e9", 10**9), ("1e3KiB", 1_024_000), (".5MiB", 1 << 19)])
def test_parse_size_exponents_and_the_largest(text, size):
    assert data_cmd.parse_size(text) == size


@pytest.mark.parametrize(("text", "message"), [
    ("99999999999999999999TiB", "--shard-size '99999999999999999999TiB' is more than 5 TiB, the largest object S3 "
                                "stores; 100 MiB to 1 GiB suits object storage"),
    ("1e30", "--shard-size '1e30' is more than 5 TiB, the largest object S3 stores; 100 MiB to 1 GiB suits object storage"),
    ("1e999999999", "--shard-size '1e999999999' is more than 5 TiB, the largest object S3 stores; 100 MiB to 1 GiB "
                    "suits object storage"),
    ("5.000001TiB", "--shard-size '5.000001TiB' is more than 5 TiB, the largest object S3 stores; 100 MiB to 1 GiB "
                    "suits object storage"),
    ("inf", "--shard-size 'inf' is not a finite number: e.g. 256MiB, 64MB, 1GiB, 1000000 (bytes)"),
    ("NaN MiB", "--shard-size 'NaN MiB' is not a finite number: e.g. 256MiB, 64MB, 1GiB, 1000000 (bytes)"),
])
def test_parse_size_bounds(text, message):
    """A 20-digit TiB count was once accepted and stored as a 33-digit integer."""
    with pytest.raises(UsageError) as caught:
        data_cmd.parse_size(text)
    assert str(caught.value) == message


def test_pack_refuses_a_shard_larger_than_s3_stores(text_src, tmp_path):
    with pytest.raises(UsageError) as caught:
        pack(text_src[0], str(tmp_path / "ds"), "text", (5 << 40) + 1)
    assert str(caught.value) == ("--shard-size 5,497,558,138,881 bytes is more than 5 TiB, the largest object S3 "
                                 "stores; 100 MiB to 1 GiB suits object storage")
    assert not (tmp_path / "ds").exists()


def test_locations_and_sources_that_cannot_be_used_exit_2(tmp_path):
    """An empty path once meant the current directory; a symlink loop was an internal error; a
    name too long for the file system created the directories above it first."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("x")
    (tmp_path / "loopa").symlink_to("loopb")
    (tmp_path / "loopb").symlink_to("loopa")
    (tmp_path / "file").write_text("x")
    long = "x" * 300
    loop = ("a symlink loop (symbolic links that point at each other) on the way to it; remove or fix the links, or "
            "choose another path")
    too_long = f"the name '{'x' * 20}...{'x' * 12}' is 300 bytes, longer than the file system allows (255); choose a shorter name"
    empty = ("the dataset location {!r} is empty: give a directory, file:///path or s3://bucket/prefix (use . for the "
             "current directory)")
    cases = [(["src", "--out", ""], empty.format("")),
             (["src", "--out", "file://"], empty.format("file://")),
             (["", "--out", "ds"], "SRC is empty: give the directory (or .jsonl/.npy file) to pack; . is the current directory"),
             (["src", "--out", "loopa"], f"loopa: {loop}"),
             (["src", "--out", "loopa/ds"], f"loopa/ds: {loop}"),
             (["loopa", "--out", "ds"], f"SRC loopa: {loop}"),
             (["src", "--out", f"new/{long}/ds"], f"new/{long}/ds: {too_long}"),
             ([long, "--out", "ds"], f"SRC {long}: {too_long}"),
             (["src", "--out", "file/ds"], "file/ds: a part of the path is a file, not a directory"),
             (["src", "--out", "s3://"], "s3://: no bucket in the URL (s3://BUCKET/prefix)"),
             (["src", "--out", "s3://Bad_Bucket!/x"], "s3://Bad_Bucket!/x: invalid bucket name 'Bad_Bucket!'")]
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, message in cases:
        proc = data_cli("pack", *args, cwd=tmp_path)
        assert (proc.returncode, proc.stdout) == (2, ""), (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith(f"error: {message}") and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing packed into the cwd, no directory made


def test_cli_json_and_table(text_src, tmp_path):
    root = typer.Typer()
    root.add_typer(data_cmd.app, name="data")
    src, _ = text_src
    runner = CliRunner()
    result = runner.invoke(root, ["data", "pack", str(src), "--out", str(tmp_path / "ds"), "--shard-size", "64KiB", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["kind"] == "trainready-data-pack" and report["samples_total"] == 300 and report["status"] == "packed"
    again = runner.invoke(root, ["data", "pack", str(src), "--out", str(tmp_path / "ds"), "--shard-size", "64KiB"])
    assert again.exit_code == 0 and "already packed" in again.stdout and "counted as bytes" in again.stdout


def test_cli_usage_errors_exit_2_without_traceback(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("{not json\n")
    cases = [([str(tmp_path / "missing"), "--out", str(tmp_path / "ds")], "does not exist"),
             ([str(tmp_path / "src"), "--out", str(tmp_path / "ds"), "--shard-size", "big"], "e.g. 256MiB"),
             ([str(tmp_path / "src"), "--out", str(tmp_path / "ds"), "--format", "jsonl", "--json"], "a.jsonl:1: not valid JSON")]
    for args, message in cases:
        proc = data_cli("pack", *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["error"]["exit_code"] == 2


def test_small_shard_size_is_warned_with_the_reason(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"{i:02d}.txt").write_bytes(b"z" * 300)
    one_each = pack(src, str(tmp_path / "ds1"), "text", 1)
    assert one_each.shards_total == one_each.samples_total == 12  # as asked, but said
    assert one_each.notes == ["--shard-size 1 byte is under 1 MiB and makes one shard per sample (a tar shard is at "
                              "least 10 KiB): every shard is one object to fetch, and per-object request overhead "
                              "(~10-50 ms per GET on S3) then dominates reading; 100 MiB to 1 GiB suits object storage"]
    few = pack(src, str(tmp_path / "ds2"), "text", 10 << 10)  # 9 members of 1 KiB (header + padded data) fit
    assert [s.samples for s in read_back(tmp_path / "ds2")[0].shards] == [9, 3]
    assert few.notes[0].startswith("--shard-size 10,240 bytes is under 1 MiB and makes shards of a few samples: ")
    assert pack(src, str(tmp_path / "ds3"), "text", 1 << 20).notes == []
    assert pack(src, str(tmp_path / "ds1"), "text", 1).notes == []  # already packed: nothing new to warn about


def test_cli_warns_before_packing_and_keeps_tables_whole_at_80_columns(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.txt").write_bytes(b"w" * 10)
    out = tmp_path / ("a-long-directory-name-so-that-the-dataset-url-does-not-fit-in-eighty-columns" * 2)
    proc = data_cli("pack", str(src), "--out", str(out), "--shard-size", "1", columns=80)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: --shard-size 1 byte is under 1 MiB and makes one shard per sample")
    assert len(proc.stderr.splitlines()) == 1  # said once: not repeated as a note after the table
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{out}: packed"
    assert all(len(line) <= 80 for line in lines[1:]) and "None" not in proc.stdout and "…" not in proc.stdout
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in lines if line.startswith("│")}
    assert (rows["shards"], rows["samples"], rows["bytes"]) == ("3 (3 written now)", "3", "30.0 KiB")
    json_run = data_cli("pack", str(src), "--out", str(tmp_path / "j"), "--shard-size", "1", "--json")
    assert (json_run.returncode, json_run.stderr) == (0, "")
    assert json.loads(json_run.stdout)["notes"][0].startswith("--shard-size 1 byte is under 1 MiB")


def test_cli_help_says_what_the_shard_size_counts():
    proc = data_cli("pack", "--help", columns=250)
    assert proc.returncode == 0
    assert ("Largest shard file, tar headers and padding included (e.g. 256MiB, 64MB, 1GiB, 1000000 (bytes)); a sample "
            "too big for it gets a shard of its own. Under 1MiB: a warning (per-object request overhead).") in \
        " ".join(proc.stdout.replace("│", " ").split())


def test_tokens_without_numpy_is_a_usage_error(tmp_path):
    code = "import sys; sys.modules['numpy'] = None\n" + CLI
    proc = subprocess.run([sys.executable, "-c", code, "pack", str(tmp_path), "--out", str(tmp_path / "ds"), "--format",
                           "tokens"], capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "error: --format tokens needs numpy: pip install 'trainready[data]'\n"
