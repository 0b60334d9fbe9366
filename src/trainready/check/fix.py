"""`check --fix`: the only changes `check` makes to a node, and only when asked: persistence mode on
(`nvidia-smi -pm 1`) and application clocks back to their defaults (`nvidia-smi -rac`). Both need root;
everything else a check finds stays advice. Runs before the probes, so the findings show the result."""

from __future__ import annotations

from .findings import Finding
from .probes import Runner, run_command

FIXES = (("persistence mode on", ["nvidia-smi", "-pm", "1"]),
         ("application clocks reset to their defaults", ["nvidia-smi", "-rac"]))


def apply_fixes(runner: Runner = run_command, timeout_s: float = 30.0) -> Finding:
    done, failed = [], []
    for what, argv in FIXES:
        result = runner(argv, timeout_s)
        said = (result.stderr or result.stdout).strip().splitlines()
        if result.exit_code == 0:
            done.append(what)
        elif result.exit_code is None:
            failed.append(f"{what}: {argv[0]} not available")
        else:
            failed.append(f"{what}: `{' '.join(argv)}` exited {result.exit_code}" + (f" ({said[-1][:120]})" if said else ""))
    finding = Finding(id="gpu.fix", area="gpu", status="pass" if not failed else "warn",
                      observed="; ".join(done) or "nothing changed", expected="; ".join(w for w, _ in FIXES),
                      reason="--fix: " + ("; ".join(failed) if failed else "done; the findings below show the node after it"))
    if failed:
        finding.advice = "run as root: sudo trainready check --fix"
    return finding
