"""Keyed dropout (pfl.models.dropout): masks drawn from a key, the same under vmap as alone, different
per key, torch's own dropout without a key, and pfl's WRN builds it."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from pfl.models import ModelConfig, build_model
from pfl.models.dropout import (
    KeyedDropout,
    _mul32,
    dropout_key,
    mix32,
    number_keyed_dropouts,
    step_key,
    step_key_tensor,
)
from pfl.seeding import derive_seed

M32 = 2**32
EDGES = [0, 1, 2, 0xFFFF, 0x10000, 0x12345678, 2**31 - 1, 2**31, M32 - 2, M32 - 1]


def lowbias32(x: int) -> int:
    """The published lowbias32 hash, written with Python's unbounded integers."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) % M32
    x ^= x >> 15
    x = (x * 0x846CA68B) % M32
    return x ^ (x >> 16)


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


def test_the_32_bit_product_is_the_product_mod_2_to_the_32_on_ints_and_int64_tensors():
    gen = torch.Generator().manual_seed(0)
    values = EDGES + torch.randint(0, M32, (200,), generator=gen, dtype=torch.int64).tolist()
    for c in (0x7FEB352D, 0x846CA68B, 0xFFFFFFFF, 0x10001, 3):
        expected = [(v * c) % M32 for v in values]
        assert [_mul32(v, c) for v in values] == expected
        assert _mul32(torch.tensor(values), c).tolist() == expected


def test_mix32_is_lowbias32():
    gen = torch.Generator().manual_seed(1)
    values = EDGES + torch.randint(0, M32, (200,), generator=gen, dtype=torch.int64).tolist()
    expected = [lowbias32(v) for v in values]
    assert [mix32(v) for v in values] == expected
    assert mix32(torch.tensor(values)).tolist() == expected


def test_a_step_key_is_the_low_32_bits_of_the_keys_seed():
    for keys in [(0, 0, 1, "train", 0), (7, 3, 2, "mean_gradient", 9)]:
        assert step_key(*keys) == derive_seed("dropout", *keys) % M32
        assert 0 <= step_key(*keys) < M32
        assert step_key_tensor(*keys).item() == step_key(*keys)


def test_the_mask_is_the_documented_hash_of_step_key_layer_and_element():
    """keep an element iff the top 24 bits of lowbias32(element's hash ^ layer's hash) are at least
    round(p * 2^24): the masks of a seed are the same in every version of pfl."""
    x = torch.randn(7, 9)
    for p, index, key in [(0.3, 0, 12345), (0.5, 2, 2**32 - 7), (0.9, 1, 0)]:
        layer = KeyedDropout(p).train()
        layer.index = index
        layer_hash = lowbias32(key ^ lowbias32(index + 1))
        threshold = round(p * 2**24)
        keep = [lowbias32(lowbias32(e) ^ layer_hash) >> 8 >= threshold for e in range(x.numel())]
        expected = x * torch.tensor(keep, dtype=x.dtype).view(x.shape).div(1 - p)
        assert torch.equal(_drop(layer, x, key), expected)


def test_a_draw_on_the_threshold_is_kept():
    """Kept iff draw >= round(p * 2^24): over all 2^24 draws exactly a fraction 1 - p is kept."""
    key, layer = 99, KeyedDropout(0.5).train()
    layer_hash = lowbias32(key ^ lowbias32(1))
    draws = [lowbias32(lowbias32(e) ^ layer_hash) >> 8 for e in range(4096)]
    layer.p = min(draws) / 2**24  # the smallest draw sits exactly on the threshold
    first = draws.index(min(draws))
    assert _drop(layer, torch.ones(4096), key)[first] != 0


def test_p_one_drops_everything_as_torchs_dropout():
    x = torch.randn(5, 4)
    assert torch.equal(_drop(KeyedDropout(1.0).train(), x, 3), torch.nn.functional.dropout(x, 1.0, True))


def test_a_key_block_restores_the_key_it_found():
    layer, x = KeyedDropout(0.5).train(), torch.randn(64)
    with dropout_key(1):
        outer = layer(x)
        with dropout_key(2):
            assert not torch.equal(layer(x), outer)
        assert torch.equal(layer(x), outer)  # the outer key again, not none


def test_layers_at_p_zero_or_none_at_all_are_not_active():
    assert number_keyed_dropouts(torch.nn.Sequential(KeyedDropout(0.0), torch.nn.Linear(2, 2))) is False
    assert number_keyed_dropouts(torch.nn.Linear(2, 2)) is False
    assert number_keyed_dropouts(torch.nn.Sequential(KeyedDropout(0.0), KeyedDropout(0.1))) is True


def test_a_draw_is_the_hashs_top_24_bits():
    """p is resolved to 2^-24: with p half-way between two 24-bit thresholds, an element whose 24-bit
    draw equals the lower one is kept (round(p * 2^24) rounds half to even), whatever its 25th bit."""
    key = 5
    layer_hash = lowbias32(key ^ lowbias32(1))
    hashes = [lowbias32(lowbias32(e) ^ layer_hash) for e in range(4096)]
    e = next(i for i, h in enumerate(hashes) if (h >> 8) % 2 == 0 and (h >> 7) % 2 == 0)
    layer = KeyedDropout(0.5).train()
    layer.p = (2 * (hashes[e] >> 8) + 1) / 2**25
    assert round(layer.p * 2**24) == hashes[e] >> 8
    assert _drop(layer, torch.ones(4096), key)[e] != 0
