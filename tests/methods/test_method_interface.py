"""The method interface as declared on ``Method``: its flags and hooks, the rule for ``averages_uploads``
on subclassing, what ``ClientContext`` offers in place of the engine, and the ``State`` type."""

from __future__ import annotations

import ast
import re
import types
import typing
import warnings
from pathlib import Path
from typing import Any, ForwardRef, Union

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import pfl.methods.base as base
from pfl.methods import Method
from pfl.methods.base import MethodFlagWarning, State, StateValue
from pfl.methods.fedavg import FedAvg
from pfl.methods.fedpg import FedPG
from pfl.methods.local import Local
from pfl.methods.registry import methods
from tests.conftest import make_loop, tiny_config

PFL = Path(base.__file__).resolve().parents[1]


# -- declared on Method ------------------------------------------------------------------------------
def _method_class_body() -> list[ast.stmt]:
    tree = ast.parse(Path(base.__file__).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Method").body


def test_every_class_attribute_of_method_has_a_one_line_docstring():
    body = _method_class_body()
    declared = {}
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            declared[stmt.target.id] = doc
    for flag in ("vectorizable", "averages_uploads", "uploads_gradients", "has_global_model", "has_personal_model"):
        assert flag in declared, f"Method does not declare {flag}"
    for name, doc in declared.items():
        assert isinstance(doc, str) and doc.strip() and "\n" not in doc, f"Method.{name} lacks a one-line docstring"


def test_every_hook_of_method_has_a_docstring_and_the_optional_ones_a_default():
    hooks = [n.name for n in _method_class_body() if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    for name in hooks:
        assert getattr(Method, name).__doc__, f"Method.{name} has no docstring"
    assert {"routing", "check_run", "upload_reference", "adapt_new_client"} <= set(hooks)
    assert Method.uploads_gradients is False and FedPG.uploads_gradients is True
    assert Method().routing(None, None) is None  # no routing rule: no route.* metrics
    assert Method().check_run(tiny_config()) is None


def test_the_framework_reads_a_method_only_through_what_method_declares():
    probe = re.compile(r"\b(getattr|hasattr)\(\s*[\w.]*method\b")
    found = [
        f"{path.relative_to(PFL.parent)}:{i}"
        for path in sorted(PFL.rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if probe.search(line)
    ]
    assert found == [], f"probing a method by name: {found}"
    read = re.compile(r"\b(?:self\.)?method\.([a-z_]+)\b")
    for folder in ("federation", "metrics"):
        for path in (PFL / folder).rglob("*.py"):
            for name in read.findall(path.read_text()):
                assert hasattr(Method, name), f"{path.name} reads method.{name}, which Method does not declare"


# -- the averages_uploads rule -----------------------------------------------------------------------
def test_a_subclass_keeps_its_parents_flags():
    class Quiet(Local):
        vectorizable = False

    class Child(Quiet):
        pass

    class Gradients(FedPG):
        def local_update(self, client, payload):
            return super().local_update(client, payload)

    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Logged(FedAvg):
            def local_update(self, client, payload):
                return super().local_update(client, payload)

    assert Child.vectorizable is False and Gradients.uploads_gradients is True
    assert Logged.averages_uploads is True and Logged.vectorizable is True


def test_a_new_aggregate_that_does_not_state_averages_uploads_is_told_once_as_it_is_defined():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")

        class MyAvg(FedAvg):
            def aggregate(self, server, uploads):
                super().aggregate(server, uploads)

    flagged = [w for w in seen if issubclass(w.category, MethodFlagWarning)]
    assert len(flagged) == 1 and MyAvg.averages_uploads is False
    message = str(flagged[0].message)
    assert "\n" not in message and message.startswith("MyAvg overrides aggregate without stating averages_uploads")
    assert "averages_uploads = True" in message
    assert Path(flagged[0].filename).resolve() == Path(__file__).resolve()  # points at the class statement


@pytest.mark.parametrize("stated", [True, False])
def test_stating_averages_uploads_keeps_it_and_silences_the_warning(stated: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Stated(FedAvg):
            averages_uploads = stated

            def aggregate(self, server, uploads):
                super().aggregate(server, uploads)

        class FromLocal(Local):  # nothing to lose: Local does not average
            def aggregate(self, server, uploads):
                pass

    assert Stated.averages_uploads is stated and FromLocal.averages_uploads is False


def test_every_shipped_method_that_defines_aggregate_states_averages_uploads():
    # Read from the source: the rule itself sets the flag on the class, so the class cannot tell.
    unstated = []
    for path in sorted((PFL / "methods").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name == "Method":
                continue
            defines = any(isinstance(n, ast.FunctionDef) and n.name == "aggregate" for n in node.body)
            targets = [t for n in node.body if isinstance(n, ast.Assign) for t in n.targets]
            states = any(isinstance(t, ast.Name) and t.id == "averages_uploads" for t in targets)
            if defines and not states:
                unstated.append(f"{path.name}:{node.name}")
    assert unstated == []
    assert len([c for c in methods().values() if "aggregate" in vars(c)]) > 10  # the walk saw the methods


# -- ClientContext in place of the worker ------------------------------------------------------------
def test_no_method_reaches_through_client_worker():
    users = [
        path.name
        for path in sorted((PFL / "methods").glob("*.py"))
        if path.name != "base.py" and re.search(r"\bclient\.worker\b", path.read_text())
    ]
    assert users == []


def test_client_context_offers_the_run_and_the_data_a_method_needs():
    loop = make_loop(tiny_config("fedavg", seed=7))
    client = loop.peek_client(2)
    worker, idx = loop.worker, loop.worker.split(2).train
    assert client.seed == 7 and client.task == "classification"
    x, y = client.train_samples()
    assert torch.equal(x, worker.data.x[idx]) and torch.equal(y, worker.data.y[idx])
    out = torch.randn(len(y), client.num_classes)
    assert torch.equal(client.loss(out, y), F.cross_entropy(out, y))
    assert client.weight_decay == worker.settings.weight_decay


# -- State -------------------------------------------------------------------------------------------
def _conforms(value: Any, tp: Any, alias: Any) -> bool:
    if isinstance(tp, ForwardRef | str):
        tp = alias
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is Union:
        return any(_conforms(value, t, alias) for t in typing.get_args(tp))
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, typing.get_args(tp)[0], alias) for v in value)
    if origin is dict:
        key, item = typing.get_args(tp)
        return isinstance(value, dict) and all(
            _conforms(k, key, alias) and _conforms(v, item, alias) for k, v in value.items()
        )
    return isinstance(value, tp)


def test_state_value_types_what_methods_store():
    def hook(value: StateValue) -> State: ...

    hints = typing.get_type_hints(hook, vars(base))
    value, state_type = hints["value"], dict[str, hints["value"]]
    assert typing.get_args(hints["return"])[0] is str  # a State is keyed by name
    loop = make_loop(tiny_config("sfedpg", trainer={"rounds": 1}))  # dicts and counters
    loop.run_round()
    state = loop.server.state
    assert any(isinstance(v, dict) for v in state.values()) and any(isinstance(v, int) for v in state.values())
    assert _conforms(state, state_type, value)  # the history: tensors keyed by client id
    assert not _conforms({"bad": object()}, state_type, value)
    assert not _conforms({1: torch.zeros(1)}, state_type, value)  # the top level is keyed by name
    assert _conforms(torch.zeros(2), value, value) and _conforms([1.0, {"a": "b"}], value, value)
    assert not isinstance(state["global"], int) and isinstance(state["global"], Tensor)
