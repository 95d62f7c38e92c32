"""Evaluation of personalized and global models over the federation (means are unweighted over clients).

A client's P-model is run once over the union of every set it is scored on (own test, S-test,
G-test, validation), each sample once: a set's score indexes the per-sample correctness (outputs),
so a paper S-test of (m − 1)·c others' tests costs no more than one pass over the test pool. The
global model is run once over all clients' tests and the server's global test set. Per-client
P-models are scored a block at a time (``BLOCK_BYTES``), so memory does not grow with N; with several
processes each scores its share of the clients and the rows are gathered (``evaluate_federation``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional import mean_absolute_error

from pfl.engine.trainer import ClientTrainer
from pfl.methods.base import ClientContext, Method, ServerContext
from pfl.metrics.protocols import g_test_indices, mean_std, reference_metrics, s_test_indices, summarize
from pfl.metrics.routing import routed_scores
from pfl.metrics.row_keys import G_TEST, OWN, S_TEST, SCORE, VAL, RowKeys
from pfl.seeding import numpy_rng


def own_key(task: str) -> str:
    """Key of a P-model's score on its own test (pm.l_acc, or pm.mae for regression)."""
    return RowKeys(task).own


# The scorer's names: a segment's loss is its name with LOSS appended; client cid's P-model segments are
# "<cid>:<segment>", the global model's on its test "gm:c<cid>", on the server's global test "gm:global".
LOSS = "_loss"
GLOBAL_TEST = "global"


def _pm_segment(cid: int, segment: str) -> str:
    return f"{cid}:{segment}"


def _gm_segment(cid: int) -> str:
    return f"gm:c{cid}"


@dataclass
class EvalSets:
    """FedPG's per-client S-test and G-test index sets, drawn once per run from (seed, client);
    ``mode``: the S-test's construction (``eval.s_test``, :func:`s_test_indices`)."""

    s: list[Tensor]
    g: list[Tensor]

    @classmethod
    def build(cls, worker: ClientTrainer, seed: int, share_of_others: float, mode: str = "paper") -> EvalSets:
        tests = [c.test.cpu().numpy() for c in worker.data.clients]
        union = np.concatenate(tests)
        s, g = [], []
        for cid, own in enumerate(tests):
            others = tests[:cid] + tests[cid + 1 :]
            rng = numpy_rng(seed, "eval", "s_test", cid)
            s_idx, _ = s_test_indices(own, others, share_of_others, rng, mode)
            g_idx = g_test_indices(len(own), union, numpy_rng(seed, "eval", "g_test", cid))
            s.append(torch.as_tensor(s_idx, dtype=torch.long, device=worker.device))
            g.append(torch.as_tensor(g_idx, dtype=torch.long, device=worker.device))
        return cls(s, g)


@torch.no_grad()
def predict(worker: ClientTrainer, state: Tensor, idx: Tensor) -> Tensor:
    """Outputs of the model ``state`` on pool samples ``idx``, in eval-batch-sized chunks."""
    worker.flat.load(state)
    worker.module.eval()
    with worker.autocast():
        outs = [worker.module(worker.data.x[b]).float() for b in idx.split(worker.eval_batch_size)]
    return torch.cat(outs) if outs else torch.zeros(0, device=worker.device)


