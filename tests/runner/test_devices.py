"""trainer.processes_per_device: rank r on device r // k, one gloo DDP strategy, bad values refused."""

from __future__ import annotations

import pytest
import torch
from lightning.fabric.strategies import DDPStrategy

from pfl.config import validate
from pfl.errors import ConfigError
from pfl.runner.devices import accelerator_type, device_index, make_fabric, parallel_devices
from tests.conftest import tiny_config


def test_rank_r_trains_on_device_r_floor_divided_by_k():
    assert [device_index(r, 2) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [device_index(r, 3) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [device_index(r, 1) for r in range(3)] == [0, 1, 2]
    cuda = parallel_devices("cuda", 2, 3)
    assert cuda == [torch.device("cuda", i) for i in (0, 0, 0, 1, 1, 1)]
    assert parallel_devices("cpu", 1, 2) == [torch.device("cpu")] * 2


def test_several_processes_on_a_cpu_are_one_gloo_ddp_strategy():
    t = tiny_config(trainer={"accelerator": "cpu", "processes_per_device": 2}).trainer
    fabric = make_fabric(t)
    assert isinstance(fabric.strategy, DDPStrategy)
    assert fabric.world_size == 2 and fabric.strategy.num_processes == 2
    assert fabric.strategy._process_group_backend == "gloo"
    assert fabric.strategy.parallel_devices == [torch.device("cpu")] * 2
    single = make_fabric(tiny_config(trainer={"accelerator": "cpu"}).trainer)
    assert single.world_size == 1 and not isinstance(single.strategy, DDPStrategy)


def test_accelerator_type_of_shared_devices(monkeypatch):
    assert accelerator_type("cuda") == accelerator_type("gpu") == "cuda"
    assert accelerator_type("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert accelerator_type("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert accelerator_type("auto") == "cuda"
    with pytest.raises(ConfigError, match="trainer.processes_per_device: several processes cannot share a mps"):
        accelerator_type("mps")


def test_bad_processes_per_device_is_refused_by_name():
    validate(tiny_config(trainer={"processes_per_device": 3}))
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ConfigError, match=r"^trainer.processes_per_device: must be a whole number >= 1"):
            validate(tiny_config(trainer={"processes_per_device": bad}))
    with pytest.raises(ConfigError, match=r"^trainer.processes_per_device: 2 processes cannot share an mps device"):
        validate(tiny_config(trainer={"processes_per_device": 2, "accelerator": "mps"}))
