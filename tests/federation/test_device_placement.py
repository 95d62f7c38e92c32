"""Tensors of the training device and of the host meeting in the loop's own checks (tests/helpers/device_tags.py
stands in for a CUDA device on a CPU machine)."""

from __future__ import annotations

import math

import pytest
import torch

from pfl.errors import TrainingDiverged
from pfl.federation import divergence
from pfl.methods import Upload
from tests.helpers.device_tags import DEVICE, is_on_device, training_device


def test_the_stand_in_device_refuses_what_cuda_refuses_and_allows_what_it_allows():
    with training_device() as dev:
        on, host = torch.ones(3, device=dev), torch.ones(3)
        for mixed in (lambda: on + host, lambda: torch.stack([on.sum(), host.sum()]), lambda: torch.cat([on, host])):
            with pytest.raises(RuntimeError, match="same device"):
                mixed()
        with pytest.raises(RuntimeError, match="same device"):
            host[on.long()]
        assert is_on_device(on * torch.tensor(2.0)) and is_on_device(on[torch.tensor([0, 2])])
        assert is_on_device(host.to(dev)) and is_on_device(host.to(on))
        assert is_on_device(torch.zeros(2, device=on.device))
        assert not is_on_device(on.cpu()) and not is_on_device(on.to("cpu")) and on.device == DEVICE
        assert float((on + host.to(dev)).sum()) == 6.0


def agent_state() -> dict:
    """What PAGE and Dap-FL keep per client besides the trained model: host tensors (the agent)."""
    return {"agent": {"networks": torch.ones(4), "generator": torch.zeros(8, dtype=torch.uint8)}, "obs": torch.ones(2)}


def test_a_client_state_with_host_tensors_beside_a_device_upload_passes_the_divergence_check():
    with training_device() as dev:
        trained = torch.full((5,), 2.0, device=dev)
        state = {**agent_state(), "personal": trained}
        total = divergence.finite_sum([Upload(trained, 1.0), state])
        assert is_on_device(total) and float(total) == 10.0 + 10.0 + 4.0 + 2.0


def test_the_round_check_takes_per_client_sums_on_different_devices():
    with training_device() as dev:
        uploads = {0: Upload(torch.ones(3, device=dev), 1.0), 1: Upload(None, 1.0)}
        states = {0: {}, 1: agent_state()}  # client 1 uploads nothing: its sum is the host's
        sums = [divergence.finite_sum([uploads[c], states[c]]) for c in (0, 1)]
        assert is_on_device(sums[0]) and not is_on_device(sums[1])
        divergence.check_round(1, [0, 1], uploads, states, {}, sums)
        states[1]["obs"] = torch.tensor([1.0, math.nan])
        sums = [divergence.finite_sum([uploads[c], states[c]]) for c in (0, 1)]
        with pytest.raises(TrainingDiverged, match="client 1"):
            divergence.check_round(1, [0, 1], uploads, states, {}, sums)


def test_totals_over_devices_land_on_the_device_and_keep_one_device_sums_as_they_were():
    with training_device() as dev:
        mixed = divergence.total_of([torch.tensor(1.0), torch.tensor(2.0, device=dev), torch.tensor(3.0)])
        assert is_on_device(mixed) and float(mixed) == 6.0
    host = [torch.tensor(0.1, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)]
    assert torch.equal(divergence.total_of(host), torch.stack(host).sum())
