"""GPU-node readiness checks."""
