"""Tests of pfl/methods/fedora.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pfl.data import DataConfig
from pfl.engine.terms import Proximal
from pfl.errors import ConfigError
from pfl.federation.loop import comparable_metrics
from pfl.methods import weighted_mean_of
from pfl.methods.fedora import DecoupledPull, FedORA
from pfl.models import ModelConfig
from pfl.optim.propagation import new_client_row, principal_angle_similarity, propagation_matrix, subspace_basis
from pfl.runner.args import parse_fit_args
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import NEW, VAL, exchanged_round, new_client_context, personal, resumed_after, run


def fedora_loop(args=None, **groups):
    groups.setdefault("data", VAL)
    return make_loop(tiny_config("fedora", args or {}, **groups))


# -- Lemma 4.2 inside the method ----------------------------------------------------------------------
def test_closed_form_equals_the_iterations_limit_in_the_method():
    closed = run(fedora_loop({"propagation": "closed"}), 3)
    iterative = run(fedora_loop({"propagation": "iterative", "tol": 1e-10}), 3)
    # the iterate on the method's own store equals M Θ of the closed form
    s = iterative.server
    m = propagation_matrix(s["W"], 1.0)
    assert torch.allclose(s["theta_hat"].double(), m @ s["theta"].double(), atol=1e-5)
    # and whole runs agree: the same W, the same Θ̂ and P-models after 3 rounds
    assert torch.allclose(closed.server["W"], s["W"])
    assert torch.allclose(closed.server["theta_hat"], s["theta_hat"], atol=1e-5)
    assert torch.allclose(personal(closed), personal(iterative), atol=1e-5)


# -- Lemma 4.1 inside the method ----------------------------------------------------------------------
def test_identity_similarity_is_local_training():
    fedora = run(fedora_loop({"similarity": "identity"}), 3)
    local = run(make_loop(tiny_config("local", data=VAL)), 3)
    assert torch.equal(fedora.server["theta_hat"], fedora.server["theta"])  # Θ̂ = Θ
    assert torch.allclose(personal(fedora), personal(local), atol=1e-5)  # λ = ε: LOCAL up to ε


@pytest.mark.parametrize("alpha", [1.0, 1e7])
def test_uniform_similarity_propagates_to_the_sample_weighted_average(alpha):
    loop = fedora_loop({"similarity": "uniform", "alpha": alpha})
    _, uploads = exchanged_round(loop)
    avg = weighted_mean_of(uploads)
    kappa = alpha / (1 + alpha)
    for cid, up in uploads.items():  # M = (1−κ)I + κ1πᵀ exactly (Sherman-Morrison), π = n / N
        expected = (1 - kappa) * up.state + kappa * avg
        assert torch.allclose(loop.server["theta_hat"][cid], expected, atol=1e-5)
    if alpha > 1e6:  # α → ∞: every client gets FedAvg's aggregate
        assert torch.allclose(loop.server["theta_hat"], avg.expand_as(loop.server["theta_hat"]), atol=1e-5)


# -- Eq. (8) ------------------------------------------------------------------------------------------
def test_lambda_is_eps_when_the_propagated_model_validates_worse(monkeypatch):
    loop = run(fedora_loop(client={"batch_size": 4}), 2)
    method, client = loop.method, loop.client(0)
    trained, init = client.state["personal"], loop.init_state
    assert client.evaluate(trained, "val").loss < client.evaluate(init, "val").loss
    assert method.selective_lambda(client, trained, init) == method.eps
    delta = client.evaluate(init, "val").loss - client.evaluate(trained, "val").loss
    assert method.selective_lambda(client, init, trained) == pytest.approx(delta, rel=1e-12)
    # the local update uses it: θ̂ that validates worse than θ_k gets λ = ε
    seen = []
    real = method.pull_term
    monkeypatch.setattr(method, "pull_term", lambda c, hat, lam: seen.append(lam) or real(c, hat, lam))
    method.local_update(loop.client(0), {"theta_hat": init})
    assert seen == [method.eps]
    assert FedORA(lam=0.3).selective_lambda(client, trained, init) == 0.3  # Table 5: constant λ
    official = FedORA(alpha=None, kappa=0.8, lambda_rule="official")
    assert official.selective_lambda(client, trained, init) == 0.0
    assert official.selective_lambda(client, trained, trained) == 1.0  # exp(0)
    delta = client.evaluate(init, "val").loss - client.evaluate(trained, "val").loss
    assert official.selective_lambda(client, init, trained) == pytest.approx(math.exp(delta / 2), rel=1e-12)


def test_official_lambda_does_not_grow_with_the_number_of_validation_batches(monkeypatch):
    """The code's exp(Δ/2) with Δ from mean validation losses: a client with many validation batches
    (a big client) gets the λ it would get from one batch, not exp(#batches · Δ/2)."""
    loop = run(fedora_loop(client={"batch_size": 4}), 2)
    client, trained, init = loop.client(0), loop.client(0).state["personal"], loop.init_state
    official = FedORA(alpha=None, kappa=0.8, lambda_rule="official")
    lams = []
    for batch in (len(client.val_idx), 4, 1):  # one batch of the whole split, then more and more batches
        monkeypatch.setattr(client.worker, "settings", dataclasses.replace(client.worker.settings, batch_size=batch))
        lams.append(official.selective_lambda(client, init, trained))
    assert len(client.val_idx) >= 4 and lams[0] > 1.0  # θ_k validates better than θ_0: Δ > 0
    assert lams == pytest.approx([lams[0]] * 3, rel=1e-12)


def test_pull_is_the_papers_lambda_norm_or_the_codes_decoupled_step():
    client_params = torch.tensor([1.0, -2.0])
    anchor = torch.tensor([0.0, 1.0])
    grads = torch.zeros(2)
    Proximal(anchor, 2 * 0.5).on_grad(client_params, grads)  # ∇ λ‖θ − θ̂‖² = 2λ(θ − θ̂)
    assert torch.equal(grads, 2 * 0.5 * (client_params - anchor))
    params = client_params.clone()
    pull = DecoupledPull(anchor, 0.5)
    pull.on_grad(params, grads)
    params -= 0.1 * torch.tensor([3.0, 3.0])  # the optimizer's step
    pull.on_step(params, 0.1)
    expected = client_params - 0.1 * torch.tensor([3.0, 3.0]) - 0.1 * 0.5 * (client_params - anchor)
    assert torch.allclose(params, expected)


# -- the graph ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2])
def test_subspace_graph_is_symmetric_with_self_similarity_p(p):
    loop = run(fedora_loop({"p": p}), 1)
    w = loop.server["W"]
    assert torch.allclose(w, w.T)
    assert torch.allclose(w.diagonal(), torch.full((6,), float(p), dtype=w.dtype))
    assert float(w.min()) >= 0 and float(w.max()) <= p + 1e-12
    assert w.shape == (6, 6) and loop.server["bases"].shape[2] == p
    off = w[~torch.eye(6, dtype=torch.bool)]
    assert float(off.max()) < p  # different clients span different subspaces


def test_basis_is_uploaded_once_and_unseen_clients_stay_isolated():
    loop = fedora_loop(trainer={"clients_per_round": 3})
    payloads, uploads = exchanged_round(loop)
    assert all("send_basis" in pl for pl in payloads.values()) and all("basis" in u for u in uploads.values())
    seen = loop.server["seen"]
    assert int(seen.sum()) == 3
    for cid in (~seen).nonzero().flatten().tolist():  # no basis yet: a self-loop only, θ̂ = θ_0
        assert torch.equal(loop.server["W"][cid], torch.eye(6, dtype=torch.float64)[cid])
        assert torch.equal(loop.server["theta_hat"][cid], loop.init_state)
    for _ in range(4):
        payloads, uploads = exchanged_round(loop)
        for cid, pl in payloads.items():
            assert ("send_basis" in pl) == ("basis" in uploads[cid])
    assert int(loop.server["seen"].sum()) == 6


@pytest.mark.parametrize("kind", ["random", "parameter", "gradient", "official"])
def test_ablation_similarities_are_valid_graphs(kind):
    args = {"similarity": kind} if kind != "official" else {"similarity": kind, "alpha": None, "kappa": 0.8}
    loop = run(fedora_loop(args), 2)
    w = loop.server["W"]
    assert bool((w >= 0).all())
    if kind == "official":  # top-2 others, row-stochastic, no self-edge
        assert torch.allclose(w.sum(dim=1), torch.ones(6, dtype=w.dtype))
        assert int((w > 0).sum(dim=1).max()) == 2 and float(w.diagonal().abs().max()) == 0
    else:
        assert torch.allclose(w, w.T) and torch.equal(w.diagonal(), torch.ones(6, dtype=w.dtype))
    if kind == "random":  # seeded: the same run seed gives the same graph, another seed another one
        again = fedora_loop(args)
        assert torch.equal(again.server["W_random"], loop.server["W_random"])
        other = make_loop(tiny_config("fedora", args, data=VAL, seed=1))
        assert not torch.equal(other.server["W_random"], loop.server["W_random"])


def test_the_codes_single_store_equals_the_papers_two_with_full_participation():
    paper = run(fedora_loop(), 3)
    single = run(fedora_loop({"replace_server_copy": True}), 3)
    assert "theta" not in single.server
    assert torch.allclose(paper.server["theta_hat"], single.server["theta_hat"], atol=1e-6)
    assert torch.allclose(personal(paper), personal(single), atol=1e-6)


# -- resume -------------------------------------------------------------------------------------------
def test_resume_keeps_bases_graph_and_stores(tmp_path):
    cfg = tiny_config("fedora", trainer={"rounds": 4, "clients_per_round": 4}, data=VAL)
    full = make_loop(cfg).fit()
    first, resumed = resumed_after(cfg, 2, tmp_path)
    for key in ("bases", "W", "M", "theta", "theta_hat", "seen", "sizes"):
        assert torch.equal(resumed.server[key], first.server[key]), key
    sampled = resumed.sampled_clients().tolist()
    requested = {c for c in sampled if "send_basis" in resumed.method.payload(resumed.server, c)}
    assert requested == {c for c in sampled if not bool(first.server["seen"][c])}  # seen clients never resend
    assert comparable_metrics(resumed.fit()) == comparable_metrics(full)


# -- new clients --------------------------------------------------------------------------------------
@pytest.mark.parametrize("labels", [True, False])
def test_new_client_gets_its_similarity_row_of_the_trained_clients(labels):
    loop = run(fedora_loop({"new_client_labels": labels}, data=NEW), 2)
    assert len(loop.worker.new_clients) == 2
    method, server = loop.method, loop.server
    ctx = new_client_context(loop, 0)
    mine = method.client_basis(ctx, labels=labels).double()
    bases = server["bases" if labels else "bases_x"]
    assert bases.shape[1] == 64 + (10 if labels else 0)  # [x, onehot(y)] or x alone
    row = new_client_row(principal_angle_similarity(bases, mine[None])[:, 0])
    expected = (row.float() @ server["theta_hat"]).to(server["theta_hat"].dtype)
    hat = method.new_client_hat(server, ctx)
    assert torch.allclose(hat, expected, atol=1e-6)
    assert torch.allclose(row.sum(), torch.tensor(1.0, dtype=row.dtype))
    adapted = method.adapt_new_client(server, ctx, epochs=2)
    if labels:  # fine-tuned with Eq. (9) from θ̂_new
        assert not torch.equal(adapted, hat)
        theta = hat.clone()
        for e in range(2):
            lam = method.selective_lambda(ctx, theta, hat)
            theta = ctx.fit(theta, epochs=1, terms=[method.pull_term(ctx, hat, lam)], purpose=f"new_client{e}")
        assert torch.equal(adapted, theta)
    else:  # unlabeled: θ̂_new as it is
        assert torch.equal(adapted, hat)
    metrics = loop.summary({})["metrics"]
    assert 0.0 <= metrics["new.acc.mean"] <= 1.0


def test_official_new_client_row_is_the_top_k_graph():
    loop = run(fedora_loop({"similarity": "official", "alpha": None, "kappa": 0.8}, data=NEW), 1)
    hat = loop.method.new_client_hat(loop.server, new_client_context(loop, 0))
    theta_hat = loop.server["theta_hat"]
    weights = torch.linalg.lstsq(theta_hat.double().T, hat.double()[:, None]).solution[:, 0]
    assert int((weights.abs() > 1e-4).sum()) == 2 and float(weights.sum()) == pytest.approx(1.0, abs=1e-5)


# -- regression ---------------------------------------------------------------------------------------
def test_fedora_on_the_regression_federation_reports_mae_and_ptr():
    data = DataConfig(source="synthetic_regression", num_clients=6, val_frac=0.2, test_frac=0.3)
    cfg = tiny_config("fedora", data=data, model={"name": "mlp", "hidden": [16]}, eval={"reference": "local"})
    cfg.client.lr = 0.01
    loop = make_loop(cfg)
    m = loop.fit()["metrics"]
    assert loop.worker.task == "regression"
    assert loop.server["bases"].shape[1] == cfg.data.regression.dim + 1  # [x, y]: the target as one column
    assert {"pm.mae.mean", "r_mae.mean", "ptr_mae"} <= set(m) and math.isfinite(m["pm.mae.mean"])


# -- configuration ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        {"alpha": 1.0, "kappa": 0.5},
        {"alpha": None},
        {"similarity": "cosine"},
        {"propagation": "iterative", "tol": None},
        {"lambda_rule": "max"},
        {"pull": "exact"},
        {"p": 0},
    ],
)
def test_bad_fedora_options_are_config_errors(args):
    with pytest.raises(ConfigError):
        FedORA(**args)


