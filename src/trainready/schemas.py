"""JSON Schemas of everything trainready writes, generated from the pydantic models.

`python -m trainready.schemas DIR` writes them; docs/schemas/ holds the committed copies and
a test fails when the code and the committed schemas disagree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from trainready.catalog.schema import GpuList, InstanceList
from trainready.check.bundle import BundleManifest
from trainready.check.findings import CheckReport
from trainready.cloud.report import AccountReport
from trainready.data.bench import DataBenchResult
from trainready.data.format import DataIndex
from trainready.data.pack import PackResult
from trainready.plan.calibration_file import CalibrationFile
from trainready.plan.estimate import EstimateResult
from trainready.plan.job import JobSpec
from trainready.plan.presets import ModelList
from trainready.plan.search import PlanResult
from trainready.plan.track_record import RecordFile
from trainready.run.diagnose import DiagnosisReport
from trainready.run.records import RunInfo, RunOutcome, StopInfo, TelemetryLine
from trainready.run.scaling import ScalingReport
from trainready.run.summary import RunSummary
from trainready.store.inspect import CheckpointListing, PruneResult, PullResult, VerifyReport
from trainready.store.manifest import Lease, Manifest
from trainready.store.tensor_index import TensorIndex


class JobFile(JobSpec):
    """A job file (TOML from `plan --save` or `estimate --save`, read by `--job`). Unset fields: `plan` chooses them."""

    schema_version: Literal[1]  # load_job refuses a file without it
    kind: Literal["trainready-job"] = "trainready-job"


class ErrorBody(BaseModel):
    message: str
    exit_code: int


class ErrorOutput(BaseModel):
    """What `--json` prints on stdout when a command fails (the message also goes to stderr)."""

    schema_version: int = 1
    error: ErrorBody


SCHEMAS: dict[str, type[BaseModel]] = {
    "estimate": EstimateResult, "plan": PlanResult, "job": JobFile, "catalog-gpus": GpuList,
    "catalog-instances": InstanceList, "catalog-models": ModelList, "error": ErrorOutput,
    "ckpt-ls": CheckpointListing, "ckpt-verify": VerifyReport, "ckpt-pull": PullResult, "ckpt-prune": PruneResult,
    "ckpt-manifest": Manifest, "ckpt-lease": Lease, "ckpt-tensor-index": TensorIndex, "check": CheckReport,
    "check-bundle": BundleManifest,
    "run-result": RunOutcome, "run-summary": RunSummary, "run-scaling": ScalingReport, "run-info": RunInfo,
    "run-stop": StopInfo, "run-telemetry": TelemetryLine, "diagnose": DiagnosisReport,
    "data-index": DataIndex, "data-pack": PackResult, "data-bench": DataBenchResult, "account": AccountReport,
    "calibration": CalibrationFile, "track-record": RecordFile,
}
ROOT_MODELS = {"run-telemetry"}  # versioned in each record rather than a top-level field


def render(name: str) -> str:
    return json.dumps(SCHEMAS[name].model_json_schema(mode="serialization"), indent=2, sort_keys=True) + "\n"


def write(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in SCHEMAS:
        (directory / f"{name}.schema.json").write_text(render(name))


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas"))
