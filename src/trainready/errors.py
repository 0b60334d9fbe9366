"""Errors the CLI turns into a message and an exit code, never a traceback."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# C0/C1 controls (terminal escapes, line breaks), the invisible Unicode format characters that
# reorder or hide text (bidi overrides, zero-width spaces), and lone surrogates (bytes of an
# argument that were not UTF-8: Python keeps them as U+DC80..U+DCFF, unprintable)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # the byte the surrogate stands for
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` with control characters written as \\xNN (\\uNNNN above 0xff): a name read from a
    file or typed by a user goes into a message or a title as text, never as a terminal escape,
    a line break or a bidi override."""
    return _CONTROL.sub(lambda m: _escape(m.group()), str(text))


def pydantic_message(msg: object) -> str:
    """A pydantic error's message without pydantic's "Value error, " prefix: the text is ours."""
    return str(msg).removeprefix("Value error, ")


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


def did_you_mean(near: Iterable[str]) -> str:
    """" Did you mean: a, b?" to put in a message (names as printable text), or "" when none is near."""
    near = list(near)
    return f" Did you mean: {', '.join(map(printable, near))}?" if near else ""


class UnknownNameError(UsageError):
    """An unknown model, GPU or instance name, with the nearest valid ones."""

    def __init__(self, kind: str, name: str, valid: Iterable[str], hint: str = ""):
        valid = sorted(set(valid))
        self.kind, self.name, self.valid = kind, name, valid
        self.suggestions = closest(name, valid)
        parts = [f"unknown {kind} '{printable(name)}'."]
        if self.suggestions:
            parts.append("Did you mean: " + ", ".join(map(printable, self.suggestions)) + "?")
        parts.append(f"Valid {kind}s: " + ", ".join(map(printable, valid)) + ".")
        if hint:
            parts.append(hint)
        super().__init__(" ".join(parts))
