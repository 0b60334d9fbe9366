"""Real output as users have it: pasted into an issue, a chat or a ticket before it reaches a bundle.

What people do to command output on the way (seen in the corpus under tests/fixtures/real/): wrap it
in a markdown code fence, quote it with `> `, put a `<details>` block around it, and cut what they
think is noise, marking the cut with `[...]`, `....`, `...<snip>...` or `(truncated)`. `clean` undoes
the wrapping and counts the cuts, so parsers read the output itself and checks know that what is not
shown is unknown (an elided link is not an inactive one)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"\s{0,8}(```|~~~)[\w+-]{0,20}\s*")
_HTML = re.compile(r"\s*</?(details|summary|pre|code)\b[^>]{0,200}>(.{0,200}</summary>)?\s*", re.I)
# A whole line that only marks a cut: [...], [ ... ], ...., ..., …, <snip>, ...<snip>..., (truncated), [output omitted]
_ELISION = re.compile(r"\s*(?:#\s*)?(?:\[\s*(?:\.{2,}|…|snip(?:ped)?|truncated|omitted|cut)[^\]]{0,60}\]|\.{2,}\s*"
                      r"(?:<\s*snip(?:ped)?\s*>|\(\s*snip(?:ped)?\s*\))?\s*\.{0,10}|<\s*snip(?:ped)?\s*>|…+|"
                      r"\(\s*(?:truncated|snip(?:ped)?|\.{3}|more lines?(?: omitted)?)\s*\)|"
                      r"(?:\.\.\.\s*)?(?:output\s+)?(?:truncated|omitted|snipped)(?:\s*\.\.\.)?)\s*", re.I)
_QUOTE = re.compile(r"\s{0,3}> ?")


@dataclass(frozen=True, slots=True)
class Paste:
    text: str
    """The output with fences, quote markers, HTML wrappers and elision lines removed."""
    elided: int = 0
    """Lines that marked a cut by the author: what they stood for is unknown."""


def is_elision(line: str) -> bool:
    return bool(line.strip()) and _ELISION.fullmatch(line) is not None


def clean(text: str | None) -> Paste:
    """`text` as the command printed it, as far as can be told; never raises."""
    if not text:
        return Paste("")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    filled = [line for line in lines if line.strip()]
    if filled and all(_QUOTE.match(line) for line in filled):  # a markdown quote around the whole paste
        lines = [_QUOTE.sub("", line, count=1) if _QUOTE.match(line) else line for line in lines]
    kept: list[str] = []
    elided = 0
    for line in lines:
        if len(line) < 300 and (_FENCE.fullmatch(line) or _HTML.fullmatch(line)):
            continue
        if len(line) < 300 and is_elision(line):
            elided += 1
            continue
        kept.append(line)
    return Paste("\n".join(kept), elided)
