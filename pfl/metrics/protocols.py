"""The papers' evaluation protocols as pure functions over per-client values and index sets.

Everything here is deterministic given its inputs (random draws take a keyed generator), so each
definition can be checked against a value computed by hand. docs/metrics.md documents the keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pfl.config import S_TESTS
from pfl.errors import require

TAIL_FRACTION = 0.05  # PLGU's top-5% / bottom-5% clients


def mean_std(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Mean and population standard deviation (ddof = 0) over clients."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std())


def tail_count(num_clients: int, fraction: float = TAIL_FRACTION) -> int:
    """How many clients form the top / bottom ``fraction``: ceil(fraction × n), at least one.

    20 clients -> 1, 21..40 -> 2, 100 -> 5: rounding up so a small federation still has a tail.
    """
    return max(1, math.ceil(fraction * num_clients - 1e-9))


def tail_means(values: Sequence[float] | np.ndarray, fraction: float = TAIL_FRACTION) -> tuple[float, float]:
    """(mean of the best ``tail_count`` clients, mean of the worst ``tail_count`` clients)."""
    arr = np.sort(np.asarray(values, dtype=np.float64))
    k = tail_count(len(arr), fraction)
    return float(arr[-k:].mean()), float(arr[:k].mean())


def summarize(prefix: str, values: Sequence[float], tails: bool = False) -> dict[str, float]:
    """``prefix.mean``/``prefix.std`` (and ``prefix.top5``/``prefix.bottom5`` with ``tails``)."""
    out: dict[str, float] = {}
    out[f"{prefix}.mean"], out[f"{prefix}.std"] = mean_std(values)
    if tails:
        out[f"{prefix}.top5"], out[f"{prefix}.bottom5"] = tail_means(values)
    return out


# -- comparison with the LOCAL reference (FedORA, PGFed) -------------------------------------------
def reference_metrics(values: Sequence[float], reference: Sequence[float], higher_is_better: bool = True):
    """R-Acc, PTR and gain of per-client ``values`` against the LOCAL reference, client by client.

    - ``r.mean``: mean over clients of (v_k − ref_k) / ref_k (clients whose reference is 0 are left out;
      NaN when all are). For errors (``higher_is_better=False``) this is the relative MAE change.
    - ``ptr``: share of clients at least as good as LOCAL; a tie (v_k == ref_k) counts as a pass.
    - ``gain.mean``/``gain.std``: v_k − ref_k over clients (PGFed's individual gain).
    """
    v = np.asarray(values, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if v.shape != ref.shape:
        raise ValueError(f"{len(v)} client values against {len(ref)} reference values")
    nonzero = ref != 0
    rel = (v[nonzero] - ref[nonzero]) / ref[nonzero]
    passed = v >= ref if higher_is_better else v <= ref
    gain_mean, gain_std = mean_std(v - ref)
    return {
        "r.mean": float(rel.mean()) if rel.size else float("nan"),
        "ptr": float(passed.mean()),
        "gain.mean": gain_mean,
        "gain.std": gain_std,
    }


# -- FedPG's mixed (S) and global (G) test sets ----------------------------------------------------
def s_test_clients(num_clients: int, share_of_others: float) -> int:
    """How many other clients FedPG's paper S-test mixes in: (m − 1)·c rounded half up, with m the
    federation's clients and c = ``share_of_others``. That is ρ = #others' samples / #own samples,
    which the paper requires to exceed 1 (SplitGP's ρ ≤ 1 leaves the mixed test mostly in-distribution)."""
    k = math.floor((num_clients - 1) * share_of_others + 0.5)
    require(
        k > 1,
        "eval.s_acc_others",
        f"(m - 1)·c = ({num_clients} - 1)·{share_of_others} gives ρ = {k}; the paper's S-test needs ρ > 1",
        "raise eval.s_acc_others, use more clients, or set eval.s_test: mixed",
    )
    return k


def _draw(pool: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` samples of ``pool``, without replacement unless the pool is smaller."""
    return rng.choice(pool, size, replace=size > len(pool))


def s_test_indices(
    own: np.ndarray,
    others: Sequence[np.ndarray],
    share_of_others: float,
    rng: np.random.Generator,
    mode: str = "paper",
) -> tuple[np.ndarray, np.ndarray]:
    """FedPG's "simulated" (S-) test set of one client. Returns (indices, chosen other-client positions).

    ``paper`` (FedPG appendix, "Metrics"): D_i ∪ D_k1 ∪ … ∪ D_k(m−1)c, the client's own test plus the
    tests of (m − 1)·c randomly chosen other clients (:func:`s_test_clients`, m = ``len(others) + 1``),
    each subsampled to |D_i| so that no client dominates: ρ = (m − 1)·c.

    ``mixed`` (the former construction): own test plus |D_i| samples in total, split evenly over
    max(1, round(c × #others)) chosen clients (the first ``len(own) mod k`` giving one more): ρ = 1.

    A share is drawn without replacement (with replacement only if that client's test is smaller).
    """
    require(mode in S_TESTS, "eval.s_test", f"unknown value {mode!r}", f"choose one of {', '.join(S_TESTS)}")
    n = len(own)
    if not len(others) or n == 0:
        return np.asarray(own), np.zeros(0, dtype=np.int64)
    if mode == "paper":
        k = s_test_clients(len(others) + 1, share_of_others)
        shares = [n] * k
    else:
        k = min(len(others), max(1, int(round(share_of_others * len(others)))))
        base, extra = divmod(n, k)
        shares = [base + (1 if i < extra else 0) for i in range(k)]
    chosen = rng.choice(len(others), k, replace=False)
    parts = [np.asarray(own)]
    for share, j in zip(shares, chosen.tolist(), strict=True):
        pool = np.asarray(others[j])
        if share and len(pool):
            parts.append(_draw(pool, share, rng))
    return np.concatenate(parts), chosen


def g_test_indices(own_size: int, union: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """FedPG's G-test: ``own_size`` samples drawn without replacement from all clients' tests."""
    return rng.choice(union, min(own_size, len(union)), replace=False)


# -- which round is reported ----------------------------------------------------------------------
def rounds_to_target(
    history: Sequence[dict[str, Any]], target: float, key: str = "pm.l_acc.mean", higher_is_better: bool = True
) -> int | None:
    """The first evaluated round whose ``key`` reaches ``target`` (>= it, or <= it for errors);
    None when it never does."""
    for row in history:
        if key in row and (row[key] >= target if higher_is_better else row[key] <= target):
            return int(row["round"])
    return None


def select_index(history: Sequence[dict[str, Any]], select: str, task: str = "classification") -> int:
    """Position in ``history`` of the reported evaluation: the last one (``final``), the best on
    validation (``best_val``) or the best on test (``best_test``). Ties go to the earliest round."""
    if select == "final":
        return len(history) - 1
    if task == "classification":
        key, sign = ("pm.val_acc.mean" if select == "best_val" else "pm.l_acc.mean"), 1.0
    else:
        key, sign = ("pm.val_mae.mean" if select == "best_val" else "pm.mae.mean"), -1.0
    scores = [sign * row[key] if key in row else -math.inf for row in history]
    return int(np.argmax(scores))
