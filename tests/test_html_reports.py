"""`report --html` and `plan --html`, opened in a real headless Chromium (Debian's `chromium`).

The browser finds the page's charts laid out (each chart's <svg> has a width and its data marks,
the `mark-*` groups, have a size), logs no console message at all (the pages carry no script, so
any message is an error: a failed load, markup that ran), and takes a screenshot. Chromium is
looked up as $TRAINREADY_CHROMIUM, else `chromium`, `chromium-browser`, `google-chrome` on PATH;
without one these tests skip and say why (`make browser` installs Debian's package).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cloud_stubs import cli_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_run import make_run_dir  # noqa: E402

pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed: pip install -e '.[report]'")

ROOT = Path(__file__).resolve().parents[1]
PREDICTION = {"source": "plan estimate for --job job.toml", "gpus": 8, "step_s": 1.3, "tokens_per_s": 100000.0,
              "mfu": 0.55}

# Appended to a copy of the page under test (the page itself has no script): after layout, what
# the browser drew, written into the DOM for --dump-dom to return.
PROBE = """<script>
addEventListener("load", () => {
  const out = {charts: {}, unavailable: [], scripts: document.scripts.length, images: document.images.length,
               embeds: document.querySelectorAll("iframe,object,embed,link[rel=stylesheet]").length,
               pwned: window.__pwned || null, text: document.body.innerText};
  for (const s of document.querySelectorAll("section[data-chart]")) {
    const svg = s.querySelector("svg");
    const marks = svg ? [...svg.querySelectorAll('[id^="mark-"]')] : [];
    const drawn = marks.filter(m => { const b = m.getBoundingClientRect(); return b.width > 0 || b.height > 0; });
    const segments = {};
    for (const m of marks) {
      let n = 0;
      for (const p of m.querySelectorAll("path")) n += ((p.getAttribute("d") || "").match(/[MLC]/g) || []).length;
      segments[m.id] = (segments[m.id] || 0) + n;
    }
    out.charts[s.dataset.chart] = {width: svg ? svg.getBoundingClientRect().width : 0, marks: marks.length,
                                   drawn: drawn.map(m => m.id), segments};
  }
  for (const s of document.querySelectorAll("section[data-chart-na]")) out.unavailable.push(s.dataset.chartNa);
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def find_chromium() -> str | None:
    named = os.environ.get("TRAINREADY_CHROMIUM")
    if named:
        return named
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        reason = "no Chromium: `make browser` (apt-get install chromium) or set TRAINREADY_CHROMIUM"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return path


def browse(chromium: str, page: Path, tmp: Path, *action: str) -> subprocess.CompletedProcess:
    cmd = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr",
           "--v=0", "--hide-scrollbars", "--virtual-time-budget=3000", *action, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def console_messages(stderr: str) -> list[str]:
    """Every console message the page caused (Chromium logs them all as INFO:CONSOLE)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def probe(chromium: str, page: Path, tmp: Path) -> tuple[dict, list[str]]:
    probed = tmp / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    proc = browse(chromium, probed, tmp, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the probe did not run: {proc.stdout[-500:]!r} {proc.stderr[-1500:]}"
    import html

    return json.loads(html.unescape(found.group(1))), console_messages(proc.stderr)


def screenshot(chromium: str, page: Path, tmp: Path, out: Path, height: int) -> None:
    proc = browse(chromium, page, tmp, f"--screenshot={out}", f"--window-size=1280,{height}")
    assert proc.returncode == 0 and out.exists(), proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    from PIL import Image

    with Image.open(out) as image:
        assert image.size == (1280, height)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is None or len(colours) > 50, "the screenshot is (almost) one colour"


def no_external_references(text: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "the page loads something from the network"
    assert "<script" not in text.lower(), "the page carries a script"


def cli(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = cli_run(*args, cwd=cwd)  # in this process
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    return proc


def test_console_messages_are_caught(chromium, tmp_path):
    """The check that guards every page can fail: a page that logs an error or throws is seen."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('boom'); missing();</script></body></html>")
    messages = console_messages(browse(chromium, page, tmp_path, "--dump-dom").stderr)
    assert any("boom" in m for m in messages) and any("Uncaught ReferenceError" in m for m in messages), messages


def test_run_report_draws_every_chart(chromium, tmp_path):
    run = make_run_dir(tmp_path / "run", steps=1500, ranks=8, ckpt_every=100, prediction=PREDICTION)
    page = tmp_path / "report.html"
    proc = cli("report", run, "--html", page)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote run report {page}" in proc.stdout
    text = page.read_text()
    no_external_references(text)
    found, messages = probe(chromium, page, tmp_path)
    assert messages == []
    assert found["unavailable"] == []
    charts = found["charts"]
    assert set(charts) == {"loss", "throughput", "breakdown", "ranks", "checkpoints", "goodput", "launches"}
    for name, chart in charts.items():
        assert chart["width"] > 600 and chart["marks"] > 0 and chart["drawn"], (name, chart)
    assert charts["loss"]["segments"]["mark-loss"] >= 300  # 1,500 steps in 750 bins (matplotlib drops collinear ones)
    assert {"mark-tokens_per_s", "mark-mfu", "mark-tokens_per_s-predicted", "mark-mfu-predicted"} <= set(
        charts["throughput"]["drawn"])
    assert {"mark-part-compute", "mark-part-data", "mark-part-comm", "mark-part-optimizer", "mark-part-other"} <= set(
        charts["breakdown"]["drawn"])
    assert "mark-rank-heat" in charts["ranks"]["drawn"]
    assert len(charts["goodput"]["drawn"]) >= 4  # billed, causes, goodput
    assert {"mark-launch-0", "mark-launch-1"} <= set(charts["launches"]["drawn"])
    assert "slowest: rank 5" in found["text"]  # the synthetic run's straggler, named
    assert "plan predicted 100,000" in found["text"]
    screenshot(chromium, page, tmp_path, tmp_path / "report.png", 2000)


def test_run_text_is_shown_never_run(chromium, tmp_path):
    """A run name, command and failure message holding markup show as text: nothing of it runs or loads."""
    run_dir = tmp_path / "run <b>&\"x'"
    command = ["python", "train.py", "--name", "<script>window.__pwned=1</script>"]
    message = '<img src=x onerror="window.__pwned=2"> worker 3 </td></tr></table><h1>died'
    run = make_run_dir(run_dir, steps=60, ranks=2, ckpt_every=10, command=command, crash_message=message)
    page = tmp_path / "report.html"
    from trainready.report.run_page import write_run_page

    write_run_page(run, page)
    found, messages = probe(chromium, page, tmp_path)
    assert messages == []  # the <img> of the message never tried to load x
    assert found["pwned"] is None and found["images"] == 0 and found["scripts"] == 1 and found["embeds"] == 0
    assert "<script>window.__pwned=1</script>" in found["text"]
    assert message in found["text"]
    assert "run <b>&\"x'" in found["text"]


def test_plan_page_draws_candidates_front_and_memory(chromium, tmp_path):
    page = tmp_path / "plan.html"
    proc = cli("plan", "--model", "llama-2-7b", "--tokens", "1e9", "--min-gpu-mem", "40", "--html", page)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    no_external_references(text)
    found, messages = probe(chromium, page, tmp_path)
    assert messages == [] and found["unavailable"] == []
    charts = found["charts"]
    assert set(charts) == {"cost-time", "memory"}
    assert {"mark-candidates", "mark-pareto", "mark-rows"} <= set(charts["cost-time"]["drawn"])
    assert {"mark-mem-weights", "mark-mem-optimizer", "mark-mem-activations", "mark-mem-gpu"} <= set(
        charts["memory"]["drawn"])
    assert "< --min-gpu-mem 40" in found["text"]  # an excluded instance, with why
    screenshot(chromium, page, tmp_path, tmp_path / "plan.png", 1600)


def test_plan_candidates_and_the_pareto_front():
    from trainready.catalog import load_catalog
    from trainready.plan.job import JobSpec
    from trainready.plan.search import PlanRequest, plan
    from trainready.report.plan_page import pareto

    assert pareto([(3, 1), (1, 5), (2, 3), (2, 3), (4, 4), (1, 6)]) == [1, 2, 0]
    result = plan(PlanRequest(job=JobSpec(model="llama-2-7b", tokens=1e9), top=3), load_catalog())
    assert [c.row for c in result.candidates[:3]] == [1, 2, 3]
    assert all(c.row is None for c in result.candidates[3:])
    assert len({(c.instance, c.nodes) for c in result.candidates}) == len(result.candidates)
    shown = {r.estimate.setup.instance for r in result.rows} | {o.instance for o in result.others}
    assert shown <= {c.instance for c in result.candidates}
    best = result.candidates[0]
    assert best.total_usd == pytest.approx(result.rows[0].estimate.cost.total_usd, rel=1e-6)


def test_what_a_run_lacks_is_said_not_drawn(tmp_path):
    """No loss logged, no price, no prediction, no per-rank times: each section says so."""
    from trainready.report.run_page import run_page

    run = make_run_dir(tmp_path / "run", steps=40, ranks=2, ckpt_every=10, usd_per_hour=None)
    lines = []
    for line in (run / "telemetry.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "step":
            record["metrics"] = {}
            record["rank_step_s"] = record["rank_comm_s"] = None
        lines.append(json.dumps(record))
    (run / "telemetry.jsonl").write_text("\n".join(lines) + "\n")
    text, _ = run_page(run)
    assert 'data-chart-na="loss"' in text and "no loss logged" in text
    assert "no prediction recorded" in text
    assert 'data-chart-na="ranks"' in text
    assert "no price recorded" in text
    assert 'http-equiv="refresh"' not in text


def test_long_series_say_they_are_binned_and_short_ones_do_not(tmp_path):
    """Over 1,000 points a line is drawn as bins of consecutive steps, and its notes say so (the tables stay
    exact); the heatmap names its windows. A short run is drawn point by point, with no such note."""
    from trainready.report.run_page import run_page

    long_text, _ = run_page(make_run_dir(tmp_path / "long", steps=2500, ranks=4, ckpt_every=500))
    assert "2,500 steps in 834 bins: line = mean, band = min..max of each bin" in long_text  # loss
    assert "steps run (recomputed ones included), drawn in bins: each point is the mean of up to 3" in long_text
    assert "2,500 steps, mean of each of 834 bins" in long_text  # the step-time breakdown
    assert "4 ranks x 60 windows of steps" in long_text
    short_text, _ = run_page(make_run_dir(tmp_path / "short", steps=300, ranks=2, ckpt_every=50))
    assert "bins" not in short_text


def test_live_page_refreshes_only_while_the_run_goes(tmp_path):
    from trainready.report.run_page import run_page
    from trainready.run.watchdog import process_start_ticks

    run = make_run_dir(tmp_path / "run", steps=40, ranks=2, ckpt_every=10)
    assert 'http-equiv="refresh"' not in run_page(run, live=True)[0]  # finished: nothing to refresh
    info = json.loads((run / "run.json").read_text())
    info["launches"][-1].update(end_unix=None, exit_code=None, reason=None, pid=os.getpid(),
                                pid_start_ticks=process_start_ticks(os.getpid()))
    (run / "run.json").write_text(json.dumps(info))
    text, summary = run_page(run, live=True)
    assert summary.status == "running" and '<meta http-equiv="refresh" content="15">' in text
    # issue 26: a live pid without its start time (pid 1 in a crafted run.json) is not shown to be the launcher:
    # the live view does not go on for ever
    for pid, ticks in ((1, None), (os.getpid(), None), (os.getpid(), 12345), (True, None), ("1", None)):
        info["launches"][-1].update(pid=pid, pid_start_ticks=ticks)
        (run / "run.json").write_text(json.dumps(info))
        text, summary = run_page(run, live=True)
        assert summary.status == "unknown" and 'http-equiv="refresh"' not in text, (pid, ticks)


def test_html_usage_errors(tmp_path):
    run = make_run_dir(tmp_path / "run", steps=20, ranks=2, ckpt_every=10)
    proc = cli("report", run, "--html", tmp_path / "missing" / "r.html")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = cli("report", run, "--live")
    assert proc.returncode == 2 and "give --html FILE" in proc.stderr
    proc = cli("report", tmp_path / "nothing", "--html", tmp_path / "r.html")
    assert proc.returncode == 2 and not (tmp_path / "r.html").exists()


def test_without_matplotlib_the_error_names_the_extra(monkeypatch, tmp_path):
    from trainready.errors import UsageError
    from trainready.report.run_page import run_page

    run = make_run_dir(tmp_path / "run", steps=20, ranks=2, ckpt_every=10)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError, match=r"trainready\[report\]"):
        run_page(run)


def test_malformed_run_files_never_break_the_page(tmp_path):
    """Telemetry fields and run.json entries of the wrong type are left out, never a traceback."""
    from trainready.report.run_page import run_page

    run = make_run_dir(tmp_path / "run", steps=30, ranks=2, ckpt_every=10, prediction=PREDICTION)
    lines = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    bad = []
    for record in lines:
        for key in ("step", "interval_s", "tokens_per_s", "mfu", "stall_s", "metrics", "rank_step_s", "t"):
            if key in record:
                bad += [{**record, key: value} for value in ("x", None, -1, [], {}, 1e308)]
    (run / "telemetry.jsonl").write_text("\n".join(map(json.dumps, lines + bad)) + "\n")
    info = json.loads((run / "run.json").read_text())
    info["config"]["prediction"] = {"tokens_per_s": "fast", "mfu": [], "gpus": "8", "source": {"x": 1}}
    info["launches"][0].update(reason=["failed"], message={"text": "<b>"})
    info["launches"].append("not a launch")
    (run / "run.json").write_text(json.dumps(info))
    text, summary = run_page(run)
    assert summary.last_step == 29 and "no prediction recorded" in text and 'data-chart="loss"' in text


def test_the_heatmap_after_a_crash_shows_the_relaunchs_windows_where_they_redo_steps():
    """After a crash the relaunch's windows go back over steps the crashed launch ran. pcolorfast's image
    places cells by a binary search of the edges, so they are made increasing first (step_grid): each
    stretch of steps takes the last window over it, as the per-cell pcolormesh drew it; a rank's unknown cell
    in the later window lets the earlier one show. Hand-worked: windows 0-10 .. 40-50 (values 1-5), a
    window from the crashed launch's last step back to the relaunch's first (50 -> 5, value 6), then 5-15,
    15-25, 25-60 (values 7, 8, 9)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from trainready.report.charts_run import step_grid

    edges = [0, 10, 20, 30, 40, 50, 5, 15, 25, 60]
    grid = np.array([[1.0, 2, 3, 4, 5, 6, 7, 8, 9],
                     [1.0, 2, 3, 4, 5, 6, np.nan, np.nan, 9]])  # rank 1: the relaunch's first windows unknown
    xs, out = step_grid(edges, grid)
    assert xs == [0, 5, 10, 15, 20, 25, 30, 40, 50, 60]
    assert out.tolist() == [[1, 7, 7, 8, 8, 9, 9, 9, 9], [1, 6, 6, 6, 6, 9, 9, 9, 9]]
    assert step_grid([0, 3, 6], grid[:, :2])[1].tolist() == grid[:, :2].tolist()  # increasing: unchanged

    def drawn(fast: bool) -> list[int]:  # the grey level at the middle of each stretch, rank 0
        fig = Figure(figsize=(6, 1), dpi=100)
        canvas = FigureCanvasAgg(fig)
        ax = fig.add_axes((0, 0, 1, 1))
        kw = dict(cmap="gray", vmin=0, vmax=10)
        if fast:
            ax.pcolorfast(xs, [-0.5, 0.5], out[:1], **kw)
        else:
            ax.pcolormesh(edges, [-0.5, 0.5], grid[:1], shading="flat", **kw)
        ax.set_xlim(0, 60)
        ax.set_ylim(-0.5, 0.5)
        canvas.draw()
        row = np.asarray(canvas.buffer_rgba())[50, :, 0]
        return [int(row[int((a + b) / 2 * 10)]) for a, b in zip(xs[:-1], xs[1:], strict=True)]

    assert drawn(fast=True) == drawn(fast=False)


def test_html_never_replaces_a_file_it_did_not_write(tmp_path):
    """issue 26: `report R --html R/telemetry.jsonl` destroyed the run's telemetry, and `--html FILE` replaced any
    file. A path inside the run directory is refused; an existing file is replaced only when it is a page
    trainready wrote (its generator tag), or with --force."""
    sys.path.insert(0, str(Path(__file__).parent))
    from cloud_stubs import invoke

    run = make_run_dir(tmp_path / "run", steps=12, ranks=1, ckpt_every=5, prediction=PREDICTION)
    telemetry = (run / "telemetry.jsonl").read_bytes()
    code, _, err = invoke("report", str(run), "--html", str(run / "telemetry.jsonl"))
    assert code == 2 and "inside the run directory" in err, err
    code, _, err = invoke("report", str(run), "--html", str(run / "page.html"), "--force")
    assert code == 2 and "inside the run directory" in err  # --force does not lift this one
    assert (run / "telemetry.jsonl").read_bytes() == telemetry
    precious = tmp_path / "notes.txt"
    precious.write_text("mine")
    code, _, err = invoke("report", str(run), "--html", str(precious))
    assert code == 2 and "not a page trainready wrote" in err and precious.read_text() == "mine"
    page = tmp_path / "page.html"
    assert invoke("report", str(run), "--html", str(page))[0] == 0
    assert invoke("report", str(run), "--html", str(page))[0] == 0  # ours: rewritten
    assert invoke("report", str(run), "--html", str(precious), "--force")[0] == 0
    assert '<meta name="generator" content="trainready">' in precious.read_text()


def test_plan_page_shows_the_row_markers_the_terminal_shows(tmp_path):
    """issue 27: `plan --html` dropped the marks beside a row's cost that the terminal shows: "?" (a price the
    catalog marks suspect) and "~" (efficiency assumed, not measured). Same plan, both outputs, row by row."""
    import html as html_lib

    args = ["plan", "--model", "llama-2-7b", "--method", "lora", "--tokens", "1e9", "--instances",
            "g6e.48xlarge,p6-b200.48xlarge,a3-highgpu-8g", "--max-nodes", "1"]  # one node: both kinds stay shown
    text = cli(*args)
    assert text.returncode == 0, text.stderr[-500:]
    doc = json.loads(cli(*args, "--json").stdout)
    marks = {r["rank"]: ("?" if r["estimate"]["cost"]["pricing"]["suspect"] else "")
             + ("~" if r["estimate"]["confidence"]["level"] == "low" else "") for r in doc["rows"]}
    assert {"?", "~"} <= set("".join(marks.values())), marks  # both kinds are in this plan
    page_path = tmp_path / "plan.html"
    assert cli(*args, "--html", page_path).returncode == 0
    page = html_lib.unescape(page_path.read_text())
    shown = page[page.index("Shown rows"):]
    shown = shown[:shown.index("</table>")]
    cells = {}
    for row in re.findall(r"<tr>(.*?)</tr>", shown):
        tds = re.findall(r"<td[^>]*>(.*?)</td>", row)
        if tds:
            cells[int(tds[0])] = tds
    assert sorted(cells) == sorted(marks)
    for rank, mark in marks.items():
        cost = cells[rank][9]  # the cost column
        assert cost.endswith(mark) and (mark or cost[-1].isdigit()), (rank, cost, mark)
        terminal = [line for line in text.stdout.splitlines() if re.match(rf"\s*{rank}\s", line)]
        assert terminal and mark in terminal[0], (rank, terminal)
    assert "? price marked suspect" in page and "~ efficiency assumed" in page
