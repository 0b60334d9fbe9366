"""`trainready report RUN_DIR --html FILE` on a synthetic 10,000-step run directory (8 ranks, two
launches, a crash, a checkpoint every 200 steps; tests/synthetic_run.py): render time and file size
against issue 15's targets (< 2 s, < 5 MB). Prints the in-process render (write_run_page: read
telemetry, summary and goodput model, charts, write) and the whole command as a user runs it
(Python start-up, imports and exit included), medians of --repeat runs, with the machine's load.
The verdict is the whole command's: CPU time is what the work costs; wall time also counts the
other jobs on a shared machine, so it is printed beside it.

    python bench/report_html.py [--steps 10000] [--repeat 3] [--screenshots]

--screenshots also writes docs/img/report.png and docs/img/plan.png with headless Chromium (the
README shows them): the report of a synthetic 2,000-step run, and `plan --model llama-2-13b
--tokens 2e9`.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from synthetic_run import make_run_dir  # noqa: E402

PREDICTION = {"source": "plan estimate for --job job.toml (synthetic)", "gpus": 8, "step_s": 1.3,
              "tokens_per_s": 100000.0, "mfu": 0.55}
TARGET_S, TARGET_MB = 2.0, 5.0


def in_process(run: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of write_run_page in a fresh interpreter, its imports included."""
    code = ("import time; t, c = time.perf_counter(), time.process_time(); from pathlib import Path; "
            "from trainready.report.run_page import write_run_page; "
            f"write_run_page(Path({str(run)!r}), Path({str(out)!r})); "
            "print(time.perf_counter() - t, time.process_time() - c)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall, cpu = proc.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def command(run: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of `trainready report RUN --html FILE` as a user runs it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainready", "report", str(run), "--html", str(out)], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _parser() -> str:
    """orjson (the report extra) or json: the reader uses orjson where it is installed."""
    try:
        import orjson
    except ImportError:
        return "json (orjson not installed: pip install 'trainready[report]')"
    return f"orjson {orjson.__version__}"


def screenshots(tmp: Path) -> None:
    chromium = os.environ.get("TRAINREADY_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("--screenshots needs Chromium: make browser")
    img = ROOT / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    make_run_dir(tmp / "runs" / "train", steps=2000, ranks=8, ckpt_every=100, prediction=PREDICTION)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    pages = {"report": (["report", "runs/train"], 3700), "plan": (["plan", "--model", "llama-2-13b", "--tokens", "2e9"], 2300)}
    for name, (args, height) in pages.items():
        html = tmp / f"{name}.html"
        subprocess.run([sys.executable, "-m", "trainready", *args, "--html", str(html)], check=True, capture_output=True,
                       env=env, cwd=tmp)  # the page names the run as given: runs/train
        subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                        f"--user-data-dir={tmp / 'profile'}", f"--window-size=1280,{height}",
                        f"--screenshot={img / f'{name}.png'}", html.as_uri()], check=True, capture_output=True)
        print(f"wrote {img / f'{name}.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--screenshots", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-html-") as tmp_name:
        tmp = Path(tmp_name)
        run = make_run_dir(tmp / "run", steps=args.steps, ranks=8, ckpt_every=200, prediction=PREDICTION)
        out = tmp / "report.html"
        telemetry_mb = (run / "telemetry.jsonl").stat().st_size / 1e6
        renders = [in_process(run, out) for _ in range(args.repeat)]
        commands = [command(run, out) for _ in range(args.repeat)]
        size_mb = out.stat().st_size / 1e6
        print(f"synthetic run: {args.steps:,} steps, 8 ranks, telemetry.jsonl {telemetry_mb:.1f} MB; "
              f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (wall time grows with the load; "
              "CPU time is what the work costs)")
        for what, runs in (("render (write_run_page, imports included)", renders),
                           ("trainready report --html (whole command)", commands)):
            wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
            print(f"{what}, median of {args.repeat}: wall {wall:.2f} s [{', '.join(f'{w:.2f}' for w, _ in runs)}], "
                  f"CPU {cpu:.2f} s [{', '.join(f'{c:.2f}' for _, c in runs)}]; target < {TARGET_S:g} s: wall "
                  f"{'PASS' if wall < TARGET_S else 'MISS'}, CPU {'PASS' if cpu < TARGET_S else 'MISS'}")
        print(f"file size: {size_mb:.2f} MB  target < {TARGET_MB:g} MB: {'PASS' if size_mb < TARGET_MB else 'MISS'}")
        wall, cpu = statistics.median(w for w, _ in commands), statistics.median(c for _, c in commands)
        print(f"issue 15 (whole command < {TARGET_S:g} s, file < {TARGET_MB:g} MB): "
              f"{'PASS' if cpu < TARGET_S and size_mb < TARGET_MB else 'MISS'} on CPU time ({cpu:.2f} s); "
              f"wall {wall:.2f} s {'PASS' if wall < TARGET_S else 'MISS'} at load {os.getloadavg()[0]:.2f}; "
              f"telemetry parsed with {_parser()}")
        if args.screenshots:
            screenshots(tmp)


if __name__ == "__main__":
    main()