def test_official_config_is_the_authors_code():
    cfg = parse_fit_args(["--config", "conf/method/fedora_official.yaml", "--data.val_frac", "0.2"])[0]
    m = cfg.method
    assert (m.similarity, m.kappa, m.alpha, m.lambda_rule, m.pull, m.replace_server_copy) == (
        "official",
        0.8,
        None,
        "official",
        "decoupled",
        True,
    )


def test_the_codes_graph_is_one_option_on_the_paper_config():
    """``--method.similarity official`` swaps only the graph: the paper's α, λ rule and pull stay."""
    argv = ["--config", "conf/method/fedora.yaml", "--method.similarity", "official"]
    m = parse_fit_args(argv)[0].method
    paper = parse_fit_args(["--config", "conf/method/fedora.yaml"])[0].method
    assert (m.similarity, m.top_k, m.temperature) == ("official", 2, 10.0)
    assert {k: v for k, v in vars(m).items() if k != "similarity"} == {
        k: v for k, v in vars(paper).items() if k != "similarity"
    }
    assert (m.alpha, m.kappa, m.lambda_rule, m.pull, m.replace_server_copy) == (1.0, None, "paper", "gradient", False)


# -- FedORA's options at their bounds, its documented defaults, and the branches of its rules ------------
def test_fedora_bounds_accept_their_edges_and_refuse_past_them():
    for ok in (
        {"alpha": 0.0},
        {"alpha": 0.5},
        {"alpha": None, "kappa": 0.0},
        {"propagation": "iterative", "iters": 1, "tol": None},
        {"lam": 0.0},
        {"top_k": 1},
        {"eps": 1e-12},
        {"label_scale": 1e-3},
    ):
        FedORA(**ok)
    for bad, field in (
        ({"alpha": -1.0}, "method.alpha"),
        ({"alpha": float("inf")}, "method.alpha"),
        ({"alpha": None, "kappa": 1.0}, "method.kappa"),
        ({"alpha": None, "kappa": 1.5}, "method.kappa"),
        ({"iters": 0}, "method.iters"),
        ({"tol": 0.0}, "method.tol"),
        ({"lam": -0.1}, "method.lam"),
        ({"eps": 0.0}, "method.eps"),
        ({"top_k": 0}, "method.top_k"),
        ({"label_scale": 0.0}, "method.label_scale"),
    ):
        with pytest.raises(ConfigError, match=field):
            FedORA(**bad)


