"""What the engines need to know about one node: its GPU count and workers (every engine), and for the cluster
kinds (k8s, jobset, pcluster) the catalog's facts and the checks they share: an instance the catalog knows,
processes it can hold, EFA for more than one node. Pure functions over an EmitSpec."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainready.errors import UsageError, closest

from .spec import EmitSpec


@dataclass(frozen=True)
class Node:
    instance: str
    cloud: str
    gpu: str
    gpus: int
    efa: int
    """EFA interfaces (vpc.amazonaws.com/efa devices); 0 where the instance has none."""
    nvme_gb: float | None
    """All local NVMe together, decimal GB; None or 0 where the catalog knows of none."""
    ram_gib: float | None

    @property
    def procs(self) -> int:
        return self.gpus


def node_of(spec: EmitSpec, kind: str) -> Node:
    """The catalog's facts for spec.instance, after the checks every cluster kind shares."""
    if spec.instance is None:
        raise UsageError(f"--emit {kind} needs --instance (e.g. p5.48xlarge): node selection, GPUs and EFA devices "
                         "come from the catalog (`trainready catalog instances` lists them)")
    from trainready.catalog import load_catalog

    catalog = load_catalog()
    inst = catalog.instance(spec.instance)  # unknown -> UsageError with the nearest names
    node = Node(instance=inst.name, cloud=inst.cloud, gpu=inst.gpu, gpus=inst.gpu_count, efa=inst.efa_interfaces or 0,
                nvme_gb=inst.nvme_total_gb, ram_gib=inst.ram_gib)
    for what, value in (("--nproc-per-node", spec.nproc_per_node), ("GPUs per node", spec.gpus_per_node)):
        if value is not None and value > node.gpus:
            raise UsageError(f"{what} {value}: {node.instance} has {node.gpus} GPUs (catalog), so one node holds at "
                             f"most {node.gpus} processes, one per GPU; give --nproc-per-node {node.gpus} or less, or "
                             "more --nnodes")
    if spec.nnodes > 1 and node.efa == 0:
        near = efa_alternatives(catalog, inst.name, inst.gpu)
        raise UsageError(f"{node.instance} has no EFA interfaces (catalog), and --nnodes {spec.nnodes} would run its "
                         "collectives over plain TCP between nodes: use one node, or an instance with EFA"
                         f"{': ' + ', '.join(near) if near else ''}")
    return node


def efa_alternatives(catalog, name: str, gpu: str) -> list[str]:
    """EFA instances of the catalog: the same GPU first, then the nearest names (up to 4 in all)."""
    with_efa = [i for i in catalog.instances.values() if (i.efa_interfaces or 0) > 0]
    same = sorted(i.name for i in with_efa if i.gpu == gpu)
    return (same + closest(name, [i.name for i in with_efa if i.gpu != gpu], n=4))[:4]


def nproc(spec: EmitSpec, node: Node) -> int:
    return spec.nproc_per_node if spec.nproc_per_node is not None else node.procs


def only_for(spec: EmitSpec, kind: str, fields: dict[str, str]) -> None:
    """Refuse options that `kind` would silently ignore: {attribute: "--flag (where it applies)"}."""
    for attr, flag in fields.items():
        if getattr(spec, attr) is not None:
            raise UsageError(f"{flag} does not apply to --emit {kind}")


def suggest_name(text: str, limit: int, fallback: str = "job") -> str:
    """A nearby valid lowercase name (a letter, then letters, digits and '-'): other characters become '-',
    trimmed to `limit`."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    out = out.lstrip("0123456789-") or fallback
    return out[:max(limit, 1)].rstrip("-") or fallback


def gpus_per_node(spec: EmitSpec) -> int | None:
    """GPUs on one node: as given, else the instance's count from the catalog, else unknown."""
    if spec.gpus_per_node is not None:
        return spec.gpus_per_node
    if spec.instance is None:
        return None
    from trainready.catalog import load_catalog

    try:
        return load_catalog().instance(spec.instance).gpu_count
    except UsageError:  # not in the catalog: SkyPilot or the cluster may still know it
        return None


def procs_per_node(spec: EmitSpec) -> int | None:
    return spec.nproc_per_node if spec.nproc_per_node is not None else gpus_per_node(spec)


def _instance_env(spec: EmitSpec) -> list:
    """The catalog's launch environment for spec.instance x spec.nnodes (catalog/launch_env.py), the same one
    `plan` prints in its launch line; an instance the catalog does not know gets NCCL's debug line only."""
    from trainready.catalog import load_catalog
    from trainready.catalog.launch_env import launch_env as catalog_env
    from trainready.errors import UsageError

    instance = None
    if spec.instance is not None:
        try:
            instance = load_catalog().instance(spec.instance)
        except UsageError:
            instance = None
    return catalog_env(instance, spec.nnodes)


def user_env(spec: EmitSpec) -> dict[str, str]:
    """What a launch file sets, sorted by name: the instance's launch environment, then --env (which wins)."""
    merged = {v.name: v.value for v in _instance_env(spec)}
    merged.update(spec.env)
    return {name: merged[name] for name in sorted(merged)}


def env_sources(spec: EmitSpec) -> list[str]:
    """One comment line per variable the launch file sets from the catalog (not overridden by --env): the value,
    why, and its source."""
    return [f"{v.name}={v.value}: {v.why}. Source: {v.source}" for v in _instance_env(spec) if v.name not in spec.env]
