"""`--deep` acceptance checks: host<->device copies, memory bandwidth, GPU-to-GPU copies, the
collectives the nccl-tests way, pairwise node tests across nodes; and DCGM's diagnostic (`--dcgm`).

Each figure is judged against thresholds.py: a sourced floor fails the node below it; a derived one
(no source covers the node) warns first and fails only far below, and says it is derived."""

from __future__ import annotations

import re
from statistics import median

from . import bisect
from .checks_node import parsed
from .context import Context
from .findings import SEVERITY, Finding, skip
from .parsers import node
from .registry import check
from .thresholds import Kind, size_text, threshold

DEEP = "trainready check --deep"
# Below this share of a floor a collective fails even when measured at a smaller message than the floor's:
# past 256 MiB nccl-tests' busbw is within ~10% of its plateau on these nodes (adt's tables: 2x p4de 76.8 GB/s
# at 1 GiB vs 78.3 at 2 GiB; 2x p5 437 at 1 GiB vs 487 at 16 GiB), so half the floor is a fault at any size.
FAR_BELOW = 0.5
PLATEAU_FROM = 256 << 20


def _measured(ctx: Context, check_id: str, area: str, key: str) -> dict | Finding:
    data = ctx.deep(key)
    if data is None:
        return skip(check_id, area, "no deep.json (run with --deep)" if ctx.bundle.text("deep.json") is None else
                    f"not measured (deep.json has no {key}: collected by an older trainready)", DEEP)
    if not isinstance(data, dict) or data.get("skipped") or data.get("error"):
        why = (data.get("skipped") or data.get("error")) if isinstance(data, dict) else "unreadable"
        return skip(check_id, area, f"not measured: {why}")
    return data


def _no_floor(check_id: str, area: str, observed: str, ctx: Context) -> Finding:
    return Finding(id=check_id, area=area, status="warn", observed=observed, expected="unknown",
                   reason=f"no figure to judge by ({ctx.unknown_instance if ctx.instance is None else 'no datasheet numbers'})",
                   advice="pass --instance TYPE")


def _per_gpu(check_id: str, ctx: Context, key: str, fields: list[tuple[str, Kind, str]], what: str, advice: str) -> Finding:
    data = _measured(ctx, check_id, "gpu", key)
    if isinstance(data, Finding):
        return data
    rows = [r for r in data.get("gpus", []) if isinstance(r, dict)]
    if not rows:
        return skip(check_id, "gpu", f"deep.json {key} has no per-GPU rows")
    observed, bad, expected, statuses = [], [], [], []
    for field, kind, label in fields:
        values = {r.get("index"): node.gbps(r.get(field)) for r in rows}
        values = {i: v for i, v in values.items() if v is not None}
        if not values:
            continue
        observed.append(f"{label} min {min(values.values()):.1f} / median {median(values.values()):.1f} GB/s")
        th = threshold(kind, ctx.instance, ctx.gpu)
        if th is None:
            continue
        expected.append(f"{label} {th.describe()}")
        for index, value in sorted(values.items(), key=lambda kv: str(kv[0])):
            status = th.judge(value)
            statuses.append(status)
            if status != "pass":
                bad.append(f"GPU {index} {label} {value:.1f} GB/s")
    size = data.get("bytes")
    observed_text = "; ".join(observed) + (f" ({len(rows)} GPUs, {size_text(size)})" if isinstance(size, int) and size > 0 else "")
    if not observed:
        return skip(check_id, "gpu", f"deep.json {key} has no readable figures")
    if not expected:
        return _no_floor(check_id, "gpu", observed_text, ctx)
    status = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "pass"
    finding = Finding(id=check_id, area="gpu", status=status, observed=observed_text, expected="; ".join(expected)[:400])
    finding.reason = (f"{what} below the floor: " + "; ".join(bad[:8])) if bad else f"every GPU's {what} at or above the floor"
    if status != "pass":
        finding.advice = advice
    return finding


