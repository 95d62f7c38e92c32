"""pfl.federation.transforms: the run's upload transforms in order, client-side first; what the server
received and what the method's aggregation combines."""

from __future__ import annotations

import pytest
import torch

from pfl.federation.attacks import Attack
from pfl.federation.robust import RobustRule
from pfl.federation.transforms import UploadStep, apply_transforms, check_order
from pfl.methods import Upload
from tests.conftest import make_loop, tiny_config


class Shift:
    """Adds ``by`` to every upload's state."""

    def __init__(self, by: float, client_side: bool):
        self.by, self.client_side = by, client_side

    def transform(self, uploads, step):
        return {c: Upload(u.state + self.by, u.weight) for c, u in uploads.items()}


def test_the_server_receives_the_client_side_output_and_aggregates_the_last_one():
    uploads = {0: Upload(torch.zeros(2), 1.0), 3: Upload(torch.ones(2), 1.0)}
    step = UploadStep(None, None, {}, 0)  # type: ignore[arg-type]
    out = apply_transforms([Shift(1.0, True), Shift(10.0, True), Shift(100.0, False)], uploads, step)
    assert torch.equal(out.received[3].state, torch.full((2,), 12.0))
    assert torch.equal(out.combined[3].state, torch.full((2,), 112.0))
    none = apply_transforms([], uploads, step)
    assert none.received is uploads and none.combined is uploads


def test_a_server_side_transform_before_a_client_side_one_is_refused():
    check_order([Shift(1.0, True), Shift(1.0, False)])
    with pytest.raises(
        ValueError, match=r"^upload transforms must list the client-side ones first \(got Shift \(server\), "
    ):
        check_order([Shift(1.0, False), Shift(1.0, True)])


def test_a_run_lists_the_attack_before_the_aggregator():
    attack = {"kind": "scale", "fraction": 0.3}
    loop = make_loop(tiny_config("fedavg", attack=attack, server={"aggregator": "median"}))
    assert [type(t) for t in loop.transforms] == [Attack, RobustRule]
    assert loop.transforms[0].client_side and not loop.transforms[1].client_side
