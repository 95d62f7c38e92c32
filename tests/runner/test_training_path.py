"""trainer.vectorize auto/true/false: which way the clients train, and the one log line that says why."""

from __future__ import annotations

import dataclasses

import pytest
from torch import Tensor

import pfl.runner.assembly as assembly
from pfl.config import validate
from pfl.engine.terms import Proximal, Term
from pfl.errors import ConfigError
from pfl.federation.dispatch import MultiProcessDispatcher, SequentialDispatcher, VectorizedDispatcher
from pfl.federation.distributed import Cohort
from pfl.methods.base import ClientContext, State
from pfl.methods.fedprox import FedProx
from pfl.runner.lockstep_report import LockstepReport
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
        assert not path.said  # the default off CUDA keeps the sequential path without a word
    assert choose_path("auto", [], "cuda", "pgfed").said and choose_path("auto", REASONS, "cuda", "pgfed").said
    assert choose_path(False, [], "cpu", "fedavg").said and choose_path(True, [], "cpu", "fedavg").said


def test_auto_names_every_reason_it_trains_one_at_a_time():
    path = choose_path("auto", REASONS, "cuda", "pgfed")
    assert not path.vectorize
    assert path.line == "clients trained one at a time: " + "; ".join(REASONS)


def test_true_vectorizes_and_false_never_does():
    assert choose_path(True, [], "cpu", "fedavg").vectorize  # insisted on: also on a CPU (plan_run refuses it)
    off = choose_path(False, [], "cuda", "fedavg")
    assert not off.vectorize and off.line == "clients trained one at a time: trainer.vectorize is false"


def test_vectorize_accepts_only_true_false_or_auto():
    for good in (True, False, "auto"):
        validate(tiny_config(trainer={"vectorize": good}))
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="trainer.vectorize: must be true, false or auto"):
            validate(tiny_config(trainer={"vectorize": bad}))


def test_the_default_on_a_cpu_is_sequential_and_silent_while_a_setting_of_it_is_said(capsys):
    loop = make_loop(tiny_config("fedavg"))
    assert type(loop.dispatcher) is SequentialDispatcher
    assert "clients trained" not in capsys.readouterr().err  # stderr stays for errors: nothing changed on a CPU
    make_loop(tiny_config("fedavg", trainer={"vectorize": False}))
    lines = [line for line in capsys.readouterr().err.splitlines() if "clients trained" in line]
    assert lines == ["pfl: clients trained one at a time: trainer.vectorize is false"]


def test_auto_on_a_cuda_device_vectorizes_what_it_can(monkeypatch, capsys):
    real = assembly.choose_path
    monkeypatch.setattr(assembly, "choose_path", lambda s, problems, _, name: real(s, problems, "cuda", name))
    assert type(make_loop(tiny_config("fedavg")).dispatcher) is VectorizedDispatcher
    monkeypatch.setattr(assembly, "vectorize_problems", lambda method, worker, precision: REASONS[:1])
    assert type(make_loop(tiny_config("fedavg")).dispatcher) is SequentialDispatcher  # auto falls back, no refusal
    # true is not re-checked here: plan_run refused it before anything was built (tests/runner/test_plan.py)
    assert type(make_loop(tiny_config("fedavg", trainer={"vectorize": True})).dispatcher) is VectorizedDispatcher
    lines = [line for line in capsys.readouterr().err.splitlines() if "clients trained" in line]
    assert lines == [
        "pfl: clients trained together (vectorized): cuda, method fedavg allows it",
        "pfl: clients trained one at a time: " + REASONS[0],
        "pfl: clients trained together (vectorized): trainer.vectorize is true, fedavg",
    ]  # one line per run


COMPILE_SLEEP_S = 0.2  # what the stand-in compiler spends on a compiled step's first call


def _stand_in_compile(monkeypatch) -> list:
    """torch.compile replaced by an identity whose compiled functions sleep on their first call (as a
    real compile traces there); a module comes back as it is. Returns what was compiled."""
    import time

    import torch

    compiled: list = []

    def compile(fn, **kwargs):
        compiled.append(fn)
        if isinstance(fn, torch.nn.Module):
            return fn
        first = [True]

        def call(*args, **kw):
            if first[0]:
                time.sleep(COMPILE_SLEEP_S)
                first[0] = False
            return fn(*args, **kw)

        return call

    monkeypatch.setattr(torch, "compile", compile)
    return compiled


