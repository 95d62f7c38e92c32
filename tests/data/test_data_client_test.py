"""data.client_test: pool — each client is tested on the server's held-out samples of its own classes."""

from __future__ import annotations

import numpy as np
import pytest

from pfl.data.config import build_data
from pfl.data.settings import DataConfig
from pfl.errors import ConfigError

POOL = dict(source="digits", num_clients=20, partition="pathological", classes_per_client=2, test_frac=0.0,
            global_test_frac=0.3, client_test="pool")  # fmt: skip


def test_pool_tests_each_client_on_every_held_out_sample_of_its_classes():
    data = build_data(DataConfig(**POOL), seed=0)
    y, held = data.y.numpy(), data.global_test.numpy()
    for c in data.clients:
        classes = set(y[c.train.numpy()].tolist())
        test = c.test.numpy()
        assert len(classes) == 2 and set(y[test].tolist()) == classes
        assert set(test.tolist()) == {i for i in held.tolist() if y[i] in classes}  # all of them, from the pool
        assert not set(test.tolist()) & set(c.train.tolist())
    assert min(len(c.test) for c in data.clients) >= 80  # ~54 held-out digits per class, 2 classes


def test_split_stays_the_default_and_the_training_split_does_not_change():
    split = build_data(DataConfig(**{**POOL, "client_test": "split", "test_frac": 0.25}), seed=0)
    assert DataConfig().client_test == "split"
    assert max(len(c.test) for c in split.clients) < 30
    pool = build_data(DataConfig(**POOL), seed=0)
    assert [len(c.train) for c in pool.clients] != [len(c.train) for c in split.clients]  # no test cut from them
    assert np.array_equal(pool.global_test.numpy(), split.global_test.numpy())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"test_frac": 0.25}, "data.test_frac"),
        ({"global_test_frac": 0.0}, "data.client_test"),
        ({"source": "synthetic"}, "data.client_test"),
        ({"rotation_groups": 4}, "data.client_test"),
        ({"client_test": "shared"}, "data.client_test"),
    ],
)
def test_pool_refuses_what_it_cannot_build(change, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_data(DataConfig(**{**POOL, **change}), seed=0)