def test_fedora_defaults_are_the_papers_and_the_codes_constants():
    m = FedORA()
    assert (m.alpha, m.kappa, m.p, m.similarity, m.propagation) == (1.0, None, 1, "subspace", "closed")
    assert m.temperature == 10.0  # the official graph's exp(10 w)
    assert m.label_scale == 1.0 and m.center is False  # the paper's uncentred [x, onehot(y)]
    assert (m.top_k, m.pull, m.lambda_rule, m.replace_server_copy) == (2, "gradient", "paper", False)


@pytest.mark.parametrize("kind", ["parameter", "gradient", "uniform", "random", "identity"])
def test_ablation_kinds_ask_for_bases_only_for_unlabeled_new_clients(kind):
    for labels in (True, False):
        loop = fedora_loop({"similarity": kind, "new_client_labels": labels})
        payloads, uploads = exchanged_round(loop)
        assert all(("send_basis" in p) == (not labels) for p in payloads.values())
        assert all("basis" not in u and ("basis_x" in u) == (not labels) for u in uploads.values())


def test_closed_propagation_starts_from_the_identity_and_the_iteration_keeps_no_matrix():
    closed = fedora_loop()
    assert torch.equal(closed.server["M"], torch.eye(6, dtype=torch.float64))
    assert "M" not in fedora_loop({"propagation": "iterative", "iters": 3}).server


