"""Collectives, judged the nccl-tests way against thresholds.py: from `--deep` (deep.json) and from
nccl-tests outputs a user already has (`nccl-tests-<op>.txt`, one file per op, as printed).

An nccl-tests output is judged at its largest message size against the floor for its number of
nodes (ranks and hosts read from its `# Rank N ... on HOST device ...` lines); its "Avg bus
bandwidth" line (the mean over every size, small ones included) is never the verdict. Wrong results
(#wrong > 0) or a run that failed are failures whatever the bandwidth."""

from __future__ import annotations

from trainready.catalog import load_catalog
from trainready.catalog.schema import Gpu, Instance
from trainready.errors import UnknownNameError

from .. import bisect
from ..facts import Facts
from ..facts.links import NcclRun
from ..findings import SEVERITY
from ..parsers import node
from ..registry import Verdict, check
from ..thresholds import Kind, size_text, threshold
from .common import squeeze

# Below this share of a floor a collective fails even when measured at a smaller message than the floor's:
# past 256 MiB nccl-tests' busbw is within ~10% of its plateau on these nodes (adt's tables: 2x p4de 76.8 GB/s
# at 1 GiB vs 78.3 at 2 GiB; 2x p5 437 at 1 GiB vs 487 at 16 GiB), so half the floor is a fault at any size.
FAR_BELOW = 0.5
ADVICE = ("run with NCCL_DEBUG=INFO and check net.nccl-env, gpu.nvlink-links, nvswitch.fabric, net.efa and "
          "net.gpudirect-rdma; across nodes: a cluster placement group and a security group allowing all "
          "traffic to and from itself")


def _row_at(rows: list[dict], size: int | None) -> tuple[float | None, int | None]:
    """(busbw, size) at `size` if measured there, else the largest message's; busbw may be None."""
    good = [r for r in rows if isinstance(r, dict) and node.gbps(r.get("busbw_gbps")) is not None
            and isinstance(r.get("size_bytes"), int)]
    if not good:
        return None, None
    if size is not None:
        at = [r for r in good if r["size_bytes"] == size]
        if at:
            return max(node.gbps(r["busbw_gbps"]) for r in at), size
    largest = max(good, key=lambda r: r["size_bytes"])
    return node.gbps(largest["busbw_gbps"]), largest["size_bytes"]


