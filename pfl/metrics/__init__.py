"""Evaluation protocols (personalized, global, FedPG S/G-tests, LOCAL reference, new clients),
communication counting, figures and report tables. docs/metrics.md lists every key.

The names below load on first use: ``pfl report`` reads run folders through ``pfl.metrics.report``
and its plots, and must not pay for torch and Lightning, which the evaluation modules import."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pfl.lazy_names import lazy_names

if TYPE_CHECKING:
    from pfl.metrics.comm import CommCounter, nbytes
    from pfl.metrics.evaluate import EvalSets, evaluate_federation, evaluate_new_clients
    from pfl.metrics.protocol_registry import ProtocolContext, protocol
    from pfl.metrics.protocols import mean_std, reference_metrics, summarize, tail_count, tail_means

_MODULE_OF = {
    "CommCounter": "comm",
    "nbytes": "comm",
    "EvalSets": "evaluate",
    "evaluate_federation": "evaluate",
    "evaluate_new_clients": "evaluate",
    "ProtocolContext": "protocol_registry",
    "protocol": "protocol_registry",
    "mean_std": "protocols",
    "reference_metrics": "protocols",
    "summarize": "protocols",
    "tail_count": "protocols",
    "tail_means": "protocols",
}

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


__getattr__ = lazy_names(__name__, _MODULE_OF)
