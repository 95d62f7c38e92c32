"""Each protocol's definition against values computed by hand on tiny fixed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pfl.errors import ConfigError
from pfl.metrics.comm import CommCounter, nbytes
from pfl.metrics.protocols import (
    g_test_indices,
    reference_metrics,
    rounds_to_target,
    s_test_clients,
    s_test_indices,
    select_index,
    summarize,
    tail_count,
    tail_means,
)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (3, 1), (20, 1), (21, 2), (40, 2), (41, 3), (100, 5), (101, 6)])
def test_tail_count_rounds_up_and_keeps_one_client(n, k):
    assert tail_count(n) == k


def test_top_and_bottom_five_percent_with_few_clients():
    # 4 clients: the tail is one client, so top5 is the best client and bottom5 the worst.
    assert tail_means([0.3, 0.9, 0.1, 0.5]) == (0.9, 0.1)
    # 30 clients: ceil(1.5) = 2 clients per tail.
    values = [0.5] * 26 + [0.9, 1.0, 0.0, 0.2]
    top, bottom = tail_means(values)
    assert top == pytest.approx(0.95) and bottom == pytest.approx(0.1)
    s = summarize("pm.l_acc", [0.3, 0.9, 0.1, 0.5], tails=True)
    assert s["pm.l_acc.mean"] == pytest.approx(0.45)
    assert s["pm.l_acc.std"] == pytest.approx(math.sqrt((0.15**2 + 0.45**2 + 0.35**2 + 0.05**2) / 4))
    assert (s["pm.l_acc.top5"], s["pm.l_acc.bottom5"]) == (0.9, 0.1)


def test_ptr_counts_ties_and_r_acc_skips_zero_references():
    values = [0.5, 0.75, 0.4, 0.8]
    ref = [0.5, 0.5, 0.5, 0.0]
    m = reference_metrics(values, ref)
    assert m["ptr"] == 0.75  # the tie 0.5 vs 0.5 passes, 0.4 < 0.5 fails
    assert m["r.mean"] == pytest.approx((0.0 + 0.5 - 0.2) / 3)  # client 4 (reference 0) left out
    gains = np.array([0.0, 0.25, -0.1, 0.8])
    assert m["gain.mean"] == pytest.approx(0.2375)
    assert m["gain.std"] == pytest.approx(math.sqrt(((gains - 0.2375) ** 2).mean()))


def test_ptr_on_errors_passes_when_not_worse():
    m = reference_metrics([1.0, 2.0, 1.0], [1.0, 1.5, 2.0], higher_is_better=False)
    assert m["ptr"] == pytest.approx(2 / 3)  # tie passes, 2.0 > 1.5 fails, 1.0 < 2.0 passes
    assert m["r.mean"] == pytest.approx((0.0 + 1 / 3 - 0.5) / 3)
    with pytest.raises(ValueError):
        reference_metrics([1.0], [1.0, 2.0])


def _others(sizes):
    start, out = 1000, []
    for s in sizes:
        out.append(np.arange(start, start + s))
        start += 1000
    return out


@pytest.mark.parametrize(
    ("own_size", "other_sizes", "share", "expected"),
    [
        (10, [20, 20, 20, 20], 0.5, [5, 5]),  # official: half of the others, equal shares
        (11, [20, 20, 20, 20], 0.5, [6, 5]),  # the remainder goes to the first chosen client
        (10, [20, 20, 20], 1.0, [4, 3, 3]),
        (4, [20, 20, 20, 20, 20], 0.2, [4]),
    ],
)
def test_mixed_s_test_composition_sizes(own_size, other_sizes, share, expected):
    own = np.arange(own_size)
    others = _others(other_sizes)
    idx, chosen = s_test_indices(own, others, share, np.random.default_rng(0), "mixed")
    assert len(idx) == 2 * own_size
    assert np.array_equal(idx[:own_size], own)
    counts = [int(np.isin(idx, others[j]).sum()) for j in chosen]
    assert counts == expected
    unchosen = set(range(len(others))) - set(chosen.tolist())
    assert all(not np.isin(idx, others[j]).any() for j in unchosen)
    assert len(np.unique(idx)) == len(idx)  # no sample twice when every share fits


def test_s_test_small_other_test_draws_with_replacement_and_single_client_is_own_test():
    own = np.arange(6)
    idx, chosen = s_test_indices(own, _others([2]), 1.0, np.random.default_rng(0), "mixed")
    assert len(idx) == 12 and np.isin(idx[6:], np.arange(1000, 1002)).all()
    idx, chosen = s_test_indices(own, _others([2, 3, 20]), 1.0, np.random.default_rng(0))
    assert len(idx) == 6 * 4 and [int(np.isin(idx, o).sum()) for o in _others([2, 3, 20])] == [6, 6, 6]
    for mode in ("paper", "mixed"):
        idx, chosen = s_test_indices(own, [], 0.5, np.random.default_rng(0), mode)
        assert np.array_equal(idx, own) and len(chosen) == 0


@pytest.mark.parametrize(("mode", "other_sizes"), [("paper", [7, 7]), ("mixed", [7])])
def test_a_share_equal_to_the_other_test_draws_each_of_its_samples_once(mode, other_sizes):
    """Own test of 7, each chosen other test of 7 (paper: 2 others, 7 each; mixed: 1 other, all 7): drawn
    without replacement, the share is that whole test, no sample twice."""
    own, others = np.arange(7), _others(other_sizes)
    idx, chosen = s_test_indices(own, others, 1.0, np.random.default_rng(5), mode)
    assert len(chosen) == len(others)
    assert np.array_equal(np.sort(idx[7:]), np.concatenate(others))


@pytest.mark.parametrize(
    ("m", "c", "k"),
    [(20, 0.5, 10), (10, 0.5, 5), (100, 0.1, 10), (5, 1.0, 4), (4, 0.5, 2), (11, 0.25, 3)],  # (m-1)c half up
)
def test_paper_s_test_is_own_test_plus_m_minus_1_times_c_other_tests_each_own_sized(m, c, k):
    own = np.arange(7)
    others = _others([30] * (m - 1))
    idx, chosen = s_test_indices(own, others, c, np.random.default_rng(m))
    assert s_test_clients(m, c) == k == len(chosen) == len(set(chosen.tolist()))
    assert len(idx) == 7 * (1 + k)  # ρ = #others / #own = (m - 1)·c
    assert np.array_equal(idx[:7], own)
    for j in range(m - 1):
        drawn = idx[np.isin(idx, others[j])]
        assert len(drawn) == (7 if j in chosen else 0) and len(np.unique(drawn)) == len(drawn)


@pytest.mark.parametrize(("m", "c"), [(2, 1.0), (3, 0.5), (20, 0.05), (11, 0.149)])
def test_paper_s_test_refuses_rho_at_most_one(m, c):
    with pytest.raises(ConfigError, match=r"eval.s_acc_others: .*needs ρ > 1.*eval.s_test: mixed"):
        s_test_indices(np.arange(4), _others([10] * (m - 1)), c, np.random.default_rng(0))
    idx, _ = s_test_indices(np.arange(4), _others([10] * (m - 1)), c, np.random.default_rng(0), "mixed")
    assert len(idx) == 8


def test_unknown_s_test_is_refused():
    with pytest.raises(ConfigError, match="eval.s_test: unknown value 'half'"):
        s_test_indices(np.arange(4), _others([10] * 5), 0.5, np.random.default_rng(0), "half")


def test_g_test_samples_own_size_from_the_union_without_replacement():
    union = np.arange(100, 150)
    idx = g_test_indices(7, union, np.random.default_rng(1))
    assert len(idx) == 7 and len(np.unique(idx)) == 7 and np.isin(idx, union).all()
    assert len(g_test_indices(80, union, np.random.default_rng(1))) == 50


def test_rounds_to_target_is_the_first_round_reaching_it():
    history = [
        {"round": 2, "pm.l_acc.mean": 0.3},
        {"round": 4, "pm.l_acc.mean": 0.5},
        {"round": 6, "pm.l_acc.mean": 0.7},
    ]
    assert rounds_to_target(history, 0.5) == 4  # equality reaches the target
    assert rounds_to_target(history, 0.45) == 4
    assert rounds_to_target(history, 0.9) is None
    mae = [{"round": 1, "pm.mae.mean": 2.0}, {"round": 2, "pm.mae.mean": 1.0}]
    assert rounds_to_target(mae, 1.5, "pm.mae.mean", higher_is_better=False) == 2


def test_select_index_final_best_val_best_test():
    history = [
        {"round": 1, "pm.val_acc.mean": 0.6, "pm.l_acc.mean": 0.5},
        {"round": 2, "pm.val_acc.mean": 0.8, "pm.l_acc.mean": 0.6},
        {"round": 3, "pm.val_acc.mean": 0.8, "pm.l_acc.mean": 0.9},
        {"round": 4, "pm.val_acc.mean": 0.7, "pm.l_acc.mean": 0.4},
    ]
    assert select_index(history, "final") == 3
    assert select_index(history, "best_val") == 1  # tie at 0.8 -> the earlier round
    assert select_index(history, "best_test") == 2
    mae = [{"round": 1, "pm.val_mae.mean": 2.0}, {"round": 2, "pm.val_mae.mean": 1.0}]
    assert select_index(mae, "best_val", "regression") == 1


def test_nbytes_counts_tensors_scalars_and_skips_static_weight():
    payload = {
        "a": torch.zeros(10),  # 40
        "b": torch.zeros(3, dtype=torch.float64),  # 24
        "c": [torch.zeros(2, dtype=torch.int64), 1.5],  # 16 + 4
        "weight": 123,  # the client's fixed sample count: not counted
        "n": 7,  # 4
        "none": None,
    }
    assert nbytes(payload) == 40 + 24 + 16 + 4 + 4
    with pytest.raises(TypeError):
        nbytes({"x": object()})
    counter = CommCounter()
    counter.exchange({"g": torch.zeros(5)}, {"state": torch.zeros(5), "weight": 9})
    counter.exchange({"g": torch.zeros(5)}, {})
    counter.extra(up=8)
    m = counter.metrics(rounds=2)
    assert m["comm.down_bytes.total"] == 40 and m["comm.up_bytes.total"] == 28
    assert m["comm.down_bytes.per_round"] == 20 and m["comm.up_bytes.per_round"] == 14
