"""Robust aggregation (``server.aggregator``): the uploads are rewritten before the method's own
aggregation, so that the weighted mean it takes is the robust result.

With the n uploaded states x_1..x_n of a round (in client-id order; ``Upload.state``: the whole state
vector, or the shared part for methods that share only some layers):

    mean          the uploads as they are: the method's own aggregation, bit for bit.
    median        every coordinate j: med_i x_ij, the middle value (the mean of the two middle
                  ones for even n). Every upload then carries that vector (Yin et al., ICML 2018).
    trimmed_mean  every coordinate: the mean of the n − 2k values left after dropping the k = ⌊βn⌋
                  smallest and the k largest (β = ``server.trim_beta``; Yin et al., ICML 2018).
    krum          score(i) = Σ ‖x_i − x_j‖² over the n − f − 2 uploads j ≠ i closest to x_i
                  (f = ``server.krum_f``, needs n > 2f + 2); only the upload of the lowest score is
                  kept (Blanchard et al., NeurIPS 2017).
    multi_krum    the m uploads of the lowest Krum scores are kept (m = ``server.krum_m``, default
                  n − f) and the method averages them with its own weights (Blanchard et al. take
                  their plain mean).
    norm_clip     Δ_i = x_i − r, r the server's current model in the uploads' coordinates
                  (``Method.upload_reference``); every Δ_i longer than τ, the q-quantile of the
                  round's ‖Δ_i‖ (q = ``server.clip_quantile``, linear interpolation), is scaled to
                  length τ: x_i ← r + Δ_i·τ/‖Δ_i‖ (norm bounding, Sun et al. 2019, "Can You Really
                  Backdoor Federated Learning?", with the bound taken from the round's norms).

Ties in Krum's scores go to the lowest client id. Weights and extras of the uploads that remain are
kept, so methods that also read extras (SCAFFOLD's Δc, PGFed's gradients) read those of the uploads
the aggregator kept. Each rule is registered by name with ``@aggregator`` (``pfl.config.AGGREGATORS``;
docs/methods.md, "Adding an aggregator"). Only methods whose server averages the uploaded states
(``Method.averages_uploads``) accept an aggregator other than mean: for the others the rewritten
uploads would not give the robust model. The loop still observes the clients' own uploads (bytes, the conflict share).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
from torch import Tensor

from pfl.config import AGGREGATORS, ServerConfig
from pfl.errors import ConfigError, require
from pfl.federation.transforms import UploadStep
from pfl.methods.base import Method, ServerContext, Upload
from pfl.methods.model_rows import row_gram, squared_distances
from pfl.methods.registry import methods


def coordinate_median(states: Tensor) -> Tensor:
    """The coordinate-wise median of the rows of ``states`` (n, d): the mean of the two middle values for even n."""
    n = states.shape[0]
    ordered = states.sort(dim=0).values
    if n % 2:
        return ordered[n // 2].clone()
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(states: Tensor, beta: float) -> Tensor:
    """The coordinate-wise mean of the rows of ``states`` (n, d) without the ⌊β·n⌋ smallest and largest values."""
    n = states.shape[0]
    k = math.floor(beta * n)
    return states.sort(dim=0).values[k : n - k].mean(dim=0)


def krum_scores(states: Tensor, f: int) -> Tensor:
    """Krum's score of every row of ``states`` (n, d): the sum of its squared distances to its n − f − 2
    nearest other rows (float64, on the CPU)."""
    n = states.shape[0]
    dist = squared_distances(row_gram(states))
    others = dist[~torch.eye(n, dtype=torch.bool)].view(n, n - 1)  # each row without its own 0
    return others.sort(dim=1).values[:, : n - f - 2].sum(dim=1)


def krum_select(states: Tensor, f: int, m: int) -> list[int]:
    """The rows of the ``m`` lowest Krum scores (ties: the lower row), in row order."""
    scores = krum_scores(states, f).tolist()
    return sorted(sorted(range(len(scores)), key=scores.__getitem__)[:m])  # sorted is stable: ties keep row order


def clip_factors(norms: Tensor, q: float) -> Tensor:
    """min(1, τ/‖Δ_i‖) for the update ``norms``, τ their q-quantile (float64)."""
    tau = torch.quantile(norms, q)
    return torch.where(norms > tau, tau / norms, torch.ones_like(norms))


@dataclass(frozen=True)
class AggregationContext:
    """What an aggregator's rule sees besides the uploads: the ``server.*`` settings, the method and the
    server's state before this round's aggregation."""

    settings: ServerConfig
    method: Method
    server: ServerContext

    def reference(self) -> Tensor:
        """The server's current model in the uploads' coordinates (``Method.upload_reference``)."""
        return self.method.upload_reference(self.server)


Rule = Callable[[dict[int, Upload], AggregationContext], dict[int, Upload]]
Check = Callable[[ServerConfig, int], None]


@dataclass(frozen=True)
class RegisteredAggregator:
    """An entry of ``AGGREGATORS``: the rule that rewrites a round's uploads and an optional check of the
    settings against the clients per round, run before any training."""

    name: str
    rule: Rule
    check: Check | None = None


def aggregator(name: str, check: Check | None = None) -> Callable[[Rule], Rule]:
    """Decorator: register ``rule(uploads, ctx) -> uploads`` as ``server.aggregator: <name>``. The rule
    returns the uploads the method's weighted mean then combines (it may drop, replace or keep them);
    ``check(settings, clients_per_round)`` raises a ConfigError for settings it cannot work with."""

    def register(rule: Rule) -> Rule:
        AGGREGATORS.add(name, RegisteredAggregator(name, rule, check))
        return rule

    return register


@aggregator("mean")
def mean(uploads: dict[int, Upload], ctx: AggregationContext) -> dict[int, Upload]:
    """The uploads as they are: the method's own aggregation."""
    return uploads


