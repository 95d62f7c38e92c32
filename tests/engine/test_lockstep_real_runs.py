"""Lockstep vectorized training (pfl.engine.lockstep), whole rounds: every registered method's rounds equal
its sequential rounds (keyed dropout, bf16, compiled steps, a BatchNorm WRN and the char-LSTM included), and
docs/performance.md's table says which methods stack. The handoff and the worker each client resumes with:
``test_lockstep.py``; stacked fits one by one: ``test_stacked.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pfl.federation.dispatch import VectorizedDispatcher
from pfl.methods import methods
from tests.conftest import make_loop, tiny_config
from tests.engine.test_stacked import DATA, _bf16_linear_calls
from tests.helpers.same_runs import assert_close, assert_same_metrics

PERFORMANCE = Path(__file__).resolve().parents[2] / "docs" / "performance.md"

# Momentum kept across rounds, weight decay, augmentation and validation splits are on in the
# registry-wide comparison (DATA; drop_last and the rest: test_stacked.py's fits).
CLIENT = {"momentum": 0.5, "keep_momentum": True, "weight_decay": 1e-3}
# PAGE's agents pick up to 20 local epochs at lr up to 0.1: float summation order (the stacked loss's
# masked mean against the batch mean) drifts the states by ~1e-4 over those steps; metrics stay within 1e-5.
STATE_ATOL = {"page": 3e-4}


def _vectorized(loop, compile: bool = False):
    """``loop`` with its clients trained in lockstep, also for methods vectorize refuses (they gain nothing:
    lockstep must still be exact)."""
    loop.dispatcher = VectorizedDispatcher(loop.worker, loop.clients, loop.init_state, loop.evals.trained, compile)
    return loop


def _loop(name: str, vectorize: bool, **groups):
    """Two rounds of ``name`` on DATA (``groups`` override whole groups: ``model={...}``)."""
    loop = make_loop(
        tiny_config(name, trainer={"rounds": 2, "eval_every": 2}, client=CLIENT, **{"data": DATA, **groups})
    )
    return _vectorized(loop) if vectorize else loop


def _assert_every_fit_stacked_as_sequentially(vec, seq) -> None:
    lockstep = vec.dispatcher.lockstep
    assert lockstep.stacked_fits > 0 and lockstep.sequential_fits == 0
    assert_close(vec.server.state, seq.server.state, "server")
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients")
    assert_same_metrics(vec.history[-1], seq.history[-1])


def _docs_table() -> dict[str, tuple[str, str]]:
    """docs/performance.md's lockstep table: method -> (fits trained together, why not)."""
    text = PERFORMANCE.read_text()
    block = text[text.index("<!-- lockstep-table") : text.index("<!-- end lockstep-table")]
    rows = [line.split("|")[1:-1] for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    return {name.strip(): (status.strip(), why.strip()) for name, status, why in rows[1:]}


def test_the_docs_table_lists_every_registered_method_once():
    assert sorted(_docs_table()) == sorted(methods())


@pytest.mark.parametrize("name", sorted(methods()))
def test_every_method_trains_in_lockstep_as_it_does_sequentially(name):
    seq, vec = _loop(name, False), _loop(name, True)
    seq.fit(), vec.fit()
    atol = STATE_ATOL.get(name, 1e-5)
    assert_close(vec.server.state, seq.server.state, "server", atol)
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients", atol)
    assert_same_metrics(vec.history[-1], seq.history[-1])
    assert vec.progress.train_samples == seq.progress.train_samples
    lockstep = vec.dispatcher.lockstep
    # What vectorize_problems and the docs' table say is what happens: a method that names no problem
    # stacks its fits or its own gradient calls, one that says it gains nothing stacks none.
    problems = seq.method.vectorize_problems()
    stacked = lockstep.stacked_fits + lockstep.stacked_batch_gradients
    assert (stacked > 0) == (not problems), stacked
    assert lockstep.sequential_gradients == 0  # every own gradient call on this model stacks
    status = "none" if not stacked else "some" if lockstep.sequential_fits else "all"
    documented, why = _docs_table()[name]
    assert documented == status, (documented, status)
    assert why == (problems[0] if problems else why if status == "some" else ""), why
    # PGFed's full-pass gradient after every fit runs stacked too (one vmapped pass for the round's clients).
    full_passes = lockstep.stacked_fits if name in ("pgfed", "pgfedmo", "pgfed_ce") else 0
    assert lockstep.stacked_gradients == full_passes


# bf16 (test_stacked.py's BF16_OF_MOVEMENT): two whole rounds compound a fit's bf16 roundings (momentum
# buffers included) and an accuracy can flip one held-out sample: 5e-2 absolute.
BF16_ROUNDS_ATOL = 5e-2


@pytest.mark.parametrize(("name", "precision"), [("plgu_lf", "bf16-mixed"), ("fedsam", "bf16-true")])
def test_bf16_rounds_train_stacked_as_sequentially(name, precision, monkeypatch):
    import lightning as L

    def loop(vectorize: bool):
        cfg = tiny_config(name, trainer={"rounds": 2, "eval_every": 2, "precision": precision}, client=CLIENT)
        out = make_loop(cfg, fabric=L.Fabric(accelerator="cpu", precision=precision))
        return _vectorized(out) if vectorize else out

    seq, vec = loop(False), loop(True)
    seq.fit()
    dtypes = _bf16_linear_calls(monkeypatch)
    vec.fit()
    lockstep = vec.dispatcher.lockstep
    assert lockstep.stacked_fits > 0 and lockstep.sequential_fits == 0
    assert set(dtypes) == {torch.bfloat16}
    assert_close(vec.server.state, seq.server.state, "server", BF16_ROUNDS_ATOL)
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients", BF16_ROUNDS_ATOL)
    assert_same_metrics(vec.history[-1], seq.history[-1], BF16_ROUNDS_ATOL)


def dropout_mlp(cfg, input_shape, num_classes):
    """An MLP with keyed dropout (``model.name: tests.engine.test_lockstep_real_runs:dropout_mlp``)."""
    from pfl.models.dropout import KeyedDropout

    dim = 1
    for d in input_shape:
        dim *= d
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(dim, 32),
        torch.nn.ReLU(),
        KeyedDropout(0.3),
        torch.nn.Linear(32, num_classes),
    )


