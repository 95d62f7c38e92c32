"""SplitGP's inference rule (Han et al., "SplitGP: Achieving both generalization and personalization
in federated learning", INFOCOM 2023): a client predicts a sample with its client-side (personalized)
model when that model is confident, and otherwise sends the sample's features to the server, whose
server-side part completes the full (generalized) model's prediction.

Confidence is the entropy H(p) = −Σ_c p_c log p_c of the client-side model's softmax output p: the
sample goes to the server when H(p) ≥ E_th. E_th = 0 therefore sends every sample to the server (the
full model's accuracy) and any E_th > log C keeps every sample on the client (the client-side model's
accuracy). Pure functions over model outputs, so every case can be checked by hand.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def entropy(logits: Tensor) -> Tensor:
    """Entropy in nats of softmax(logits) per row (0·log 0 counted as 0 through log_softmax)."""
    return -(F.softmax(logits, dim=1) * F.log_softmax(logits, dim=1)).sum(dim=1)


def route(out_client: Tensor, out_server: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """(predicted classes, mask of the samples sent to the server): the client-side argmax where the
    client-side output's entropy is below ``threshold``, the full model's argmax elsewhere."""
    to_server = entropy(out_client) >= threshold
    pred = out_client.argmax(dim=1).where(~to_server, out_server.argmax(dim=1))
    return pred, to_server


def routed_scores(out_client: Tensor, out_server: Tensor, y: Tensor, threshold: float) -> tuple[float, float]:
    """(accuracy of the routed predictions, share of the samples sent to the server) on one
    non-empty set."""
    pred, to_server = route(out_client, out_server, threshold)
    return int((pred == y).sum()) / len(y), int(to_server.sum()) / len(y)
