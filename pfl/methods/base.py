"""What a method is: a few server hooks and a local update; everything else belongs to the loop.

Server hooks receive a ``ServerContext`` (the round, the federation's size, the model layout and the
server's state dict); the local update receives a ``ClientContext`` (the client's id, its persistent
state, its training settings and data, and ``fit`` to train from a vector) and returns an ``Upload``.
Server and client state are plain dicts (``State``: tensors, numbers, strings and lists and dicts
of them), so they checkpoint and move between processes as they are. A method never owns a model: it
asks the client context to train from a vector and reads the trained vector back.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

import torch
from torch import Tensor

from pfl.engine.fit_spec import EvalStats, FitSpec, FitStats, LossFn, batches_per_epoch
from pfl.engine.flat import FlatModule, ModelLayout
from pfl.engine.terms import Term
from pfl.errors import require
from pfl.methods.choices import check_choices
from pfl.methods.costs import SCALAR_BYTES, Reports, Times

if TYPE_CHECKING:  # the engine itself (Lightning) is imported by whoever builds a run, not by a method's interface
    from pfl.engine.stacked_loss import StackedLoss
    from pfl.engine.trainer import ClientModule, ClientTrainer

# What server and client state hold, as methods store them: tensors (models, rows of models, momentum),
# numbers (counters, statistics), strings (an agent's settings) and lists and dicts of them, the dicts
# keyed by name or by client id (FedPG's gradient history, PAGE's agent). Every value is something
# ``torch.load(weights_only=True)`` reads back.
StateValue: TypeAlias = "Tensor | bool | int | float | str | None | list[StateValue] | dict[str | int, StateValue]"
# A State's values are StateValues; the dict is typed Any so that a hook reads its own entries (a model
# tensor, its dict of tensors) without narrowing a union at every read (tests/methods check the values).
State: TypeAlias = dict[str, Any]
# How a server averages the sampled clients' models (a method's ``weighting`` option): ``uniform``, each
# sampled client once (a plain mean), or ``samples``, by training-set size (FedAvg's). ``upload_weight``
# turns it into a client's ``Upload.weight``.
Weighting: TypeAlias = Literal["uniform", "samples"]


class MethodFlagWarning(UserWarning):
    """A capability flag a subclass did not state was set for it by a rule (``Method.__init_subclass__``), or
    one it kept does not fit what it did (``has_personal_model``: ``Dispatcher.check_personal_models``)."""


@dataclass
class Upload:
    """What a client returns to the server.

    ``state``: the trained state vector, or the shared part of it for methods that share only some
    layers. ``weight``: the aggregation weight (the client's training-set size by default; known to the
    server after the first contact, so not counted as communication). ``extras``: anything else the
    client sends (gradients, scalars as tensors); every tensor in ``state`` and ``extras`` is counted
    in the communication metrics."""

    state: Tensor | None = None
    weight: float = 0.0
    extras: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.extras[key]

    def __contains__(self, key: str) -> bool:
        return key in self.extras


@dataclass
class ServerContext:
    """The server as a hook sees it: the round being run, the federation, the model layout and the
    server's state dict. It reads like that dict (``server["global"]``) for brevity.

    Hooks report what they spend through it: ``with server.timed("solve"):`` adds the block's seconds
    to a phase, and every server<->client exchange outside the payload/upload pair counts its own bytes
    (``ask_loss``, or ``count_bytes`` for one a method performs itself). ``take_times`` and
    ``take_bytes`` hand the sums over and reset them (``Method.metrics`` / ``Method.comm_extra``)."""

    round: int
    num_clients: int
    clients_per_round: int
    layout: ModelLayout
    init_state: Tensor
    state: State = field(default_factory=dict)
    seed: int = 0  # the run's seed, for keyed server-side randomness (pfl.seeding)
    evaluator: Callable[[Tensor], EvalStats] | None = field(default=None, repr=False)
    val_evaluator: Callable[[Tensor], EvalStats] | None = field(default=None, repr=False)
    client_loss: Callable[[int, Tensor], float] | None = field(default=None, repr=False)
    # The run's network built again under keys (pfl.models.redrawn_params): its trainable parameters, flat.
    draw_params: Callable[..., Tensor] | None = field(default=None, repr=False)
    reports: Reports = field(default_factory=Reports, repr=False)
    client_lr_at: Callable[[int], float] | None = field(default=None, repr=False)  # round -> its clients' lr

    def evaluate(self, state: Tensor) -> EvalStats:
        """Accuracy and loss of ``state`` on the server's global test set (``data.global_test``)."""
        if self.evaluator is None:
            raise RuntimeError("this server has no global test set to evaluate on")
        return self.evaluator(state)

    def evaluate_val(self, state: Tensor) -> EvalStats:
        """Accuracy and loss of ``state`` on the union of the clients' validation splits (each client
        scores the model on its own split and sends back its sums; never a reported test set)."""
        if self.val_evaluator is None:
            raise RuntimeError("no client has a validation split (data.val_frac)")
        return self.val_evaluator(state)

    def ask_loss(self, cid: int, state: Tensor, *, sent: int | None = None) -> float:
        """Client ``cid``'s mean train loss at ``state`` (eval mode): one exchange with that client,
        counted here: one number up, and down ``sent`` bytes (what the client needs to rebuild
        ``state``, e.g. a step size along a direction it already holds) or, None, ``state`` itself."""
        if self.client_loss is None:
            raise RuntimeError("this server cannot ask clients for their losses")
        down = state.numel() * state.element_size() if sent is None else sent
        self.count_bytes(up=SCALAR_BYTES, down=down)
        return self.client_loss(cid, state)

    def fresh_init(self, *keys: int | str) -> Tensor:
        """Another initialisation of the run's network, as a full state vector like ``init_state``: the
        parameters an independent draw of the model's own initialisers keyed by ``keys`` (the network
        built once more, ``draw_params``), the buffers (BatchNorm running statistics) ``init_state``'s."""
        if self.draw_params is None:
            raise RuntimeError("this server cannot build its network again (no draw_params)")
        state = self.init_state.clone()
        state[: self.layout.num_params] = self.draw_params(*keys)
        return state

    @property
    def client_lr(self) -> float:
        """The learning rate of this round's client fits (``client.lr`` decayed by ``client.lr_decay``), the
        ``ClientContext.lr`` of every client this round: a setting of the run the server knows, not sent."""
        if self.client_lr_at is None:
            raise RuntimeError("this server does not know its clients' learning rate")
        return self.client_lr_at(self.round)

    def timed(self, name: str) -> AbstractContextManager[None]:
        """``with server.timed(name):`` adds the block's wall-clock seconds to phase ``name`` of this round."""
        return self.reports.timed(name, self.round)

    def count_bytes(self, up: int = 0, down: int = 0) -> None:
        """Bytes of an exchange with the clients outside the payload/upload pair (e.g. a direction sent down)."""
        self.reports.count_bytes(up, down)

    def take_bytes(self) -> tuple[int, int]:
        """Bytes (up, down) counted since the last take, then zero (drained every round)."""
        return self.reports.take_bytes()

    def take_times(self) -> Times:
        """Seconds and counts per phase and the rounds they were spent in since the last take, then none
        (drained at every evaluation)."""
        return self.reports.take_times()

    @property
    def device(self) -> torch.device:
        return self.layout.device

    def __getitem__(self, key: str) -> Any:
        # Any, not StateValue: a hook knows which of its entries are tensors (every model entry is).
        return self.state[key]

    def __setitem__(self, key: str, value: StateValue) -> None:
        self.state[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.state

    def get(self, key: str, default: Any = None) -> Any:
        return self.state.get(key, default)


@dataclass
class ClientContext:
    """One client as a method sees it during a round: its id, its persistent state, the run's seed and
    task, its training settings and data splits, and the engine calls a local update needs. ``worker``
    is the engine behind them, there for code that needs more; no method shipped with pfl reads it."""

    cid: int
    round: int
    worker: ClientTrainer = field(repr=False)
    state: State
    init_state: Tensor
    fits: list[FitStats] = field(default_factory=list)

    # -- the run -------------------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """The run's seed, for keyed client-side randomness (``pfl.seeding``: derive it with the client id)."""
        return self.worker.seed

    @property
    def task(self) -> str:
        """The data's task: "classification" or "regression"."""
        return self.worker.task

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        """The task's mean loss of outputs ``out`` against targets ``y`` (what ``fit`` minimises by default)."""
        return self.worker.module.loss(out, y)

    # -- settings -------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        """The learning rate of this round's fits (``client.lr`` decayed by ``client.lr_decay``)."""
        return self.worker.settings.lr_at(self.round)

    @property
    def epochs(self) -> int:
        return self.worker.settings.epochs

    @property
    def batch_size(self) -> int:
        return self.worker.settings.batch_size

    @property
    def momentum(self) -> float:
        """The run's SGD momentum (``client.momentum``, or the method's ``client_momentum`` when set)."""
        return self.worker.settings.momentum

    @property
    def weight_decay(self) -> float:
        return self.worker.settings.weight_decay

    @property
    def keep_momentum(self) -> bool:
        """Whether "train" fits continue the client's momentum across rounds (``client.keep_momentum``,
        or the method's ``keep_momentum`` when set)."""
        return self.worker.settings.keep_momentum

    @property
    def layout(self) -> ModelLayout:
        return self.worker.flat.layout

    @property
    def flat(self) -> FlatModule:
        """The reusable model as flat vectors (for methods with their own per-batch procedure)."""
        return self.worker.flat

    def params(self, state: Tensor) -> Tensor:
        """The trainable-parameter part of a full state vector (what proximal terms act on)."""
        return state[: self.worker.flat.num_params]

    # -- data -----------------------------------------------------------------------------------
    @property
    def train_idx(self) -> Tensor:
        return self.worker.split(self.cid).train

    @property
    def val_idx(self) -> Tensor:
        return self.worker.split(self.cid).val

    @property
    def num_samples(self) -> int:
        return len(self.train_idx)

    @property
    def num_classes(self) -> int:
        return self.worker.data.num_classes

    def class_counts(self) -> Tensor:
        """Samples per class in the client's train split (float, length num_classes)."""
        y = self.worker.data.y[self.train_idx]
        return torch.bincount(y, minlength=self.num_classes).float()

    @property
    def batches_per_epoch(self) -> int:
        """Batches of one epoch over the train split (``client.drop_last`` honoured), as ``batches`` draws them."""
        return batches_per_epoch(self.num_samples, self.batch_size, self.worker.settings.drop_last)

    def train_samples(self) -> tuple[Tensor, Tensor]:
        """Inputs and targets of the client's train split (on the training device)."""
        data, idx = self.worker.data, self.train_idx
        return data.x[idx], data.y[idx]

    def batches(self, purpose: str = "train", epochs: int | None = None) -> Iterator[Tensor]:
        """The index batches ``fit`` would draw for this (client, round, purpose)."""
        return self.worker.batches(self.cid, self.round, purpose, self.epochs if epochs is None else epochs)

    # -- training -------------------------------------------------------------------------------
    def fit(
        self,
        start: Tensor,
        *,
        epochs: int | None = None,
        terms: Sequence[Term] = (),
        purpose: str = "train",
        lr: float | None = None,
        momentum: float | None = None,
        keep_momentum: bool | None = None,
        loss_fn: LossFn | None = None,
        objective: type[ClientModule] | None = None,
        context: dict[str, Any] | None = None,
        indices: Tensor | None = None,
        stacked_loss: StackedLoss | None = None,
    ) -> Tensor:
        """Train from ``start`` on this client's train split (or on the pool samples ``indices``, e.g.
        the train split minus a held-out validation part); returns the trained state vector.

        ``keep_momentum``: the optimizer's momentum continues from this client's previous fit of the
        same ``purpose`` (kept in ``state["momentum"]`` for "train", ``state["momentum.<purpose>"]``
        otherwise, so it checkpoints) instead of starting from zero; None (the default) keeps it for
        the "train" fit when the run's settings say so (``client.keep_momentum`` or the method's
        ``keep_momentum``). ``objective``: a ClientModule subclass whose ``training_step`` is the
        local objective (``context`` becomes its ``fit_context``); by default the data loss plus ``terms``.
        ``stacked_loss``: ``loss_fn`` restated so that ``trainer.vectorize`` trains this fit together
        with other clients' (``pfl.engine.stacked_loss``); without it a custom loss runs one client at a time."""
        if keep_momentum is None:
            keep_momentum = self.keep_momentum and purpose == "train"
        key = "momentum" if purpose == "train" else f"momentum.{purpose}"
        buf = self.state.get(key) if keep_momentum else None
        spec = FitSpec(epochs, terms, purpose, lr, momentum, buf, loss_fn, objective, context, indices, stacked_loss)
        stats = self.worker.train(self.cid, start, self.round, spec)
        if keep_momentum:
            saved = self.worker.momentum_buffer()
            if saved is not None:
                self.state[key] = saved
        self.fits.append(stats)
        return self.worker.snapshot()

    def gradient(self, batch: Tensor, loss_fn: LossFn | None = None) -> Tensor:
        """Fill ``flat.grads`` with the loss gradient on ``batch`` at the loaded parameters; returns the loss."""
        return self.worker.gradient(batch, loss_fn)

    def mean_gradient(self, state: Tensor) -> tuple[Tensor, float]:
        """Mean batch gradient and mean loss over one full pass of the train split at ``state``."""
        return self.worker.mean_gradient(self.cid, state, self.round)

    def evaluate(self, state: Tensor, on: str | Tensor = "val") -> EvalStats:
        """Accuracy and loss of ``state`` on one of the client's splits (train, val or test) or on
        given sample indices."""
        idx = getattr(self.worker.split(self.cid), on) if isinstance(on, str) else on
        return self.worker.evaluate(state, idx)

    def record_fit(self, steps: int, epochs: int, started: float) -> None:
        """Account for a local procedure that ran its own loop (throughput metrics)."""
        n = self.num_samples
        self.fits.append(FitStats(n, n * epochs, steps, float("nan"), time.perf_counter() - started))


def _decide_averages_uploads(cls: type[Method]) -> None:
    """The one flag a subclass does not simply inherit: a class that overrides ``aggregate`` averages
    the uploads only if it says so, since a robust aggregator rewriting the uploads of a server that
    does something else would change the method without an error. When the parent averaged, the class
    is told once, as it is defined."""
    if "aggregate" not in cls.__dict__ or "averages_uploads" in cls.__dict__:
        return
    if cls.averages_uploads:
        warnings.warn(
            f"{cls.__name__} overrides aggregate without stating averages_uploads, so it is False and "
            "server.aggregator accepts only mean: set the class attribute averages_uploads = True if its "
            "aggregate still takes the weighted mean of Upload.state (False to say it does not)",
            MethodFlagWarning,
            stacklevel=3,
        )
    cls.averages_uploads = False


class Method:
    """Base class. Subclasses set ``name``/``description``, register with ``@register`` and implement
    the hooks they change. Their hyper-parameters are the ``__init__`` arguments, stored as
    attributes of the same name (that is what ``hparams`` reports and configs set)."""

    # What a method declares: its capability flags (class attributes) and its optional hooks (methods
    # below), each with its default here; the loop, evaluation, attacks and config checks read them
    # only as declared on this class (docs/methods.md, "What a method declares").

    name: ClassVar[str] = ""
    """How runs, reports, W&B tags and ``--method NAME`` call the method; unset: the class name, lowercased."""
    name_from_class: ClassVar[bool] = False
    """Whether ``name`` was derived from the class name (set by ``__init_subclass__``, never by hand)."""
    description: ClassVar[str] = ""
    """One line for ``pfl methods`` and ``--help``."""
    has_global_model: ClassVar[bool] = True
    """Whether the server keeps one global model (``server["global"]``) that evaluation scores as the G-model."""
    has_personal_model: ClassVar[bool] = True
    """False when the only model is the global one (FedAvg, FedProx, ...): P-models are then the global model."""
    client_momentum: float | None = None
    """The method's SGD momentum for every local fit (None: the run's ``client.momentum``)."""
    keep_momentum: bool | None = None
    """Whether a client's "train" fit keeps its momentum across rounds (None: ``client.keep_momentum``)."""
    vectorizable: ClassVar[bool] = True
    """Whether the clients' local updates are independent within a round, so lockstep runs them exactly."""
    one_at_a_time: ClassVar[str] = ""
    """Why every fit runs one client at a time (a custom loss, its own loop), for ``vectorize_problems``."""
    averages_uploads: ClassVar[bool] = True
    """Whether ``aggregate`` takes a weighted mean of ``Upload.state``; a new ``aggregate`` must state it."""
    uploads_gradients: ClassVar[bool] = False
    """Whether the server works on pseudo-gradients w − w_i, so attacks in ``auto`` space perturb updates."""
    fixed_options: ClassVar[tuple[str, ...]] = ()
    """Parent ``__init__`` arguments the class fixes in its ``super().__init__`` call (left out of ``hparams``)."""
    # A resumed run (--resume) whose config.yaml lacks such an option continues with that value, and
    # pfl report counts the run at it, not at today's default (pfl.runner.args.predating_args).
    predating_options: ClassVar[dict[str, Any]] = {}
    """Options added after runs were recorded whose default is another rule than theirs -> their value."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _decide_averages_uploads(cls)
        # A parent's default name is not the subclass's: each unnamed class is named after itself.
        cls.name_from_class = not cls.__dict__.get("name") and (not cls.name or cls.name_from_class)
        if cls.name_from_class:
            cls.name = cls.__name__.lower()

    def vectorize_problems(self) -> list[str]:
        """Why ``trainer.vectorize`` cannot train this method's clients together with its current
        settings, in one line each (empty: at least some of its fits stack; ``pfl.engine.lockstep``).
        A method whose fits all run one client at a time (custom losses or objectives, its own loop)
        says so in ``one_at_a_time``: lockstep would run it exactly, but gain nothing."""
        if self.one_at_a_time:
            return self.runs_one_at_a_time(self.one_at_a_time)
        if self.vectorizable:
            return []
        return [f"{self.name}'s clients' local updates depend on each other within a round"]

    def runs_one_at_a_time(self, why: str) -> list[str]:
        """``vectorize_problems``'s line for a method none of whose fits stack, ``why`` naming the cause."""
        return [f"{self.name}'s {why}: its clients train one at a time, so trainer.vectorize gains nothing"]

    def __new__(cls, *args: Any, **kwargs: Any) -> Method:
        # A hyper-parameter annotated Literal[...] is checked here, once for every method and before its
        # __init__ runs, as jsonargparse checks it on the command line.
        check_choices(cls, args, kwargs)
        return super().__new__(cls)

    def set_client_optimizer(self, client_momentum: float | None, keep_momentum: bool | None) -> None:
        """Validate and store the method-level optimizer overrides."""
        require(
            client_momentum is None or 0 <= client_momentum < 1,
            "method.client_momentum",
            f"must be in [0, 1), or null for client.momentum (got {client_momentum})",
        )
        self.client_momentum, self.keep_momentum = client_momentum, keep_momentum

    # -- server side ----------------------------------------------------------------------------
    def init_server(self, server: ServerContext) -> State:
        """The server's state before round 0."""
        return {"global": server.init_state.clone()}

    def payload(self, server: ServerContext, cid: int) -> State:
        """What the server sends to client ``cid`` this round."""
        return {"global": server["global"]}

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        """Combine the sampled clients' uploads (keyed by client id) into the server state."""
        server["global"] = weighted_mean_of(uploads)

    def upload_reference(self, server: ServerContext) -> Tensor:
        """The server's current model in the coordinates of an upload's state: what a client's update
        (upload − reference) is measured from, before this round's aggregation."""
        return server["global"]

    def global_state(self, server: ServerContext) -> Tensor | None:
        """The model evaluation scores as the G-model: ``server["global"]``, or None without one."""
        return server.get("global") if self.has_global_model else None

    def metrics(self, server: ServerContext) -> dict[str, float]:
        """The method's own quantities, merged into every evaluation's metrics; keys should start with
        the method's name. By default the phases its hooks timed since the last evaluation, as
        ``time.<name>.<phase>_s_per_round`` (``take_times``)."""
        return self.take_times(server).per_round(self.name)

    def comm_extra(self, server: ServerContext) -> tuple[int, int]:
        """Bytes (up, down) exchanged since the last call outside the payload/upload pair, e.g. a line
        search asking the clients for their losses; added to the communication metrics every round.
        By default what the exchanges counted on the server (``ServerContext.take_bytes``)."""
        return server.take_bytes()

    def timed(self, name: str) -> AbstractContextManager[None]:
        """``with self.timed(name):`` in a client hook adds the block's seconds to phase ``name`` (server
        hooks use ``server.timed``); reported with the server's phases by ``take_times``."""
        return self._client_reports.timed(name)

    def take_times(self, server: ServerContext) -> Times:
        """The server's phases (``server.timed``) and the client hooks' (``self.timed``) since the last
        take, then none; per-round means divide by the rounds the server timed something in."""
        return server.take_times().merged(self._client_reports.take_times())

    @property
    def _client_reports(self) -> Reports:
        # Created on first use: subclasses need not call Method.__init__.
        reports = self.__dict__.get("_client_reports_")
        if reports is None:
            reports = self.__dict__["_client_reports_"] = Reports()
        return reports

    def check_run(self, cfg: Any) -> None:
        """Checks that need the rest of the run's configuration (``cfg``: the RunConfig), called by
        ``pfl.config.validate``; raise ConfigError naming the field. None by default."""

    # -- client side ----------------------------------------------------------------------------
    def local_update(self, client: ClientContext, payload: State) -> Upload:
        """Run on the client; returns what it uploads."""
        raise NotImplementedError(f"{type(self).__name__} must implement local_update")

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        """The client's model used for evaluation: by default its last trained personal model
        (``client.state["personal"]``), or the global model for methods without personal models."""
        if not self.has_personal_model and self.has_global_model:
            return server["global"]
        return client.state.get("personal", client.init_state)

    def routing(self, server: ServerContext, client: ClientContext) -> tuple[Tensor, Tensor, float] | None:
        """An inference rule that routes uncertain samples to the server: (client-side model, full model,
        entropy threshold), scored as ``route.*`` metrics on classification (SplitGP); None: none."""
        return None

    def adapt_new_client(self, server: ServerContext, client: ClientContext, epochs: int) -> Tensor:
        """The model of a client that never took part (``eval.new_client_epochs`` of fine-tuning):
        the global model trained ``epochs`` on its train split, or the initial model for methods
        without one. Methods with their own adaptation (e.g. FedORA's propagation) override this."""
        start = self.global_state(server)
        start = client.init_state if start is None else start
        if epochs == 0:
            return start
        return client.fit(start, epochs=epochs, purpose="new_client")

    # -- bookkeeping ----------------------------------------------------------------------------
    def hparams(self) -> dict[str, Any]:
        """The options a config can set (``option_names``), read back from the attributes of the same names."""
        return {n: getattr(self, n) for n in self.option_names() if hasattr(self, n)}

    @classmethod
    def option_names(cls) -> list[str]:
        """The options a config can set: the class's ``__init__`` arguments and, where it passes
        ``**kwargs`` on, its parents' in method resolution order, as jsonargparse follows them, less the
        ``fixed_options`` the class passes its parent itself."""
        names: list[str] = []
        for klass in cls.__mro__:
            if "__init__" not in vars(klass) or klass is object:
                continue
            params = inspect.signature(klass.__init__).parameters.values()
            names += [
                p.name for p in params if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            ]
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                break
        return [n for n in dict.fromkeys(names) if n not in cls.fixed_options]

    def unstored_options(self) -> list[str]:
        """The ``option_names`` this instance keeps under no attribute of the same name (``hparams``
        cannot report them, so the instance does not say what it was built with)."""
        return [n for n in self.option_names() if not hasattr(self, n)]


class ClientOptimizerMethod(Method):
    """A method whose configs may set its clients' SGD optimizer. A subclass takes its own
    hyper-parameters and passes the rest on, so the two options are declared and checked here only:
    ``def __init__(self, mu: float = 0.01, **kwargs: Any): ...; super().__init__(**kwargs)``
    (jsonargparse follows ``**kwargs`` into this signature, so configs and ``--help`` see them).

    Args:
        client_momentum: SGD momentum of every local fit of this method (null: client.momentum).
        keep_momentum: keep each client's SGD momentum of its main ("train") fit across its rounds
            (null: client.keep_momentum).
    """

    def __init__(self, client_momentum: float | None = None, keep_momentum: bool | None = None):
        self.set_client_optimizer(client_momentum, keep_momentum)


def weighted_mean(vectors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """Σ w_i v_i / Σ w_i, summed in the given order (callers pass clients sorted by id, so the result
    does not depend on the order in which clients were trained)."""
    total = float(sum(weights))
    out = torch.zeros_like(vectors[0])
    for v, w in zip(vectors, weights, strict=True):
        out.add_(v, alpha=float(w) / total)
    return out


def upload_weight(weighting: Weighting, client: ClientContext) -> float:
    """``client``'s ``Upload.weight`` under ``weighting``: 1 (``uniform``) or its number of training samples
    (``samples``), so that ``weighted_mean_of`` takes the plain or the sample-weighted mean of the uploads."""
    return 1.0 if weighting == "uniform" else client.num_samples


def weighted_mean_of(uploads: dict[int, Upload]) -> Tensor:
    """The weighted mean of the uploaded states, in client-id order."""
    ordered = [uploads[cid] for cid in sorted(uploads)]
    return weighted_mean([u.state for u in ordered], [u.weight for u in ordered])
