"""Comparing two runs of the same configuration (lockstep against sequential): states and metrics."""

from __future__ import annotations

import pytest
import torch


def assert_close(a, b, what: str, atol: float = 1e-5) -> None:
    """Tensors (and dicts of them, nested) equal within ``atol``; float tensors only, the rest by keys."""
    if isinstance(b, torch.Tensor) and b.is_floating_point():
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=what)
    elif isinstance(b, dict):
        assert a.keys() == b.keys(), what
        for k in b:
            assert_close(a[k], b[k], f"{what}[{k}]", atol)


def assert_same_metrics(got: dict, expected: dict, atol: float = 1e-5) -> None:
    """Every float metric of a history row (timings and NaNs left out) as in ``expected``'s."""
    for key, value in expected.items():
        if isinstance(value, float) and not key.startswith(("time", "throughput")) and value == value:
            assert got[key] == pytest.approx(value, abs=atol), key
