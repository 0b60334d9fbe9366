"""GPU and instance facts as data files, behind a typed, lazy loader."""

from .loader import Catalog, load_catalog
from .schema import Gpu, Instance, PeakTflops, Price

__all__ = ["Catalog", "Gpu", "Instance", "PeakTflops", "Price", "load_catalog"]
