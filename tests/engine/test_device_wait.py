"""Clock reads wait for a CUDA device's queued work, and never for the CPU's (``pfl.engine.device_wait``)."""

from __future__ import annotations

import torch

from pfl.engine.device_wait import wait_for


def test_only_a_cuda_device_is_synchronized(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    wait_for(torch.device("cpu"))
    assert synced == []
    cuda = torch.device("cuda", 1)  # a device object only: nothing runs on it
    wait_for(cuda)
    assert synced == [cuda]
