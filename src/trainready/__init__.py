"""trainready: plan, check, checkpoint and run LLM training on rented GPU nodes.

Importing the package is cheap and needs no torch: subsystems load on first use.
"""

from trainready.version import __version__

__all__ = ["__version__", "init"]


def init(**kwargs):  # noqa: ANN003, ANN201 - the signature lives in trainready.run.session.init
    """Start a training session (see trainready.run.session.init); imports torch."""
    from trainready.run.session import init as _init

    return _init(**kwargs)
