"""Numbers as people read them, for the plan's messages and the CLI's tables: every figure
whole (never cut), huge ones short (1.0e30 tokens, not a 31-digit integer), None as "-"."""

from __future__ import annotations

BIG = 1e15  # from here on a count is written as 1.0e15: grouped digits stop being readable


def _sci(x: float) -> str:
    return f"{x:.1e}".replace("e+", "e")


def count_text(x: float | None) -> str:
    """2,000,000,000 and 1,908; 1.0e30 from 10^15 up."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) < BIG else _sci(x)


def usd_text(x: float | None) -> str:
    """$0.42, $1,234, $1.2e12 from a billion dollars up."""
    if x is None:
        return "-"
    if abs(x) >= 1e9:
        return "$" + _sci(x)
    return f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def hours_text(h: float | None) -> str:
    """45 min, 14.5 h, 6.0 d, 31 years, 2.7e20 years."""
    if h is None:
        return "-"
    if h < 1:
        return f"{h * 60:.0f} min"
    if h < 72:
        return f"{h:,.1f} h"
    days = h / 24
    if days < 3650:
        return f"{days:,.1f} d"
    years = days / 365.25
    return f"{years:,.0f} years" if years < 1e6 else f"{_sci(years)} years"
