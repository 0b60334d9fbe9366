import os

import pytest
from hypothesis import settings

from trainready.catalog import load_catalog

# CI runs the same examples every time; `HYPOTHESIS_PROFILE=soak pytest tests/test_properties.py`
# explores many more, freshly random each run.
settings.register_profile("ci", derandomize=True, max_examples=150, deadline=None)
settings.register_profile("soak", max_examples=3000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Under `make test` (pytest-xdist) tests are handed to workers in this order: the longest files' tests first, so
# no worker is left with one of them at the end while the others idle. Rough order of their run time on a 2-core
# VM (pytest --durations). (--dist loadfile, to make each module fixture once, left one worker the whole tail.)
LONGEST_FIRST = ("test_run.py", "test_run_contract.py", "test_store_multinode.py", "test_store_crash.py",
                 "test_store_preempt.py", "test_data_training.py", "test_schemas.py", "test_ckpt_cli.py",
                 "test_data_bench.py", "test_exporters.py", "test_goodput.py", "test_check_deep.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


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