def world_nodes(ctx, world: int) -> int:
    nodes = ctx.deep("nodes")
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1:
        return nodes
    per = ctx.instance.gpu_count if ctx.instance else None
    return -(-world // per) if per and world > per else 1  # deep.json before issue 16: infer from the world size


def _judge(value: float, at: int | None, th, nodes: int) -> tuple[str, str]:
    status = th.judge(value)
    short = th.size_bytes is not None and (at is None or at < th.size_bytes)
    if short and status == "fail" and value >= FAR_BELOW * th.floor_gbps:
        return "warn", (f"below the floor, but measured at {size_text(at) if at else 'an unknown size'}, smaller than "
                        f"the floor's {size_text(th.size_bytes)} (busbw rises with size): rerun with that size")
    if nodes > 2 and status == "fail":
        return "warn", f"below the 2-node floor with {nodes} nodes (no published figure at this scale): see nccl.pairwise"
    return status, (f"{value / th.floor_gbps:.0%} of the floor" + (" (derived)" if th.derived else "") +
                    (f"; typical {th.typical_gbps:g} GB/s" if th.typical_gbps else ""))


def _from_deep(f: Facts, kind: Kind, key: str) -> Verdict | None:
    ctx = f.ctx
    data = ctx.deep(key)
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("skipped") or data.get("error"):
        why = (data.get("skipped") or data.get("error")) if isinstance(data, dict) else "unreadable"
        return Verdict.skip(f"not measured: {why}")
    busbw_max = node.gbps(data.get("busbw_gbps"))
    rows = data.get("rows") if isinstance(data.get("rows"), list) else []
    world = data.get("world_size") if isinstance(data.get("world_size"), int) else 0
    backend = str(data.get("backend", "?"))
    if busbw_max is None and not rows:
        return Verdict.skip(f"no {kind} result in deep.json")
    observed = f"{busbw_max or 0:.1f} GB/s bus bandwidth ({backend}, {world} ranks, largest of the sweep)"
    if backend != "nccl":
        return Verdict("skip", observed=observed, expected="NCCL on GPUs",
                       reason=str(data.get("note", "measured with gloo (no GPUs): not comparable with NVLink/EFA figures")))
    nodes = world_nodes(ctx, world)
    th = threshold(kind, ctx.instance, ctx.gpu, nodes=min(nodes, 2))
    if th is None:
        return Verdict("warn", observed=observed, expected="unknown", reason="no expected figure for this instance",
                       advice="pass --instance TYPE")
    value, at = _row_at(rows, th.size_bytes)
    if value is None:
        value, at = busbw_max, None
    status, reason = _judge(value, at, th, nodes)
    return Verdict(status, observed=f"--deep: busbw {value:.1f} GB/s" + (f" at {size_text(at)}" if at else "") +
                   f" ({backend}, {world} ranks" + (f", {nodes} nodes" if nodes > 1 else "") +
                   f"; largest of the sweep {busbw_max or value:.1f})", expected=th.describe(), reason=reason)


def _gpu_named(name: str) -> Gpu | None:
    catalog = load_catalog()
    for candidate in (name, name.removeprefix("NVIDIA ").removeprefix("Tesla ")):
        try:
            return catalog.gpu(candidate)
        except UnknownNameError:
            continue
    return None


def _node_like(f: Facts, run: NcclRun, per_host: int) -> tuple[Instance | None, Gpu | None, str]:
    """The instance to judge by: --instance (or the bundle's), else for one node a catalog instance with
    the header's GPU model and count (8 SXM GPUs of A100/H100/H200/B200 sit on an NVSwitch board)."""
    if f.ctx.instance is not None:
        return f.ctx.instance, f.ctx.gpu, ""
    gpu = _gpu_named(run.gpus[0]) if run.gpus and len(set(run.gpus)) == 1 else None
    if gpu is None or len(run.hosts) > 1:
        return None, gpu, ""
    like = sorted((i for i in load_catalog().instances.values() if i.gpu == gpu.name and i.gpu_count == per_host),
                  key=lambda i: (i.topology != "nvswitch", i.cloud != "aws", i.name))
    if not like:
        return None, gpu, ""
    return like[0], gpu, f" (judged as a {like[0].name}-like node: {per_host}x {run.gpus[0]} in the header; pass --instance)"


def _from_tests(f: Facts, kind: Kind, op: str) -> Verdict | None:
    run = f.nccl_tests(op)
    if run is None:
        return None
    tests = run.tests
    wrong = [r for r in tests.rows if r.has_wrong]
    hosts = max(1, len(run.hosts))
    label = f"nccl-tests ({run.source})"
    if tests.failures or wrong or (tests.out_of_bounds or 0) > 0:
        what = ([f"#wrong at {size_text(r.size_bytes)}" for r in wrong[:3]] +
                ([f"{tests.out_of_bounds} out-of-bounds values"] if tests.out_of_bounds else []) + tests.failures[:2])
        return Verdict("fail", observed=squeeze(f"{label}: " + "; ".join(what), 300), expected="no wrong results, no failure",
                       reason="the collective returned wrong data or failed: a GPU, NVLink or NIC corrupts or drops traffic"
                       if wrong or tests.out_of_bounds else "the run failed before it finished",
                       advice="rerun on each node alone and in pairs to find the bad one (trainready check --deep under "
                              "torchrun does it); read the NCCL WARN lines")
    if not tests.rows:
        return Verdict("warn", observed=f"{label}: no result rows", expected="an nccl-tests table", unverified=True,
                       reason=f"unreadable: {run.source} has no result rows (cut short, or the run hung before its table)",
                       advice="rerun nccl-tests and save its whole output")
    largest = max(tests.rows, key=lambda r: r.size_bytes)
    value = largest.busbw_gbps
    per_host = (run.ranks or len(run.gpus) or 0) // hosts if run.ranks or run.gpus else 0
    instance, gpu, like = _node_like(f, run, per_host)
    shape = (f"{run.ranks} ranks" if run.ranks else "ranks unknown") + \
        (f" on {hosts} host{'s' if hosts > 1 else ''}" if run.hosts else "")
    observed = f"{label}: busbw {value:.1f} GB/s at {size_text(largest.size_bytes)} ({shape})"
    if run.elided:
        observed += "; sizes elided by the paste's author"
    th = threshold(kind, instance, gpu, nodes=min(hosts, 2)) if gpu is not None else None
    if th is None:
        return Verdict("warn", observed=observed, expected="unknown", partial=True,
                       reason=("no floor for this run: " + (f"{f.ctx.unknown_instance} and the header names no GPU we know"
                                                           if gpu is None else "instance type unknown across nodes")),
                       advice="pass --instance TYPE")
    status, reason = _judge(value, largest.size_bytes, th, hosts)
    if not run.hosts and status == "fail":  # no `# Rank ... on HOST` lines: one node or several, unknown
        return Verdict("warn", observed=observed, expected=th.describe(), partial=True,
                       reason=f"below the one-node floor ({reason}), but the output names no hosts (no `# Rank N ... "
                              "on HOST` lines): across nodes the floor is lower; keep the whole output",
                       advice="rerun nccl-tests and save its whole output (its header names ranks and hosts)")
    return Verdict(status, observed=observed, expected=th.describe(), reason=reason + like)


def judge_collective(f: Facts, kind: Kind, key: str, op: str) -> Verdict | None:
    verdicts = [v for v in (_from_tests(f, kind, op), _from_deep(f, kind, key)) if v is not None]
    if not verdicts:
        return Verdict.skip("not measured: run --deep, or put nccl-tests output in the bundle as "
                            f"nccl-tests-{op}.txt (or pass --nccl-tests FILE)", "trainready check --deep")
    worst = min(verdicts, key=lambda v: SEVERITY[v.status])
    v = Verdict(worst.status, observed=squeeze("; ".join(x.observed for x in verdicts if x.observed), 500),
                expected=worst.expected, reason=worst.reason, advice=worst.advice, partial=worst.partial,
                unverified=worst.unverified)
    if len(verdicts) > 1 and len({x.status for x in verdicts}) > 1:
        v.reason = squeeze(v.reason + "; the nccl-tests output and --deep disagree: "
                           + ", ".join(f"{x.status}" for x in verdicts), 500)
    if v.status not in ("pass", "skip") and not v.advice:
        v.advice = ADVICE
    return v


@check("nccl.allreduce", "nccl", needs=("nccl-tests-all_reduce.txt", "deep.json"), deep=True)
def allreduce(f: Facts) -> Verdict | None:
    """Judged against thresholds.py: aznhc's floors inside one node (228 GB/s at 8 GiB on 8x A100, 460 at
    16 GiB on 8x H100), published 2-node EFA figures across nodes, a derived figure elsewhere."""
    return judge_collective(f, "all_reduce", "allreduce", "all_reduce")


@check("nccl.allgather", "nccl", needs=("nccl-tests-all_gather.txt", "deep.json"), deep=True)
def all_gather(f: Facts) -> Verdict | None:
    return judge_collective(f, "all_gather", "all_gather", "all_gather")


@check("nccl.reducescatter", "nccl", needs=("nccl-tests-reduce_scatter.txt", "deep.json"), deep=True)
def reduce_scatter(f: Facts) -> Verdict | None:
    return judge_collective(f, "reduce_scatter", "reduce_scatter", "reduce_scatter")


@check("nccl.alltoall", "nccl", needs=("nccl-tests-alltoall.txt", "deep.json"), deep=True)
def all_to_all(f: Facts) -> Verdict | None:
    return judge_collective(f, "all_to_all", "all_to_all", "alltoall")


@check("nccl.pairwise", "nccl", deep=True)
def pairwise(f: Facts) -> Verdict | None:
    ctx = f.ctx
    data = ctx.deep("pairwise")
    nodes_measured = ctx.deep("nodes")
    if data is None:
        one = isinstance(nodes_measured, int) and nodes_measured <= 1
        return Verdict.skip("one node: pairwise node tests run under torchrun across nodes" if one
                    else "no pairwise results in deep.json", "torchrun --nnodes N ... -m trainready check --deep")
    if not isinstance(data, dict) or data.get("skipped") or data.get("error"):
        return Verdict.skip(f"not measured: {data.get('skipped') or data.get('error')}"
                    if isinstance(data, dict) else "unreadable")
    hosts = [str(h) for h in data.get("nodes", [])] if isinstance(data.get("nodes"), list) else []
    results = [bisect.PairResult(r["a"], r["b"], node.gbps(r["busbw_gbps"]))
               for rnd in data.get("rounds", []) if isinstance(rnd, list) for r in rnd
               if isinstance(r, dict) and isinstance(r.get("a"), int) and isinstance(r.get("b"), int)
               and node.gbps(r.get("busbw_gbps")) is not None]
    count = len(hosts) or (max((max(r.a, r.b) for r in results), default=-1) + 1)
    floor = node.gbps(data.get("floor_gbps"))
    verdict = bisect.verdict(count, results, floor)

    def name(n: int) -> str:
        return f"node {n} ({hosts[n]})" if n < len(hosts) else f"node {n}"

    rounds = len(data.get("rounds", [])) if isinstance(data.get("rounds"), list) else 0
    observed = (f"{count} nodes, {len(results)} pair tests in {rounds} round(s)" +
                (f", {size_text(data['size_bytes'])}" if isinstance(data.get("size_bytes"), int) else "") +
                (f": min {min(r.busbw_gbps for r in results):.1f} GB/s" if results else ""))
    expected = (f">= {floor:.1f} GB/s busbw per pair ({data.get('floor_source', 'floor')})" if floor else "unknown")
    v = Verdict(status="pass", observed=observed[:300], expected=str(expected)[:400])
    if verdict.slow_nodes or verdict.slow_links:
        v.status = "fail"
        parts = [f"slow {name(n)}: below the floor with healthy partners" for n in verdict.slow_nodes]
        parts += [f"slow link {name(a)} <-> {name(b)}: each is fine with other nodes" for a, b in verdict.slow_links]
        v.reason = "; ".join(parts)[:500]
        v.advice = "drain the slow node (stop/start it for another host) and rerun; a slow link alone: check placement"
    elif verdict.all_slow:
        v.status = "warn" if count > 2 or floor is None else "fail"
        v.reason = ("every pair measured is below the floor: a cause the nodes share (EFA software, security group, "
                          "placement group, NCCL settings), not one node")
        v.advice = "check net.efa, net.nccl-env and net.gpudirect-rdma on every node"
    elif verdict.unresolved:
        v.status = "warn"
        v.reason = "could not tell: " + ", ".join(name(n) for n in verdict.unresolved[:8]) + " never paired with a healthy node"
        v.advice = "rerun with more nodes, or check those nodes alone (trainready check --deep on each)"
    else:
        v.reason = "every node reaches the floor with its partners"
    return v




OTHER_OPS = ("broadcast", "reduce", "sendrecv")


@check("nccl.other-ops", "nccl", needs=tuple(f"nccl-tests-{op}.txt" for op in OTHER_OPS))
def other_ops(f: Facts) -> Verdict | None:
    """nccl-tests of ops no floor covers (broadcast, reduce, sendrecv): judged for wrong results and
    failures only; the bandwidth is shown, not judged."""
    parts, worst = [], "pass"
    for op in OTHER_OPS:
        run = f.nccl_tests(op)
        if run is None:
            continue
        tests = run.tests
        wrong = [r for r in tests.rows if r.has_wrong]
        if tests.failures or wrong or not tests.rows:
            status = "fail" if tests.failures or wrong else "warn"
            parts.append(f"{op}: " + ("; ".join([*(f"#wrong at {size_text(r.size_bytes)}" for r in wrong[:2]),
                                                 *tests.failures[:2]]) or "no result rows (unreadable)"))
        else:
            status = "pass"
            largest = max(tests.rows, key=lambda r: r.size_bytes)
            parts.append(f"{op}: busbw {largest.busbw_gbps:.1f} GB/s at {size_text(largest.size_bytes)}")
        worst = min(worst, status, key=SEVERITY.__getitem__)
    return Verdict(worst, observed=squeeze("; ".join(parts), 400), expected="no wrong results, no failure",
                   reason="no published floor for these ops: checked for correctness, bandwidth shown only"
                   if worst == "pass" else "wrong results or a failed run" if worst == "fail" else
                   "unreadable: a run without result rows", partial=worst == "warn",
                   advice="" if worst == "pass" else ADVICE)