def _stacked(uploads: dict[int, Upload]) -> tuple[list[int], Tensor]:
    cids = sorted(uploads)
    return cids, torch.stack([uploads[c].state for c in cids])  # type: ignore[misc]


@aggregator("median")
def median(uploads: dict[int, Upload], ctx: AggregationContext) -> dict[int, Upload]:
    """Every upload carries the coordinate-wise median of the round's uploads."""
    cids, states = _stacked(uploads)
    robust = coordinate_median(states)
    return {c: replace(uploads[c], state=robust) for c in cids}


@aggregator("trimmed_mean")
def trimmed(uploads: dict[int, Upload], ctx: AggregationContext) -> dict[int, Upload]:
    """Every upload carries the coordinate-wise mean without the ⌊β·n⌋ smallest and largest values."""
    cids, states = _stacked(uploads)
    robust = trimmed_mean(states, ctx.settings.trim_beta)
    return {c: replace(uploads[c], state=robust) for c in cids}


def check_krum(cfg: ServerConfig, clients_per_round: int) -> None:
    """Krum's scores need more than 2f + 2 uploads a round."""
    n, f = clients_per_round, cfg.krum_f
    require(
        n > 2 * f + 2,
        "server.krum_f",
        f"Krum needs more than 2·krum_f + 2 clients per round (krum_f = {f}, {n} per round)",
        f"lower server.krum_f to at most {(n - 3) // 2} or sample more clients per round"
        if n >= 3
        else "sample at least 3 clients per round",
    )


def check_multi_krum(cfg: ServerConfig, clients_per_round: int) -> None:
    """Krum's condition, and at most the round's uploads kept."""
    check_krum(cfg, clients_per_round)
    if cfg.krum_m is not None:
        n = clients_per_round
        require(cfg.krum_m <= n, "server.krum_m", f"must be at most the {n} clients per round (got {cfg.krum_m})")


