"""Keyed dropout (pfl.models.dropout): masks drawn from a key, the same under vmap as alone, different
per key, torch's own dropout without a key, and pfl's WRN builds it."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from pfl.models import ModelConfig, build_model
from pfl.models.dropout import KeyedDropout, dropout_key, mix32, number_keyed_dropouts, step_key, step_key_tensor


def _drop(layer: KeyedDropout, x: torch.Tensor, key) -> torch.Tensor:
    with dropout_key(key):
        return layer(x)


def test_a_key_draws_its_own_mask_and_the_same_one_again():
    layer = KeyedDropout(0.3).train()
    x = torch.randn(64, 8, 5)
    a, b = _drop(layer, x, step_key(0, 0, 1, "train", 0)), _drop(layer, x, step_key(0, 0, 2, "train", 0))
    assert torch.equal(a, _drop(layer, x, step_key(0, 0, 1, "train", 0)))
    assert not torch.equal(a == 0, b == 0)  # two clients, two masks
    assert (a == 0).float().mean().item() == pytest.approx(0.3, abs=0.03)
    kept = a != 0
    torch.testing.assert_close(a[kept], x[kept] / 0.7)  # inverted dropout, as nn.Dropout
    other = KeyedDropout(0.3).train()
    other.index = 1
    assert not torch.equal(_drop(other, x, 5) == 0, _drop(layer, x, 5) == 0)  # two layers, two masks


def test_masks_under_vmap_are_each_keys_masks_and_padding_keeps_them():
    layer = KeyedDropout(0.5).train()
    x = torch.randn(2, 6, 4)
    keys = torch.tensor([11, 12])
    stacked = vmap(lambda k, v: _drop(layer, v, k))(keys, x)
    for j in range(2):
        assert torch.equal(stacked[j], _drop(layer, x[j], int(keys[j])))
    assert torch.equal(_drop(layer, x[0, :4], 11), stacked[0, :4])  # a batch padded at the end: same rows


def test_without_a_key_or_in_eval_mode_it_is_torchs_dropout():
    layer = KeyedDropout(0.3).train()
    x = torch.randn(16, 8)
    torch.manual_seed(3)
    expected = torch.nn.functional.dropout(x, 0.3, True)
    torch.manual_seed(3)
    assert torch.equal(layer(x), expected)
    assert torch.equal(layer.eval()(x), x)


def test_the_hash_is_exact_on_ints_and_tensors():
    values = [0, 1, 12345, 2**31, 2**32 - 1]
    assert mix32(torch.tensor(values)).tolist() == [mix32(v) for v in values]
    assert all(0 <= mix32(v) < 2**32 for v in values) and len({mix32(v) for v in values}) == len(values)


def test_wrn_dropout_is_keyed_and_numbered():
    net = build_model(ModelConfig(name="wrn28_10", depth=10, widen=1, dropout=0.3), (3, 8, 8), 10)
    layers = [m for m in net.modules() if isinstance(m, KeyedDropout)]
    assert len(layers) == 3 and number_keyed_dropouts(net)
    assert [m.index for m in layers] == [0, 1, 2]
    assert not number_keyed_dropouts(build_model(ModelConfig(name="wrn28_10", depth=10, widen=1), (3, 8, 8), 10))


def test_a_key_tensor_draws_the_int_keys_mask():
    layer = KeyedDropout(0.4).train()
    x = torch.randn(32, 6)
    key = step_key(1, 2, 3, "train", 4)
    assert torch.equal(_drop(layer, x, step_key_tensor(1, 2, 3, "train", 4)), _drop(layer, x, key))
