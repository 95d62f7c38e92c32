"""trainer.vectorize auto/true/false: which way the clients train, and the one log line that says why."""

from __future__ import annotations

import pytest

import pfl.runner.assembly as assembly
from pfl.config import validate
from pfl.errors import ConfigError
from pfl.federation.dispatch import SequentialDispatcher, VectorizedDispatcher
from pfl.runner.training_path import choose_path
from tests.conftest import make_loop, tiny_config

REASONS = ["'pgfed' reads trained states before the round ends", "bf16-mixed is not supported"]


def test_auto_trains_together_only_on_cuda_when_nothing_refuses():
    path = choose_path("auto", [], "cuda", "pgfed")
    assert path.vectorize
    assert path.line == "clients trained together (vectorized): cuda, method pgfed allows it"
    for device in ("cpu", "mps"):
        path = choose_path("auto", [], device, "fedavg")
        assert not path.vectorize
        assert path.line.startswith("clients trained one at a time: ") and f"on {device}" in path.line


def test_auto_names_every_reason_it_trains_one_at_a_time():
    path = choose_path("auto", REASONS, "cuda", "pgfed")
    assert not path.vectorize
    assert path.line == "clients trained one at a time: " + "; ".join(REASONS)


def test_true_keeps_the_refusal_and_false_never_vectorizes():
    with pytest.raises(ConfigError, match=r"^trainer.vectorize: 'pgfed' reads .*; bf16-mixed is not supported \("):
        choose_path(True, REASONS, "cuda", "pgfed")
    assert choose_path(True, [], "cpu", "fedavg").vectorize  # insisted on: also on a CPU
    off = choose_path(False, [], "cuda", "fedavg")
    assert not off.vectorize and off.line == "clients trained one at a time: trainer.vectorize is false"


def test_vectorize_accepts_only_true_false_or_auto():
    for good in (True, False, "auto"):
        validate(tiny_config(trainer={"vectorize": good}))
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="trainer.vectorize: must be true, false or auto"):
            validate(tiny_config(trainer={"vectorize": bad}))


def test_the_default_on_a_cpu_is_sequential_and_says_why_in_one_line(capsys):
    loop = make_loop(tiny_config("fedavg"))
    assert type(loop.dispatcher) is SequentialDispatcher
    lines = [line for line in capsys.readouterr().err.splitlines() if "clients trained" in line]
    assert lines == ["pfl: clients trained one at a time: trainer.vectorize auto trains clients together only on CUDA "
                     "(this run is on cpu)"]  # fmt: skip


def test_auto_on_a_cuda_device_vectorizes_what_it_can(monkeypatch, capsys):
    real = assembly.choose_path
    monkeypatch.setattr(assembly, "choose_path", lambda s, problems, _, name: real(s, problems, "cuda", name))
    assert type(make_loop(tiny_config("fedavg")).dispatcher) is VectorizedDispatcher
    monkeypatch.setattr(assembly, "vectorize_problems", lambda method, worker, precision: REASONS[:1])
    assert type(make_loop(tiny_config("fedavg")).dispatcher) is SequentialDispatcher  # auto falls back, no refusal
    with pytest.raises(ConfigError, match="trainer.vectorize: 'pgfed' reads trained states"):
        make_loop(tiny_config("fedavg", trainer={"vectorize": True}))
    lines = [line for line in capsys.readouterr().err.splitlines() if "clients trained" in line]
    assert lines == [
        "pfl: clients trained together (vectorized): cuda, method fedavg allows it",
        "pfl: clients trained one at a time: " + REASONS[0],
    ]  # one line per run
