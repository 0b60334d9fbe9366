"""`--dcgm 1|2|3`: NVIDIA's DCGM diagnostic (`dcgmi diag -r LEVEL -j`), its JSON kept in the bundle as
dcgm-diag.json and turned into findings by the gpu.dcgm check (checks/dcgm.py). Level 1 takes seconds, 2 about
two minutes, 3 up to half an hour (NVIDIA's DCGM user guide); the timeouts leave room for each."""

from __future__ import annotations

import time

from .bundle import Bundle, ProbeRecord, shareable
from .probes import Runner, run_command

LEVELS = (1, 2, 3)
TIMEOUT_S = {1: 300.0, 2: 1200.0, 3: 3600.0}
FILE = "dcgm-diag.json"


def run_dcgm(bundle: Bundle, level: int, runner: Runner = run_command) -> None:
    """Run the diagnostic into `bundle` (file and manifest record). dcgmi exits non-zero when a test
    fails and still prints the JSON: the output is kept whatever the exit code."""
    argv = ["dcgmi", "diag", "-r", str(level), "-j"]
    result = runner(argv, TIMEOUT_S[level])
    if result.exit_code is not None and result.stdout.strip():
        bundle.files[FILE] = shareable(FILE, result.stdout)
    if bundle.manifest is not None:
        bundle.manifest.probes.append(ProbeRecord(
            file=FILE, command=" ".join(argv), exit_code=result.exit_code, duration_s=round(result.duration_s, 3),
            timestamp_unix=time.time(), error=result.stderr.strip()[:300] if result.exit_code != 0 else ""))
