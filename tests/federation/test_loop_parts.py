"""The loop's parts: the loop is the round over parts it receives built (pfl.runner.assembly), local
updates run through a dispatcher chosen once, a method says why vectorizing gains it nothing, the learning-rate
schedule lives in the training settings, and the Checkpointer owns the chain."""

from __future__ import annotations

import ast
import dataclasses
import math
import warnings
from pathlib import Path

import pytest

from pfl.engine.trainer import TrainSettings
from pfl.errors import ConfigError
from pfl.federation.checkpoint import Checkpointer
from pfl.federation.dispatch import (
    MultiProcessDispatcher,
    SequentialDispatcher,
    VectorizedDispatcher,
    make_dispatcher,
)
from pfl.federation.distributed import Cohort
from pfl.methods import ClientContext, State, Upload, methods
from pfl.methods.base import Method, MethodFlagWarning
from pfl.methods.fedavg import FedAvg
from tests.conftest import make_loop, tiny_config

LOOP = Path(__file__).resolve().parents[2] / "pfl" / "federation" / "loop.py"


def test_the_loop_class_is_short_and_names_no_method():
    tree = ast.parse(LOOP.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FederatedLoop"]
    assert cls.end_lineno - cls.lineno + 1 <= 200
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & set(methods()), strings & set(methods())


def test_vectorizable_is_inherited_and_a_method_says_why_it_gains_nothing():
    assert all(cls.vectorizable for cls in methods().values())  # every method's clients are independent

    class Child(FedAvg):
        name = "child"

    class Shared(FedAvg):
        name = "shared"
        vectorizable = False

    assert Child.vectorizable and Child().vectorize_problems() == []
    assert Shared().vectorize_problems() == ["shared's clients' local updates depend on each other within a round"]
    assert methods()["ditto"](prox="autograd").vectorize_problems() == [
        "ditto's prox=autograd personal fit is a custom objective (use exact or gradient): its clients train one "
        "at a time, so trainer.vectorize gains nothing"
    ]
    assert methods()["ditto"]().vectorize_problems() == []


def test_a_method_that_gains_nothing_from_vectorize_is_refused_by_name_before_training():
    with pytest.raises(ConfigError, match=r"trainer.vectorize.*ditto's prox=autograd personal fit .* gains nothing"):
        make_loop(tiny_config("ditto", {"prox": "autograd"}, trainer={"vectorize": True}))


def test_the_dispatcher_is_chosen_once_from_the_settings():
    sequential = make_loop(tiny_config("fedavg"))
    assert type(sequential.dispatcher) is SequentialDispatcher
    vectorized = make_loop(tiny_config("fedavg", trainer={"vectorize": True}))
    assert type(vectorized.dispatcher) is VectorizedDispatcher
    loop = sequential
    two = Cohort(0, 2, gather=lambda obj: [obj, obj])
    parts = (loop.worker, loop.clients, loop.init_state)
    several = make_dispatcher(*parts, cohort=two, sizes=[1] * loop.server.num_clients)
    assert type(several) is MultiProcessDispatcher and type(several.local) is SequentialDispatcher


def test_a_dispatch_returns_every_sampled_clients_upload_in_id_order():
    loop = make_loop(tiny_config("ditto", trainer={"fraction": 0.5}))
    sampled = loop.sampled_clients().tolist()
    payloads = {cid: loop.method.payload(loop.server, cid) for cid in sampled}
    uploads, fits = loop.dispatcher.dispatch(loop.method, 0, sampled, payloads)
    assert list(uploads) == sorted(sampled) and len(fits) == 2 * len(sampled)  # ditto: personal + global fit
    assert all("personal" in loop.clients[cid] for cid in sampled)


def test_the_learning_rate_schedule_is_the_settings_own():
    settings = TrainSettings(lr=0.2, lr_decay=0.5)
    assert settings.lr_at(3) == 0.2 * 0.5**3 and settings.lr_at(0) == 0.2 and settings.lr == 0.2
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lr = 0.1  # type: ignore[misc]
    loop = make_loop(tiny_config("fedavg", client={"lr": 0.2, "lr_decay": 0.5}))
    before = loop.worker.settings
    loop.run_round(), loop.run_round()
    assert loop.worker.settings is before and before.lr == 0.2  # the rounds read the schedule, never write it
    assert loop.client(0).lr == 0.2 * 0.5**2  # the context of round 2
    worker = loop.worker
    worker.train(0, loop.init_state, 3)  # a fit of round 3 steps with round 3's rate
    assert worker._last_optimizer.param_groups[0]["lr"] == 0.2 * 0.5**3


def test_the_checkpointer_owns_the_chain_and_its_schedule(tmp_path):
    checkpointer = Checkpointer(checkpoint_every=3)
    assert checkpointer.chain is None and checkpointer.due(1)  # nothing measured yet: the first one is due
    checkpointer.run_dir = tmp_path
    assert checkpointer.chain is not None and checkpointer.chain.run_dir == tmp_path
    checkpointer.save_cost = 1e9  # expensive: only the cap on lost rounds applies
    assert not checkpointer.due(2) and checkpointer.due(3)
    checkpointer.run_dir = None
    assert checkpointer.chain is None


def test_client_learning_rate_decays_per_round():
    loop = make_loop(tiny_config("fedavg", client={"lr": 0.2, "lr_decay": 0.5}))
    seen = []
    update = loop.method.local_update

    def recording(client, payload):
        seen.append((client.round, client.lr))
        return update(client, payload)

    loop.method.local_update = recording
    for _ in range(3):
        loop.run_round()
    assert {r: lr for r, lr in seen} == {0: 0.2, 1: 0.1, 2: 0.05}
    assert not math.isnan(loop.evaluate()["pm.l_acc.mean"])


class GlobalOnly(Method):
    """A user's global-model method (the base's init_server, payload and aggregate: FedAvg's) that leaves
    has_personal_model at the base class's default, True."""

    name = "global_only"
    averages_uploads = False

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        return Upload(client.fit(payload["global"]), client.num_samples)


class KeepsPersonal(GlobalOnly):
    def local_update(self, client: ClientContext, payload: State) -> Upload:
        upload = super().local_update(client, payload)
        client.state["personal"] = upload.state.clone()
        return upload


def test_a_method_that_has_personal_models_but_stores_none_is_warned_once(recwarn):
    loop = make_loop(tiny_config(f"{__name__}.GlobalOnly", trainer={"rounds": 2}))
    loop.fit()
    warned = [w for w in recwarn if issubclass(w.category, MethodFlagWarning)]
    assert len(warned) == 1  # once, after the first round
    text = str(warned[0].message)
    assert "global_only has has_personal_model = True" in text and "client.state['personal']" in text
    assert "its initial model: set the class attribute has_personal_model = False" in text
    assert warned[0].filename == __file__  # the method's own local_update
    first = loop.history[-1]  # what the warning is about: P-models scored as the untrained initial model
    assert first["pm.l_acc.mean"] < first["gm.l_acc.mean"]
    recwarn.clear()
    for ok in (f"{__name__}.KeepsPersonal", "fedavg", "ditto"):
        make_loop(tiny_config(ok, trainer={"rounds": 1})).fit()
    assert not [w for w in recwarn if issubclass(w.category, MethodFlagWarning)]


class SaysGlobalOnly(GlobalOnly):
    has_personal_model = False  # the flag stated: its P-model is the global model


class OwnPersonalState(GlobalOnly):
    def personal_state(self, server, client):  # a P-model of its own making, whatever it stored
        return server["global"]


def _first_dispatch(method: str, round_idx: int, sampled: list[int]) -> list[str]:
    """The MethodFlagWarnings of a dispatch of ``sampled`` in ``round_idx``, the dispatcher's first."""
    loop = make_loop(tiny_config(method))
    payloads = {cid: loop.method.payload(loop.server, cid) for cid in sampled}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop.dispatcher.dispatch(loop.method, round_idx, sampled, payloads)
    return [str(w.message) for w in caught if issubclass(w.category, MethodFlagWarning)]


def test_the_personal_model_warning_names_the_first_client_trained_without_one_and_its_round():
    # the first dispatch this process makes (a resumed run's: any round), clients in the order sampled
    (text,) = _first_dispatch(f"{__name__}.GlobalOnly", 4, [3, 1])
    assert "stored no client.state['personal'] for client 3 in round 5, so that client's P-model" in text
    # has_personal_model = False stated, or a personal_state of its own: nothing to warn about
    for ok in (f"{__name__}.SaysGlobalOnly", f"{__name__}.OwnPersonalState"):
        assert _first_dispatch(ok, 0, [3, 1]) == []
