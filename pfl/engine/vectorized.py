"""Vectorized local training (``trainer.vectorize``): the sampled clients of a round trained together.

Two parts:

- ``pfl.engine.lockstep``: the clients' local updates run in lockstep, one client's code at a time as
  in sequential mode, and every fit they reach together is handed to
- ``pfl.engine.stacked``: one stacked (clients × parameters) SGD loop per group of fits with the same
  term structure, per-client learning rates, epochs, momentum and samples, the sequential keyed
  batches, the terms' stacked forms (``pfl.engine.terms``), SAM's step, BatchNorm with per-client
  running statistics and keyed dropout; and PGFed's full-pass ``mean_gradient`` of several clients
  in one vmapped pass.

A fit that cannot be stacked (custom loss or objective, a term without a stacked form) runs on the
client trainer at once, exactly as in sequential mode; so does every fit of a model or precision that
cannot be stacked at all (``pfl.engine.stacked.model_problems``), which is why ``plan_run`` refuses
``trainer.vectorize true`` for those (``pfl.runner.plan``). Which dispatcher a run uses is decided in
``pfl.runner.assembly.build_loop`` (``pfl.federation.dispatch``).
"""

from __future__ import annotations

from pfl.engine.stacked import FitRequest, StackedTrainer, model_problems

__all__ = ["FitRequest", "StackedTrainer", "model_problems"]