def test_gradient_similarity_stores_each_clients_last_update():
    loop = fedora_loop({"similarity": "gradient"})
    before = loop.server["theta"].clone()
    _, uploads = exchanged_round(loop)
    for cid, u in uploads.items():
        assert torch.equal(loop.server["updates"][cid], u.state - before[cid])


def test_parameter_graph_is_recomputed_every_round_from_the_parameters_only(bn_model):
    loop = fedora_loop({"similarity": "parameter"}, model=bn_model)
    p = loop.server.layout.num_params
    for _ in range(2):  # round 2 has no new joiners: the graph still follows the new parameters
        loop.run_round()
        rows = (loop.server["theta"] - loop.init_state).double()[:, :p]
        norms = rows.norm(dim=1)
        expected = (rows @ rows.T / (norms[:, None] * norms[None, :])).clamp(0.0, 1.0)
        expected.fill_diagonal_(1.0)
        torch.testing.assert_close(loop.server["W"], expected)


@pytest.fixture
def bn_model():
    return ModelConfig(name="tests.methods.helpers:bn_mlp")


def test_a_single_seen_client_has_self_similarity_p():
    loop = fedora_loop({"p": 2}, trainer={"clients_per_round": 1})
    loop.run_round()
    torch.testing.assert_close(loop.server["W"], 2.0 * torch.eye(6, dtype=torch.float64), rtol=0, atol=1e-12)


