"""Robust aggregation (``server.aggregator``, pfl.federation.robust): each aggregator against a hand
computation, its wiring into the loop, and the configuration errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pfl.config import ServerConfig, validate
from pfl.errors import ConfigError
from pfl.federation.robust import (
    RobustRule,
    clip_factors,
    coordinate_median,
    krum_scores,
    krum_select,
    trimmed_mean,
)
from pfl.federation.transforms import UploadStep, apply_transforms
from pfl.methods import Upload, methods
from pfl.methods.base import MethodFlagWarning
from pfl.methods.fedavg import FedAvg
from pfl.runner.args import parse_fit_args
from tests.conftest import make_loop, tiny_config
from tests.methods.registry_properties import NOT_AVERAGING


def rule(kind: str, **settings) -> RobustRule:
    """The aggregator ``kind`` with the given ``server.*`` settings."""
    return RobustRule(ServerConfig(aggregator=kind, **settings))


def aggregate(loop, uploads: dict) -> None:
    """The loop's aggregation of ``uploads`` after its upload transforms."""
    transformed = apply_transforms(loop.transforms, uploads, UploadStep(loop.method, loop.server, {}, loop.round))
    loop.aggregate(transformed.received, transformed.combined)


HALF = {"rounds": 3, "fraction": 0.5}  # 6 clients, 3 per round
# Five clients' uploads of three coordinates, by hand below.
ROWS = [[1.0, 5.0, -2.0], [2.0, 0.0, 4.0], [10.0, 1.0, 0.0], [3.0, 2.0, 1.0], [0.0, 7.0, 3.0]]
# Krum's example: squared distances d(0,1)=1 d(0,2)=4 d(0,3)=2 d(0,4)=200 d(1,2)=5 d(1,3)=1 d(1,4)=181
# d(2,3)=2 d(2,4)=164 d(3,4)=162.
POINTS = [[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [10.0, 10.0]]
CIDS = [3, 7, 8, 11, 20]


def uploads_of(rows: list[list[float]], cids: list[int] = CIDS) -> dict[int, Upload]:
    return {c: Upload(torch.tensor(r), weight=float(10 + c)) for c, r in zip(cids, rows, strict=False)}


def states(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows)


# -- the aggregators against hand computations ------------------------------------------------------
def test_coordinate_median_odd_and_even():
    assert torch.equal(coordinate_median(states(ROWS)), torch.tensor([2.0, 2.0, 1.0]))
    # four rows: the mean of the two middle values, (2+3)/2, (1+2)/2, (0+1)/2
    assert torch.equal(coordinate_median(states(ROWS[:4])), torch.tensor([2.5, 1.5, 0.5]))


def test_trimmed_mean_drops_floor_beta_n_at_each_end():
    # beta 0.2 of 5: one value dropped at each end, mean(1,2,3), mean(1,2,5), mean(0,1,3)
    torch.testing.assert_close(trimmed_mean(states(ROWS), 0.2), torch.tensor([2.0, 8 / 3, 4 / 3]))
    # beta 0.1 of 5 rounds down to 0: the plain mean
    torch.testing.assert_close(trimmed_mean(states(ROWS), 0.1), torch.tensor([3.2, 3.0, 1.2]))
    # beta 0.4 of 5: two at each end, the median
    assert torch.equal(trimmed_mean(states(ROWS), 0.4), torch.tensor([2.0, 2.0, 1.0]))
    # beta 0.25 of 4: one at each end
    torch.testing.assert_close(trimmed_mean(states(ROWS[:4]), 0.25), torch.tensor([2.5, 1.5, 0.5]))


def test_krum_scores_sum_the_n_minus_f_minus_2_nearest():
    # f = 1: the two nearest of each row
    assert krum_scores(states(POINTS), 1).tolist() == [3.0, 2.0, 6.0, 3.0, 326.0]
    # f = 0: the three nearest
    assert krum_scores(states(POINTS), 0).tolist() == [7.0, 7.0, 11.0, 5.0, 507.0]


def test_krum_ties_go_to_the_lowest_row_among_many():
    same = torch.zeros(40, 3)
    same[:5] = 1.0  # rows 5..39 tie (score 3·3: the three ones among their 37 nearest)
    assert krum_select(same, 1, 1) == [5] and krum_select(same, 1, 3) == [5, 6, 7]


def test_krum_and_multi_krum_select_the_lowest_scores_ties_to_the_lower_row():
    assert krum_select(states(POINTS), 1, 1) == [1]
    assert krum_select(states(POINTS), 0, 1) == [3]
    assert krum_select(states(POINTS), 1, 2) == [0, 1]  # 0 and 3 tie at 3: the lower row
    assert krum_select(states(POINTS), 1, 4) == [0, 1, 2, 3]


def test_clip_factors_scale_to_the_quantile_of_the_norms():
    norms = torch.tensor([0.0, 5.0, 2.0, 10.0], dtype=torch.float64)
    # sorted 0, 2, 5, 10; q = 0.5 interpolates at 1.5: tau = 3.5
    assert clip_factors(norms, 0.5).tolist() == pytest.approx([1.0, 0.7, 1.0, 0.35])
    assert clip_factors(norms, 0.25).tolist() == pytest.approx([1.0, 0.3, 0.75, 0.15])  # tau = 1.5
    assert clip_factors(norms, 1.0).tolist() == [1.0, 1.0, 1.0, 1.0]
    # a zero quantile cuts every other update to nothing; the zero updates keep factor 1 (not 0/0)
    zeros = torch.tensor([0.0, 0.0, 5.0], dtype=torch.float64)
    assert clip_factors(zeros, 0.5).tolist() == [1.0, 1.0, 0.0]


# -- RobustRule.apply: what the method's weighted mean then combines ----------------------------
def test_mean_leaves_the_uploads_untouched():
    uploads = uploads_of(ROWS)
    assert RobustRule().apply(uploads, FedAvg(), None) is uploads  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("agg", "expected"),
    [(rule("median"), [2.0, 2.0, 1.0]), (rule("trimmed_mean", trim_beta=0.2), [2.0, 8 / 3, 4 / 3])],
)
def test_median_and_trimmed_mean_give_every_upload_the_robust_state(agg, expected):
    uploads = uploads_of(ROWS)
    out = agg.apply(uploads, FedAvg(), None)  # type: ignore[arg-type]
    assert sorted(out) == CIDS
    for c in CIDS:
        torch.testing.assert_close(out[c].state, torch.tensor(expected))
        assert out[c].weight == uploads[c].weight
        assert torch.equal(uploads[c].state, torch.tensor(ROWS[CIDS.index(c)]))  # the originals are kept


