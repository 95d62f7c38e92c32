"""Tests of pfl/methods/model_rows.py."""

from __future__ import annotations

import pytest
import torch

from pfl.engine.flat import FlatModule
from pfl.methods import model_rows
from pfl.models import ModelConfig, build_model
from pfl.seeding import derive_seed
from tests.methods.helpers import BN_CNN, cluster_loop


def test_row_gram_is_the_centred_float64_gram_over_column_blocks():
    g = torch.Generator().manual_seed(0)
    store = torch.randn(3, model_rows._BLOCK + 1000, generator=g)  # two column blocks, the second partial
    center = torch.randn(store.shape[1], generator=g)
    rows = store.double() - center.double()
    torch.testing.assert_close(model_rows.row_gram(store, center), rows @ rows.T, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(model_rows.row_gram(store), store.double() @ store.double().T, rtol=1e-12, atol=1e-9)
    first = store[:, :700].double()
    torch.testing.assert_close(model_rows.row_gram(store, cols=700), first @ first.T, rtol=1e-12, atol=1e-9)
    assert model_rows.row_gram(store).dtype == torch.float64


def test_squared_distances_and_clipped_cosine_from_a_gram_matrix():
    rows = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    gram = rows @ rows.T
    dist = model_rows.squared_distances(gram)
    torch.testing.assert_close(dist, torch.cdist(rows, rows) ** 2)
    assert torch.equal(dist.diagonal(), torch.zeros(4, dtype=torch.float64))
    # rounding can make G_ii + G_jj - 2 G_ij slightly negative for (nearly) equal rows: clamped at 0
    near = torch.tensor([[1.0, 1.0 + 2**-52], [1.0 + 2**-52, 1.0]], dtype=torch.float64)
    assert torch.equal(model_rows.squared_distances(near), torch.zeros(2, 2, dtype=torch.float64))
    cos = model_rows.clipped_cosine(gram)
    expected = torch.tensor(
        [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64
    )  # orthogonal: 0; opposite (cos -1): clipped to 0; the zero row: 0 with the others, 1 with itself
    torch.testing.assert_close(cos, expected)
    parallel = torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]], dtype=torch.float64)  # cos rounds to 1 + 2^-52
    assert torch.equal(model_rows.clipped_cosine(parallel @ parallel.T), torch.ones(2, 2, dtype=torch.float64))
    skew = torch.tensor([[3.0, 4.0], [4.0, 3.0]], dtype=torch.float64)
    for scale in (1.0, 1e-3):  # scale-free: rows of norm below 1 too
        cos_skew = model_rows.clipped_cosine((scale * skew) @ (scale * skew).T)[0, 1]
        torch.testing.assert_close(cos_skew, torch.tensor(24.0 / 25.0, dtype=torch.float64))


def test_cluster_starts_build_the_network_again_keyed_by_seed_purpose_and_cluster():
    loop = cluster_loop("ifca", BN_CNN, clusters=3)
    server, p = loop.server, loop.server.layout.num_params
    starts = server["models"]
    for j in (1, 2):  # digits: (1, 8, 8) images, 10 classes; built under torch's CPU generator seeded by the keys
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(0, "ifca", "cluster_start", j))
            built = FlatModule(build_model(ModelConfig(**BN_CNN), (1, 8, 8), 10))
        assert torch.equal(starts[j, :p], built.params)
    with torch.random.fork_rng(devices=[]):  # the global generator is neither read nor moved
        torch.manual_seed(123)
        before = torch.get_rng_state()
        assert torch.equal(model_rows.cluster_starts(server, 3, "ifca"), starts)
        assert torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(model_rows.cluster_starts(server, 3, "fesem")[1:], starts[1:])  # keyed by the purpose
    server.seed = 1
    other = model_rows.cluster_starts(server, 3, "ifca")
    assert torch.equal(other[0], starts[0]) and not torch.equal(other[1], starts[1])  # and by the seed
    assert not torch.equal(other[2], starts[2])
    server.draw_params = None  # one cluster is the shared initialisation alone: nothing to build
    assert torch.equal(model_rows.cluster_starts(server, 1, "ifca"), starts[:1])
    with pytest.raises(RuntimeError, match="cannot build its network again"):
        model_rows.cluster_starts(server, 2, "ifca")