def test_the_official_graph_links_two_seen_clients():
    loop = fedora_loop({"similarity": "official", "alpha": None, "kappa": 0.8}, trainer={"clients_per_round": 2})
    loop.run_round()
    seen = loop.server["seen"].nonzero().flatten().tolist()
    a, b = seen
    w = loop.server["W"]
    assert float(w[a, b]) == 1.0 and float(w[b, a]) == 1.0  # each other's only neighbour, row-normalised


def test_pull_term_is_the_papers_gradient_or_the_codes_decoupled_pull():
    loop = fedora_loop()
    ctx, hat = loop.client(0), loop.init_state
    term = loop.method.pull_term(ctx, hat, 0.3)
    assert isinstance(term, Proximal) and term.mu == pytest.approx(0.6)  # ∇ λ‖θ − θ̂‖² = 2λ(θ − θ̂)
    decoupled = fedora_loop({"pull": "decoupled"}).method.pull_term(ctx, hat, 0.3)
    assert isinstance(decoupled, DecoupledPull) and decoupled.lam == 0.3


def test_regression_basis_scales_the_target_column():
    data = DataConfig(source="synthetic_regression", num_clients=6, val_frac=0.2, test_frac=0.3)
    loop = make_loop(tiny_config("fedora", {"label_scale": 2.0}, data=data, model={"name": "mlp", "hidden": [16]}))
    ctx = loop.client(0)
    x = loop.worker.data.x[ctx.train_idx].reshape(len(ctx.train_idx), -1).double()
    y = loop.worker.data.y[ctx.train_idx].double()
    expected = subspace_basis(torch.cat([x, 2.0 * y[:, None]], dim=1), None, 1, 1, label_scale=2.0)
    basis = loop.method.client_basis(ctx, labels=True)
    torch.testing.assert_close((basis.T @ expected).abs(), torch.ones(1, 1, dtype=basis.dtype))  # same direction


def test_a_new_client_needs_one_trained_client_and_uniform_kinds_use_the_sizes():
    loop = fedora_loop({"similarity": "uniform"}, data=NEW, trainer={"clients_per_round": 1})
    ctx = new_client_context(loop, 0)
    with pytest.raises(ConfigError, match="method.similarity"):
        loop.method.new_client_hat(loop.server, ctx)
    loop.run_round()  # exactly one client joins
    (seen,) = loop.server["seen"].nonzero().flatten().tolist()
    assert torch.equal(loop.method.new_client_hat(loop.server, ctx), loop.server["theta_hat"][seen])
    run(loop, 3)
    idx = loop.server["seen"].nonzero().flatten()
    sizes = loop.server["sizes"][idx]
    expected = (sizes / sizes.sum()).float() @ loop.server["theta_hat"][idx]
    torch.testing.assert_close(loop.method.new_client_hat(loop.server, ctx), expected)


def test_a_labeled_new_client_fine_tunes_for_one_epoch_when_asked():
    loop = run(fedora_loop(data=NEW), 1)
    ctx = new_client_context(loop, 0)
    hat = loop.method.new_client_hat(loop.server, ctx)
    assert torch.equal(loop.method.adapt_new_client(loop.server, ctx, 0), hat)
    one = loop.method.adapt_new_client(loop.server, ctx, 1)
    assert not torch.equal(one, hat) and len(ctx.fits) == 1
