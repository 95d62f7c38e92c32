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
    weights: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Dirichlet(α) label skew: each class is split over clients with proportions ~ Dir(α)
    (times ``weights``, the quantity skew, when given).

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
            if weights is not None:
                props = props * weights / (props * weights).sum()
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


def pathological_partition(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Pat-k: every client holds exactly ``classes_per_client`` distinct classes.

    Each client takes k of the classes held by the fewest clients so far (ties broken at random), so
    every class has almost the same number of holders and the class combinations vary; a class's
    samples are split over its holders in proportion to ``weights``.
    """
    classes = np.unique(labels)
    k = classes_per_client
    if k > len(classes):
        raise ConfigError(
            "data.classes_per_client", f"{k} classes per client but the data has {len(classes)}", "lower it"
        )
    counts = np.zeros(len(classes), dtype=np.int64)
    owned = []
    for _ in range(num_clients):
        pick = np.lexsort((rng.random(len(classes)), counts))[:k]
        counts[pick] += 1
        owned.append(classes[pick].tolist())
    holders: dict[int, list[int]] = {}
    for client, cs in enumerate(owned):
        for c in cs:
            holders.setdefault(int(c), []).append(client)
    w = np.ones(num_clients) if weights is None else np.asarray(weights, dtype=np.float64)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c, hs in holders.items():
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < len(hs):
            raise ConfigError(
                "data.num_clients",
                f"class {c} has {len(idx)} samples for {len(hs)} clients holding it",
                "use fewer clients or more classes per client",
            )
        # Each holder gets one sample first, the rest by weight: nobody ends up without a class it holds.
        share = w[hs] / w[hs].sum()
        extra = np.floor(share * (len(idx) - len(hs))).astype(int)
        extra[: (len(idx) - len(hs)) - extra.sum()] += 1
        cuts = np.cumsum(1 + extra)[:-1]
        for client, chunk in zip(hs, np.split(idx, cuts), strict=True):
            parts[client].extend(chunk.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def lognormal_weights(num_clients: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Quantity skew: relative client sizes ~ LogNormal(0, σ), normalised to sum to 1 (σ = 0: equal)."""
    w = rng.lognormal(0.0, sigma, num_clients) if sigma > 0 else np.ones(num_clients)
    return w / w.sum()


def sized_partition(
    num_samples: int, weights: np.ndarray, rng: np.random.Generator, min_samples: int = 1
) -> list[np.ndarray]:
    """IID samples with client sizes proportional to ``weights`` and at least ``min_samples`` each."""
    n = len(weights)
    if n * min_samples > num_samples:
        raise ConfigError(
            "data.min_samples",
            f"{n} clients x {min_samples} samples exceeds the {num_samples} samples available",
            "lower data.min_samples or data.num_clients",
        )
    spare = num_samples - n * min_samples
    sizes = min_samples + np.floor(weights * spare).astype(int)
    sizes[np.argsort(-weights)[: num_samples - sizes.sum()]] += 1
    cuts = np.cumsum(sizes)[:-1]
    return [np.sort(p) for p in np.split(rng.permutation(num_samples), cuts)]


def contiguous_split(idx: np.ndarray, fractions: tuple[float, ...]) -> list[np.ndarray]:
    """Cut ordered samples (text windows) into consecutive blocks, so overlapping windows do not leak
    from train into test (LEAF splits each role's lines the same way)."""
    sizes = [int(round(f * len(idx))) for f in fractions[1:]]
    cuts = np.cumsum([len(idx) - sum(sizes), *sizes])[:-1]
    return list(np.split(np.asarray(idx), cuts))
