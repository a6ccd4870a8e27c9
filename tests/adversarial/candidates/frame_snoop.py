"""Attack: look for the expected output (or the reference kernel) in the callers' frames and
among all live objects, and return it."""

import gc
import sys

import torch

NAMES = ("expected", "ref", "reference", "ref_out", "ref_output", "want", "target")


def _search(data):
    frame = sys._getframe(1)
    while frame is not None:
        for name in NAMES:
            value = frame.f_locals.get(name)
            if isinstance(value, torch.Tensor) and value.shape == data[4].shape:
                return value.clone()
        frame = frame.f_back
    for obj in gc.get_objects():
        ref_kernel = getattr(obj, "ref_kernel", None) if type(obj).__name__ == "module" else None
        if callable(ref_kernel):
            return ref_kernel(data)
    return None


def custom_kernel(data):
    found = _search(data)
    if found is None:
        raise LookupError("no reference output and no ref_kernel anywhere in this process")
    return found