@check("gpu.h2d-d2h", "gpu", deep=True)
def host_copies(ctx: Context) -> Finding:
    return _per_gpu("gpu.h2d-d2h", ctx, "copy", [("h2d_gbps", "h2d", "H2D"), ("d2h_gbps", "d2h", "D2H")],
                    "host<->device bandwidth",
                    "check gpu.pcie (link width/generation), the CPU/NUMA the process ran on (nvidia-smi topo -m), "
                    "and IOMMU settings; a GPU alone below its peers is a bad slot: stop/start the instance")


@check("gpu.memory-bandwidth", "gpu", deep=True)
def memory_bandwidth(ctx: Context) -> Finding:
    return _per_gpu("gpu.memory-bandwidth", ctx, "memory", [("gbps", "memory", "copy")], "memory bandwidth",
                    "check gpu.throttle and gpu.clocks (memory clock); a GPU alone below its peers: drain the node")


@check("gpu.p2p", "gpu", deep=True)
def p2p(ctx: Context) -> Finding:
    data = _measured(ctx, "gpu.p2p", "gpu", "p2p")
    if isinstance(data, Finding):
        return data
    pairs = [p for p in data.get("pairs", []) if isinstance(p, dict) and node.gbps(p.get("gbps")) is not None]
    if not pairs:
        return skip("gpu.p2p", "gpu", "deep.json p2p has no pairs")
    values = [node.gbps(p["gbps"]) for p in pairs]
    observed = f"{len(pairs)} ordered pairs: min {min(values):.1f} / median {median(values):.1f} GB/s"
    th = threshold("p2p", ctx.instance, ctx.gpu)
    if th is None:
        return _no_floor("gpu.p2p", "gpu", observed, ctx)
    judged = [(p, th.judge(node.gbps(p["gbps"]))) for p in pairs]
    no_peer = [p for p in pairs if p.get("peer_access") is False]
    bad = [p for p, status in judged if status != "pass"]
    status = "fail" if any(s == "fail" for _, s in judged) else "warn" if bad else "pass"
    if no_peer and ctx.gpu is not None and ctx.gpu.has_nvlink and status == "pass":
        status = "warn"
    finding = Finding(id="gpu.p2p", area="gpu", status=status, observed=observed, expected=th.describe())
    slow = _slow_gpus(bad)
    finding.reason = ("pairs below the floor: " + "; ".join(f"GPU{p['src']}->GPU{p['dst']} {node.gbps(p['gbps']):.1f}"
                                                              for p in bad[:8]) + (f" (common to all: GPU {slow})" if slow else "")
                      if bad else "every pair at or above the floor")
    if no_peer:
        finding.reason += f"; peer access off for {len(no_peer)} pair(s) (copies go through host memory)"
    if status != "pass":
        finding.advice = "check gpu.nvlink-links and nvswitch.fabric; one GPU in every slow pair is the bad one: drain the node"
    return finding


def _slow_gpus(bad: list[dict]) -> str:
    """A GPU that is in every slow pair, when there is one (it is the one at fault)."""
    if len(bad) < 2:
        return ""
    common = set.intersection(*({p.get("src"), p.get("dst")} for p in bad))
    return ", ".join(str(g) for g in sorted(common, key=str)) if common else ""


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


