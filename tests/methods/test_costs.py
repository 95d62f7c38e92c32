"""Tests of pfl/methods/costs.py."""

from __future__ import annotations

import types

import pytest
import torch

from pfl.methods import Method
from pfl.methods import costs as costs_module
from tests.methods.helpers import _bare_server


def _ticking_clock(monkeypatch, step: float = 1.0) -> None:
    """perf_counter returns 0, step, 2·step, ...: a timed block takes one step."""
    clock = iter(range(10_000))
    monkeypatch.setattr(costs_module, "time", types.SimpleNamespace(perf_counter=lambda: step * next(clock)))


def test_server_timed_adds_seconds_per_phase_and_round_and_take_resets(monkeypatch):
    _ticking_clock(monkeypatch, 2.0)
    server = _bare_server()
    for r in (3, 4):
        server.round = r
        with server.timed("solve"):
            pass
        with server.timed("solve"):
            pass
    server.round = 5
    with pytest.raises(ValueError), server.timed("search"):  # a block that raises still counts
        raise ValueError
    times = server.take_times()
    assert times.seconds == {"solve": 8.0, "search": 2.0} and times.counts == {"solve": 4, "search": 1}
    assert times.rounds == 3  # rounds 3, 4 and 5, each counted once however many blocks ran in it
    assert times.per_round("m") == {"time.m.solve_s_per_round": 8.0 / 3, "time.m.search_s_per_round": 2.0 / 3}
    assert server.take_times() == costs_module.Times()  # reset by the take
    assert costs_module.Times({"x": 1.0}, {"x": 1}, 0).per_round("m") == {}  # no round: no per-round mean


def test_client_side_phases_join_the_servers_and_its_rounds(monkeypatch):
    _ticking_clock(monkeypatch)
    server, method = _bare_server(), Method()
    with server.timed("solve"):
        pass
    for _ in range(3):
        with method.timed("client"):
            pass
    with method.timed("solve"):  # a phase timed on both sides adds up
        pass
    assert method.metrics(server) == {"time..solve_s_per_round": 2.0, "time..client_s_per_round": 3.0}
    assert method.metrics(server) == {}  # both sides reset
    with method.timed("client"):
        pass
    assert method.metrics(server) == {}  # client time without a server round has no per-round mean
    assert Method().take_times(server).seconds == {}  # each method its own client-side sums


def test_ask_loss_counts_its_own_exchange_and_take_bytes_resets():
    server = _bare_server(5)
    asked = []
    server.client_loss = lambda cid, state: asked.append((cid, state.clone())) or 0.5
    state = torch.ones(5, dtype=torch.float64)
    assert server.ask_loss(2, state) == 0.5 and torch.equal(asked[0][1], state) and asked[0][0] == 2
    assert server.take_bytes() == (4, 5 * 8)  # one 32-bit loss up, the float64 state down
    assert server.take_bytes() == (0, 0)
    server.ask_loss(0, state, sent=4)  # the client rebuilds the state from one number it is sent
    server.ask_loss(1, state, sent=0)
    server.count_bytes(down=7)
    server.count_bytes(up=3)
    assert Method().comm_extra(server) == (4 + 4 + 3, 4 + 0 + 7)  # the base hook drains the server's counts
    assert server.take_bytes() == (0, 0)
