"""Attack: declare the test an expected failure from inside the kernel."""

import pytest


def custom_kernel(data):
    pytest.xfail("known issue")
