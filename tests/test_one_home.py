"""Things written once (issue 25: the copies `duplicates` showed). A second copy drifts: the cloud cache took a
relative $XDG_CACHE_HOME that the shard cache (rightly, per the XDG spec) ignored; run.json's redactor missed
{"password": "short"} where the bundle's caught it."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "trainready"


def places(pattern: str) -> list[str]:
    found = re.compile(pattern)
    return sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if found.search(p.read_text()))


def test_the_xdg_lookup_has_one_home():
    assert places(r"environ\.get\(\s*[\"']XDG_") == [] and places(r"(?m)^def xdg_dir\(") == ["io/files.py"]


def test_the_json_redactor_has_one_home():
    assert places(r"def \w*redact\w*\(value") == ["io/redact.py"]


def test_the_per_node_price_cap_has_one_home():
    assert places(r"^MAX_USD_PER_HOUR\s*=") == [] and places(r"(?m)^MAX_USD_PER_HOUR\s*=") == ["limits.py"]


def test_the_billing_rate_has_one_home():
    assert places(r"(?m)^def usd_per_second\(") == ["run/budget.py"]


def test_a_short_secret_under_a_secret_key_is_hidden_in_run_json_too():
    from trainready.io import redact_json

    assert redact_json({"password": "short", "note": "short"}) == {"password": "***", "note": "short"}