@pytest.mark.parametrize("name", ["fedavg", "pgfed"])
def test_rounds_with_keyed_dropout_train_stacked_as_sequentially(name):
    model = {"name": "tests.engine.test_lockstep_real_runs:dropout_mlp"}
    seq, vec = _loop(name, False, model=model), _loop(name, True, model=model)
    seq.fit(), vec.fit()
    _assert_every_fit_stacked_as_sequentially(vec, seq)
    again = _loop(name, False, model=model)
    again.fit()
    assert torch.equal(again.server.state["global"], seq.server.state["global"])  # the same seed reproduces


def test_compiled_stacked_rounds_with_keyed_dropout_train_as_sequentially():
    """``trainer.compile`` with keyed dropout: the compiled vmapped step reads each client's key of the step
    and pads every step to the batch size, and still trains as the sequential worker (a real compile on
    the CPU: about 20 s the first time)."""
    model = {"name": "tests.engine.test_lockstep_real_runs:dropout_mlp"}

    def loop(vectorize: bool):
        trainer = {"rounds": 2, "eval_every": 2, "compile": vectorize}
        data = {"val_frac": 0.2, "augment": "flip"}  # clients of 34 to 237 samples: ragged stacks
        out = make_loop(tiny_config("fedavg", trainer=trainer, client=CLIENT, data=data, model=model))
        return _vectorized(out, True) if vectorize else out

    seq, vec = loop(False), loop(True)
    trainer, rows = vec.dispatcher.lockstep.trainer, []
    step = trainer.step
    trainer.step = lambda p, *rest: rows.append(len(p)) or step(p, *rest)
    seq.fit(), vec.fit()
    assert vec.worker.compile_clock.seconds is not None  # it compiled
    # every step of a group trains all its clients: one stack size, one compiled graph
    assert len(set(rows)) == 1 and len(rows) > 2
    assert vec.dispatcher.lockstep.stacked_fits > 0 and vec.dispatcher.lockstep.trainer.static_width
    assert_close(vec.server.state, seq.server.state, "server")
    assert_same_metrics(vec.history[-1], seq.history[-1])


