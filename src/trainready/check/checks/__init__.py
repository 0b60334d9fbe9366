"""Every check, one module per concern. Importing this package registers them all (registry.CHECKS)."""

from . import (  # noqa: F401  (registration)
    collectives,
    cuda,
    dcgm,
    deep,
    fabric,
    gpu_health,
    gpu_inventory,
    gpu_settings,
    host,
    host_accept,
    network,
    nvlink,
)
