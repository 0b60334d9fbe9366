"""Launching, watching and resuming training runs (torchrun underneath)."""
