"""The one redactor: secrets it must hide wherever they appear, and ordinary text it must leave alone."""

import pytest

from trainready.io import redact, redact_argv

SECRETS = [
    ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@bucket/p", "wJalrXUtnFEMI"),  # '/' in it
    ("https://user:p@ss@host/x", "p@ss"),
    ("//srv/share /mnt cifs username=bob,password=hunter2,uid=0 0 0", "hunter2"),
    ("//srv/share /mnt cifs pass=hunter2secret 0 0", "hunter2secret"),
    ('{"password": "two words"}', "two"),
    ("password=a\"b c", 'a"b'),
    ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop"),
    ("clientSecret=zzzzzzzzzz", "zzzzzzzzzz"),
    ("AccountName=x;AccountKey=abc123xyz==;EndpointSuffix=core.windows.net", "abc123xyz"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789 here", "ghp_abc"),
    ("key sk-abcdefghijklmnopqrstuvwxyz", "sk-abc"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F2026&X-Amz-Signature=abcdef0123&x=1",
     "abcdef0123"),
    ("Credential=AKIAIOSFODNN7EXAMPLE/2026, Signature=deadbeefdeadbeef", "deadbeefdeadbeef"),
    ("secret_key=abc", "=abc"),
    ("--data https://x.blob.core.windows.net/c?sv=2021&sig=abcdEFGH123%3D", "abcdEFGH123"),
]

ORDINARY = ["all checks pass: 12", "forward_pass: 0.12s", "token: 4096", "eos_token=2", "sig: 15", "PWD=/work/main",
            "the signature: valid", "tokens_per_s: 123", "shards.3.name = '../../etc/passwd': escapes",
            "bypass=1 compass: north", "pad_token: <pad>", "stopped by signal SIGTERM after step 5",
            "s3://bucket/run-1/step-000000000005-g0001", "--tokens 2e9 --token-budget 5"]


@pytest.mark.parametrize("text, secret", SECRETS)
def test_secrets_are_hidden(text, secret):
    assert secret not in redact(text)


def test_secret_environment_values_are_hidden_anywhere(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghij")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3tvalue")
    assert "hf_abcdefghij" not in redact("loaded hf_abcdefghij from the env") and "s3cr3t" not in redact("x s3cr3tvalue")


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_alone(text):
    assert redact(text) == text


def test_argv_hides_the_value_after_a_secret_option():
    argv = ["python", "train.py", "--hf-token", "abc", "--wandb_api_key=zzzzzzzzzz", "--lr", "3", "--password", "x",
            "--tokens", "2e9"]
    assert redact_argv(argv) == ["python", "train.py", "--hf-token", "***", "--wandb_api_key=***", "--lr", "3",
                                 "--password", "***", "--tokens", "2e9"]


def test_part_size_grows_so_no_file_needs_more_than_s3s_10000_parts():
    from trainready.io.urls import S3_MAX_PARTS, S3_PART, part_size_for

    for size in (0, 1, S3_PART, S3_PART * S3_MAX_PARTS, S3_PART * S3_MAX_PARTS + 1, 5 << 40):
        part = part_size_for(size)
        assert part >= S3_PART and part % (1 << 20) == 0
        assert -(-size // part) <= S3_MAX_PARTS, size
    assert part_size_for(S3_PART * S3_MAX_PARTS) == S3_PART  # unchanged up to 625 GiB


def test_credentials_before_an_at_are_masked_with_or_without_a_scheme():
    """issue 26: a bucket named with credentials (s3://user:SECRET@bucket), and user:password@host written without a
    scheme (AWS_ENDPOINT_URL values, database URLs in arguments); e-mail addresses and git@host:repo stay."""
    from trainready.io import has_url_credentials, redact

    for text, want in (("s3://AKIA:SECRET@bucket/x", "s3://***@bucket/x"), ("admin:hunter2@127.0.0.1:9000",
                       "***@127.0.0.1:9000"), ("bucket 'u:pw@b' is bad", "bucket '***@b' is bad")):
        assert redact(text) == want and has_url_credentials(text)
    for text in ("ops@example.com", "git@github.com:org/repo.git", "s3://bucket/x"):
        assert redact(text) == text and not has_url_credentials(text)


def test_credentials_with_slashes_and_ats_are_masked_and_ordinary_words_are_not_credentials():
    """Review of issue 26's redactor: AWS secret keys hold '/', passwords may hold '@'; a user alone (git@), an image
    digest, mailto: and numbers around an @ are not credentials for a launch file."""
    from trainready.io import has_url_credentials, redact

    key = "AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@mybucket/x"
    assert redact(key) == "***@mybucket/x" and has_url_credentials(key, any_host=True)
    assert redact("user:p@ss@host") == "***@host" and redact("//user:pw@host/db") == "***@host/db"
    assert has_url_credentials("user:pa/ss@host") and has_url_credentials("u:p@[::1]:5432")
    for word in ("git+ssh://git@github.com/org/repo.git", "docker://nvcr.io/nvidia/pytorch:24.01-py3@sha256:abc",
                 "ubuntu:22.04@sha256:abc", "cosine:0.1@1000", "mailto:me@example.com", "s3://bucket/runs@v2"):
        assert not has_url_credentials(word), word
    assert redact("ubuntu:22.04@sha256:abc") == "ubuntu:22.04@sha256:abc"
    # an error's prose after "credentials:" is not a secret value
    text = "AWS refused the credentials: credentials refused (InvalidClientTokenId): set AWS_PROFILE"
    assert redact(text, pairs=False) == text
