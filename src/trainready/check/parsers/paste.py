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
# Matched on the line stripped and its spaces squeezed (at most 80 characters): no two spans of spaces
# meet, so no input makes the match slow.
_ELISION = re.compile(r"(?:# ?)?(?:\[ ?(?:\.{2,}|…|snip(?:ped)?|truncated|omitted|cut)[^\]]{0,60}\]|\.{2,10} ?"
                      r"(?:< ?snip(?:ped)? ?>|\( ?snip(?:ped)? ?\))?(?: ?\.{1,10})?|< ?snip(?:ped)? ?>|…+|"
                      r"\( ?(?:truncated|snip(?:ped)?|\.{3}|more lines?(?: omitted)?) ?\)|"
                      r"(?:\.\.\. ?)?(?:output )?(?:truncated|omitted|snipped)(?: ?\.\.\.)?)", re.I)
_SPACES = re.compile(r"\s+")
_QUOTE = re.compile(r"\s{0,3}> ?")


@dataclass(frozen=True, slots=True)
class Paste:
    text: str
    """The output with fences, quote markers, HTML wrappers and elision lines removed."""
    elided: int = 0
    """Lines that marked a cut by the author: what they stood for is unknown."""


def is_elision(line: str) -> bool:
    core = line.strip()
    if not core or len(core) > 200:
        return False
    core = _SPACES.sub(" ", core)
    return len(core) <= 80 and _ELISION.fullmatch(core) is not None


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
