"""The package's version, on the floor of the layers: store and check stamp it into what they write without
importing the package root (whose `init()` reaches up to run)."""

__version__ = "0.1.0"
