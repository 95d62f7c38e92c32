"""trainer.cuda_graphs (pfl.engine.cuda_graphs): capture once per input signature, replay on the new
inputs, outputs that a later replay cannot overwrite, the uncaptured fallback; and where the setting
applies. CUDA's graph API is replaced by a stand-in whose replay re-runs the captured call on the
captured tensors (no GPU here), so what is checked is the wrapper's bookkeeping."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pfl.engine.cuda_graphs as cg
from pfl.config import TrainerConfig, validate
from pfl.engine.stacked import StackedTrainer
from pfl.errors import ConfigError
from pfl.runner.training_path import graphs_clause, use_graphs
from tests.conftest import make_loop, tiny_config


class FakeGraph:
    """Replays the call captured inside ``torch.cuda.graph(self)`` on the tensors it was captured with,
    writing into the outputs it returned then (as a CUDA graph replays its kernels on its own memory)."""

    def __init__(self):
        self.call = None
        self.replays = 0

    def replay(self):
        fn, args, outputs = self.call
        for out, fresh in zip(outputs, fn(*args), strict=True):
            out.copy_(fresh)
        self.replays += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    capturing: list[FakeGraph] = []

    @contextlib.contextmanager
    def graph(g):
        capturing.append(g)
        try:
            yield
        finally:
            capturing.pop()

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    return capturing


def recorded(fn, capturing, calls):
    """``fn`` that counts its calls and tells a capturing graph what it computed."""

    def wrapped(*args):
        calls.append(tuple(a.clone() for a in args))
        out = fn(*args)
        if capturing:
            capturing[-1].call = (fn, args, out)
        return out

    return wrapped


def step(x, y):
    return x * 2 + y, (x * y).sum()


def test_the_first_call_of_a_signature_captures_and_later_calls_replay_on_their_own_inputs(fake_cuda):
    calls = []
    captured = cg.CapturedStep(recorded(step, fake_cuda, calls))
    x, y = torch.arange(4.0), torch.ones(4)
    first = captured(x, y)
    assert len(calls) == cg.WARMUP_CALLS + 1 and len(captured.graphs) == 1 and captured.replays == 1
    torch.testing.assert_close(first, step(x, y), rtol=0, atol=0)
    x2, y2 = torch.tensor([5.0, -1.0, 0.5, 3.0]), torch.full((4,), 2.0)
    second = captured(x2, y2)
    assert len(calls) == cg.WARMUP_CALLS + 1  # replayed, not called
    torch.testing.assert_close(second, step(x2, y2), rtol=0, atol=0)
    # the outputs are copies: a later replay does not change what an earlier call returned
    torch.testing.assert_close(first, step(x, y), rtol=0, atol=0)
    # the caller's inputs are copied in, never captured themselves
    static_inputs, _, _ = next(iter(captured.graphs.values()))
    assert all(s is not t for s, t in zip(static_inputs, (x2, y2), strict=True))


def test_each_input_signature_gets_its_own_graph(fake_cuda):
    calls = []
    captured = cg.CapturedStep(recorded(step, fake_cuda, calls))
    captured(torch.ones(4), torch.ones(4))
    captured(torch.ones(3), torch.ones(3))
    captured(torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64))
    captured(torch.ones(3), torch.ones(3))
    assert len(captured.graphs) == 3 and len(calls) == 3 * (cg.WARMUP_CALLS + 1)
    torch.testing.assert_close(captured(torch.ones(3) * 4, torch.ones(3)), step(torch.ones(3) * 4, torch.ones(3)))


def test_past_the_graph_limit_a_new_signature_runs_uncaptured(fake_cuda, monkeypatch):
    monkeypatch.setattr(cg, "MAX_GRAPHS", 2)
    calls = []
    captured = cg.CapturedStep(recorded(step, fake_cuda, calls))
    for n in (1, 2, 3, 3, 1):
        torch.testing.assert_close(captured(torch.ones(n) * n, torch.ones(n)), step(torch.ones(n) * n, torch.ones(n)))
    assert len(captured.graphs) == 2 and captured.replays == 3  # n=1 twice, n=2 once; n=3 called directly
    assert len(calls) == 2 * (cg.WARMUP_CALLS + 1) + 2


def test_a_trainer_holds_at_most_eight_graphs(fake_cuda):
    captured = cg.CapturedStep(recorded(step, fake_cuda, []))
    for n in range(1, 10):
        captured(torch.ones(n), torch.ones(n))
    assert len(captured.graphs) == 8 and captured.replays == 8  # the ninth signature ran uncaptured


def test_a_step_that_cannot_be_captured_runs_uncaptured_and_says_why(fake_cuda):
    calls = []

    def refusing(*args):
        if fake_cuda:
            raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
        return step(*args)

    captured = cg.CapturedStep(recorded(refusing, fake_cuda, calls))
    with pytest.warns(UserWarning, match=r"could not be captured \(RuntimeError: operation not permitted") as warned:
        out = captured(torch.ones(2), torch.ones(2))
    assert warned[0].filename == __file__  # the warning points at the step's caller
    torch.testing.assert_close(out, step(torch.ones(2), torch.ones(2)))
    assert captured.fallback == "RuntimeError: operation not permitted when stream is capturing"
    assert captured.graphs == {}
    before = len(calls)
    captured(torch.ones(5), torch.ones(5))
    assert len(calls) == before + 1 and captured.replays == 0  # called directly, never captured again


class NamedStream:
    def __init__(self, name):
        self.name = name

    def wait_stream(self, other):
        pass


class StreamModel:
    """CUDA's current stream as torch.cuda sets it: ``stream(s)`` makes ``s`` current and puts the previous
    one back on exit; ``graph(g)`` enters the capture stream and, as torch.cuda.graph does, raises from its
    exit without putting the caller's stream back when the step it captured failed (the capture is invalidated)."""

    def __init__(self):
        self.current = NamedStream("caller")
        self.capturing = False

    def stream(self, s):
        model = self

        class Context:
            def __enter__(self):
                self.before, model.current = model.current, s

            def __exit__(self, *exc):
                model.current = self.before

        return Context()

    def graph(self, g):
        model = self

        class Capture:
            def __enter__(self):
                self.ctx = model.stream(NamedStream("capture"))
                self.ctx.__enter__()
                model.capturing = True

            def __exit__(self, kind, *rest):
                model.capturing = False
                if kind is not None:  # capture_end on an invalidated capture raises before the stream's exit
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                self.ctx.__exit__(kind, *rest)

        return Capture()


