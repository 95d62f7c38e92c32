"""Evaluation protocols (personalized, global, FedPG S/G-tests, LOCAL reference, new clients),
communication counting, figures and report tables. docs/metrics.md lists every key."""

from pfl.metrics.comm import CommCounter, nbytes
from pfl.metrics.evaluate import EvalSets, evaluate_federation, evaluate_new_clients
from pfl.metrics.protocol_registry import ProtocolContext, protocol
from pfl.metrics.protocols import mean_std, reference_metrics, summarize, tail_count, tail_means

__all__ = [
    "CommCounter",
    "EvalSets",
    "ProtocolContext",
    "evaluate_federation",
    "evaluate_new_clients",
    "mean_std",
    "nbytes",
    "protocol",
    "reference_metrics",
    "summarize",
    "tail_count",
    "tail_means",
]