def world_nodes(ctx: Context, world: int) -> int:
    nodes = ctx.deep("nodes")
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1:
        return nodes
    per = ctx.instance.gpu_count if ctx.instance else None
    return -(-world // per) if per and world > per else 1  # deep.json before issue 16: infer from the world size


def judge_collective(ctx: Context, check_id: str, kind: Kind, key: str) -> Finding:
    data = _measured(ctx, check_id, "nccl", key)
    if isinstance(data, Finding):
        return data
    busbw_max = node.gbps(data.get("busbw_gbps"))
    rows = data.get("rows") if isinstance(data.get("rows"), list) else []
    world = data.get("world_size") if isinstance(data.get("world_size"), int) else 0
    backend = str(data.get("backend", "?"))
    if busbw_max is None and not rows:
        return skip(check_id, "nccl", f"no {kind} result in deep.json")
    observed = f"{busbw_max or 0:.1f} GB/s bus bandwidth ({backend}, {world} ranks, largest of the sweep)"
    if backend != "nccl":
        return Finding(id=check_id, area="nccl", status="skip", observed=observed, expected="NCCL on GPUs",
                       reason=str(data.get("note", "measured with gloo (no GPUs): not comparable with NVLink/EFA figures")))
    nodes = world_nodes(ctx, world)
    th = threshold(kind, ctx.instance, ctx.gpu, nodes=min(nodes, 2))
    if th is None:
        return Finding(id=check_id, area="nccl", status="warn", observed=observed, expected="unknown",
                       reason="no expected figure for this instance", advice="pass --instance TYPE")
    value, at = _row_at(rows, th.size_bytes)
    if value is None:
        value, at = busbw_max, None
    observed = f"busbw {value:.1f} GB/s" + (f" at {size_text(at)}" if at else "") + f" ({backend}, {world} ranks" + \
        (f", {nodes} nodes" if nodes > 1 else "") + f"; largest of the sweep {busbw_max or value:.1f})"
    finding = Finding(id=check_id, area="nccl", status=th.judge(value), observed=observed, expected=th.describe())
    short = th.size_bytes is not None and (at is None or at < th.size_bytes)
    if short and finding.status == "fail" and value >= FAR_BELOW * th.floor_gbps:
        finding.status = "warn"
        finding.reason = (f"below the floor, but measured at {size_text(at) if at else 'an unknown size'}, smaller than "
                          f"the floor's {size_text(th.size_bytes)} (busbw rises with size): rerun --deep with that size")
    elif nodes > 2 and finding.status == "fail":
        finding.status = "warn"
        finding.reason = f"below the 2-node floor with {nodes} nodes (no published figure at this scale): see nccl.pairwise"
    else:
        finding.reason = (f"{value / th.floor_gbps:.0%} of the floor" + (" (derived)" if th.derived else "") +
                          (f"; typical {th.typical_gbps:g} GB/s" if th.typical_gbps else ""))
    if finding.status != "pass":
        finding.advice = ("run with NCCL_DEBUG=INFO and check net.nccl-env, gpu.nvlink-links, nvswitch.fabric, net.efa and "
                          "net.gpudirect-rdma; across nodes: a cluster placement group and a security group allowing all "
                          "traffic to and from itself")
    return finding


@check("nccl.allgather", "nccl", deep=True)
def all_gather(ctx: Context) -> Finding:
    return judge_collective(ctx, "nccl.allgather", "all_gather", "all_gather")


@check("nccl.reducescatter", "nccl", deep=True)
def reduce_scatter(ctx: Context) -> Finding:
    return judge_collective(ctx, "nccl.reducescatter", "reduce_scatter", "reduce_scatter")


@check("nccl.alltoall", "nccl", deep=True)
def all_to_all(ctx: Context) -> Finding:
    return judge_collective(ctx, "nccl.alltoall", "all_to_all", "all_to_all")


@check("nccl.pairwise", "nccl", deep=True)
def pairwise(ctx: Context) -> Finding:
    data = ctx.deep("pairwise")
    nodes_measured = ctx.deep("nodes")
    if data is None:
        one = isinstance(nodes_measured, int) and nodes_measured <= 1
        return skip("nccl.pairwise", "nccl", "one node: pairwise node tests run under torchrun across nodes" if one
                    else "no pairwise results in deep.json", "torchrun --nnodes N ... -m trainready check --deep")
    if not isinstance(data, dict) or data.get("skipped") or data.get("error"):
        return skip("nccl.pairwise", "nccl", f"not measured: {data.get('skipped') or data.get('error')}"
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
    finding = Finding(id="nccl.pairwise", area="nccl", status="pass", observed=observed[:300], expected=str(expected)[:400])
    if verdict.slow_nodes or verdict.slow_links:
        finding.status = "fail"
        parts = [f"slow {name(n)}: below the floor with healthy partners" for n in verdict.slow_nodes]
        parts += [f"slow link {name(a)} <-> {name(b)}: each is fine with other nodes" for a, b in verdict.slow_links]
        finding.reason = "; ".join(parts)[:500]
        finding.advice = "drain the slow node (stop/start it for another host) and rerun; a slow link alone: check placement"
    elif verdict.all_slow:
        finding.status = "warn" if count > 2 or floor is None else "fail"
        finding.reason = ("every pair measured is below the floor: a cause the nodes share (EFA software, security group, "
                          "placement group, NCCL settings), not one node")
        finding.advice = "check net.efa, net.nccl-env and net.gpudirect-rdma on every node"
    elif verdict.unresolved:
        finding.status = "warn"
        finding.reason = "could not tell: " + ", ".join(name(n) for n in verdict.unresolved[:8]) + " never paired with a healthy node"
        finding.advice = "rerun with more nodes, or check those nodes alone (trainready check --deep on each)"
    else:
        finding.reason = "every node reaches the floor with its partners"
    return finding


DCGM_FILE = "dcgm-diag.json"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "test"


@check("gpu.dcgm", "gpu")
def dcgm(ctx: Context) -> Finding | list[Finding]:
    diag = parsed(ctx, DCGM_FILE, node.parse_dcgm_diag)
    if diag is None:
        record = ctx.bundle.record(DCGM_FILE)
        if record is not None and record.exit_code is None:
            return skip("gpu.dcgm", "gpu", f"dcgmi not available on {ctx.bundle.machine} (DCGM not installed): "
                        "no DCGM diagnostic", "install DCGM (datacenter-gpu-manager) to use --dcgm")
        if record is not None:
            return skip("gpu.dcgm", "gpu", ctx.bundle.why_missing(DCGM_FILE))
        return skip("gpu.dcgm", "gpu", "not asked: --dcgm 1|2|3 runs NVIDIA's DCGM diagnostic (dcgmi diag)")
    if diag.runtime_error and not diag.results:
        return Finding(id="gpu.dcgm", area="gpu", status="warn", observed="dcgmi diag did not run its tests",
                       expected="every DCGM test passes", reason=diag.runtime_error, advice="run `dcgmi diag -r 1` by hand")
    if not diag.results:
        return skip("gpu.dcgm", "gpu", "no test results in dcgmi diag output" + (f": {diag.problems[0]}" if diag.problems else ""))
    tests: dict[str, list[node.DcgmResult]] = {}  # one finding per test, its GPUs together
    for result in diag.results:
        tests.setdefault(result.test, []).append(result)
    findings = []
    counts = {"fail": 0, "warn": 0, "pass": 0, "skip": 0}
    for name, results in tests.items():
        status = min((_dcgm_status(r.status) for r in results), key=SEVERITY.__getitem__)  # the worst GPU's
        counts[status] += 1
        if status not in ("fail", "warn"):
            continue
        gpus = [g for r in results if _dcgm_status(r.status) == status for g in r.gpus]
        messages = [m for r in results for m in r.messages]
        findings.append(Finding(
            id=f"dcgm.{_slug(name)}", area="gpu", status=status, expected="Pass",
            observed=f"{name}: {status}" + (f" on GPU {', '.join(gpus)}" if gpus else ""),
            reason=("; ".join(messages) or f"DCGM's {results[0].category or ''} test {name} did not pass").strip()[:500],
            advice="see NVIDIA's DCGM diagnostics guide for this test; a hardware test failing: drain the node"))
    nothing = not counts["pass"] and not counts["fail"] and not counts["warn"]
    summary = Finding(id="gpu.dcgm", area="gpu", expected="every DCGM test passes",
                      status="fail" if counts["fail"] else "warn" if counts["warn"] or nothing else "pass",
                      observed=f"{counts['pass']} pass, {counts['fail']} fail, {counts['warn']} warn, {counts['skip']} skip "
                               f"(tests)" + (f", DCGM {diag.version}" if diag.version else ""),
                      reason="DCGM diagnostic: " + ("see the dcgm.* findings" if findings else
                                                    "every test skipped: nothing was verified" if nothing else "no test failed"))
    if findings or nothing:
        summary.advice = ("the dcgm.* findings name each test; rerun with a higher --dcgm level to confirm" if findings else
                          "DCGM skips tests a GPU or its configuration does not allow (dcgmi diag -r 3 -v says why)")
    return [summary, *findings]


def _dcgm_status(word: str) -> str:
    word = word.strip().lower()
    if word in ("pass", "passed", "success"):
        return "pass"
    if word in ("fail", "failed", "error"):
        return "fail"
    if word.startswith("warn"):
        return "warn"
    return "skip"