def test_after_a_failed_capture_the_uncaptured_step_and_all_later_work_run_on_the_callers_stream(monkeypatch):
    """A step that syncs the host fails mid-capture, and torch.cuda.graph's exit then raises before it
    restores the caller's stream: left current, the capture stream would run the fallback and every later
    kernel of the round's thread, unordered with the clients' threads' work on the caller's stream."""
    model = StreamModel()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", model.graph)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: NamedStream("side"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: model.current)
    monkeypatch.setattr(torch.cuda, "stream", model.stream)
    streams = []

    def syncing(*args):
        streams.append(model.current.name)
        if model.capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return step(*args)

    captured = cg.CapturedStep(syncing)
    with pytest.warns(UserWarning, match="could not be captured"):
        out = captured(torch.ones(2), torch.ones(2))
    torch.testing.assert_close(out, step(torch.ones(2), torch.ones(2)))
    assert model.current.name == "caller" and streams[-1] == "caller"  # the fallback ran on the caller's stream
    assert "operation not permitted when stream is capturing" in captured.fallback  # the step's error, named


def test_a_failed_captures_reason_names_the_error_it_was_raised_over():
    def raised(body):
        try:
            body()
        except Exception as err:
            return err

    def over():
        try:
            raise RuntimeError("operation not permitted when stream is capturing\ndetail")
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture") from None

    assert cg.failure_reason(ValueError("bad\nmore")) == "ValueError: bad"
    assert cg.failure_reason(KeyError()) == "KeyError: "
    assert cg.failure_reason(raised(over)) == "RuntimeError: operation failed due to a previous error during capture"

    def during():
        try:
            raise RuntimeError("operation not permitted when stream is capturing\ndetail")
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904

    assert cg.failure_reason(raised(during)) == (
        "RuntimeError: operation failed due to a previous error during capture "
        "(over RuntimeError: operation not permitted when stream is capturing)"
    )

    def caused():
        raise TypeError("outer") from OSError("inner")

    assert cg.failure_reason(raised(caused)) == "TypeError: outer (over OSError: inner)"


