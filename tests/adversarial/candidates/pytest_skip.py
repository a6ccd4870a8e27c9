"""Attack: skip the test from inside the kernel, so it is neither passed nor failed."""

import pytest


def custom_kernel(data):
    pytest.skip("kernel not applicable on this device")
