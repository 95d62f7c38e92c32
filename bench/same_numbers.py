"""Same seeds, same numbers: every registered method's ``summary.json`` metrics, to compare across a change.

A refactor of the loop, the engine or a method must leave every number bit-identical. This script runs
each registered method (its ``conf/method/<name>.yaml`` on ``conf/default.yaml``, 4 rounds, evaluated
after rounds 2 and 4, checkpointed) and a few settings that take other paths through the round
(vectorized training, an attack, a server optimizer, the disk client store, a resumed run, several
clients' fits per round), and writes their comparable metrics (everything but timings) with every
float's exact ``repr``::

    python -m bench.same_numbers --write before.json      # on the old code
    python -m bench.same_numbers --check before.json      # on the new code: exit 1 on any difference

The file also records the platform of its runs (``pfl.numeric_platform``): a check on another platform (another
CPU's kernels, another torch) says so first, since numbers can differ there without any change in the code.

Cost: about 2 CPU-minutes (one thread per run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pfl import numeric_platform
from pfl.federation.loop import comparable_metrics
from pfl.methods.registry import methods
from pfl.runner.args import parse_fit_args
from pfl.runner.experiment import run_experiment

CONF = Path(__file__).resolve().parents[1] / "conf"
COMMON = ["--trainer.rounds", "4", "--trainer.eval_every", "2", "--trainer.progress", "false",
          "--tracking.wandb", "false", "--data.num_clients", "8", "--trainer.fraction", "0.5"]  # fmt: skip
# Methods whose warm-up is sized for paper-length runs use their short configs (as tests/methods/defaults_learn.py).
SHORT_RUN = {"page": ["--config", str(CONF / "method" / "page_short.yaml"), "--data.val_frac", "0.1",
                      "--method.warmup", "2"],
             "dapfl": ["--config", str(CONF / "method" / "dapfl_short.yaml"), "--data.val_frac", "0.1",
                       "--method.warmup", "2"]}  # fmt: skip
# Settings that take other paths through the round: (name, method, extra arguments).
PATHS = [
    ("fedavg+vectorize", "fedavg", ["--trainer.vectorize", "true"]),
    ("ditto+vectorize", "ditto", ["--trainer.vectorize", "true"]),
    (
        "fedprox+vectorize+momentum",
        "fedprox",
        ["--trainer.vectorize", "true", "--client.momentum", "0.9", "--client.weight_decay", "0.001"],
    ),
    (
        "ditto_gradient+vectorize+momentum",
        "ditto",
        ["--trainer.vectorize", "true", "--method.prox", "gradient", "--client.momentum", "0.5"],
    ),
    ("fedavg+attack_scale", "fedavg", ["--attack.kind", "scale", "--attack.fraction", "0.25"]),
    ("fedavg+server_adam", "fedavg", ["--server.optimizer", "adam", "--server.lr", "0.01"]),
    ("fedrep+disk_store", "fedrep", ["--trainer.client_store", "disk", "--trainer.store_budget_mb", "0"]),
    ("fedavg+lr_decay", "fedavg", ["--client.lr_decay", "0.9"]),
    ("ditto+checkpoint_every3", "ditto", ["--trainer.checkpoint_every", "3"]),
]


def method_argv(name: str) -> list[str]:
    own = CONF / "method" / f"{name}.yaml"
    argv = ["--config", str(CONF / "default.yaml")]
    if name in SHORT_RUN:
        return argv + SHORT_RUN[name]
    return argv + (["--config", str(own)] if own.exists() else ["--method", name])


def exact(metrics: dict[str, Any]) -> dict[str, str]:
    """Each value's exact text (floats by repr: a last-bit change shows)."""
    return {key: repr(value) for key, value in sorted(metrics.items())}


def run(argv: list[str], root: Path, resume: Path | None = None) -> dict[str, Any]:
    cfg = parse_fit_args(argv + ["--tracking.root", str(root)])[0]
    return run_experiment(cfg, resume_dir=resume)


def scenarios() -> Iterator[tuple[str, list[str]]]:
    for name in sorted(methods()):
        yield name, method_argv(name) + COMMON
    for label, name, extra in PATHS:
        yield label, method_argv(name) + COMMON + extra


def collect(only: list[str] | None = None) -> tuple[dict[str, dict[str, str]], dict[str, Any] | None]:
    """Each scenario's exact metrics, and the platform its runs recorded (None: no scenario ran)."""
    out: dict[str, dict[str, str]] = {}
    platform = None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for label, argv in scenarios():
            if only and label not in only:
                continue
            summary = run(argv, root / label)
            platform = platform or summary.get("platform")
            out[label] = exact(comparable_metrics(summary))
            print(f"{label}: {len(out[label])} metrics", flush=True)
        if not only or "pgfed+resume" in only:
            # A run killed after round 2 and resumed: the resumed run's numbers, which must also not change.
            argv = method_argv("pgfed") + COMMON
            folder = root / "resume" / "run"
            first = parse_fit_args([*argv, "--trainer.rounds", "2", "--tracking.root", str(root / "resume")])[0]
            run_experiment(first, run_dir=folder)
            summary = run(argv, root / "resume", resume=folder)
            out["pgfed+resume"] = exact(comparable_metrics(summary))
            platform = platform or summary.get("platform")
            print(f"pgfed+resume: {len(out['pgfed+resume'])} metrics", flush=True)
    return out, platform


def read_numbers(path: Path) -> tuple[dict[str, dict[str, str]], dict[str, Any] | None]:
    """A written file's metrics and platform (a file written before platforms were recorded: None)."""
    data = json.loads(path.read_text())
    if "runs" in data and "platform" in data:
        return data["runs"], data["platform"]
    return data, None


def platform_note(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str | None:
    """A line when the file's runs and these ran on different platforms (None: the same one, or unknown)."""
    if before is None or after is None or before == after:
        return None
    return (
        f"platforms differ: the file's runs on {numeric_platform.label(before)}, these on "
        f"{numeric_platform.label(after)}; numbers can differ by platform alone"
    )


def differences(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> list[str]:
    lines = []
    for label in sorted(set(before) | set(after)):
        old, new = before.get(label), after.get(label)
        if old is None or new is None:
            lines.append(f"{label}: only {'after' if old is None else 'before'}")
            continue
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                lines.append(f"{label}: {key} {old.get(key)} -> {new.get(key)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, help="write the metrics of this code to FILE")
    mode.add_argument("--check", type=Path, help="compare this code's metrics with FILE")
    parser.add_argument("--only", nargs="*", help="scenarios to run (default: all)")
    args = parser.parse_args(argv)
    numbers, platform = collect(args.only)
    if args.write is not None:
        args.write.write_text(json.dumps({"platform": platform, "runs": numbers}, indent=1, sort_keys=True) + "\n")
        print(f"{len(numbers)} runs, {sum(map(len, numbers.values()))} metrics -> {args.write}")
        return 0
    before, written_on = read_numbers(args.check)
    note = platform_note(written_on, platform)
    if note:
        print(note)
    if args.only:
        before = {k: v for k, v in before.items() if k in args.only}
    diff = differences(before, numbers)
    total = sum(map(len, numbers.values()))
    print(f"{len(numbers)} runs, {total} metrics compared: {len(diff)} differ")
    for line in diff:
        print("  " + line)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
