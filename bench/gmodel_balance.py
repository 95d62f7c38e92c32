"""A method's G-model on the server's global test set: plain accuracy, class-balanced accuracy (mean
recall over the classes present) and the accuracy with the federation's training label prior added to
its logits (log of the class counts), with the test set's class shares.

``python -m bench.gmodel_balance METHOD [--config FILE] [fit arguments]``: trains METHOD on
conf/experiment/page_embedded_synthetic.yaml with conf/method/METHOD.yaml (or the given configs and
arguments) and prints one JSON line (docs/paper_vs_code.md, FedRoD).
"""

from __future__ import annotations

import json
import sys

import torch

from bench.common import make_loop
from pfl.data import build_data
from pfl.metrics.evaluate import predict
from pfl.runner.args import parse_fit_args

BASE = "conf/experiment/page_embedded_synthetic.yaml"


def balance(loop) -> dict[str, float | list[float]]:
    data = loop.worker.data
    c = data.num_classes
    counts = torch.bincount(data.y[torch.cat([s.train for s in data.clients])], minlength=c).double()
    idx = data.global_test
    y = data.y[idx]
    out = predict(loop.worker, loop.server["global"], idx).double()
    pred = out.argmax(1)
    recalls = [float((pred[y == k] == k).double().mean()) for k in range(c) if bool((y == k).any())]
    shifted = (out + counts.clamp_min(1).log()).argmax(1)
    shares = (torch.bincount(y, minlength=c).double() / len(y)).sort(descending=True).values
    return {
        "acc": float((pred == y).double().mean()),
        "balanced_acc": sum(recalls) / len(recalls),
        "acc_with_train_prior": float((shifted == y).double().mean()),
        "classes_in_test": len(recalls),
        "top3_class_shares": [round(float(v), 3) for v in shares[:3]],
    }


def main(argv: list[str]) -> dict:
    method, rest = argv[0], argv[1:]
    configs = rest if "--config" in rest else ["--config", f"conf/method/{method}.yaml", *rest]
    args = ["--config", BASE, *configs, "--trainer.progress", "false", "--tracking.wandb", "false"]
    cfg = parse_fit_args(args)[0]
    loop = make_loop(cfg, build_data(cfg.data, cfg.seed))
    loop.fit()
    metrics = loop.evaluate()
    row = {"method": method, "gm.acc": metrics["gm.acc"], "pm.l_acc.mean": metrics["pm.l_acc.mean"], **balance(loop)}
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main(sys.argv[1:])
