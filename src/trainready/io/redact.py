"""Secrets never leave the process: one redactor for every message, record and file we write.

What it hides: URL user-info (`s3://user:pw@...`), presigned-URL query parameters
(X-Amz-Signature/Credential/Security-Token, GCS and Azure SAS signatures, `token=`), `key=value`
pairs whose key names a secret (`password=` in an fstab line, `secret=`, `token=`), AWS access
key ids, and the values of secret-looking environment variables (AWS keys, HF_TOKEN,
WANDB_API_KEY, anything named *_TOKEN, *SECRET*, *PASSWORD*, *_API_KEY) wherever they appear.
`redact_argv` also hides the value after a secret-looking option (`--hf-token abc`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

MASK = "***"
_USERINFO = re.compile(r"\b([a-zA-Z][\w+.-]*://)[^/@\s]+@")
_SECRET_WORD = (r"(?:password|passwd|pwd|pass|secret|token|api[_-]?key|access[_-]?key|secret[_-]?key|credentials?|sig|"
                r"signature|security[_-]?token|auth[_-]?token)")
# query parameters of presigned URLs and SAS tokens: ?X-Amz-Signature=...&Signature=...&sig=...
_QUERY = re.compile(r"(?i)([?&;](?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
                    r"x-goog-credential|signature|awsaccesskeyid|sig|token|access_token|se|sv|skoid|sktid)=)[^&\s\"'#]+")
# key=value / key: value where the key names a secret (fstab options, config dumps, headers)
_PAIR = re.compile(r"(?i)(?<![/\w.-])((?:[\w.-]*[_.-])?" + _SECRET_WORD + r")([\"']?\s*[=:]\s*[\"']?)(?!\*\*\*)([^\s,;&\"'}]+)")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")
_SECRET_ENV = re.compile(r"(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|SECRET_KEY|ACCESS_KEY_ID)(_|$)")
_SECRET_OPTION = re.compile(r"(?i)^--?(?:[\w-]*[_-])?" + _SECRET_WORD + r"$")
_MIN_SECRET_LEN = 6  # shorter environment values ("1", "true") would mask ordinary words


def _secret_values() -> list[str]:
    values = [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= _MIN_SECRET_LEN]
    return sorted(set(values), key=len, reverse=True)


def redact(text: object) -> str:
    """`text` with every secret we can recognise replaced by ***."""
    out = str(text)
    for value in _secret_values():
        if value in out:
            out = out.replace(value, MASK)
    out = _USERINFO.sub(r"\1" + MASK + "@", out)
    out = _QUERY.sub(r"\1" + MASK, out)
    out = _PAIR.sub(lambda m: m.group(1) + m.group(2) + MASK, out)
    return _AWS_KEY_ID.sub(MASK, out)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with secrets hidden: each word redacted, and the word after an option whose
    name says secret (`--hf-token abc`, `--password abc`) masked whole."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        word = str(word)
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if _SECRET_OPTION.match(word):
            hide_next = True
            out.append(word)
            continue
        out.append(redact(word))
    return out
