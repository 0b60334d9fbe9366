"""Errors the CLI turns into a message and an exit code, never a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TrainreadyError(Exception):
    """Base class: a message meant for the user, and the exit code it maps to."""

    exit_code = 1


class UsageError(TrainreadyError):
    """Bad input from the user (names, values, files): exit code 2."""

    exit_code = 2


def normalize_name(name: str) -> str:
    """Lower-case, unify separators and drop vendor prefixes so aliases compare equal."""
    key = name.strip().lower()
    for prefix in ("nvidia ", "nvidia-", "tesla "):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key.replace("_", "-").replace(" ", "-")


def closest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Nearest valid names to `name` (by normalized spelling), best first."""
    by_key: dict[str, str] = {}
    for cand in candidates:
        by_key.setdefault(normalize_name(cand), cand)
    keys = difflib.get_close_matches(normalize_name(name), list(by_key), n=n, cutoff=0.4)
    if not keys:  # fall back to shared prefix, e.g. "llama" -> llama-2-7b ...
        stem = normalize_name(name)[:4]
        keys = [k for k in by_key if k.startswith(stem)][:n]
    seen: list[str] = []
    for key in keys:
        if by_key[key] not in seen:
            seen.append(by_key[key])
    return seen


class UnknownNameError(UsageError):
    """An unknown model, GPU or instance name, with the nearest valid ones."""

    def __init__(self, kind: str, name: str, valid: Iterable[str], hint: str = ""):
        valid = sorted(set(valid))
        self.kind, self.name, self.valid = kind, name, valid
        self.suggestions = closest(name, valid)
        parts = [f"unknown {kind} '{name}'."]
        if self.suggestions:
            parts.append("Did you mean: " + ", ".join(self.suggestions) + "?")
        parts.append(f"Valid {kind}s: " + ", ".join(valid) + ".")
        if hint:
            parts.append(hint)
        super().__init__(" ".join(parts))
