"""Which way a run trains its sampled clients (``trainer.vectorize``): together or one at a time, and why.

``auto`` (the default) trains them together only on CUDA and only when nothing refuses it: on a CPU
the stacked step is slower than the sequential loop (docs/performance.md, "Vectorized clients"),
while on a GPU small clients are launch-bound one at a time. ``true`` insists (a refusal is a
ConfigError naming the reasons, raised by ``pfl.runner.plan.plan_run`` before anything is built);
``false`` never vectorizes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pfl.errors import require


@dataclass(frozen=True)
class TrainingPath:
    """The chosen path (``vectorize``) and the one log line that says which and why; ``said`` is whether
    the run prints it (not for the default on a CPU or MPS, where ``auto`` keeps the sequential path and
    an extra line would only sit beside a command's results and its one-line errors)."""

    vectorize: bool
    line: str
    said: bool = True


def choose_path(setting: bool | str, problems: list[str], device_type: str, method: str) -> TrainingPath:
    """The path of a run whose ``trainer.vectorize`` is ``setting``, given what refuses vectorizing
    (``pfl.federation.dispatch.vectorize_problems``: read by ``auto`` only, since the plan of a run that
    sets ``true`` has refused it already when anything stands in the way) and the training device's
    type (cpu, cuda, mps)."""
    if setting is False:
        return TrainingPath(False, "clients trained one at a time: trainer.vectorize is false")
    if setting is True:
        return TrainingPath(True, f"clients trained together (vectorized): trainer.vectorize is true, {method}")
    if device_type != "cuda":
        reason = f"trainer.vectorize auto trains clients together only on CUDA (this run is on {device_type})"
        return TrainingPath(False, f"clients trained one at a time: {reason}", said=False)
    if problems:
        return TrainingPath(False, "clients trained one at a time: " + "; ".join(problems))
    return TrainingPath(True, f"clients trained together (vectorized): cuda, method {method} allows it")


def use_graphs(setting: bool | str, compile: bool) -> bool:
    """Whether the vectorized step is captured on CUDA (``trainer.cuda_graphs``; auto: when not compiled)."""
    return setting is True or (setting == "auto" and not compile)


def graphs_clause(setting: bool | str, compile: bool, vectorized: bool, device_type: str) -> str:
    """What ``trainer.cuda_graphs`` does on this path, as a clause of its log line ("" when it does
    nothing worth a word: off, or auto where it does not apply)."""
    if not use_graphs(setting, compile):
        return ""
    if vectorized and device_type == "cuda":
        return f"; its step replayed from CUDA graphs (trainer.cuda_graphs {str(setting).lower()})"
    if setting == "auto":
        return ""
    if device_type != "cuda":
        return f"; trainer.cuda_graphs is ignored on {device_type}"
    return "; trainer.cuda_graphs is ignored: clients are trained one at a time"


def require_vectorizable(problems: list[str]) -> None:
    """``trainer.vectorize true`` refused in one line naming what stands in the way."""
    require(not problems, "trainer.vectorize", "; ".join(problems), "set trainer.vectorize false or auto")


def announce(line: str) -> None:
    """The run's one line on its training path, on stderr (stdout carries the command's results)."""
    print(f"pfl: {line}", file=sys.stderr, flush=True)


__all__ = ["TrainingPath", "announce", "choose_path", "graphs_clause", "require_vectorizable", "use_graphs"]
