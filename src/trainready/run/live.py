"""The launcher's live view, fed by telemetry records: a Rich panel on a terminal, a status
line every STATUS_EVERY_S seconds otherwise (CI logs, `nohup`). Worker output scrolls above it.
Everything shown is rich.text.Text: a command, a path or a message is printed as written, never
read as markup (a Panel reads a plain-string title as markup even on a markup-off console)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from trainready.io import redact_argv

STATUS_EVERY_S = 10.0


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _tps(step: dict[str, Any]) -> str:
    value = step.get("tokens_per_s")
    return f"{value:,.0f}" if isinstance(value, (int, float)) else "-"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


class LiveView:
    def __init__(self, console: Console, title: str, live: bool):
        # the title quotes the user's command, joined by spaces: split back into words so that
        # `--hf-token VALUE` is masked like in run.json
        self.console, self.title = console, " ".join(redact_argv(title.split(" ")))
        self.step: dict[str, Any] | None = None
        self.start: dict[str, Any] | None = None
        self.events: list[str] = []
        self.restarts = 0
        self._live: Live | None = Live(console=console, refresh_per_second=4, transient=False) if live else None
        self._last_status = 0.0
        self._gone = False  # the console's reader went away: nothing more is printed

    def __enter__(self) -> LiveView:
        if self._live is not None:
            self._live.start()
            self._live.update(self.render())
        return self

    def __exit__(self, *_: Any) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.stop()

    def print(self, line: str) -> None:
        """Worker output and launcher messages (above the panel when live), never cut."""
        self._show(Text(line))

    def _show(self, text: Text) -> None:
        """One line to the console, unless it has gone (`run ... | head`: Rich exits on a broken pipe). The run goes
        on without its echo: everything is in launcher.log, logs/ and telemetry.jsonl."""
        if self._gone:
            return
        try:
            self.console.print(text, soft_wrap=True)
        except (OSError, ValueError, SystemExit):
            self._gone = True

    def update(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            kind = r.get("type")
            if kind == "step":
                self.step = r
            elif kind == "start":
                self.start = r
                if r.get("restart_count"):
                    self.restarts = r["restart_count"]
                    world = f", world size {r['world_size']}" if r.get("world_size") else ""
                    self._event(f"workers restarted (restart {r['restart_count']}){world}")
            elif kind == "restore":
                where = (f"step {r['step']} from the {r.get('tier') or 'hot'} tier" if r.get("step") is not None
                         else "nothing: fresh start")
                self._event(f"restored {where}")
            elif kind == "end" and self.step is not None:  # after the last save and upload: the final status
                ckpt = dict(self.step.get("ckpt") or {}, saving=False, uploading=None)
                ckpt["last_saved"] = r.get("last_saved", ckpt.get("last_saved"))
                ckpt["archived"] = r["archived"] if "archived" in r else ckpt.get("archived")
                self.step = dict(self.step, ckpt=ckpt)
            elif kind in ("ckpt_interval", "budget", "ckpt_dropped") and r.get("message"):
                self._event(r["message"])  # a stop is said once, by the launcher's result line
        if self._live is not None:
            self._live.update(self.render())
        elif self.step is not None and time.monotonic() - self._last_status >= STATUS_EVERY_S:
            self._last_status = time.monotonic()
            self._show(Text(self.status_line()))

    def _event(self, message: str) -> None:
        self.events = (self.events + [message])[-4:]
        if self._live is None:
            self._show(Text(f"trainready: {message}"))

    def status_line(self) -> str:
        s = self.step or {}
        loss = (s.get("metrics") or {}).get("loss")
        total = (self.start or {}).get("total_steps")
        return (f"step {s.get('step', '-')}{f'/{total}' if total else ''}"
                f"{f'  loss {loss:.4f}' if isinstance(loss, (int, float)) else ''}"
                f"  {_tps(s)} tok/s  MFU {_pct(s.get('mfu'))}"
                f"  data wait {_pct(_share(s, 'data_s'))}  ETA {_dur(s.get('eta_s'))}  cost {_usd(s.get('cost_usd'))}")

    def render(self) -> Panel:
        s = self.step or {}
        start = self.start or {}
        grid = Table.grid(padding=(0, 2))
        for _ in range(4):
            grid.add_column(overflow="fold")
        loss = (s.get("metrics") or {}).get("loss")
        total = start.get("total_steps")
        ckpt = s.get("ckpt") or {}
        saving = "saving" if ckpt.get("saving") else ("uploading" if ckpt.get("uploading") else "")
        mfu = _pct(s.get("mfu")) if s.get("mfu") is not None else ("n/a (no GPU peak)" if not start.get("peak_tflops") else "-")

        def row(*cells: str) -> None:
            grid.add_row(*(Text(c) for c in cells))

        row("step", f"{s.get('step', '-')}{f' / {total}' if total else ''}", "loss",
            f"{loss:.4f}" if isinstance(loss, (int, float)) else "-")
        row("tokens/s", _tps(s), "MFU", mfu)
        row("data wait", _pct(_share(s, "data_s")), "comm", _pct(_share(s, "comm_s")))
        hot = ckpt.get("last_saved")
        newest = ckpt.get("archived")
        archived = f"  archived {newest if newest is not None else '-'}" if start.get("archive") else ""
        row("checkpoint", f"hot {hot if hot is not None else '-'}{archived} {saving}".strip(), "ETA", _dur(s.get("eta_s")))
        budget = start.get("budget_usd")
        row("cost", _usd(s.get("cost_usd")), "projected",
            f"{_usd(s.get('projected_usd'))}{f' (budget {_usd(budget)})' if budget else ''}")
        parts: list[Any] = [grid]
        if self.events:
            parts.append(Text("\n".join(self.events), style="dim"))
        world = start.get("world_size")
        title = f"{self.title}  ({world} process{'es' if world != 1 else ''})" if world else self.title
        return Panel(Group(*parts), title=Text(title), border_style="cyan")


def _share(step: dict[str, Any], key: str) -> float | None:
    interval = step.get("interval_s")
    value = step.get(key)
    if not interval or value is None:
        return None
    return min(1.0, value / interval)
