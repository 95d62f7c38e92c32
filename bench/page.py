"""PAGE at scale: seconds per round, the agents' share (Table 5's split) and peak memory, on Synthetic.

    python -m bench.page --clients 1000 --rounds 3            # PAGE and FedAvg, one process each
    python -m bench.page --clients 100 --epochs 20 --batch-size 5 --methods page

Each (method, clients) runs in its own process so that its peak resident memory (VmHWM) is its own.
The federation is PAGE's Synthetic generator (30-dim inputs, 30 classes, 375 samples per client,
logistic model), every client every round; PAGE uses conf/method/page_short.yaml's agents with the
epoch ceiling set to ``--epochs`` and a replay capacity of 2 000 (the run never fills it, so the
actions are those of the paper's 60 000).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_mb() -> float:
    """VmHWM of this process in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(method: str, clients: int, rounds: int, epochs: int, batch_size: int) -> dict:
    from pfl.data import build_data
    from pfl.runner.args import parse_fit_args
    from pfl.runner.assembly import build_loop
    from pfl.runner.plan import plan_run

    argv = ["--config", "conf/experiment/page_embedded_synthetic.yaml", "--data.num_clients", str(clients)]
    argv += ["--client.epochs", str(epochs), "--client.batch_size", str(batch_size), "--tracking.wandb", "false"]
    if method == "page":
        argv += ["--config", "conf/method/page_short.yaml", "--method.epoch_max", str(epochs)]
        argv += ["--method.buffer_size", "2000"]
    else:
        argv += ["--method.name", method]
    cfg = parse_fit_args(argv)[0]
    started = time.perf_counter()
    loop = build_loop(plan_run(cfg, build_data(cfg.data, cfg.seed)))
    setup_s = time.perf_counter() - started
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        loop.run_round()
        seconds.append(time.perf_counter() - started)
    started = time.perf_counter()
    metrics = loop.evaluate()
    eval_s = time.perf_counter() - started
    row = {
        "method": method,
        "clients": clients,
        "epochs": epochs,
        "batch_size": batch_size,
        "setup_s": round(setup_s, 2),
        "round_s": [round(s, 2) for s in seconds],
        "eval_s": round(eval_s, 2),
        "gm.acc": round(metrics["gm.acc"], 4),
        "pm.l_acc.mean": round(metrics["pm.l_acc.mean"], 4),
        "vmhwm_mb": round(peak_rss_mb(), 1),
    }
    row.update({k: round(v, 3) for k, v in metrics.items() if k.startswith("time.page.")})
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000])
    parser.add_argument("--methods", nargs="+", default=["page", "fedavg"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "CLIENTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        row = measure(args.one[0], int(args.one[1]), args.rounds, args.epochs, args.batch_size)
        print(json.dumps(row))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for clients in args.clients:
        for method in args.methods:
            cmd = [sys.executable, "-m", "bench.page", "--one", method, str(clients), "--rounds", str(args.rounds)]
            cmd += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
            out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
