"""`trainready catalog gpus|instances|models`: the facts the planner and `check` use."""

from __future__ import annotations

from typing import Annotated

import typer

from trainready.catalog import load_catalog
from trainready.catalog.schema import GpuList, InstanceList
from trainready.plan.presets import ModelEntry, ModelList, presets

from . import options as o
from .console import emit_json, out
from .render import render_gpus, render_instances, render_models

app = typer.Typer(no_args_is_help=True, help="GPU, instance and model facts, each with its source. "
                  "Exit codes: 0 ok, 2 usage error (e.g. a bad --catalog file).")

Cloud = Annotated[str, typer.Option("--cloud", help="Only this cloud (aws, gcp, azure, lambda).")]


@app.command("gpus", help="GPUs: memory, peak TFLOP/s per precision, HBM and link bandwidth.")
def gpus(catalog_file: o.CatalogFile = None, json_out: o.Json = False) -> None:
    cat = load_catalog(catalog_file)
    items = sorted(cat.gpus.values(), key=lambda g: g.name)
    if json_out:
        emit_json(GpuList(gpus=items))
    else:
        render_gpus(out, items)


@app.command("instances", help="Instance types: GPUs, CPU, RAM, NVMe, network, topology, prices.")
def instances(cloud: Cloud = "", catalog_file: o.CatalogFile = None, json_out: o.Json = False) -> None:
    cat = load_catalog(catalog_file)
    items = sorted((i for i in cat.instances.values() if not cloud or i.cloud == cloud.lower()),
                   key=lambda i: (i.cloud, i.name))
    if cloud and not items:
        from trainready.errors import UsageError, closest, printable
        clouds = sorted({i.cloud for i in cat.instances.values()})
        near = closest(cloud, clouds)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise UsageError(f"unknown cloud '{printable(cloud)}'.{hint} Valid clouds: {', '.join(clouds)}.")
    if json_out:
        emit_json(InstanceList(instances=items))
    else:
        render_instances(out, items, cat)


@app.command("models", help="Model presets with their exact shapes and parameter counts.")
def models(json_out: o.Json = False) -> None:
    items = list(presets().values())
    if json_out:
        emit_json(ModelList(models=[ModelEntry(params=m.param_count(), active_params=m.active_param_count(),
                                                    **m.model_dump()) for m in items]))
    else:
        render_models(out, items)
