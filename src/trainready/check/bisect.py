"""Which node, or which link between two nodes, makes a multi-node all-reduce slow: pure logic.

After the world test, nodes are measured in pairs (two nodes' GPUs all-reduce together), the way
Meta's gcm narrows a slow collective down instead of reporting one number for the world:

1. round 1 pairs the nodes disjointly (0-1, 2-3, ...), all pairs at once;
2. a node in a pair at or above the floor is *cleared*; every node neither cleared nor already slow
   with a cleared partner is then paired with a cleared node it has not met (one pair per node per
   round, so rounds stay parallel);
3. when no pair passes, the suspects are re-paired crosswise (0-2, 1-3, ...) to find one that does.

A node that is slow with a cleared partner is a slow node. A slow pair whose nodes are both cleared
elsewhere is a slow link. A node never paired with a cleared node stays unresolved. Rounds stop when
nothing is left to learn or after `max_rounds`. Everything here takes and returns plain data, so the
same verdict comes from a live run and from a bundle's deep.json.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

Pair = tuple[int, int]
MAX_ROUNDS = 4
RELATIVE_FLOOR = 0.75  # with no known floor: a pair below 75% of the median pair is slow


@dataclass(frozen=True)
class PairResult:
    a: int
    b: int
    busbw_gbps: float

    @property
    def pair(self) -> Pair:
        return (min(self.a, self.b), max(self.a, self.b))


@dataclass
class Verdict:
    slow_nodes: list[int] = field(default_factory=list)
    slow_links: list[Pair] = field(default_factory=list)
    unresolved: list[int] = field(default_factory=list)
    cleared: list[int] = field(default_factory=list)
    all_slow: bool = False  # every pair measured was slow: a shared cause (network setup), not one node
    floor_gbps: float | None = None


def first_round(nodes: int) -> list[Pair]:
    """Disjoint pairs 0-1, 2-3, ...; an odd last node waits for round 2 (paired with a cleared node)."""
    return [(i, i + 1) for i in range(0, nodes - 1, 2)]


def pair_floor(known: float | None, results: Iterable[PairResult]) -> float | None:
    """The floor pairs are judged by: the known 2-node floor, else a share of the median pair."""
    if known is not None:
        return known
    values = [r.busbw_gbps for r in results]
    return RELATIVE_FLOOR * median(values) if len(values) >= 2 else None


def _cleared(results: Sequence[PairResult], floor: float) -> set[int]:
    return {n for r in results if r.busbw_gbps >= floor for n in (r.a, r.b)}


def next_round(nodes: int, results: Sequence[PairResult], floor: float | None, rounds_done: int) -> list[Pair]:
    """The pairs to measure next, disjoint; [] when done."""
    if rounds_done >= MAX_ROUNDS or nodes < 2:
        return []
    met = {r.pair for r in results}
    busy: set[int] = set()
    plan: list[Pair] = []
    if floor is None:  # no floor yet (too few pairs for a median): measure the nodes not measured yet
        measured = sorted({n for r in results for n in (r.a, r.b)})
        unmeasured = [n for n in range(nodes) if n not in measured]
        # each unmeasured node with the next measured one, each measured node once, while both last
        return [(min(n, m), max(n, m)) for n, m in zip(unmeasured, measured, strict=False)]
    cleared = _cleared(results, floor)
    convicted = {n for r in results if r.busbw_gbps < floor for n, other in ((r.a, r.b), (r.b, r.a)) if other in cleared}
    suspects = [n for n in range(nodes) if n not in cleared and n not in convicted]
    if not suspects:
        return []
    if cleared:
        for s in suspects:
            partner = next((c for c in sorted(cleared) if c not in busy and (min(s, c), max(s, c)) not in met), None)
            if partner is not None and s not in busy:
                plan.append((min(s, partner), max(s, partner)))
                busy.update((s, partner))
        return plan
    # nothing passed yet: re-pair the suspects crosswise, pairs not measured before
    for s in suspects:
        if s in busy:
            continue
        partner = next((t for t in suspects if t != s and t not in busy and (min(s, t), max(s, t)) not in met), None)
        if partner is not None:
            plan.append((min(s, partner), max(s, partner)))
            busy.update((s, partner))
    return plan


def verdict(nodes: int, results: Sequence[PairResult], floor: float | None) -> Verdict:
    if floor is None or not results:
        return Verdict(unresolved=list(range(nodes)), floor_gbps=floor)
    cleared = _cleared(results, floor)
    slow = [r for r in results if r.busbw_gbps < floor]
    slow_nodes: set[int] = set()
    links: set[Pair] = set()
    for r in slow:
        a_ok, b_ok = r.a in cleared, r.b in cleared
        if a_ok and b_ok:
            links.add(r.pair)
        elif a_ok:
            slow_nodes.add(r.b)
        elif b_ok:
            slow_nodes.add(r.a)
    judged = cleared | slow_nodes | {n for link in links for n in link}
    return Verdict(slow_nodes=sorted(slow_nodes), slow_links=sorted(links),
                   unresolved=[n for n in range(nodes) if n not in judged], cleared=sorted(cleared),
                   all_slow=bool(results) and not cleared, floor_gbps=floor)


def plan_all(nodes: int, measure, known_floor: float | None) -> tuple[list[list[PairResult]], float | None]:
    """Run the rounds with `measure(pairs) -> list[PairResult]` (one call per round, pairs disjoint).
    Returns the rounds' results and the floor used."""
    rounds: list[list[PairResult]] = []
    plan = first_round(nodes)
    floor = known_floor
    while plan:
        rounds.append(list(measure(plan)))
        flat = [r for rnd in rounds for r in rnd]
        if floor is None:  # a relative floor is set once, from the first pairs: later rounds test suspects
            floor = pair_floor(None, flat)
        plan = next_round(nodes, flat, floor, len(rounds))
    return rounds, floor
