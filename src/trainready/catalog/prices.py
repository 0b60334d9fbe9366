"""Prices that do not look like a market price are flagged `suspect` when the catalog loads.

A spot price is compared with the on-demand price of the same instance type and region:
- below SPOT_MIN_FRACTION of it: the clouds state their largest spot discount as "up to 90%"
  (AWS EC2 Spot, Azure Spot VMs; GCP Spot VMs "60-91%"), so a figure near or past that edge is
  more likely a stale or mis-scraped row (SkyPilot's lowest per-AZ price) than what a job pays;
- at or above it: a spot market with no discount is more likely a row that copied on-demand.
An entry with `verified` (where someone checked that very figure: the cloud's price page or
spot price history on a date, a bill, a contract) is left as it is. The threshold is a policy,
not a fact: it marks what to check, it changes no price.
"""

from __future__ import annotations

from .schema import Instance, Price

SPOT_MIN_FRACTION = 0.20


def spot_concern(spot: Price, on_demand: Price) -> str | None:
    """Why `spot` looks wrong next to `on_demand` (same region), or None."""
    if spot.usd_per_hour is None or on_demand.usd_per_hour is None or spot.verified:
        return None
    ratio = spot.usd_per_hour / on_demand.usd_per_hour
    if ratio >= 1.0:
        same = "equals" if abs(ratio - 1.0) < 1e-9 else "exceeds"
        return (f"spot {same} on-demand (${spot.usd_per_hour:,.2f}/h): no spot discount recorded, likely a copied "
                f"on-demand row")
    if ratio < SPOT_MIN_FRACTION:
        top = ""
        if spot.usd_per_hour_max:
            top = f", up to ${spot.usd_per_hour_max:,.2f} ({spot.usd_per_hour_max / on_demand.usd_per_hour:.0%}) by zone"
        return (f"spot is {ratio:.0%} of on-demand (${spot.usd_per_hour:,.2f} vs ${on_demand.usd_per_hour:,.2f}/h"
                f"{top}): {1 - ratio:.0%} off, near the 90% the clouds state as their largest discount")
    return None


def flag_suspect_prices(inst: Instance) -> Instance:
    """`inst` with every spot price that `spot_concern` questions marked suspect, the reason in its note."""
    prices, changed = [], False
    for p in inst.price:
        od = inst.price_for("on-demand", p.region) if p.model == "spot" else None
        why = spot_concern(p, od) if od is not None else None
        if why is None or p.suspect:
            prices.append(p)
            continue
        note = why + (f" ({p.note})" if p.note else "")
        prices.append(p.model_copy(update={"suspect": True, "note": note}))
        changed = True
    return inst.model_copy(update={"price": prices}) if changed else inst


def planning_rate(spot: Price, on_demand: Price | None) -> tuple[float | None, str | None]:
    """(the per-node $/h to plan a spot run at, what was done when that is not the listed figure). A suspect
    figure is never the one a plan ranks on: the top of its per-zone range where the catalog has one (a price
    some zone did charge), else the on-demand price of the region (no discount assumed), else unknown."""
    listed = spot.usd_per_hour
    if listed is None or not spot.suspect:
        return listed, None
    od = on_demand.usd_per_hour if on_demand is not None else None
    top_ok = (spot.usd_per_hour_max is not None and spot.usd_per_hour_max > listed
              and (od is None or spot.usd_per_hour_max >= SPOT_MIN_FRACTION * od))  # the top is no dubious low too
    if top_ok:
        return spot.usd_per_hour_max, (f"planned at ${spot.usd_per_hour_max:,.2f}/h, the top of the per-zone spot "
                                       f"range ${listed:,.2f}-{spot.usd_per_hour_max:,.2f}, because the lowest is "
                                       f"marked suspect")
    if od is not None and listed < od:
        return od, (f"planned at the on-demand ${od:,.2f}/h: the spot figure ${listed:,.2f} is marked suspect and "
                    f"the catalog has no per-zone range above {SPOT_MIN_FRACTION:.0%} of on-demand")
    return listed, None  # a spot row that copied on-demand: that figure is the conservative one