def test_krum_keeps_the_selected_clients_uploads():
    uploads = uploads_of(POINTS)
    assert rule("krum", krum_f=1).apply(uploads, FedAvg(), None) == {7: uploads[7]}  # type: ignore[arg-type]
    assert rule("krum", krum_f=0).apply(uploads, FedAvg(), None) == {11: uploads[11]}  # type: ignore[arg-type]
    multi = rule("multi_krum", krum_f=1).apply(uploads, FedAvg(), None)  # type: ignore[arg-type]
    assert sorted(multi) == [3, 7, 8, 11]  # m = n - f = 4: the outlier (client 20) is dropped
    two = rule("multi_krum", krum_f=1, krum_m=2).apply(uploads, FedAvg(), None)  # type: ignore[arg-type]
    assert two == {3: uploads[3], 7: uploads[7]}


def test_norm_clip_scales_long_updates_to_the_quantile():
    reference = torch.tensor([1.0, 1.0])
    uploads = uploads_of([[1.0, 1.0], [4.0, 5.0], [1.0, 3.0], [-5.0, 9.0]])  # updates of norm 0, 5, 2, 10
    out = rule("norm_clip", clip_quantile=0.5).apply(uploads, FedAvg(), {"global": reference})  # type: ignore[arg-type]
    torch.testing.assert_close(out[7].state, torch.tensor([3.1, 3.8]))  # 1 + (3, 4)·3.5/5
    torch.testing.assert_close(out[11].state, torch.tensor([-1.1, 3.8]))  # 1 + (-6, 8)·3.5/10
    assert out[3] is uploads[3] and out[8] is uploads[8]  # not longer than tau: untouched
    assert out[7].weight == uploads[7].weight
    low = rule("norm_clip", clip_quantile=0.25).apply(uploads, FedAvg(), {"global": reference})  # type: ignore[arg-type]
    torch.testing.assert_close(low[8].state, torch.tensor([1.0, 2.5]))  # tau = 1.5: (0, 2)·0.75


# -- in the loop: the method's own aggregation gives the robust result ----------------------------
def _round_uploads(loop, size: int) -> dict[int, Upload]:
    gen = torch.Generator().manual_seed(0)
    return {c: Upload(torch.randn(size, generator=gen), weight=float(c + 1)) for c in (0, 2, 5)}