def union_of(segments: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """(the distinct samples of the non-empty segments, each segment's positions among them): one
    forward pass over the samples scores every segment, each sample once however many hold it."""
    segments = {k: v for k, v in segments.items() if len(v)}
    if not segments:
        return torch.zeros(0, dtype=torch.long), {}
    samples, where = torch.unique(torch.cat(list(segments.values())), return_inverse=True)
    return samples, dict(zip(segments, where.split([len(v) for v in segments.values()]), strict=True))


def score_segments(worker: ClientTrainer, state: Tensor, segments: dict[str, Tensor]) -> dict[str, float]:
    """Returns ``{name: score}`` and ``{name_loss: mean loss}`` per segment from one forward pass over
    the union of the segments' samples: each sample is scored once, however many segments (or a
    paper S-test's repeated draws) hold it, and a segment's score indexes the per-sample outputs."""
    samples, positions = union_of(segments)
    if not positions:
        return {}
    out = predict(worker, state, samples)
    y = worker.data.y[samples]
    y = y.float() if y.is_floating_point() else y
    correct = out.argmax(1) == y if worker.task == "classification" else None
    scores: dict[str, float] = {}
    for name, pos in positions.items():
        o, t = out[pos], y[pos]
        if correct is not None:
            scores[name] = int(correct[pos].sum()) / len(pos)  # the exact ratio: equal accuracies stay equal
        else:
            scores[name] = float(mean_absolute_error(o, t))
        scores[name + LOSS] = float(worker.module.loss(o, t))
    return scores


ROUTE_PREFIX = "route."


def routed_row(
    worker: ClientTrainer, routing: tuple[Tensor, Tensor, float], segments: dict[str, Tensor]
) -> dict[str, float]:
    """``route.<set>_acc`` and ``route.<set>_server`` (the share sent to the server) of a method's
    inference rule (``Method.routing``: client-side model, full model, threshold) on each non-empty
    set, from one pass of each model over the sets' union (pfl.metrics.routing)."""
    client_state, server_state, threshold = routing
    samples, positions = union_of(segments)
    if not positions:
        return {}
    out_client, out_server = predict(worker, client_state, samples), predict(worker, server_state, samples)
    y = worker.data.y[samples]
    row: dict[str, float] = {}
    for name, pos in positions.items():
        acc, share = routed_scores(out_client[pos], out_server[pos], y[pos], threshold)
        row[f"{ROUTE_PREFIX}{name}_acc"], row[f"{ROUTE_PREFIX}{name}_server"] = acc, share
    return row


BLOCK_BYTES = 64 * 2**20  # per-client P-models held at once before their block is scored


def _shared_tensors(server: Any, global_state: Tensor | None) -> set[int]:
    """ids of the tensors the server holds: a P-model that is one of them is shared by clients (the
    global model, a cluster model) and stays alive anyway, so its segments are collected over all
    clients and scored in one pass at the end."""
    state = getattr(server, "state", server)
    ids = {id(v) for v in state.values() if isinstance(v, Tensor)} if isinstance(state, dict) else set()
    if global_state is not None:
        ids.add(id(global_state))
    return ids


class _Scorer:
    """Scores (model, index set) segments with one forward pass per distinct model and group.

    Shared models (held by the server, or the common init) collect segments from every client and
    are scored once, at ``finish``. Per-client models are scored in blocks of at most ``block_bytes``
    of models, then released, so evaluating N clients holds a block of P-models, not N (with a disk
    client store, the others stay on disk). The same model on the same index set is scored once."""

    def __init__(self, worker: ClientTrainer, shared: set[int], block_bytes: int):
        self.worker, self.shared, self.block_bytes = worker, shared, block_bytes
        self.scores: dict[str, float] = {}
        self._groups: dict[int, tuple[Tensor, dict[str, Tensor]]] = {}  # shared: until finish
        self._block: dict[int, tuple[Tensor, dict[str, Tensor]]] = {}
        self._block_bytes = 0
        self._aliases: dict[str, str] = {}
        self._first: dict[tuple[int, int], str] = {}
        self._block_first: dict[tuple[int, int], str] = {}

    def add(self, state: Tensor, key: str, idx: Tensor) -> None:
        shared = id(state) in self.shared
        first = self._first if shared else self._block_first
        seen = first.setdefault((id(state), id(idx)), key)
        if seen != key:
            self._aliases[key] = seen
            return
        groups = self._groups if shared else self._block
        if id(state) not in groups and not shared:
            self._block_bytes += state.numel() * state.element_size()
        groups.setdefault(id(state), (state, {}))[1][key] = idx

    def end_client(self) -> None:
        """A client's segments are all added: score the block if it is full (ids of released
        tensors may be reused, so the block's identity table goes with it)."""
        if self._block_bytes >= self.block_bytes:
            self._flush()

    def _flush(self) -> None:
        for state, segments in self._block.values():
            self.scores.update(score_segments(self.worker, state, segments))
        self._block, self._block_first, self._block_bytes = {}, {}, 0

    def finish(self) -> dict[str, float]:
        self._flush()
        for state, segments in self._groups.values():
            self.scores.update(score_segments(self.worker, state, segments))
        for key, seen in self._aliases.items():
            for suffix in ("", LOSS):
                if seen + suffix in self.scores:
                    self.scores[key + suffix] = self.scores[seen + suffix]
        return self.scores


def score_clients(
    method: Method,
    server: ServerContext,
    worker: ClientTrainer,
    client: Callable[[int], ClientContext],
    cids: Sequence[int],
    sets: EvalSets | None = None,
    personal: Callable[[int], Tensor | None] | None = None,
    with_global: bool = True,
    global_test: bool = True,
    block_bytes: int = BLOCK_BYTES,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One row per client in ``cids`` (its P-model's own-test/validation scores, S/G-tests with
    ``sets``, the global model's score on its test with ``with_global``), and the global model's
    scores on the server's global test set (``{"global": .., "global_loss": ..}``, with
    ``global_test``). ``personal(cid)`` overrides the method's P-model (None = keep it)."""
    data, task = worker.data, worker.task
    keys = RowKeys(task)
    global_state = method.global_state(server) if with_global else None
    shared = _shared_tensors(server, global_state)
    scorer = _Scorer(worker, shared, block_bytes)
    routes = task == "classification"  # entropy routing needs class probabilities
    routed: dict[int, dict[str, float]] = {}
    for cid in cids:
        split = data.clients[cid]
        ctx = client(cid)
        shared.add(id(ctx.init_state))
        state = personal(cid) if personal is not None else None
        if state is None:
            state = method.personal_state(server, ctx)
        segments = {OWN: split.test, VAL: split.val}
        if sets is not None:
            segments.update({S_TEST: sets.s[cid], G_TEST: sets.g[cid]})
        for seg, idx in segments.items():
            scorer.add(state, _pm_segment(cid, seg), idx)
        rule = method.routing(server, ctx) if routes else None
        if rule is not None:
            routed[cid] = routed_row(worker, rule, {k: v for k, v in segments.items() if k != VAL})
        if global_state is not None:
            scorer.add(global_state, _gm_segment(cid), split.test)
        del state, ctx
        scorer.end_client()
    if global_state is not None and global_test:
        scorer.add(global_state, f"gm:{GLOBAL_TEST}", data.global_test)
    scores = scorer.finish()

    rows: list[dict[str, Any]] = []
    for cid in cids:
        split = data.clients[cid]
        row: dict[str, Any] = {"client": cid, "n_train": len(split.train), "n_test": len(split.test)}
        own = _pm_segment(cid, OWN)
        row[keys.own], row[keys.own_loss] = scores[own], scores[own + LOSS]
        for seg in (S_TEST, G_TEST, VAL):
            if _pm_segment(cid, seg) in scores:
                row[keys.pm(seg)] = scores[_pm_segment(cid, seg)]
        if global_state is not None:
            gm = _gm_segment(cid)
            row[keys.gm], row[keys.gm_loss] = scores[gm], scores[gm + LOSS]
        row.update(routed.get(cid, {}))
        rows.append(row)
    gm_global = {k.removeprefix("gm:"): v for k, v in scores.items() if k.startswith(f"gm:{GLOBAL_TEST}")}
    return rows, gm_global


def summarize_rows(
    rows: Sequence[dict[str, Any]],
    task: str,
    gm_global: dict[str, float] | None = None,
    reference: Sequence[float] | None = None,
) -> dict[str, float]:
    """The federation's metrics from every client's row (sorted by client id) and the global model's
    global-test scores; ``reference`` holds LOCAL's per-client own-test scores (R-Acc, PTR, gain) and
    adds ``ref.*``/``gain`` to the rows."""
    keys = RowKeys(task)
    own = keys.own
    metrics: dict[str, float] = {}
    metrics.update(summarize(own, [r[own] for r in rows], tails=task == "classification"))
    for key in (*keys.spread, keys.gm_loss):
        values = [r[key] for r in rows if key in r]  # a tiny client may have no validation sample
        if values:
            metrics.update(summarize(key, values))
    for key in sorted({k for r in rows for k in r if k.startswith(ROUTE_PREFIX)}):
        metrics.update(summarize(key, [r[key] for r in rows if key in r]))
    if rows and keys.gm in rows[0]:
        metrics.update(summarize(keys.gm, [r[keys.gm] for r in rows], tails=task == "classification"))
    if gm_global and GLOBAL_TEST in gm_global:
        score, loss = keys.gm_global
        metrics[score], metrics[loss] = gm_global[GLOBAL_TEST], gm_global[GLOBAL_TEST + LOSS]

    if reference is not None:
        values = [r[own] for r in rows]
        comp = reference_metrics(values, reference, higher_is_better=task == "classification")
        for row, ref in zip(rows, reference, strict=True):
            row[f"ref.{own}"], row["gain"] = ref, row[own] - ref
        if task == "classification":
            metrics["r_acc.mean"], metrics["ptr"] = comp["r.mean"], comp["ptr"]
            metrics["gain.mean"], metrics["gain.std"] = comp["gain.mean"], comp["gain.std"]
        else:
            metrics["r_mae.mean"], metrics["ptr_mae"] = comp["r.mean"], comp["ptr"]
            metrics["gain_mae.mean"], metrics["gain_mae.std"] = comp["gain.mean"], comp["gain.std"]
    return metrics


Gather = Callable[[Any], list[Any]]


def evaluate_federation(
    method: Method,
    server: ServerContext,
    worker: ClientTrainer,
    client: Callable[[int], ClientContext],
    sets: EvalSets | None = None,
    personal: Callable[[int], Tensor | None] | None = None,
    reference: Sequence[float] | None = None,
    *,
    with_global: bool = True,
    share: Sequence[int] | None = None,
    rank: int = 0,
    gather: Gather | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Returns (aggregate metrics, one row per client).

    ``sets`` adds FedPG's S/G-tests; ``personal(cid)`` overrides the method's P-model (None = keep
    it); ``reference`` holds LOCAL's per-client own-test scores for R-Acc / PTR / gain;
    ``with_global=False`` leaves out the global model's scores.

    With several processes, each scores only ``share`` (its clients; rank 0 also the global test)
    and ``gather`` (all-gather of Python objects) brings every rank's rows together; every rank
    then computes the same metrics from the same id-sorted rows.
    """
    cids = list(range(worker.data.num_clients)) if share is None else list(share)
    rows, gm_global = score_clients(
        method, server, worker, client, cids, sets, personal, with_global, rank == 0, block_bytes
    )
    if gather is not None:
        parts = gather((rows, gm_global))
        rows = sorted((r for part_rows, _ in parts for r in part_rows), key=lambda r: r["client"])
        gm_global = next((g for _, g in parts if g), {})
    if len(rows) != worker.data.num_clients:
        raise RuntimeError(f"evaluation scored {len(rows)} of {worker.data.num_clients} clients")
    return summarize_rows(rows, worker.task, gm_global, reference), rows


HONEST_PREFIX = "honest."


def honest_metrics(rows: Sequence[dict[str, Any]], malicious: frozenset[int] | set[int], task: str) -> dict[str, float]:
    """``honest.<key>.{mean,std}`` (and tails for the own-test score) of every per-client P-model and
    global-model score, over the clients not in ``malicious`` (FedPG's Table 3 reports honest
    clients only)."""
    honest = [r for r in rows if r["client"] not in malicious]
    if not honest:
        return {}
    keys = RowKeys(task)
    own = keys.own
    out = summarize(HONEST_PREFIX + own, [r[own] for r in honest], tails=task == "classification")
    for key in (*keys.spread, keys.gm, keys.gm_loss):
        values = [r[key] for r in honest if key in r]
        if values:
            out.update(summarize(HONEST_PREFIX + key, values))
    out[HONEST_PREFIX + "clients"] = float(len(honest))
    return out


def evaluate_new_clients(
    method: Method, server: ServerContext, worker: ClientTrainer, round_idx: int, epochs: int, init_state: Tensor
) -> dict[str, float]:
    """``new.{acc|mae}.{mean,std}`` of held-out clients after ``method.adapt_new_client``."""
    n = worker.data.num_clients
    score = SCORE[worker.task]
    values = []
    for j, split in enumerate(worker.new_clients):
        ctx = ClientContext(n + j, round_idx, worker, {}, init_state)
        state = method.adapt_new_client(server, ctx, epochs)
        values.append(score_segments(worker, state, {"t": split.test})["t"])
    if not values:
        return {}
    mean, std = mean_std(values)
    return {f"new.{score}.mean": mean, f"new.{score}.std": std}
