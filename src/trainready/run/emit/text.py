"""Words and documents the engines write: shell words (quoted so commands with spaces, quotes, `$` or newlines
reach the training process unchanged), YAML scalars and documents, continued command lines."""

from __future__ import annotations

import re
import shlex

_YAML_PLAIN_RE = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*")
_YAML_RESERVED = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}


_BASH_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def sh_quote(word: str) -> str:
    """One shell word: `shlex.quote`, or bash's $'...' where it holds control characters.

    $'...' keeps every emitted command on lines of its own (a raw newline inside quotes
    would break YAML block scalars and line-oriented editing).
    """
    if all(c.isprintable() for c in word):
        return shlex.quote(word)
    out = []
    for c in word:
        if c in _BASH_ESCAPES:
            out.append(_BASH_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return "$'" + "".join(out) + "'"


def sh_join(words: list[str]) -> str:
    return " ".join(sh_quote(w) for w in words)


def yaml_scalar(text: str) -> str:
    """A YAML string scalar: plain when unambiguous, else double-quoted with escapes."""
    if _YAML_PLAIN_RE.fullmatch(text) and text.lower() not in _YAML_RESERVED:
        return text
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif ord(c) <= 0xFF:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def continued(first: str, rest: list[str], indent: str = "  ") -> list[str]:
    """`first \\` then each of `rest` on its own indented line, joined by backslashes."""
    lines = [first]
    for part in rest:
        lines[-1] += " \\"
        lines.append(indent + part)
    return lines


def pairs(words: list[str]) -> list[str]:
    """Options as display lines: `--flag value` together, a bare `--flag` alone."""
    lines: list[str] = []
    i = 0
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            lines.append(f"{sh_quote(words[i])} {sh_quote(words[i + 1])}")
            i += 2
        else:
            lines.append(sh_quote(words[i]))
            i += 1
    return lines


def export_lines(env: dict[str, str]) -> list[str]:
    return [f"export {name}={sh_quote(value)}" for name, value in env.items()]


def dump_yaml(docs: list[dict]) -> str:
    """YAML documents by PyYAML, in the order built, without anchors (a shared selector is written out twice)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        # PyYAML writes U+0085, U+2028 and U+2029 raw in plain and single-quoted scalars, where a YAML reader
        # takes them for line breaks: such words, and any with control characters, go double-quoted with escapes
        quoted = any(c in "\x85\u2028\u2029" or not c.isprintable() for c in value)
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if quoted else None)

    Dumper.add_representer(str, text)

    return yaml.dump_all(docs, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                         width=1000, explicit_start=True)
