"""NVIDIA DCGM's diagnostic: the JSON `--dcgm N` keeps (dcgm-diag.json), or the table `dcgmi diag -r N`
prints, saved or pasted as dcgm-diag.txt. One summary finding, plus one `dcgm.<test>` per test that
did not pass."""

from __future__ import annotations

import re

from ..facts import Facts
from ..findings import SEVERITY, Finding
from ..parsers import node
from ..registry import Verdict, check

# The deployment tests are DCGM's level 1 (a few seconds); levels 2 and 3 add the integration, hardware
# and stress tests (NVIDIA's DCGM user guide, "Run Levels").
LEVEL1 = ("deployment", "software")


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "test"


def status_of(word: str) -> str:
    word = word.strip().lower()
    if word in ("pass", "passed", "success"):
        return "pass"
    if word in ("fail", "failed", "error"):
        return "fail"
    if word.startswith("warn"):
        return "warn"
    return "skip"


@check("gpu.dcgm", "gpu")
def dcgm(f: Facts) -> Verdict | None:
    found = f.dcgm
    refused = [n for n in ("dcgm-diag.json", "dcgm-diag.txt") if n in f.bundle.refused]
    if not found and refused:
        return Verdict.skip(f.bundle.why_missing(refused[0]))
    if not found:
        record = f.bundle.record("dcgm-diag.json")
        if record is not None and record.exit_code is None:
            return Verdict.skip(f"dcgmi not available on {f.bundle.machine} (DCGM not installed): no DCGM diagnostic",
                                "install DCGM (datacenter-gpu-manager) to use --dcgm")
        if record is not None:
            return Verdict.skip(f.bundle.why_missing("dcgm-diag.json"))
        return Verdict.skip("not asked: --dcgm 1|2|3 runs NVIDIA's DCGM diagnostic (dcgmi diag), or give its output "
                            "with --dcgm-output FILE")
    if len(found) > 1:  # the JSON and a table: one diagnostic made of both
        diag = node.DcgmDiag(version=found[0][0].version or found[1][0].version,
                             results=[r for d, _ in found for r in d.results],
                             runtime_error=found[0][0].runtime_error or found[1][0].runtime_error,
                             problems=[p for d, _ in found for p in d.problems])
        source = " and ".join(name for _, name in found)
    else:
        diag, source = found[0]
    if diag.runtime_error and not diag.results:
        return Verdict("warn", observed="dcgmi diag did not run its tests", expected="every DCGM test passes",
                       reason=diag.runtime_error, advice="run `dcgmi diag -r 1` by hand")
    if not diag.results:
        return Verdict("warn", unverified=True, expected="every DCGM test passes",
                       reason=f"unreadable: {source}: no test results" + (f" ({diag.problems[0]})" if diag.problems else ""),
                       advice="save the whole `dcgmi diag -r N` output (or its -j JSON)")
    tests: dict[str, list[node.DcgmResult]] = {}  # one finding per test, its GPUs together
    for result in diag.results:
        tests.setdefault(result.test, []).append(result)
    extra, counts, ids = [], {"fail": 0, "warn": 0, "pass": 0, "skip": 0}, set()
    for name, results in tests.items():
        status = min((status_of(r.status) for r in results), key=SEVERITY.__getitem__)  # the worst GPU's
        counts[status] += 1
        if status not in ("fail", "warn"):
            continue
        gpus = sorted({g for r in results if status_of(r.status) == status for g in r.gpus})
        messages = list(dict.fromkeys(m for r in results for m in r.messages))
        finding_id = f"dcgm.{_slug(name)}"
        while finding_id in ids:  # "PCIe" and "PCIe." are two tests with one slug
            finding_id += "-2"
        ids.add(finding_id)
        extra.append(Finding(
            id=finding_id, area="gpu", status=status, expected="Pass",
            observed=f"{name}: {status}" + (f" on GPU {', '.join(gpus)}" if gpus else ""),
            reason=("; ".join(messages) or f"DCGM's {results[0].category or ''} test {name} did not pass").strip()[:500],
            advice="see NVIDIA's DCGM diagnostics guide for this test; a hardware test failing: drain the node"))
    past_level1 = [n for n, rs in tests.items() if (rs[0].category or "").lower() not in LEVEL1]
    skipped_past = [n for n in past_level1 if all(status_of(r.status) == "skip" for r in tests[n])]
    incomplete = bool(past_level1) and len(skipped_past) == len(past_level1)
    v = Verdict("pass", expected="every DCGM test passes",
                observed=f"{counts['pass']} pass, {counts['fail']} fail, {counts['warn']} warn, {counts['skip']} skip (tests)"
                         + (f", DCGM {diag.version}" if diag.version else "") + f" ({source})")
    if counts["fail"]:
        v.status, v.reason = "fail", "DCGM diagnostic: see the dcgm.* findings"
        v.advice = "the dcgm.* findings name each test; rerun with a higher --dcgm level to confirm"
    elif incomplete:
        v.status, v.partial = "warn", True
        v.reason = (f"incomplete: every test past level 1 was skipped ({', '.join(skipped_past[:6])}): only the deployment "
                    "checks ran, the GPUs were not exercised")
        v.advice = "rerun as root with nothing else on the GPUs (dcgmi diag -r 3 -v says why a test skips)"
    elif counts["warn"]:
        v.status, v.reason = "warn", "DCGM diagnostic: see the dcgm.* findings"
        v.advice = "the dcgm.* findings name each test"
    elif not counts["pass"]:
        v.status, v.reason = "warn", "every test skipped: nothing was verified"
        v.advice = "DCGM skips tests a GPU or its configuration does not allow (dcgmi diag -r 3 -v says why)"
    else:
        v.reason = "DCGM diagnostic: no test failed" + (f" ({counts['skip']} skipped)" if counts["skip"] else "")
    v.extra = extra
    return v
