"""Label partitions of a sample pool over clients (seeded numpy generators, no global state)."""

from __future__ import annotations

import numpy as np

from pfl.errors import ConfigError


def iid_partition(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(num_samples), num_clients)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_samples: int = 10,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Dirichlet(α) label skew: each class is split over clients with proportions ~ Dir(α).

    Resamples up to ``max_tries`` times until every client holds ``min_samples``; if that fails
    (tiny α, many clients), the largest clients donate random samples to the short ones, so the
    guarantee holds without looping forever.
    """
    n = len(labels)
    if num_clients * min_samples > n:
        raise ConfigError(
            "data.min_samples",
            f"{num_clients} clients x {min_samples} samples exceeds the {n} samples available",
            "lower data.min_samples or data.num_clients",
        )
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            props = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(props)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_samples:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    return _top_up(parts, min_samples, rng)


def _top_up(parts: list[list[int]], min_samples: int, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = [rng.permutation(np.asarray(p, dtype=np.int64)) for p in parts]
    for i in range(len(arrays)):
        while len(arrays[i]) < min_samples:
            donor = int(np.argmax([len(a) for a in arrays]))
            take = min(min_samples - len(arrays[i]), len(arrays[donor]) - min_samples)
            arrays[i] = np.concatenate([arrays[i], arrays[donor][:take]])
            arrays[donor] = arrays[donor][take:]
    return [np.sort(a) for a in arrays]


def split_indices(idx: np.ndarray, fractions: tuple[float, ...], rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``idx`` and cut it by ``fractions`` (the remainder goes to the first part)."""
    perm = rng.permutation(idx)
    sizes = [int(round(f * len(idx))) for f in fractions[1:]]
    first = len(idx) - sum(sizes)
    cuts = np.cumsum([first, *sizes])[:-1]
    return [np.sort(p) for p in np.split(perm, cuts)]
