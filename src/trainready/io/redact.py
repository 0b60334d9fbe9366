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
# user:password@host without a scheme (a bucket name typed with credentials, `user:pw@db:5432`, `//u:p@h`): a
# colon is needed, so e-mail addresses and git@host:repo are left alone; the password runs to the last @ before a
# host (secrets hold / and :, even @), and an image digest (`name:tag@sha256:...`) is not a host
_USERINFO_BARE = re.compile(r"(?<![\w:@.*-])(?!mailto:)(?://)?[\w.+%~-]+:(?!//)\S*@(?!sha\d+:)(?=[\w.\[-])")
# what makes a word a credential for a launch file: a URL's userinfo with a password (`scheme://user:pw@host`,
# a user alone as in git@ or ssh:// is not one), or the bare form before a host with a dot, an IP or a port
_URL_PASSWORD = re.compile(r"\b[a-zA-Z][\w+.-]*://[^/\s@]*:[^/\s]*@")
_BARE_CREDENTIALS = re.compile(r"(?<![\w:@.*-])(?!mailto:)(?://)?[\w.+%~-]+:(?!//)\S*@(?!sha\d+:)"
                               r"(?:[\w-]+\.[\w.-]+|\[[0-9a-fA-F:]+\]|[\w-]+:\d+|localhost)")
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


def redact(text: object, pairs: bool = True) -> str:
    """`text` with every secret we can recognise replaced by ***. `pairs=False` leaves `key: value` text alone (an
    error message's prose, "the credentials: refused"), masking only values that are secrets by their form."""
    out = str(text)
    for value in _secret_values():
        if value in out:
            out = out.replace(value, MASK)
    out = _USERINFO.sub(r"\1" + MASK + "@", out)
    out = _USERINFO_BARE.sub(MASK + "@", out)
    out = _QUERY.sub(r"\1" + MASK, out)
    out = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", out)
    if pairs:
        out = _PAIR.sub(_pair, out)
    return _KNOWN_TOKENS.sub(MASK, out)


def has_url_credentials(text: str, any_host: bool = False) -> bool:
    """Whether `text` holds a password in a URL (`scheme://user:pw@host`) or a bare `user:pw@host` whose host has a
    dot, is an IP or has a port; a user alone (git@github.com), an image digest or `cosine:0.1@1000` is not one.
    `any_host`: a bare `user:pw@` before any name counts (a path or bucket, where an @ after a colon is no syntax)."""
    if _URL_PASSWORD.search(text) or _BARE_CREDENTIALS.search(text):
        return True
    for match in _USERINFO_BARE.finditer(text):
        user, _, password = match.group(0).removeprefix("//")[:-1].partition(":")
        # before a bare name: a user with a letter and a password that is not a number (`12:30@home`, `0.1@1000`)
        if any_host or (re.search(r"[A-Za-z]", user) and re.search(r"[^\d.]", password)):
            return True
    return False


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


MAX_JSON_DEPTH = 64
"""Past this nesting a value is not one of ours (a stop record, a config): it is replaced, not walked (a parser may
accept 1,000 levels, which this walk would not survive)."""


def redact_json(value: object, _depth: int = 0) -> object:
    """Every string in a JSON-like value redacted, a value judged with its key ({"password": "x"} hides "x", which
    alone would not look like a secret): run.json's config and environment, stop records, bundle JSON files."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, (list, dict)) and _depth >= MAX_JSON_DEPTH:
        return f"{MASK} (nested past {MAX_JSON_DEPTH} levels)"
    if isinstance(value, list):
        return [redact_json(v, _depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _redact_pair(k, v) if isinstance(v, str) and isinstance(k, str) else redact_json(v, _depth + 1)
                for k, v in value.items()}
    return value


def _redact_pair(key: str, value: str) -> str:
    pair = redact(f"{key}={value}")
    return pair[len(key) + 1:] if pair.startswith(f"{key}=") else redact(value)


def is_secret_name(name: str) -> bool:
    """An environment variable name that holds a secret by its name (AWS_SECRET_ACCESS_KEY, HF_TOKEN, DB_PASSWORD)."""
    return bool(_SECRET_ENV.search(name))
