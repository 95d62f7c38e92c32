"""Tests of pfl/methods/fedbabu.py."""

from __future__ import annotations

import torch

from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    exchanged_round,
)


def test_fedbabu_head_stays_at_init_and_only_the_body_is_exchanged():
    loop = make_loop(tiny_config("fedbabu", trainer=HALF))
    head = loop.worker.flat.layout.tail(1)
    for _ in range(3):
        payloads, results = exchanged_round(loop)
    assert torch.equal(loop.server["global"][head], loop.init_state[head])
    assert not torch.equal(loop.server["global"][: head.start], loop.init_state[: head.start])
    for r in results.values():
        assert r.state.numel() == head.start  # body only (the MLP has no buffers)
    personal = loop.method.personal_state(loop.server, loop.client(0))  # fine-tuned: the head moves
    assert not torch.equal(personal[head], loop.init_state[head])
