import os

import pytest
from hypothesis import settings
from run_helpers import EXIT_FAST

from trainready.catalog import load_catalog

# CI runs the same examples every time; `HYPOTHESIS_PROFILE=soak pytest tests/test_properties.py`
# explores many more, freshly random each run.
settings.register_profile("ci", derandomize=True, max_examples=150, deadline=None)
settings.register_profile("soak", max_examples=3000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Every Python the tests start (torchrun's agent, its workers, the CLI) skips the collections at interpreter exit:
# about 1.5 s of CPU a 2-process launch. exit_fast/sitecustomize.py says why nothing checked happens there.
if EXIT_FAST not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # xdist's workers inherit it
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (EXIT_FAST, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


@pytest.fixture(scope="session")
def moto():
    """moto's standalone S3 server on 127.0.0.1, for the whole session."""
    from s3server import MotoServer

    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(moto, monkeypatch, request):
    """A fresh bucket on the local S3 server; AWS variables point every client at it."""
    import re

    import boto3

    for key, value in {"AWS_ENDPOINT_URL_S3": moto.url, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") or "bucket"
    boto3.client("s3", endpoint_url=moto.url).create_bucket(Bucket=name)
    return name
