"""The documented JSON schemas (docs/schemas) match what the code emits."""

from pathlib import Path

import pytest

from trainready.schemas import ROOT_MODELS, SCHEMAS, render

DOCS = Path(__file__).resolve().parents[1] / "docs" / "schemas"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_committed_schema_matches_code(name):
    committed = (DOCS / f"{name}.schema.json").read_text()
    assert committed == render(name), (
        f"docs/schemas/{name}.schema.json is stale: run `python -m trainready.schemas docs/schemas` "
        "and describe the change in docs/")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_output_is_versioned(name):
    if name in ROOT_MODELS:  # the job file carries schema_version outside the model; telemetry in every record
        return
    assert "schema_version" in SCHEMAS[name].model_json_schema()["properties"]
