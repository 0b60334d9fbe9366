"""trainready: plan, check, checkpoint and run LLM training on rented GPU nodes.

Importing the package is cheap and needs no torch: subsystems load on first use.
"""

__version__ = "0.1.0"
