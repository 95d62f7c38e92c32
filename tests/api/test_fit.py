"""pfl.fit: resuming from Python, a user's model class, no global state left behind."""

from __future__ import annotations

import random
import textwrap
import warnings

import numpy as np
import pytest
import torch

import pfl
from pfl.errors import ConfigError
from tests.api.helpers import tiny_fit


def test_fit_leaves_no_global_state_behind(tmp_path):
    torch.set_num_threads(2)  # a run sets trainer.threads (1)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    warnings.filterwarnings("ignore", message="a marker filter")
    filters = list(warnings.filters)
    try:
        run = tiny_fit(tmp_path, "r")
        assert torch.get_num_threads() == 2
        assert list(warnings.filters) == filters
        after = (torch.rand(3), np.random.rand(3), random.random())
        assert torch.equal(after[0], expected[0]) and np.array_equal(after[1], expected[1])
        assert after[2] == expected[2]
    finally:
        warnings.filters.remove(filters[0])
        torch.set_num_threads(1)
    assert run.summary["rounds"] == 2


def test_fit_restores_numpy_and_python_rngs_that_the_users_model_draws_from(tmp_path, monkeypatch):
    """pfl draws from neither global RNG itself; a user's model may (here: dropout masks from numpy's,
    a jitter from Python's, at every forward pass), and the caller's next draws must not see it."""
    (tmp_path / "noisy_nets.py").write_text(
        textwrap.dedent(
            """
            import math
            import random
            import numpy as np
            import torch
            from torch import nn

            class Noisy(nn.Module):
                def __init__(self, input_shape, num_classes):
                    super().__init__()
                    self.fc = nn.Linear(math.prod(input_shape), num_classes)

                def forward(self, x):
                    keep = torch.as_tensor(np.random.rand(*x.shape[1:]) > 0.1, dtype=x.dtype)
                    return self.fc((x * keep).flatten(1)) * (1 + 0.01 * random.random())
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    np.random.seed(7), random.seed(7)
    expected = (np.random.rand(3), random.random())
    np.random.seed(7), random.seed(7)
    tiny_fit(tmp_path, "r", model={"class_path": "noisy_nets.Noisy"}, trainer={"rounds": 1, "progress": False})
    assert np.array_equal(np.random.rand(3), expected[0])
    assert random.random() == expected[1]


def test_resume_from_python(tmp_path):
    run = tiny_fit(tmp_path, "r")
    resumed = pfl.fit(resume=run.path, **{"trainer.rounds": 3})  # --resume DIR --trainer.rounds 3
    assert resumed.path == run.path and list(resumed.metrics["round"]) == [1, 2, 3]
    with pytest.raises(ConfigError, match="--resume: .* may not change client.lr"):
        pfl.fit(resume=run.path, client={"lr": 0.5})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA generators exist only on a GPU")
def test_fit_restores_the_cuda_rng(tmp_path):
    torch.cuda.init()
    torch.cuda.manual_seed_all(7)
    expected = torch.rand(3, device="cuda")
    torch.cuda.manual_seed_all(7)
    tiny_fit(tmp_path, "r", **{"trainer.accelerator": "cuda"})  # the run seeds the CUDA generators too
    assert torch.equal(torch.rand(3, device="cuda"), expected)


def test_a_users_model_class_with_init_args(tmp_path, monkeypatch):
    (tmp_path / "my_nets.py").write_text(
        textwrap.dedent(
            """
            import math
            from torch import nn

            class Wide(nn.Sequential):
                def __init__(self, input_shape, num_classes, width=4):
                    super().__init__(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
                                     nn.Linear(width, num_classes))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = {"class_path": "my_nets.Wide", "init_args": {"width": 7}}
    run = tiny_fit(tmp_path, "r", model=model)
    assert run.config["model"]["name"] == "my_nets.Wide" and run.config["model"]["init_args"] == {"width": 7}
    parameters = (64 * 7 + 7) + (7 * 10 + 10)  # digits: 8x8 inputs, 10 classes
    # FedAvg uploads the whole model: 2 of the 5 clients per round (fraction 0.5), float32
    assert run.summary["metrics"]["comm.up_bytes.per_round"] == 2 * parameters * 4
    with pytest.raises(ConfigError, match="model.init_args: my_nets.Wide cannot be called"):
        tiny_fit(tmp_path, "bad", model={"class_path": "my_nets.Wide", "init_args": {"depth": 2}})