def _krum_kept(uploads: dict[int, Upload], f: int, m: int) -> dict[int, Upload]:
    cids, states = _stacked(uploads)
    return {cids[i]: uploads[cids[i]] for i in krum_select(states, f, m)}


@aggregator("krum", check=check_krum)
def krum(uploads: dict[int, Upload], ctx: AggregationContext) -> dict[int, Upload]:
    """Only the upload of the lowest Krum score is kept."""
    return _krum_kept(uploads, ctx.settings.krum_f, 1)


@aggregator("multi_krum", check=check_multi_krum)
def multi_krum(uploads: dict[int, Upload], ctx: AggregationContext) -> dict[int, Upload]:
    """The uploads of the m lowest Krum scores are kept (m = krum_m, default n − krum_f)."""
    s = ctx.settings
    return _krum_kept(uploads, s.krum_f, len(uploads) - s.krum_f if s.krum_m is None else s.krum_m)


@aggregator("norm_clip")
def norm_clip(uploads: dict[int, Upload], ctx: AggregationContext) -> dict[int, Upload]:
    """The uploads whose update is longer than the round's quantile, scaled down to it."""
    reference = ctx.reference()
    cids = sorted(uploads)
    deltas = [uploads[c].state - reference for c in cids]  # type: ignore[operator]
    norms = torch.stack([d.to(torch.float64).norm() for d in deltas]).cpu()
    factors = clip_factors(norms, ctx.settings.clip_quantile)
    out = dict(uploads)
    for c, delta, factor in zip(cids, deltas, factors.tolist(), strict=True):
        if factor < 1:
            out[c] = replace(uploads[c], state=reference + delta * factor)
    return out


@dataclass(frozen=True)
class RobustRule:
    """The run's robust rule (``server.aggregator``, with its settings; ``RobustRule()`` is mean). It does
    not aggregate: it rewrites a round's uploads (drops, replaces or clips them) so that the method's own
    aggregation of what is left gives the robust result. A server-side upload transform, after every
    client-side one (``pfl.federation.transforms``)."""

    settings: ServerConfig = field(default_factory=ServerConfig)
    client_side: ClassVar[bool] = False  # rewrites what the aggregation combines, not what clients sent

    @property
    def kind(self) -> str:
        return self.settings.aggregator

    @classmethod
    def build(cls, cfg: ServerConfig, method: Method, clients_per_round: int) -> RobustRule:
        """The run's robust rule; a ConfigError when it cannot apply to ``method`` or to ``clients_per_round``
        uploads a round."""
        entry = AGGREGATORS.get(cfg.aggregator)
        if entry.rule is mean:
            return cls(cfg)
        if not method.averages_uploads:
            able = ", ".join(name for name, c in methods().items() if c.averages_uploads)
            raise ConfigError(
                "server.aggregator",
                f"{cfg.aggregator} cannot apply to method {method.name!r}: its server does not take a weighted mean "
                "of uploaded models",
                f"use server.aggregator mean, or one of the methods {able}; a method of your own whose "
                "aggregate takes that mean says so with the class attribute averages_uploads = True",
            )
        if entry.check is not None:
            entry.check(cfg, clients_per_round)
        return cls(cfg)

    def apply(self, uploads: dict[int, Upload], method: Method, server: ServerContext) -> dict[int, Upload]:
        """The uploads the method's aggregation combines into the robust result (mean: ``uploads`` itself)."""
        rule = AGGREGATORS.get(self.kind).rule
        return rule(uploads, AggregationContext(self.settings, method, server))

    def transform(self, uploads: dict[int, Upload], step: UploadStep) -> dict[int, Upload]:
        return self.apply(uploads, step.method, step.server)


__all__ = [
    "AggregationContext",
    "RobustRule",
    "RegisteredAggregator",
    "aggregator",
    "clip_factors",
    "coordinate_median",
    "krum_scores",
    "krum_select",
    "trimmed_mean",
]
