"""Tests of pfl/methods/fedsam.py."""

from __future__ import annotations

import torch

from tests.methods.helpers import fit_half_momentum as _fit


# -- identities -----------------------------------------------------------------------------------
def test_fedsam_with_rho_zero_is_fedavg_and_with_rho_not():
    fedavg = _fit("fedavg")
    assert torch.equal(fedavg.server["global"], _fit("fedsam", {"rho": 0.0}).server["global"])
    assert not torch.equal(fedavg.server["global"], _fit("fedsam").server["global"])