@pytest.mark.parametrize("name, compiled_steps", [("apfl", 3), ("pgfed", 2)])
def test_compiled_custom_losses_and_full_passes_train_as_sequentially(name, compiled_steps, monkeypatch):
    """``trainer.compile`` compiles every padded stacked step: the default loss's and the full pass's
    (built with the trainer) and each custom loss's (APFL's mixture, built at its first fit); APFL and
    PGFed (its full pass) then train as the sequential worker (a real compile on the CPU). In float64:
    in float32 the compiled kernels' own summation order moves PGFed's kept momentum by up to 3e-5 after
    two rounds, in float64 by 2e-16, so a gap above 1e-10 is a different computation."""
    compiled = []
    real = torch.compile

    def recording(fn, **kwargs):
        if not isinstance(fn, torch.nn.Module):  # the model's forward is compiled too (pfl.runner.assembly)
            compiled.append(fn)
        return real(fn, **kwargs)

    def loop(vectorize: bool):
        trainer = {"rounds": 2, "eval_every": 2, "compile": vectorize}
        out = make_loop(tiny_config(name, trainer=trainer, client=CLIENT))
        return _vectorized(out, True) if vectorize else out

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        seq = loop(False)
        monkeypatch.setattr(torch, "compile", recording)
        vec = loop(True)
        seq.fit(), vec.fit()
    finally:
        torch.set_default_dtype(previous)
    assert len(compiled) == compiled_steps and vec.worker.compile_clock.seconds is not None
    assert vec.init_state.dtype == torch.float64
    lockstep = vec.dispatcher.lockstep
    assert lockstep.stacked_fits > 0 and lockstep.sequential_fits == 0
    assert_close(vec.server.state, seq.server.state, "server", atol=1e-10)
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients", atol=1e-10)
    assert_same_metrics(vec.history[-1], seq.history[-1], 1e-10)


def test_stacked_wrn_batchnorm_rounds_equal_the_sequential_rounds_in_float64():
    """Whole rounds of a Wide ResNet with BatchNorm (momentum kept across rounds, weight decay,
    augmentation; clients 0 and 3 end each epoch on a batch of 2 samples). In float32 the stacked run's
    metrics differ from the sequential run's by up to 0.065 after two rounds: in some fit a ReLU input
    within rounding of zero takes another sign, and training amplifies the changed gradient. In float64
    every state and metric agrees to 1e-12, so a small change of the stacked computation still fails here."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = {"name": "wrn28_10", "depth": 10, "widen": 1}
        client = {**CLIENT, "lr": 0.05}

        def loop(vectorize: bool):
            data = {"val_frac": 0.2, "augment": "flip"}
            cfg = tiny_config("fedavg", trainer={"rounds": 2, "eval_every": 1}, model=model, client=client, data=data)
            out = make_loop(cfg)
            out.worker.data.x = out.worker.data.x.double()
            return _vectorized(out) if vectorize else out

        seq, vec = loop(False), loop(True)
        assert [len(seq.worker.split(c).train) % 16 for c in (0, 3)] == [2, 2]
        seq.fit(), vec.fit()
        assert vec.dispatcher.lockstep.stacked_fits == 12 and vec.dispatcher.lockstep.sequential_fits == 0
        assert_close(vec.server.state, seq.server.state, "server", atol=1e-12)
        assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients", atol=1e-12)
        for got, expected in zip(vec.history, seq.history, strict=True):
            assert_same_metrics(got, expected, 1e-12)
    finally:
        torch.set_default_dtype(previous)


def test_char_lstm_rounds_on_shakespeare_train_stacked_as_sequentially():
    """The LSTM (LEAF's Shakespeare model) under vmap: each client's stacked weights through nn.LSTM, and
    FedRoD's split of it (its features, then the generic and personal heads)."""
    groups = {"data": {"source": "shakespeare", "num_clients": 4, "min_samples": 20}}
    groups["model"] = {"name": "char_lstm", "hidden": [16], "embed": 8}
    seq, vec = _loop("fedrod", False, **groups), _loop("fedrod", True, **groups)
    seq.fit(), vec.fit()
    _assert_every_fit_stacked_as_sequentially(vec, seq)
