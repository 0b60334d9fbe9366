"""One bound per option (issue 25): a numeric option takes its range from the model its value ends up in (the job
spec, the plan request, the run settings), so the CLI never accepts what the model then refuses, nor refuses what
the model (and so a job file) takes. `--memory-margin 0.7` was refused by the CLI (0.5) and taken by PlanRequest
(0.9). Probed at each bound and just past it, through the command itself."""

from __future__ import annotations

from typing import Annotated

import pytest
from cloud_stubs import invoke
from pydantic import TypeAdapter, ValidationError

from trainready.cli.options import bounds_of
from trainready.plan.job import JobSpec
from trainready.plan.search import PlanRequest
from trainready.run.settings import RunSettings

ESTIMATE = ("estimate", "--model", "no-such-model")  # parsed first: a value the parser takes ends at the model
PLAN = ("plan", "--model", "no-such-model")
RUN = ("run", "--run-dir", "{tmp}/r")
CASES = [
    (ESTIMATE, "--gpus", JobSpec, "gpus"), (ESTIMATE, "--gpus-per-node", JobSpec, "gpus_per_node"),
    (ESTIMATE, "--tp", JobSpec, "tp"), (ESTIMATE, "--pp", JobSpec, "pp"), (ESTIMATE, "--cp", JobSpec, "cp"),
    (ESTIMATE, "--ep", JobSpec, "ep"), (ESTIMATE, "--etp", JobSpec, "etp"),
    (ESTIMATE, "--pp-virtual", JobSpec, "pp_virtual"), (ESTIMATE, "--micro-batch", JobSpec, "micro_batch"),
    (ESTIMATE, "--global-batch", JobSpec, "global_batch"), (ESTIMATE, "--seq-len", JobSpec, "seq_len"),
    (ESTIMATE, "--lora-rank", JobSpec, "lora_rank"), (ESTIMATE, "--memory-margin", JobSpec, "memory_margin"),
    (ESTIMATE, "--capacity-factor", JobSpec, "capacity_factor"),
    (ESTIMATE, "--expert-load-imbalance", JobSpec, "expert_load_imbalance"),
    (ESTIMATE, "--usd-per-hour", JobSpec, "usd_per_hour"), (ESTIMATE, "--inter-node-gbps", JobSpec, "inter_node_gbps"),
    (PLAN, "--memory-margin", PlanRequest, "memory_margin"), (PLAN, "--top", PlanRequest, "top"),
    (PLAN, "--max-nodes", PlanRequest, "max_nodes"), (PLAN, "--max-usd", PlanRequest, "max_usd"),
    (PLAN, "--min-gpu-mem", PlanRequest, "min_gpu_mem_gib"),
    (RUN, "--keep-hot", RunSettings, "keep_hot"), (RUN, "--grace", RunSettings, "grace_s"),
    (RUN, "--usd-per-hour", RunSettings, "usd_per_hour"), (RUN, "--budget-usd", RunSettings, "budget_usd"),
    (RUN, "--mtbf-hours", RunSettings, "mtbf_h"),
]


def probes(b: dict) -> list[float]:
    step = 1 if b["whole"] else 1e-6
    out = [b["lo"], b["lo"] - step, b["lo"] + step]
    if b["hi"] is not None:
        out += [b["hi"], b["hi"] + step, b["hi"] - step]
    return out


@pytest.mark.parametrize(("command", "option", "model", "field"), CASES, ids=[f"{c[0][0]} {c[1]}" for c in CASES])
def test_the_option_takes_exactly_what_its_model_takes(tmp_path, command, option, model, field):
    info = model.model_fields[field]
    adapter = TypeAdapter(Annotated[(int if bounds_of(model, field)["whole"] else float), *info.metadata])
    args = [a.format(tmp=tmp_path) for a in command]
    for value in probes(bounds_of(model, field)):
        text = repr(float(value)) if not float(value).is_integer() else str(int(value))
        try:
            adapter.validate_python(int(value) if float(value).is_integer() else value)
            model_takes = True
        except ValidationError:
            model_takes = False
        tail = ["--", "python", "no-such-script.py"] if command is RUN else []
        code, out, err = invoke(*args, option, text, *tail)
        cli_refused = code == 2 and f"{option}" in err and ("is not" in err or "give" in err)
        assert not cli_refused == model_takes, (option, text, model_takes, err[-300:])
