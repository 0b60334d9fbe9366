"""How long `check --bundle` takes on every real output of tests/fixtures/real/ and on a complete
`check collect` bundle of this machine, and whether any output cut at any line makes a check crash.

Issue 23's target: under 2 s per bundle. The fixtures are judged in-process; the collected bundle also
through the whole command (Python start-up and imports included), as a user runs it.
Then every fixture is cut after each of its lines (every line, not the test suite's 10 random ones)
and judged; a check that raised shows as "check could not run" and is counted as a failure of this
soak. Prints the figures; exits 1 if any bundle took 2 s or more, or any cut crashed a check.

    .venv/bin/python bench/check_corpus.py [--no-cuts]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from test_check_real import FIXTURES, body  # noqa: E402  (the corpus and its header rule)

from trainready.check.analyze import analyze  # noqa: E402
from trainready.check.bundle import Bundle  # noqa: E402
from trainready.check.probes import collect  # noqa: E402

LIMIT_S = 2.0


def timed(files: dict[str, str]) -> tuple[float, list]:
    started = time.perf_counter()
    report = analyze(Bundle(files, None, source="bench"))
    return time.perf_counter() - started, report.checks


def main() -> int:
    times = []
    for entry in FIXTURES:
        seconds, _ = timed({entry["as"]: body(entry["path"])})
        times.append((seconds, entry["file"]))
    times.sort(reverse=True)
    print(f"{len(times)} real outputs: median {statistics.median(t for t, _ in times) * 1000:.1f} ms, "
          f"slowest {times[0][0] * 1000:.1f} ms ({times[0][1]})")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        collect(Path(tmp) / "bundle")
        collected = time.perf_counter() - started
        bundle = Bundle.load(Path(tmp) / "bundle")
        started = time.perf_counter()
        analyze(bundle)
        analysed = time.perf_counter() - started
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "trainready", "check", "--bundle", str(Path(tmp) / "bundle"), "--json"],
                       capture_output=True, timeout=60)
        command = time.perf_counter() - started
    print(f"this machine: check collect {collected:.2f} s ({len(bundle.files)} files), analysis {analysed:.3f} s, "
          f"the whole command `trainready check --bundle DIR --json` {command:.2f} s")
    slow = [(t, f) for t, f in times if t >= LIMIT_S] + ([(command, "collected bundle")] if command >= LIMIT_S else [])
    crashed = 0
    if "--no-cuts" not in sys.argv:
        cuts = 0
        for entry in FIXTURES:
            lines = body(entry["path"]).splitlines(keepends=True)
            for k in range(len(lines) + 1):
                _, findings = timed({entry["as"]: "".join(lines[:k])})
                cuts += 1
                bad = [f.id for f in findings if "check could not run" in f.reason]
                if bad:
                    crashed += 1
                    print(f"  CRASH {entry['file']} cut after line {k}: {', '.join(bad)}")
        print(f"cut after every line: {cuts} bundles judged, {crashed} with a crashed check")
    print(f"over {LIMIT_S:g} s: {len(slow)}")
    return 1 if slow or crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
