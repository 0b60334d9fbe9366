"""One self-contained HTML page: inline CSS, inline SVG charts, tables. No script, no external
resource: it opens from disk offline. Every piece of text that came from a run or a user (names,
commands, messages, log lines) goes through `esc` (html.escape): it shows as written and is never
read as markup."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

GENERATOR = '<meta name="generator" content="trainready">'
"""In every page we write: `--html` replaces a file only when it carries this (html_target in cli/render_html.py)."""

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.15em;margin:28px 0 6px;border-bottom:1px solid #ddd}
.sub{color:#555;margin:2px 0}.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em;
white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;font-size:.9em;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.kv td:first-child{font-weight:600;white-space:nowrap}
.na{color:#8a6d00;background:#fff8e1;border:1px solid #f0d98c;padding:6px 10px;border-radius:4px}
.note{color:#555;font-size:.9em;margin:4px 0}svg{max-width:100%;height:auto}
"""


def esc(value: object) -> str:
    """Text for HTML: <, >, &, and both quotes escaped."""
    return html.escape(str(value), quote=True)


@dataclass
class Page:
    title: str
    subtitle: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    def heading(self, key: str, text: str) -> None:
        self.parts.append(f'<h2 id="{esc(key)}">{esc(text)}</h2>')

    def chart(self, key: str, heading: str, svg: str, notes: list[str] | tuple[str, ...] = ()) -> None:
        """A chart section: `svg` is our own matplotlib output (its text already XML-escaped)."""
        self.heading(key, heading)
        body = "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
        self.parts.append(f'<section class="chart" data-chart="{esc(key)}">{svg}{body}</section>')

    def unavailable(self, key: str, heading: str, why: str) -> None:
        self.heading(key, heading)
        self.parts.append(f'<section class="chart-na" data-chart-na="{esc(key)}"><p class="na">{esc(why)}</p></section>')

    def table(self, headers: list[str], rows: list[list[object]], *, numeric: set[int] = frozenset(),
              css: str = "") -> None:
        head = "".join(f"<th>{esc(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{esc(c)}</td>'
                                        for i, c in enumerate(row)) + "</tr>" for row in rows)
        cls = f' class="{esc(css)}"' if css else ""
        self.parts.append(f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def key_values(self, rows: list[tuple[str, object]]) -> None:
        body = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows)
        self.parts.append(f'<table class="kv"><tbody>{body}</tbody></table>')

    def note(self, text: str, mono: bool = False) -> None:
        self.parts.append(f'<p class="{"mono" if mono else "note"}">{esc(text)}</p>')

    def render(self, refresh_s: int | None = None) -> str:
        refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
        sub = "".join(f'<p class="sub">{esc(s)}</p>' for s in self.subtitle)
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">{GENERATOR}{refresh}"
                f"<title>{esc(self.title)}</title><style>{CSS}</style></head><body>"
                f"<h1>{esc(self.title)}</h1>{sub}{''.join(self.parts)}</body></html>\n")
