"""Per-run evaluation state the loop keeps: communication totals, the models clients trained this
round (FedPG's P-model for global-only methods), FedPG's fixed S/G test sets, the client rows of
the rounds that can still be reported and the LOCAL reference; plus the end-of-run choice of the
reported round.

``eval.protocols`` chooses what is measured: ``local`` (P-models on their own test and validation,
always), ``sg`` (FedPG's S- and G-tests: about three times the test samples of ``local``),
``global`` (the global model on every client's test and on the global test set) and ``new``
(held-out clients after ``adapt_new_client``, at the end of the run); a protocol of one's own
(``pfl.metrics.protocol_registry``) adds its metrics at every evaluation."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import torch
from torch import Tensor

from pfl.config import EvalConfig
from pfl.engine.trainer import ClientTrainer
from pfl.errors import ConfigError
from pfl.methods.base import ClientContext, Method, ServerContext, Upload
from pfl.metrics.comm import CommCounter
from pfl.metrics.evaluate import EvalSets, Gather, evaluate_federation, honest_metrics, own_key
from pfl.metrics.protocol_registry import ProtocolContext, measure_protocols
from pfl.metrics.protocols import rounds_to_target, select_index

Share = Callable[[Sequence[int], Sequence[int]], list[int]]  # (clients, their sizes) -> this rank's

BEST_TEST_PREFIX = "best_test."


class EvalSession:
    def __init__(
        self,
        cfg: EvalConfig,
        worker: ClientTrainer,
        seed: int,
        trained: MutableMapping[int, Tensor] | None = None,
        share: Share | None = None,
        gather: Gather | None = None,
        rank: int = 0,
        reference: dict[str, Any] | None = None,
        malicious: frozenset[int] = frozenset(),
    ):
        self.cfg = cfg
        self.worker = worker
        self.seed = seed
        self.comm = CommCounter()
        # pm_source=local_update: the last model each client trained (the loop passes a client store)
        self.trained: MutableMapping[int, Tensor] = {} if trained is None else trained
        self.rows: dict[int, list[dict[str, Any]]] = {}  # round -> per-client rows (see keep_rows)
        self.share, self.gather, self.rank = share, gather, rank
        self.reference = reference  # the LOCAL reference (pfl.runner.reference) behind R-Acc, PTR and gain
        self.conflicts: list[float] = []  # the rounds observed since the last evaluation: see observe_update
        self.malicious = frozenset(malicious)  # attacked clients (attack.*): honest.* leaves them out
        self._sets: EvalSets | None = None

    @property
    def own_key(self) -> str:
        return own_key(self.worker.task)

    def measures(self, protocol: str) -> bool:
        return protocol in self.cfg.protocols

    def check(self) -> None:
        """Fail before training when the chosen protocol cannot be measured on this data."""
        if self.cfg.select == "best_val" and any(len(c.val) == 0 for c in self.worker.data.clients):
            raise ConfigError(
                "eval.select", "best_val needs a validation split on every client", "set data.val_frac > 0"
            )

    # -- during a round ---------------------------------------------------------------------------
    def pm_source(self, method: Method) -> str:
        """Where P-models come from: ``local_update`` (FedPG's convention) applies only to methods
        without a personal model of their own; every other method is scored on its own P-model."""
        if self.cfg.pm_source == "local_update" and not method.has_personal_model:
            return "local_update"
        return "method"

    def observe(self, cid: int, payload: Any, upload: Upload) -> None:
        """One client's exchange this round: count its bytes, keep its trained model if asked to."""
        self.comm.exchange(payload, upload)
        if self.cfg.pm_source == "local_update" and upload.state is not None:
            self.trained[cid] = upload.state

    def observe_update(self, previous: Tensor, new: Tensor, uploads: dict[int, Upload]) -> None:
        """FedPG's motivating quantity, for every method with a global model: the share of sampled
        clients whose pseudo-gradient g_i = w − w_i conflicts with the applied update Δ = w' − w
        (g_i·Δ > 0: the global step raises client i's loss to first order). Counted over the clients
        that uploaded a full model; parameters only."""
        p = self.worker.flat.num_params
        delta = new[:p] - previous[:p]
        full = [u.state for u in uploads.values() if u.state is not None and u.state.numel() == new.numel()]
        if full and bool(delta.any()):
            # g_i·Δ = w·Δ − w_i·Δ: one dot product per client, no stacked copy of the uploads
            base = torch.dot(previous[:p], delta)
            dots = torch.stack([base - torch.dot(s[:p], delta) for s in full])
            self.conflicts.append(float((dots > 0).float().mean()))

    # -- at an evaluation -------------------------------------------------------------------------
    def evaluate(
        self, method: Method, server: ServerContext, client: Callable[[int], ClientContext], round_idx: int
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        if self._sets is None and self.measures("sg"):
            self._sets = EvalSets.build(self.worker, self.seed, self.cfg.s_acc_others, self.cfg.s_test)
        personal = self._trained_model if self.pm_source(method) == "local_update" else None
        values = self.reference["values"] if self.reference is not None else None
        share = None
        if self.share is not None:  # several processes: each scores its share of the clients
            clients = self.worker.data.clients
            sizes = [len(c.test) + len(c.val) for c in clients]
            share = self.share(range(len(clients)), sizes)
        metrics, rows = evaluate_federation(
            method,
            server,
            self.worker,
            client,
            self._sets,
            personal,
            values,
            with_global=self.measures("global"),
            share=share,
            rank=self.rank,
            gather=self.gather if share is not None else None,
        )
        if self.malicious:
            metrics.update(honest_metrics(rows, self.malicious, self.worker.task))
        metrics.update(self.comm.metrics(round_idx))
        metrics.update(
            measure_protocols(self.cfg.protocols, ProtocolContext(method, server, self.worker, client, round_idx))
        )
        if self.conflicts:  # the loop observes the evaluated round only (a mean if a caller observed more)
            metrics["conflict.fraction"] = sum(self.conflicts) / len(self.conflicts)
            self.conflicts = []
        self.rows[round_idx] = rows
        return metrics, rows

    def _trained_model(self, cid: int) -> Tensor | None:
        peek = getattr(self.trained, "peek", None)  # a client store: read without taking ownership
        return peek(cid) if peek is not None else self.trained.get(cid)

    def keep_rows(self, history: list[dict[str, Any]]) -> None:
        """Drop the client rows no round selection can report any more: only the latest round's and
        the best round's so far are kept (a round that is not the best of a prefix of the history
        is never the best of the whole, ties going to the earliest), so memory does not grow with
        the number of evaluations."""
        if not history:
            return
        best = history[select_index(history, self.cfg.select, self.worker.task)]
        keep = {int(history[-1]["round"]), int(best["round"])}
        self.rows = {r: rows for r, rows in self.rows.items() if r in keep}

    # -- at the end -------------------------------------------------------------------------------
    def select(self, history: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(metrics of the reported round, its client rows); best_test keys carry a prefix."""
        chosen = dict(history[select_index(history, self.cfg.select, self.worker.task)])
        rows = self.rows.get(int(chosen["round"]), [])
        if self.cfg.select == "best_test":
            chosen = {k if k == "round" else BEST_TEST_PREFIX + k: v for k, v in chosen.items()}
        return chosen, rows

    def target_round(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        if self.cfg.target is None:
            return {}
        higher = self.worker.task == "classification"
        return {"rounds_to_target": rounds_to_target(history, self.cfg.target, f"{self.own_key}.mean", higher)}

    def state_dict(self) -> dict[str, Any]:
        """The small part of the state (the loop checkpoints ``trained`` and ``rows`` itself, only
        when they change)."""
        return {"comm": self.comm.state_dict(), "conflicts": list(self.conflicts)}

    def load_state_dict(self, state: dict[str, Any], device: Any = None) -> None:
        """Restores ``state_dict()`` (and the ``rows`` of checkpoints of earlier versions, which kept
        them here; the loop restores ``trained``)."""
        self.comm.load_state_dict(state["comm"])
        if "rows" in state:
            self.rows = state["rows"]
        self.conflicts = list(state.get("conflicts", []))