def test_off_cuda_the_stacked_step_is_neither_captured_nor_padded():
    loop = make_loop(tiny_config("fedavg"))
    trainer = StackedTrainer(loop.worker, graphs=True)
    assert not isinstance(trainer.step, cg.CapturedStep) and trainer.static_width is False
    assert not isinstance(trainer.gradient_step, cg.CapturedStep)


def test_captured_steps_are_padded_to_the_batch_size(monkeypatch):
    loop = make_loop(tiny_config("fedavg"))
    monkeypatch.setattr(type(loop.worker), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    trainer = StackedTrainer(loop.worker, graphs=True)
    assert isinstance(trainer.step, cg.CapturedStep) and trainer.static_width is True
    assert isinstance(trainer.gradient_step, cg.CapturedStep)  # PGFed's full pass too
    compiled = StackedTrainer(loop.worker, graphs=False)
    assert not isinstance(compiled.step, cg.CapturedStep) and compiled.static_width is False


def test_cuda_graphs_with_compile_is_refused_in_one_line_and_auto_captures_only_without_compile():
    with pytest.raises(ConfigError, match=r"trainer\.cuda_graphs: cannot be combined with trainer\.compile"):
        validate(tiny_config("fedavg", trainer={"cuda_graphs": True, "compile": True}))
    with pytest.raises(ConfigError, match=r"trainer\.cuda_graphs: must be true, false or auto \(got 'yes'\)"):
        validate(tiny_config("fedavg", trainer={"cuda_graphs": "yes"}))
    validate(tiny_config("fedavg", trainer={"cuda_graphs": "auto", "compile": True}))
    assert TrainerConfig().cuda_graphs == "auto"
    assert [use_graphs(s, c) for s in (True, "auto", False) for c in (False, True)] == [
        True, True, True, False, False, False]  # fmt: skip


def test_the_run_says_what_cuda_graphs_does_on_its_path():
    replayed = "; its step replayed from CUDA graphs (trainer.cuda_graphs {})"
    assert graphs_clause("auto", False, True, "cuda") == replayed.format("auto")
    assert graphs_clause(True, False, True, "cuda") == replayed.format("true")
    assert graphs_clause("auto", True, True, "cuda") == ""  # compiled: not captured
    assert graphs_clause(False, False, True, "cuda") == ""
    assert graphs_clause("auto", False, True, "cpu") == graphs_clause("auto", False, False, "cuda") == ""
    assert graphs_clause(True, False, True, "cpu") == "; trainer.cuda_graphs is ignored on cpu"
    assert graphs_clause(True, False, False, "cuda") == (
        "; trainer.cuda_graphs is ignored: clients are trained one at a time"
    )


def test_captured_fits_train_a_power_of_two_of_their_clients_one_graph_per_stack_size(fake_cuda, monkeypatch):
    """Ragged clients: each captured step trains the clients with a batch filled up to a power of two (at
    most all of them), so the fit meets a few stack sizes, one graph each; the results are the uncaptured
    fit's."""
    from pfl.engine.stacked import FitRequest
    from pfl.engine.trainer import FitSpec

    loop = make_loop(tiny_config("fedavg", client={"batch_size": 8}))
    w, start = loop.worker, loop.init_state
    specs = [FitSpec(epochs=e) for e in (4, 3, 2, 1, 1)]  # ragged: 5 clients, then fewer and fewer

    def fit(graphs: bool):
        requests = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in enumerate(specs)]
        with monkeypatch.context() as m:  # a trainer built for CUDA (it captures), trained on the CPU
            m.setattr(type(w), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
            trainer = StackedTrainer(w, graphs=graphs)
        if graphs:
            trainer.step.fn = recorded(trainer.step.fn, fake_cuda, [])
        trainer.train(requests)
        return trainer, torch.stack([r.out for r in requests])

    _, eager = fit(False)
    trainer, captured = fit(True)
    sizes = sorted(key[0][0][0] for key in trainer.step.graphs)  # each graph's number of rows
    assert sizes == [1, 2, 4, 5] and trainer.step.replays > len(sizes)
    torch.testing.assert_close(captured, eager, rtol=0, atol=1e-6)


def test_a_custom_losss_step_is_captured_as_the_default_losss_and_trains_as_uncaptured(fake_cuda, monkeypatch):
    """A stacked custom loss (pfl.engine.stacked_loss, e.g. APFL's mixture) gets its own captured step:
    one graph per stack size, the extra tensors and parameters as the uncaptured fit leaves them."""
    from pfl.engine.stacked import FitRequest
    from pfl.engine.stacked_loss import StackedLoss
    from pfl.engine.terms import ExtraParamSGD
    from pfl.engine.trainer import FitSpec
    from tests.engine.test_stacked_loss import ShiftedLoss

    loop = make_loop(tiny_config("fedavg", client={"batch_size": 8}))
    w, start = loop.worker, loop.init_state
    g = torch.Generator().manual_seed(0)
    extras = [0.1 * torch.randn(10, generator=g) for _ in range(3)]
    shifts = [torch.rand(10, generator=g) + 0.5 for _ in range(3)]

    def fit(graphs: bool):
        specs = []
        for k, epochs in enumerate((3, 2, 1)):  # ragged: 3 clients, then fewer
            term = ExtraParamSGD(extras[k].clone().requires_grad_(True), lr=0.3, momentum=0.5)
            specs.append(FitSpec(epochs=epochs, terms=[term], loss_fn=lambda net, x, y: net(x).sum(),
                                 stacked_loss=StackedLoss(ShiftedLoss(), term, (shifts[k],))))  # fmt: skip
        requests = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in enumerate(specs)]
        with monkeypatch.context() as m:  # a trainer built for CUDA (it captures), trained on the CPU
            m.setattr(type(w), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
            trainer = StackedTrainer(w, graphs=graphs)
        loss_step = trainer._loss_step(specs[0].stacked_loss)
        if graphs:
            loss_step.fn = recorded(loss_step.fn, fake_cuda, [])
        trainer.train(requests)
        extra = torch.stack([s.stacked_loss.extra.tensor.detach() for s in specs])
        return trainer, loss_step, torch.stack([r.out for r in requests]), extra

    _, eager_step, eager, eager_extra = fit(False)
    trainer, step, captured, captured_extra = fit(True)
    assert not isinstance(eager_step, cg.CapturedStep) and isinstance(step, cg.CapturedStep)
    assert trainer.captured_steps()[-1] is step and trainer.step in trainer.captured_steps()
    assert sorted(key[0][0][0] for key in step.graphs) == [1, 2, 3] and step.replays > 3
    assert trainer.step.replays == 0  # the default loss's step never ran
    torch.testing.assert_close(captured, eager, rtol=0, atol=1e-6)
    torch.testing.assert_close(captured_extra, eager_extra, rtol=0, atol=1e-6)
    assert not torch.equal(captured_extra, torch.stack(extras))  # the extra tensors trained


def test_a_methods_own_gradient_calls_are_captured_once_per_stack_size_and_batch_width(fake_cuda, monkeypatch):
    """pFedMe's and Per-FedAvg's ``client.gradient`` calls, served stacked (``batch_gradients``): replayed
    from one graph per number of calls and batch width, each client resuming as its sequential calls leave it."""
    from pfl.engine.lockstep import Lockstep
    from tests.engine.test_batch_gradients import _own_loop
    from tests.engine.test_stacked import _worker

    w = _worker().worker
    start = w.flat.snapshot()
    cids = [0, 1, 2]
    expected = [_own_loop(c, start)(w) for c in cids]
    with monkeypatch.context() as m:  # a trainer built for CUDA (it captures), trained on the CPU
        m.setattr(type(w), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
        trainer = StackedTrainer(w, graphs=True)
    captured = trainer._batch_gradient
    assert isinstance(captured, cg.CapturedStep) and captured in trainer.captured_steps()
    captured.fn = recorded(captured.fn, fake_cuda, [])
    lockstep = Lockstep(w, trainer)
    got = lockstep.run([_own_loop(c, start) for c in cids])
    assert lockstep.stacked_batch_gradients > 0 and lockstep.sequential_gradients == 0
    shapes = {key[1][0][:2] for key in captured.graphs}  # (calls, batch width) of each graph's x
    assert shapes == {(3, 16), (2, 16)}  # all three clients' calls, then two (one client's batches ran out)
    assert 0 < captured.replays < lockstep.stacked_batch_gradients  # several calls per replay
    for a, b in zip(got, expected, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_gradient_calls_on_a_model_with_integer_buffers_stay_uncaptured(monkeypatch):
    """An integer buffer would be one more input of the captured pass: such a model's calls run uncaptured."""
    loop = make_loop(tiny_config("fedavg"))
    w = loop.worker
    monkeypatch.setattr(type(w), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    assert isinstance(StackedTrainer(w, graphs=True)._batch_gradient, cg.CapturedStep)
    w.module.net.register_buffer("calls", torch.zeros((), dtype=torch.long))
    trainer = StackedTrainer(w, graphs=True)
    assert trainer._batch_gradient is None and isinstance(trainer.step, cg.CapturedStep)


# What a captured step may not do on CUDA: read a value back to the host (.item(), bool(), float()) or
# size a result by its values (nonzero, masked_select, unique): capture refuses the synchronization.
HOST_SYNCS = {
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal", "aten::nonzero",
    "aten::masked_select", "aten::unique_dim", "aten::_unique2", "aten::unique_consecutive",
    "aten::repeat_interleave",
}  # fmt: skip


class NoHostSync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in HOST_SYNCS:
            raise RuntimeError(f"{func._schema.name} synchronizes the host inside a captured step")
        return func(*args, **(kwargs or {}))


def capture_without_host_syncs(self, inputs):
    """``CapturedStep._capture`` on the CPU: the step run once as capture would run it (a host sync raises,
    as CUDA does), then replayed by re-running it on the static inputs."""
    static = [t.clone() for t in inputs]
    with NoHostSync():
        outputs = self.fn(*static)
    graph = FakeGraph()
    graph.call = (self.fn, static, outputs)
    return static, tuple(outputs), graph


KEYED = {"name": "tests.engine.test_lockstep_real_runs:dropout_mlp"}


@pytest.mark.parametrize(
    "name, model",
    [("fedavg", KEYED), ("pgfed", KEYED)]
    + [(n, None) for n in ("plgu_lf", "fedrep", "apfl", "fedrod", "splitgp", "pfedme", "perfedavg", "fedala")],
)
def test_every_step_a_run_captures_runs_without_host_syncs(name, model, monkeypatch):
    """The padded fit steps (keyed dropout, SAM's), PGFed's full pass, the custom losses' steps and a
    method's own gradient calls, as a round captures them: none reads a value back to the host, which
    would fail the capture on CUDA and leave the step uncaptured."""
    groups = {"trainer": {"rounds": 1, "vectorize": True}}
    if model is not None:
        groups["model"] = model
    loop = make_loop(tiny_config(name, **groups))
    w = loop.worker
    with monkeypatch.context() as m:  # a trainer built for CUDA (it captures), trained on the CPU
        m.setattr(type(w), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
        trainer = loop.dispatcher.lockstep.trainer = StackedTrainer(w, graphs=True)
    monkeypatch.setattr(cg.CapturedStep, "_capture", capture_without_host_syncs)
    loop.run_round()
    steps = trainer.captured_steps()
    assert [s.fallback for s in steps] == [None] * len(steps)
    assert sum(s.replays for s in steps) > 0