@pytest.mark.parametrize("vectorize", [True, False])
def test_compile_says_once_how_long_compiling_took(vectorize, monkeypatch, capsys):
    compiled = _stand_in_compile(monkeypatch)
    trainer = {"rounds": 3, "eval_every": 1, "compile": True, "vectorize": vectorize}
    loop = make_loop(tiny_config("fedavg", trainer=trainer))
    loop.fit()
    lines = [line for line in capsys.readouterr().err.splitlines() if "compiling took" in line]
    assert len(lines) == 1, lines  # once, though three rounds were evaluated
    seconds = float(lines[0].removeprefix("pfl: compiling took ").removesuffix(" s (first compiled step)"))
    assert seconds == pytest.approx(loop.worker.compile_clock.seconds, abs=0.05)
    # the model's forward, and the vectorized steps: the default loss's and the full pass's (not called here)
    assert len(compiled) == (3 if vectorize else 1)
    if vectorize:  # the step's first call (where compiling happens) was timed, its later ones not
        assert COMPILE_SLEEP_S <= seconds < 2 * COMPILE_SLEEP_S


def test_no_compile_line_without_compile(capsys):
    loop = make_loop(tiny_config("fedavg", trainer={"rounds": 1}))
    loop.fit()
    assert "compiling took" not in capsys.readouterr().err and loop.worker.compile_clock.seconds is None


def test_a_path_once_chosen_cannot_be_changed():
    path = choose_path(True, [], "cuda", "fedavg")
    with pytest.raises(dataclasses.FrozenInstanceError):
        path.vectorize = False  # type: ignore[misc]


class HandPull(Proximal):
    """Proximal's gradient, in a subclass: no stacked form of its own, so its fits run one at a time."""

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads.add_(params - self.anchor, alpha=self.mu)


class HandProx(FedProx):
    """A user's FedProx whose term has no stacked form; it declares no one_at_a_time."""

    name = "handprox"

    def local_terms(self, client: ClientContext, payload: State) -> list[Term]:
        return [HandPull(client.params(payload["global"]), self.mu)]


def _stack_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "no fit was trained together" in line]


def test_a_vectorized_run_whose_fits_stack_none_says_so_naming_the_first_reason(capsys):
    # vectorize_problems sees only what the class declares; the term shows when a fit runs.
    assert HandProx().vectorize_problems() == []
    trainer = {"rounds": 2, "eval_every": 1, "vectorize": True}
    loop = make_loop(tiny_config(f"{__name__}.HandProx", trainer=trainer))
    loop.fit()
    assert _stack_lines(capsys.readouterr().err) == [
        "pfl: no fit was trained together: handprox's fits ran one client at a time (the first with the term "
        "HandPull, which has no stacked form), so trainer.vectorize gains nothing (set trainer.vectorize false; "
        "a method whose fits never stack says why in its one_at_a_time, which auto and true read before the run)"
    ]  # once, not per evaluation
    make_loop(tiny_config("fedprox", trainer=trainer)).fit()  # its Proximal stacks: nothing to say
    make_loop(tiny_config(f"{__name__}.HandProx", trainer={**trainer, "vectorize": False})).fit()
    assert _stack_lines(capsys.readouterr().err) == []


def test_rank_zero_of_several_processes_reports_its_own_vectorized_share(capsys):
    loop = make_loop(tiny_config(f"{__name__}.HandProx", trainer={"vectorize": True}))
    loop.run_round()
    two = Cohort(0, 2, gather=lambda obj: [obj, obj])
    loop.dispatcher = MultiProcessDispatcher(loop.dispatcher, two, [1] * loop.server.num_clients)
    capsys.readouterr()
    LockstepReport().on_evaluation(loop, {})  # the fits of this rank's share, run by its local dispatcher
    assert len(_stack_lines(capsys.readouterr().err)) == 1


def _reports(loop) -> int:
    return sum(isinstance(c, LockstepReport) for c in loop.callbacks)


def test_only_rank_zero_of_a_vectorized_run_gets_the_lockstep_report():
    vectorized = tiny_config(f"{__name__}.HandProx", trainer={"vectorize": True})
    assert _reports(make_loop(vectorized)) == 1
    assert _reports(make_loop(tiny_config(f"{__name__}.HandProx"))) == 0  # sequential: nothing to stack
    assert _reports(make_loop(vectorized, announce_path=False)) == 0  # a run's LOCAL reference
    rank_one = Cohort(1, 2, gather=lambda obj: [obj, obj])
    assert _reports(make_loop(vectorized, cohort=rank_one)) == 0  # rank 0 says it for every rank
