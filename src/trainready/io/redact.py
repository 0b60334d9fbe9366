"""Secrets never leave the process: one redactor for every message, record and file we write.

What it hides:
- URL user-info (`s3://key:secret@bucket`, up to the last `@` of the URL: secrets contain `/`);
- presigned-URL and SAS query parameters (X-Amz-Signature/Credential/Security-Token, GCS and
  Azure signatures, `token=`);
- `key=value` / `key: value` pairs (quoted or not) whose key names a secret: always for
  password, secret, api key, access/private/account key, credentials and the *_token family
  named for sessions, auth and refresh; for bare `token`, `pass` and `signature` only when the
  value looks like one (8+ characters, not a number), so `eos_token=2` or `pass: 12` survive;
- `Bearer`/`Basic` credentials, AWS access key ids and tokens with well-known prefixes (GitHub,
  Hugging Face, OpenAI-style `sk-`, Slack, Google API keys);
- the values of secret-looking environment variables wherever they appear.
`redact_argv` also hides the word after a secret-looking option (`--hf-token abc`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

MASK = "***"
_USERINFO = re.compile(r"\b([a-zA-Z][\w+.-]*://)\S*@")
# user:password@host without a scheme (a bucket name typed with credentials, `user:pw@db:5432`); a colon is needed,
# so e-mail addresses and git@host:repo are left alone
_USERINFO_BARE = re.compile(r"(?<![\w/:@.*-])[\w.+%~-]+:[^\s@/:]+@(?=[\w.-]+)")
_QUERY = re.compile(r"(?i)([?&;](?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
                    r"x-goog-credential|signature|awsaccesskeyid|sig|token|access_token|se|sv|skoid|sktid)=)[^&\s\"'#]+")
_STRONG = (r"password|passwd|secret|secret[_-]?key|secret[_-]?access[_-]?key|client[_-]?secret|api[_-]?key|"
           r"access[_-]?key(?:[_-]?id)?|private[_-]?key|account[_-]?key|credentials?|security[_-]?token|"
           r"session[_-]?token|auth[_-]?token|access[_-]?token|refresh[_-]?token|authorization")
_WEAK = r"token|pass|signature"
_PAIR = re.compile(r"(?i)(?<![/\w.-])([\w.-]*?(?:(" + _STRONG + r")|" + _WEAK + r"))([\"']?\s*[=:]\s*)"
                   r"(?:\"((?:[^\"\\]|\\.)*)\"|'([^']*)'|(?!\*\*\*)([^\s,;&}\"']+[^\s,;&}]*))")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_KNOWN_TOKENS = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bgithub_pat_\w{30,}\b|"
                           r"\bsk-[A-Za-z0-9_-]{20,}\b|\bhf_[A-Za-z0-9]{30,}\b|\bxox[abprs]-[A-Za-z0-9-]{10,}\b|"
                           r"\bAIza[0-9A-Za-z_-]{35}\b")
_SECRET_ENV = re.compile(r"(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|SECRET_KEY|ACCESS_KEY_ID)(_|$)")
_SECRET_OPTION = re.compile(r"(?i)^--?(?:[\w-]*[_-])?(?:" + _STRONG + r"|token|pass)$")
_NUMBERISH = re.compile(r"^[-+]?[\d.,]+[a-z%]{0,3}$", re.IGNORECASE)
_MIN_SECRET_LEN = 6  # shorter environment values ("1", "true") would mask ordinary words


def _secret_values() -> list[str]:
    values = [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= _MIN_SECRET_LEN]
    return sorted(set(values), key=len, reverse=True)


def _looks_secret(value: str) -> bool:
    return len(value) >= 8 and not _NUMBERISH.match(value)


def _pair(match: re.Match[str]) -> str:
    key, strong, sep = match.group(1), match.group(2), match.group(3)
    double, single, bare = match.group(4), match.group(5), match.group(6)
    value = next(v for v in (double, single, bare) if v is not None)
    if not strong and not _looks_secret(value):
        return match.group(0)
    if double is not None:
        return f'{key}{sep}"{MASK}"'
    if single is not None:
        return f"{key}{sep}'{MASK}'"
    return f"{key}{sep}{MASK}"


def redact(text: object) -> str:
    """`text` with every secret we can recognise replaced by ***."""
    out = str(text)
    for value in _secret_values():
        if value in out:
            out = out.replace(value, MASK)
    out = _USERINFO.sub(r"\1" + MASK + "@", out)
    out = _USERINFO_BARE.sub(MASK + "@", out)
    out = _QUERY.sub(r"\1" + MASK, out)
    out = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", out)
    out = _PAIR.sub(_pair, out)
    return _KNOWN_TOKENS.sub(MASK, out)


def has_url_credentials(text: str) -> bool:
    """Whether `text` holds a user:password (or user) before an @ of a URL, with or without its scheme."""
    return bool(_USERINFO.search(text) or _USERINFO_BARE.search(text))


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
