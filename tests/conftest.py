import os

import pytest
from hypothesis import settings

from trainready.catalog import load_catalog

# CI runs the same examples every time; `HYPOTHESIS_PROFILE=soak pytest tests/test_properties.py`
# explores many more, freshly random each run.
settings.register_profile("ci", derandomize=True, max_examples=150, deadline=None)
settings.register_profile("soak", max_examples=3000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()
