"""pFedHN's hypernetwork over flat targets, its server update and PLGU-GHN's perturbed update."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.nn.functional as F

from pfl.engine.flat import FlatModule
from pfl.models import ModelConfig, build_model
from pfl.optim.hypernet import HyperNetwork, hn_sam_server_update, hn_server_update, layer_sizes


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


SIZES = [10, 300, 7, 50]  # with chunk=40: dedicated, 8 chunks (last cut to 20), dedicated, 2 chunks


def _hn(seed: int = 0, chunk: int | None = 40, sizes=SIZES, clients: int = 4, **kw) -> HyperNetwork:
    return HyperNetwork(clients, sizes, generator=_gen(seed), hidden=8, n_hidden=2, chunk=chunk, **kw).double()


def _offsets(sizes):
    out, start = [], 0
    for s in sizes:
        out.append(slice(start, start + s))
        start += s
    return out


# -- architecture --------------------------------------------------------------------------------
def test_dedicated_heads_are_one_linear_map_per_target_layer():
    hn = _hn(chunk=None)
    f = hn.features(hn.embeddings[2])
    w = hn(2)
    assert w.shape == (sum(SIZES),)
    for sl in _offsets(SIZES):  # the head's rows for layer l map the features to layer l alone
        torch.testing.assert_close(w[sl], F.linear(f, hn.head.weight[sl], hn.head.bias[sl]))


def test_trunk_has_n_hidden_layers_with_relu_between_and_pfedhn_embedding_width():
    hn = HyperNetwork(50, [3], generator=_gen(), n_hidden=5, hidden=100)
    assert len(hn.trunk) == 5 and hn.embeddings.shape == (50, 13)  # 1 + 50/4
    v = hn.embeddings[0]
    h = v
    for i, layer in enumerate(hn.trunk):
        h = layer(h if i == 0 else torch.relu(h))
    torch.testing.assert_close(hn.features(v), h)


def test_chunked_layers_follow_the_chunk_generator_formula():
    hn = _hn()
    cid = 1
    f = hn.features(hn.embeddings[cid])
    w = hn(cid)
    c = 40
    first = {1: 0, 3: 8}  # chunk index of the first chunk of each chunked layer
    for layer, sl in enumerate(_offsets(SIZES)):
        if layer not in first:
            continue
        size = sl.stop - sl.start
        blocks = []
        for k in range(-(-size // c)):
            e = hn.chunk_embeddings[first[layer] + k]
            hidden = torch.relu(hn.chunk_mix(torch.cat([f, e])))  # W_mix [f; c_{l,k}] + b_mix
            blocks.append(hn.chunk_head(hidden))
        torch.testing.assert_close(w[sl], torch.cat(blocks)[:size])
    assert hn.chunk_embeddings.shape[0] == 10 and hn.head.out_features == 10 + 7


def test_chunks_carry_different_client_dependent_parts():
    """Without the nonlinearity every chunk would move by the same vector between two clients."""
    hn = _hn()
    diff = hn(0) - hn(3)
    layer = _offsets(SIZES)[1]
    a, b = diff[layer.start : layer.start + 40], diff[layer.start + 40 : layer.start + 80]
    assert not torch.allclose(a, b, atol=1e-6)


def test_a_batch_of_ids_is_the_stack_of_single_outputs():
    hn = _hn()
    torch.testing.assert_close(hn(torch.tensor([3, 0, 2])), torch.stack([hn(3), hn(0), hn(2)]))
    assert not torch.allclose(hn(0), hn(1))


@pytest.mark.parametrize("chunk", [None, 40, 5, 1000])
def test_count_parameters_matches_the_built_network(chunk):
    hn = HyperNetwork(7, SIZES, generator=_gen(), hidden=8, n_hidden=3, chunk=chunk, chunk_embed_dim=4)
    built = sum(p.numel() for p in hn.parameters())
    assert built == HyperNetwork.count_parameters(7, SIZES, hidden=8, n_hidden=3, chunk=chunk, chunk_embed_dim=4)


def test_default_chunk_keeps_pfedhn_cnn_unchunked_and_resnet_sized_targets_small():
    pfedhn_cnn = [1216, 12832, 96120, 10164, 850]
    assert HyperNetwork.count_parameters(50, pfedhn_cnn) == HyperNetwork.count_parameters(50, pfedhn_cnn, chunk=None)
    resnet_like = [9408] + [36864] * 4 + [73728, 147456 * 3, 8192, 294912, 589824 * 3, 32768]
    resnet_like += [1179648, 2359296 * 3, 131072, 5130]
    assert HyperNetwork.count_parameters(100, resnet_like, chunk=16384) < 0.5 * sum(resnet_like)


def test_same_generator_seed_same_network_and_global_rng_untouched():
    state = torch.get_rng_state()
    a, b, c = _hn(5), _hn(5), _hn(6)
    assert torch.equal(torch.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_state_dict_is_plain_tensors_and_round_trips():
    a, b = _hn(1), _hn(2)
    sd = a.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    b.load_state_dict(sd)
    torch.testing.assert_close(b(torch.tensor([0, 1, 2, 3])), a(torch.tensor([0, 1, 2, 3])), rtol=0, atol=0)


def test_output_loads_into_a_flat_module_layout():
    net = build_model(ModelConfig(name="cnn", channels=[4, 8], kernel=3, padding=1, fc=16), (1, 8, 8), 10)
    flat = FlatModule(net)
    sizes = layer_sizes(flat.layout.layer_slices())
    assert sum(sizes) == flat.num_params
    hn = HyperNetwork(3, sizes, generator=_gen(), hidden=16, n_hidden=2, chunk=100)
    with torch.no_grad():
        flat.load_params(hn(1))
    assert torch.equal(flat.params, hn(1).detach())
    assert net(torch.randn(2, 1, 8, 8, generator=_gen(3))).shape == (2, 10)
    with pytest.raises(ValueError):
        layer_sizes([slice(0, 3), slice(4, 6)])


# -- server updates ------------------------------------------------------------------------------
def _applied(hn_before: HyperNetwork, hn_after: HyperNetwork, lr: float = 1.0) -> dict[str, torch.Tensor]:
    """The gradient an SGD(lr) step applied: (before − after) / lr."""
    after = dict(hn_after.named_parameters())
    return {n: (p.detach() - after[n].detach()) / lr for n, p in hn_before.named_parameters()}


def _surrogate_grads(hn: HyperNetwork, cids, deltas, phi_mean: bool = True) -> dict[str, torch.Tensor]:
    """Autograd of Σ_i ½‖h(v_i; φ) − (w_i + Δw_i).detach()‖², φ part divided by the batch size."""
    hn.zero_grad()
    loss = 0.0
    for cid, delta in zip(cids, deltas, strict=True):
        w = hn(cid)
        loss = loss + 0.5 * (w - (w + delta).detach()).square().sum()
    loss.backward()
    out = {n: p.grad.clone() for n, p in hn.named_parameters()}
    if phi_mean:
        out = {n: g if n == "embeddings" else g / len(cids) for n, g in out.items()}
    return out


def _delta(seed: int, shape) -> torch.Tensor:
    return 0.1 * torch.randn(*shape, generator=_gen(seed), dtype=torch.float64)


def test_server_update_is_the_gradient_of_the_distance_to_the_trained_weights():
    hn = _hn(3)
    ref = copy.deepcopy(hn)
    before = copy.deepcopy(hn)
    delta = _delta(4, (sum(SIZES),))
    hn_server_update(hn, torch.optim.SGD(hn.parameters(), lr=1.0), 2, delta)
    expected = _surrogate_grads(ref, [2], [delta])
    applied = _applied(before, hn)
    for name, g in expected.items():
        torch.testing.assert_close(applied[name], g, msg=name)
    assert applied["embeddings"][[0, 1, 3]].abs().max() == 0  # only client 2's embedding moves


def test_server_update_moves_the_clients_weights_toward_the_trained_ones():
    hn = _hn(3)
    delta = _delta(5, (sum(SIZES),))
    target = (hn(1) + delta).detach()
    before = (hn(1) - target).norm()
    hn_server_update(hn, torch.optim.SGD(hn.parameters(), lr=1e-3), 1, delta)
    assert (hn(1) - target).norm() < before


def test_a_batch_update_averages_phi_and_gives_each_embedding_its_own_gradient():
    hn = _hn(7)
    ref, before = copy.deepcopy(hn), copy.deepcopy(hn)
    deltas = _delta(8, (2, sum(SIZES)))
    hn_server_update(hn, torch.optim.SGD(hn.parameters(), lr=1.0), [3, 0], deltas)
    expected = _surrogate_grads(ref, [3, 0], list(deltas))
    applied = _applied(before, hn)
    for name, g in expected.items():
        torch.testing.assert_close(applied[name], g, msg=name)


def test_max_grad_norm_clips_over_all_hypernetwork_parameters():
    hn = _hn(9)
    ref, before = copy.deepcopy(hn), copy.deepcopy(hn)
    delta = _delta(10, (sum(SIZES),))
    hn_server_update(hn, torch.optim.SGD(hn.parameters(), lr=1.0), 0, delta, max_grad_norm=1e-3)
    expected = _surrogate_grads(ref, [0], [delta])
    total = torch.sqrt(sum(g.square().sum() for g in expected.values()))
    assert total > 1e-3
    applied = _applied(before, hn)
    for name, g in expected.items():
        torch.testing.assert_close(applied[name], g * (1e-3 / (total + 1e-6)), msg=name)


@pytest.mark.parametrize("gradient", ["paper", "surrogate"])
def test_sam_update_with_rho_zero_is_the_plain_update(gradient):
    a = _hn(11)
    b = copy.deepcopy(a)
    deltas = _delta(12, (2, sum(SIZES)))
    opt_a = torch.optim.SGD(a.parameters(), lr=0.5, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.5, momentum=0.9)
    for _ in range(2):
        hn_server_update(a, opt_a, [1, 2], deltas)
        hn_sam_server_update(b, opt_b, [1, 2], deltas, rho=0.0, gradient=gradient)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


def _sam_by_hand(before: HyperNetwork, cids: list[int], deltas: torch.Tensor, rho: float, gradient: str) -> dict:
    """g from the surrogate at φ, ε = ρ g/‖g‖ over φ only, then at φ + ε either (∂w_i/∂φ)ᵀ(−Δw_i)
    (Eq. 24) or the surrogate's gradient with the targets fixed at φ; φ's part averaged over clients."""
    ref = copy.deepcopy(before)
    targets = [(ref(c) + d).detach() for c, d in zip(cids, deltas, strict=True)]
    g = _surrogate_grads(ref, cids, list(deltas))
    phi_names = [n for n, _ in ref.named_parameters() if n != "embeddings"]
    norm = torch.sqrt(sum(g[n].square().sum() for n in phi_names))
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n != "embeddings":
                p.add_(rho * g[n] / norm)
    ref.zero_grad()
    if gradient == "paper":
        loss = sum((ref(c) * -d).sum() for c, d in zip(cids, deltas, strict=True))
    else:
        loss = sum(0.5 * (ref(c) - t).square().sum() for c, t in zip(cids, targets, strict=True))
    loss.backward()
    return {n: p.grad if n == "embeddings" else p.grad / len(cids) for n, p in ref.named_parameters()}


@pytest.mark.parametrize("gradient", ["paper", "surrogate"])
@pytest.mark.parametrize("cids", [[2], [3, 1]])
def test_sam_update_applies_the_gradient_taken_at_the_perturbed_hypernetwork(cids, gradient):
    rho = 0.3
    hn = _hn(13)
    before = copy.deepcopy(hn)
    deltas = _delta(14, (len(cids), sum(SIZES)))
    arg_cid, arg_delta = (cids[0], deltas[0]) if len(cids) == 1 else (cids, deltas)
    opt = torch.optim.SGD(hn.parameters(), lr=1.0)
    hn_sam_server_update(hn, opt, arg_cid, arg_delta, rho=rho, gradient=gradient)

    expected = _sam_by_hand(before, cids, deltas, rho, gradient)
    applied = _applied(before, hn)
    for name, e in expected.items():
        torch.testing.assert_close(applied[name], e, msg=name)
    plain = _surrogate_grads(copy.deepcopy(before), cids, list(deltas))
    assert not torch.allclose(applied["trunk.0.weight"], plain["trunk.0.weight"])  # ε mattered
    other = _sam_by_hand(before, cids, deltas, rho, "surrogate" if gradient == "paper" else "paper")
    assert not torch.allclose(applied["trunk.0.weight"], other["trunk.0.weight"])  # the two rules differ


def test_the_papers_rule_is_the_default():
    hn = _hn(15)
    a, b = copy.deepcopy(hn), copy.deepcopy(hn)
    deltas = _delta(16, (2, sum(SIZES)))
    hn_sam_server_update(a, torch.optim.SGD(a.parameters(), lr=1.0), [0, 3], deltas, rho=0.3)
    hn_sam_server_update(b, torch.optim.SGD(b.parameters(), lr=1.0), [0, 3], deltas, rho=0.3, gradient="paper")
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(ValueError, match="gradient must be one of"):
        hn_sam_server_update(a, torch.optim.SGD(a.parameters(), lr=1.0), 0, deltas[0], rho=0.3, gradient="exact")


def test_sam_update_rejects_bad_input():
    hn = _hn()
    opt = torch.optim.SGD(hn.parameters(), lr=1.0)
    with pytest.raises(ValueError):
        hn_sam_server_update(hn, opt, 0, torch.zeros(5, dtype=torch.float64), rho=0.1)
    with pytest.raises(ValueError):
        hn_sam_server_update(hn, opt, 0, torch.zeros(sum(SIZES), dtype=torch.float64), rho=-1.0)
    with pytest.raises(ValueError):
        hn_server_update(hn, opt, 9, torch.zeros(sum(SIZES), dtype=torch.float64))


# -- edges and defaults (mutation run) -------------------------------------------------------------
def test_layer_sizes_accept_plain_slices_and_refuse_empty_or_strided_ones():
    assert layer_sizes([slice(0, 3, 1), slice(3, 4)]) == [3, 1]
    assert layer_sizes({"a": slice(0, 2), "b": slice(2, 7)}) == [2, 5]
    for bad in ([slice(0, 0)], [slice(0, 4, 2)], [slice(0, 2), slice(3, 5)], [slice(1, 3)]):
        with pytest.raises(ValueError, match="contiguous, non-empty"):
            layer_sizes(bad)


def test_linear_layers_start_from_pytorchs_default_uniform_init():
    hn = HyperNetwork(2, [3], generator=_gen(), hidden=400, n_hidden=2)
    layer = hn.trunk[1]  # fan_in 400: U(±1/20)
    for t in (layer.weight.detach(), layer.bias.detach()):
        assert float(t.abs().max()) <= 0.05 and float(t.max()) > 0.045 and float(t.min()) < -0.045


def test_defaults_are_the_papers_five_hidden_layers_of_100_and_chunks_of_2_to_the_17():
    hn = HyperNetwork(8, [4, 6], generator=_gen())
    assert [(m.in_features, m.out_features) for m in hn.trunk] == [(3, 100)] + [(100, 100)] * 4  # e = 1 + 8/4
    assert sum(p.numel() for p in hn.parameters()) == HyperNetwork.count_parameters(8, [4, 6])
    # a layer of exactly 2^17 keeps its own head; one more entry and it is chunked (16-d chunk embeddings)
    assert HyperNetwork.count_parameters(1, [1 << 17]) == 1 * 1 + 2 * 100 + 4 * 101 * 100 + 101 * (1 << 17)
    chunked = 2 * 16 + (100 + 16 + 1) * 100 + 101 * (1 << 17)
    assert HyperNetwork.count_parameters(1, [(1 << 17) + 1]) == 1 * 1 + 2 * 100 + 4 * 101 * 100 + chunked


def test_a_layer_of_exactly_chunk_entries_gets_a_dedicated_head():
    hn = _hn(sizes=[8, 9], chunk=8)
    assert hn.head.out_features == 8 and hn.chunk_embeddings.shape[0] == 2
    assert HyperNetwork.count_parameters(4, [8, 9], hidden=8, n_hidden=2, chunk=8) == sum(
        p.numel() for p in hn.parameters()
    )


def test_smallest_sizes_are_valid_and_smaller_ones_refused():
    hn = HyperNetwork(1, [1, 3], generator=_gen(), hidden=1, n_hidden=1, chunk=1, chunk_embed_dim=1)
    assert hn(0).shape == (4,)
    for kw in ({"hidden": 0}, {"n_hidden": 0}, {"chunk": 0}, {"chunk_embed_dim": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            HyperNetwork(2, [3], generator=_gen(), **kw)
    for clients, sizes in ((0, [3]), (2, []), (2, [3, 0])):
        with pytest.raises(ValueError, match="need >= 1 client"):
            HyperNetwork(clients, sizes, generator=_gen())


def test_embedding_width_rule_is_the_same_in_count_parameters():
    hn = HyperNetwork(8, [5], generator=_gen(), hidden=4, n_hidden=2)  # e = int(1 + 8/4) = 3
    assert hn.embeddings.shape == (8, 3)
    assert HyperNetwork.count_parameters(8, [5], hidden=4, n_hidden=2) == sum(p.numel() for p in hn.parameters())


@pytest.mark.parametrize("sizes", [[3, 50], [3, 50, 2, 5]])
def test_dedicated_runs_around_a_chunked_layer_come_from_their_own_head_rows(sizes):
    hn = _hn(sizes=sizes, chunk=40)
    f = hn.features(hn.embeddings[1])
    w = hn(1)
    assert w.shape == (sum(sizes),)
    head = F.linear(f, hn.head.weight, hn.head.bias)  # the dedicated layers' outputs, in order
    torch.testing.assert_close(w[:3], head[:3])
    torch.testing.assert_close(w[53:], head[3:])


def test_client_ids_must_be_one_id_or_a_flat_batch_inside_the_federation():
    hn = _hn()
    opt = torch.optim.SGD(hn.parameters(), lr=0.1)
    p = sum(SIZES)
    with pytest.raises(ValueError, match="1-D sequence"):
        hn_server_update(hn, opt, torch.tensor([[0, 1]]), torch.zeros(1, 2, p, dtype=torch.float64))
    for ids in ([-1], [4], [0, 4]):
        with pytest.raises(ValueError, match=r"client ids must be in \[0, 4\)"):
            hn_server_update(hn, opt, ids, torch.zeros(len(ids), p, dtype=torch.float64))


def test_the_network_and_its_parameter_count_share_their_defaults():
    built = inspect.signature(HyperNetwork.__init__).parameters
    counted = inspect.signature(HyperNetwork.count_parameters).parameters
    for name in ("embed_dim", "hidden", "n_hidden", "chunk", "chunk_embed_dim"):
        assert built[name].default == counted[name].default, name


def test_param_groups_give_the_embeddings_their_own_learning_rate_when_asked():
    hn = _hn()
    phi, emb = hn.param_groups()
    assert emb == {"params": [hn.embeddings]} and len(phi["params"]) == len(hn.phi_parameters())
    _, emb = hn.param_groups(embed_lr=0.3)
    assert emb["lr"] == 0.3
    opt = torch.optim.SGD(hn.param_groups(embed_lr=0.3), lr=0.01)
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.3]
