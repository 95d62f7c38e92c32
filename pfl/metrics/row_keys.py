"""The keys of the evaluation's per-client rows, spelled in one place.

Each built-in protocol (``pfl.metrics.protocol_registry``) puts its scores in every client's row under
the keys ``RowKeys.protocol`` declares: ``local`` the P-model on the client's own test (score and loss)
and on its validation split, ``sg`` the P-model on FedPG's S- and G-tests, ``global`` the global model
on the client's own test (and, as metrics of the whole federation, on the server's global test:
``gm_global``). The row builder (``pfl.metrics.evaluate.score_clients``) writes these keys, and the
summaries (``summarize_rows``, ``honest_metrics``) read them from here.

A score is ``<model>.<segment>_<score>`` (model ``pm`` or ``gm``; segment ``l``: own test, ``val``,
``s``, ``g``; score ``acc`` or, for regression, ``mae``) and a loss ``<model>.<segment>_loss``. One
exception, kept for the runs already written: the P-model's own-test MAE is ``pm.mae``, not ``pm.l_mae``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Per task: the score of a segment and its name in the keys.
SCORE = {"classification": "acc", "regression": "mae"}
OWN, VAL, S_TEST, G_TEST = "l", "val", "s", "g"  # a client's segments: own test, validation, S- and G-test


@dataclass(frozen=True)
class RowKeys:
    """The row and metric keys of a task (``classification`` or ``regression``)."""

    task: str

    @property
    def score(self) -> str:
        return SCORE[self.task]

    def pm(self, segment: str) -> str:
        """The P-model's score on ``segment``."""
        if segment == OWN and self.task == "regression":
            return "pm.mae"
        return f"pm.{segment}_{self.score}"

    @property
    def own(self) -> str:
        """The P-model's score on its own test: the headline (pm.l_acc, or pm.mae for regression)."""
        return self.pm(OWN)

    @property
    def own_loss(self) -> str:
        return f"pm.{OWN}_loss"

    @property
    def gm(self) -> str:
        """The global model's score on a client's own test."""
        return f"gm.{OWN}_{self.score}"

    @property
    def gm_loss(self) -> str:
        return f"gm.{OWN}_loss"

    @property
    def gm_global(self) -> tuple[str, str]:
        """The metrics (score, loss) of the global model on the server's global test set."""
        return f"gm.{self.score}", "gm.loss"

    def protocol(self, name: str) -> tuple[str, ...]:
        """The row keys the built-in protocol ``name`` fills (none for another protocol)."""
        keys = {
            "local": (self.own, self.own_loss, self.pm(VAL)),
            "sg": (self.pm(S_TEST), self.pm(G_TEST)),
            "global": (self.gm, self.gm_loss),
        }
        return keys.get(name, ())

    @property
    def spread(self) -> tuple[str, ...]:
        """The P-model's row keys besides ``own``, summarized by their mean and std (``own`` also gets
        its tails), in the order the metrics list them."""
        return self.pm(S_TEST), self.pm(G_TEST), self.pm(VAL), self.own_loss


__all__ = ["G_TEST", "OWN", "S_TEST", "SCORE", "VAL", "RowKeys"]
