# Shared helpers of this problem family, as GPU MODE's ../utils.py (written for these tests).
import torch


def mismatch_report(received, expected, rtol=1e-5, atol=1e-8):
    if received.shape != expected.shape:
        return f"SIZE MISMATCH: {tuple(received.shape)} vs {tuple(expected.shape)}"
    bad = ~torch.isclose(received, expected, rtol=rtol, atol=atol)
    count = int(bad.sum())
    if count:
        return f"Number of mismatched elements: {count}"
    return ""
