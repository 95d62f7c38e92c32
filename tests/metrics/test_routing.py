"""Tests of pfl/metrics/routing.py: SplitGP's inference rule, a sample the client-side model is unsure of
(entropy ≥ E_th) predicted by the full model."""

from __future__ import annotations

import math

import pytest
import torch

from pfl.metrics.routing import entropy, route, routed_scores

# Three samples over three classes: a confident client output, a uniform one, a mildly peaked one.
OUT_CLIENT = torch.tensor([[10.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
OUT_SERVER = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 5.0], [3.0, 0.0, 0.0]])
Y = torch.tensor([0, 2, 1])


def test_entropy_of_a_softmax_by_hand():
    p = math.e / (math.e + 2)
    q = 1 / (math.e + 2)
    expected = [0.0, math.log(3), -(p * math.log(p) + 2 * q * math.log(q))]
    torch.testing.assert_close(entropy(OUT_CLIENT), torch.tensor(expected), atol=1e-3, rtol=0)
    assert float(entropy(OUT_CLIENT)[1]) == pytest.approx(math.log(3), abs=1e-6)


def test_routing_by_hand_on_a_tiny_batch():
    # H = (≈0.0009, log 3 ≈ 1.0986, ≈0.9754): at E_th = 0.5 samples 1 and 2 go to the server.
    pred, to_server = route(OUT_CLIENT, OUT_SERVER, 0.5)
    assert to_server.tolist() == [False, True, True]
    assert pred.tolist() == [0, 2, 0]  # client's 0; server's 2 and 0
    assert routed_scores(OUT_CLIENT, OUT_SERVER, Y, 0.5) == (2 / 3, 2 / 3)
    # Each model alone gets one of three: the client says 0, 0, 0 and the server 1, 2, 0.
    assert routed_scores(OUT_CLIENT, OUT_SERVER, Y, 10.0) == (1 / 3, 0.0)
    assert routed_scores(OUT_CLIENT, OUT_SERVER, Y, 0.0) == (1 / 3, 1.0)
    # A sample whose entropy equals E_th goes to the server; just above it, it stays on the client.
    h2 = entropy(OUT_CLIENT)[2]
    above = torch.nextafter(h2, torch.tensor(math.inf))  # the next float32: outputs are float32
    assert route(OUT_CLIENT, OUT_SERVER, float(h2))[1].tolist() == [False, True, True]
    assert route(OUT_CLIENT, OUT_SERVER, float(above))[1].tolist() == [False, True, False]
    assert route(OUT_CLIENT, OUT_SERVER, 1.0)[1].tolist() == [False, True, False]
