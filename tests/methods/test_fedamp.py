"""Tests of pfl/methods/fedamp.py."""

from __future__ import annotations

import math

import pytest
import torch

from pfl.engine.terms import Proximal
from pfl.methods import ClientContext, Method, ServerContext, State, Upload
from pfl.methods.fedamp import attention_weights
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import exchanged_round, personal, run


class LocalProx(Method):
    """Local training with FedAMP's proximal term towards the client's own previous model."""

    name = "local_prox_test"
    averages_uploads = False
    has_global_model = False

    def __init__(self, mu: float):
        self.mu = mu

    def init_server(self, server: ServerContext) -> State:
        return {}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        own = client.state.get("personal", client.init_state)
        client.state["personal"] = client.fit(own, terms=[Proximal(client.params(own), self.mu)])
        return Upload()

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        pass


@pytest.mark.parametrize("sigma", [math.inf, 1e30])
def test_fedamp_without_attention_is_local_with_a_proximal_term(sigma):
    cfg = tiny_config("fedamp", {"sigma": sigma, "alpha_k": 0.5, "lam": 0.2})
    fedamp = run(make_loop(cfg), 3)
    cfg.method = LocalProx(0.2 / 0.5)
    local_prox = run(make_loop(cfg), 3)
    assert torch.allclose(personal(fedamp), personal(local_prox), atol=1e-6)
    if math.isinf(sigma):
        assert torch.equal(personal(fedamp), personal(local_prox))


def test_fedamp_attention_favours_closer_models_and_rows_sum_to_one():
    d = torch.tensor([[0.0, 1.0, 4.0], [1.0, 0.0, 9.0], [4.0, 9.0, 0.0]], dtype=torch.float64)
    xi = attention_weights(d, alpha_k=0.5, sigma=2.0, members=torch.ones(3, dtype=torch.bool))
    assert torch.allclose(xi.sum(dim=1), torch.ones(3, dtype=torch.float64))
    assert xi[0, 1] > xi[0, 2] and xi[0, 1] == pytest.approx(0.5 * math.exp(-0.5) / 2.0)
    assert xi[0, 0] == pytest.approx(1 - 0.5 * (math.exp(-0.5) + math.exp(-2.0)) / 2.0)
    lone = attention_weights(d, 0.5, 2.0, members=torch.tensor([True, True, False]))
    assert torch.equal(lone[2], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)) and lone[0, 2] == 0


def test_fedamp_cloud_models_are_the_attention_mix_of_the_uploaded_models():
    loop = make_loop(tiny_config("fedamp", trainer={"fraction": 0.5}))
    payloads, _ = exchanged_round(loop)
    seen = loop.server["seen"].cpu()
    assert seen.tolist() == [cid in payloads for cid in range(6)]  # the clients that have uploaded a model
    models = loop.server["models"].double()
    xi = attention_weights(torch.cdist(models, models) ** 2, 1.0, 100.0, seen)
    assert not torch.allclose(xi, torch.eye(6, dtype=torch.float64))
    torch.testing.assert_close(loop.server["cloud"], (xi @ models).to(loop.server["cloud"].dtype))