def test_fedavg_with_median_aggregates_to_the_coordinate_median():
    loop = make_loop(tiny_config("fedavg", trainer=HALF, server={"aggregator": "median"}))
    uploads = _round_uploads(loop, loop.server.layout.size)
    aggregate(loop, uploads)
    expected = torch.stack([uploads[c].state for c in (0, 2, 5)]).median(dim=0).values  # odd n: the middle
    torch.testing.assert_close(loop.server["global"], expected, rtol=0, atol=1e-6)


def test_layer_sharing_aggregates_its_shared_part_robustly_and_keeps_the_rest():
    loop = make_loop(tiny_config("fedper", trainer=HALF, server={"aggregator": "krum", "krum_f": 0}))
    mask = loop.method.mask(loop.server.layout)
    before = loop.server["global"].clone()
    uploads = _round_uploads(loop, int(mask.sum()))
    uploads[5] = Upload(uploads[5].state * 100, uploads[5].weight)  # far from the other two
    scores = krum_scores(torch.stack([uploads[c].state for c in (0, 2, 5)]), 0)
    chosen = (0, 2)[int(scores[:2].argmin())]
    aggregate(loop, uploads)
    torch.testing.assert_close(loop.server["global"][mask], uploads[chosen].state, rtol=0, atol=1e-6)
    assert torch.equal(loop.server["global"][~mask], before[~mask])


def test_norm_clip_measures_layer_sharing_updates_from_the_shared_part_of_the_global_model():
    loop = make_loop(tiny_config("fedper", trainer=HALF, server={"aggregator": "norm_clip", "clip_quantile": 0.5}))
    mask = loop.method.mask(loop.server.layout)
    ref = loop.server["global"][mask].clone()
    direction = torch.ones(int(mask.sum()))
    uploads = {c: Upload(ref + k * direction, 1.0) for c, k in ((0, 1.0), (2, 2.0), (5, 30.0))}
    aggregate(loop, uploads)
    # norms sqrt(d)·(1, 2, 30): tau is the middle one, client 5's update is cut to 2·direction
    torch.testing.assert_close(loop.server["global"][mask], ref + (1 + 2 + 2) / 3 * direction, rtol=0, atol=1e-5)


def test_fedavg_upload_reference_is_the_global_model_in_the_uploads_coordinates():
    loop = make_loop(tiny_config("fedavg", trainer=HALF))
    p = loop.server.layout.num_params
    loop.server["global"] = torch.arange(loop.server.layout.size, dtype=torch.float32)
    assert loop.method.upload_reference(loop.server) is loop.server["global"]
    loop.method.share_buffers = False  # FedBN-style: only the parameters are uploaded
    assert torch.equal(loop.method.upload_reference(loop.server), loop.server["global"][:p])


def test_default_run_builds_mean_and_trains_as_before():
    plain = make_loop(tiny_config("fedavg", trainer=HALF))
    assert [type(t) for t in plain.transforms] == [RobustRule] and plain.transforms[0] == RobustRule()
    explicit = make_loop(tiny_config("fedavg", trainer=HALF, server={"aggregator": "mean", "krum_f": 5}))
    for _ in range(2):
        plain.run_round(), explicit.run_round()
    assert torch.equal(plain.server["global"], explicit.server["global"])


def test_median_run_differs_from_the_mean_run():
    a = make_loop(tiny_config("fedavg", trainer=HALF))
    b = make_loop(tiny_config("fedavg", trainer=HALF, server={"aggregator": "median"}))
    a.run_round(), b.run_round()
    assert not torch.allclose(a.server["global"], b.server["global"])


# -- which methods accept an aggregator ------------------------------------------------------------
def test_methods_that_average_their_uploads():
    refused = {n for n, c in methods().items() if not c.averages_uploads}
    assert refused == set(NOT_AVERAGING)


def test_a_new_aggregate_states_whether_it_averages():
    with pytest.warns(MethodFlagWarning, match="Own overrides aggregate without stating averages_uploads"):

        class Own(FedAvg):
            def aggregate(self, server, uploads):
                pass

    class OwnMean(FedAvg):
        averages_uploads = True

        def aggregate(self, server, uploads):
            super().aggregate(server, uploads)

    class Trains(FedAvg):
        def local_update(self, client, payload):
            return super().local_update(client, payload)

    assert (Own.averages_uploads, OwnMean.averages_uploads, Trains.averages_uploads) == (False, True, True)


