"""Bounds shared by layers that must not import each other's modules for one number (run's settings read in every
worker, and plan's job spec, which imports the catalog)."""

MAX_USD_PER_HOUR = 10_000.0  # per node: 10x an 8-GPU node's list price; more is a typo (or cents)
