"""`check` on real outputs of broken and healthy nodes (tests/fixtures/real/, issue 23).

Each fixture is a verbatim copy of what a machine printed, found in a public issue, a vendor's test data
or documentation; its first line names the source and what is wrong or healthy. Each directory's
index.toml says which bundle file the output is (`as`), the instance when the source names it, and
the verdict an expert gives (`expect`). The test drops the header lines, puts the output alone in a
bundle (plus instance-type.txt when the instance is known), and checks every expected status; a
healthy output must fail nothing. Cut at random lines, no fixture may make `check` raise."""

from __future__ import annotations

import random
import re
import tomllib
from pathlib import Path

import pytest

from trainready.catalog import load_catalog
from trainready.check.analyze import analyze
from trainready.check.bundle import FILES, Bundle
from trainready.errors import UnknownNameError

REAL = Path(__file__).parent / "fixtures" / "real"
HEADER = re.compile(r"# (source|machine|command|note):")
CATEGORIES = ("nvsmi", "kernel", "fabric", "nccl", "dcgm", "ib")


def _load() -> list[dict]:
    out = []
    for category in CATEGORIES:
        index = tomllib.loads((REAL / category / "index.toml").read_text())
        for entry in index["fixture"]:
            out.append({**entry, "category": category, "path": REAL / category / entry["file"]})
    return out


FIXTURES = _load()


def body(path: Path) -> str:
    """The output without the fixture's own header lines (# source:, # machine:, # command:, # note:)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    k = 0
    while k < len(lines) and HEADER.match(lines[k]):
        k += 1
    return "".join(lines[k:])


def _instance(name: str) -> str | None:
    if not name:
        return None
    try:
        return load_catalog().instance(name).name
    except UnknownNameError:
        return None


def judge(entry: dict, text: str | None = None) -> dict[str, tuple[str, str]]:
    files = {entry["as"]: body(entry["path"]) if text is None else text}
    instance = _instance(entry.get("instance", ""))
    if instance:
        files["instance-type.txt"] = instance + "\n"
    report = analyze(Bundle(files, None, source=str(entry["path"].name)))
    return {f.id: (f.status, f"{f.observed} | {f.reason}") for f in report.checks}


def test_corpus_is_real_and_large_enough():
    assert len(FIXTURES) >= 40
    names = {e["path"] for e in FIXTURES}
    on_disk = {p for c in CATEGORIES for p in (REAL / c).iterdir() if p.name != "index.toml"}
    assert names == on_disk, "every fixture file is in its index, and every entry has its file"
    for entry in FIXTURES:
        first = entry["path"].read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# source: ") and " | " in first, entry["file"]
        assert entry["as"] in FILES, f"{entry['file']}: {entry['as']} is not a bundle file name"
        assert body(entry["path"]).strip(), entry["file"]
    for category in CATEGORIES:  # healthy and broken outputs in every category
        kinds = {e["healthy"] for e in FIXTURES if e["category"] == category}
        assert False in kinds, category


@pytest.mark.parametrize("entry", FIXTURES, ids=lambda e: f"{e['category']}/{e['file'][:70]}")
def test_judged_as_an_expert_would(entry):
    findings = judge(entry)
    for check_id, want in entry["expect"].items():
        got, why = findings[check_id]
        assert got == want, f"{entry['file']}: {check_id} is {got}, expected {want} ({entry.get('why', '')}); said: {why}"
    if entry["healthy"]:
        failed = {k: v for k, v in findings.items() if v[0] == "fail"}
        assert not failed, f"{entry['file']} is healthy, yet: {failed}"


@pytest.mark.parametrize("entry", FIXTURES, ids=lambda e: f"{e['category']}/{e['file'][:70]}")
def test_cut_anywhere_never_raises(entry):
    """A capture cut short (a paste, a full disk, a killed command) at 10 random lines: findings, never
    a traceback, and a check that crashed would say "check could not run"."""
    lines = body(entry["path"]).splitlines(keepends=True)
    rng = random.Random(entry["file"])
    for cut in sorted({rng.randrange(0, max(1, len(lines))) for _ in range(10)}):
        findings = judge(entry, "".join(lines[:cut]) + (lines[cut][: len(lines[cut]) // 2] if cut < len(lines) else ""))
        crashed = {k: v for k, v in findings.items() if "check could not run" in v[1]}
        assert not crashed, f"{entry['file']} cut at line {cut}: {crashed}"