# -- configuration errors --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"aggregator": "geomed"}, "server.aggregator: unknown aggregator 'geomed' (choose one of mean, median,"),
        ({"trim_beta": 0.5}, "server.trim_beta: must be in [0, 0.5) (got 0.5)"),
        ({"trim_beta": -0.1}, "server.trim_beta: must be in [0, 0.5)"),
        ({"krum_f": -1}, "server.krum_f: must be >= 0 (got -1)"),
        ({"krum_m": 0}, "server.krum_m: must be >= 1"),
        ({"clip_quantile": 0.0}, "server.clip_quantile: must be in (0, 1] (got 0.0)"),
        ({"clip_quantile": 1.5}, "server.clip_quantile: must be in (0, 1] (got 1.5)"),
    ],
)
def test_validate_names_the_bad_field(server, message):
    with pytest.raises(ConfigError) as err:
        validate(tiny_config("fedavg", server=server))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_boundary_values_are_valid():
    validate(tiny_config("fedavg", server={"trim_beta": 0.0, "krum_f": 0, "krum_m": 1, "clip_quantile": 1.0}))


def test_a_method_that_does_not_average_its_uploads_is_refused_with_the_ones_that_do():
    with pytest.raises(ConfigError) as err:
        make_loop(tiny_config("fedpg", trainer=HALF, server={"aggregator": "median"}))
    text = str(err.value)
    assert text.startswith("server.aggregator: median cannot apply to method 'fedpg'") and "\n" not in text
    assert "fedavg" in text and "fedrep" in text and "fedmgda_plus" not in text
    make_loop(tiny_config("fedpg", trainer=HALF))  # mean applies to every method


@pytest.mark.parametrize("kind", ["krum", "multi_krum"])
@pytest.mark.parametrize(("per_round", "f", "hint"), [(2, 0, None), (3, 1, 0), (4, 1, 0), (5, 2, 1), (6, 2, 1)])
def test_krum_needs_more_than_2f_plus_2_clients_per_round(kind, per_round, f, hint):
    trainer = {"rounds": 3, "fraction": per_round / 6}
    with pytest.raises(ConfigError) as err:
        make_loop(tiny_config("fedavg", trainer=trainer, server={"aggregator": kind, "krum_f": f}))
    fix = (
        "sample at least 3 clients per round"
        if hint is None
        else (f"lower server.krum_f to at most {hint} or sample more clients per round")
    )
    assert str(err.value) == (
        f"server.krum_f: Krum needs more than 2·krum_f + 2 clients per round (krum_f = {f}, {per_round} per round) "
        f"({fix})"
    )
    if hint is not None:
        make_loop(tiny_config("fedavg", trainer=trainer, server={"aggregator": kind, "krum_f": hint}))


def test_the_aggregator_is_a_value():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RobustRule().kind = "median"  # type: ignore[misc]


def test_multi_krum_keeps_at_most_the_clients_of_a_round():
    with pytest.raises(ConfigError, match=r"server.krum_m: must be at most the 3 clients per round \(got 4\)"):
        make_loop(tiny_config("fedavg", trainer=HALF, server={"aggregator": "multi_krum", "krum_f": 0, "krum_m": 4}))
    make_loop(tiny_config("fedavg", trainer=HALF, server={"aggregator": "multi_krum", "krum_f": 0, "krum_m": 3}))


def test_the_command_line_sets_the_aggregator():
    argv = ["--config", "conf/default.yaml", "--tracking.wandb", "false", "--server.aggregator", "trimmed_mean"]
    cfg = parse_fit_args([*argv, "--server.trim_beta", "0.2", "--server.krum_m", "3"])[0]
    assert cfg.server == ServerConfig(aggregator="trimmed_mean", trim_beta=0.2, krum_m=3)


@pytest.mark.parametrize("name", sorted(n for n, c in methods().items() if c.averages_uploads))
def test_every_averaging_method_trains_with_dropped_and_replaced_uploads(name):
    """Multi-Krum drops an upload whole (extras included), then the median gives every upload one state:
    each method's aggregation takes both, and the next round trains from what it made."""
    trainer, server = {"rounds": 3, "fraction": 5 / 6}, {"aggregator": "multi_krum"}
    cfg = tiny_config(name, trainer=trainer, server=server, data={"val_frac": 0.2})  # PAGE's agent scores on val
    loop = make_loop(cfg)
    loop.run_round()
    loop.transforms = [rule("median")]
    loop.run_round()
    loop.run_round()
    assert all(bool(torch.isfinite(v).all()) for v in loop.server.state.values() if isinstance(v, torch.Tensor))
