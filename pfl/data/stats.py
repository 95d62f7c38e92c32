"""Describe a federation: per-client split sizes, label histograms, a table, and summary figures."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pfl.data.federated import ClientSplit, FederatedData


def label_histograms(data: FederatedData, clients: list[ClientSplit] | None = None) -> np.ndarray:
    """(clients, classes) counts over each client's train + val + test samples."""
    y = data.y.cpu().numpy()
    rows = []
    for c in data.clients if clients is None else clients:
        idx = np.concatenate([c.train.cpu().numpy(), c.val.cpu().numpy(), c.test.cpu().numpy()])
        rows.append(np.bincount(y[idx], minlength=data.num_classes))
    return np.asarray(rows, dtype=np.int64).reshape(-1, data.num_classes)


def _rows(data: FederatedData, clients: list[ClientSplit], offset: int) -> list[dict[str, Any]]:
    hist = label_histograms(data, clients)
    out = []
    for k, (c, h) in enumerate(zip(clients, hist, strict=True)):
        row: dict[str, Any] = {"id": offset + k}
        if data.client_names:
            row["name"] = data.client_names[offset + k]
        row.update(train=len(c.train), val=len(c.val), test=len(c.test), labels=h.tolist())
        out.append(row)
    return out


def _entropy(hist: np.ndarray) -> np.ndarray:
    p = hist / np.maximum(hist.sum(1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)


def federation_stats(data: FederatedData) -> dict[str, Any]:
    hist = label_histograms(data)
    sizes = hist.sum(1)
    train = np.asarray(data.sizes("train"))
    summary = {
        "clients": data.num_clients,
        "new_clients": len(data.new_clients),
        "samples": int(len(data.y)),
        "global_test": int(len(data.global_test)),
        "client_size_mean": float(sizes.mean()),
        "client_size_std": float(sizes.std()),
        "client_size_min": int(sizes.min()),
        "client_size_max": int(sizes.max()),
        "train_size_mean": float(train.mean()),
        "classes_per_client_mean": float((hist > 0).sum(1).mean()),
        "classes_per_client_min": int((hist > 0).sum(1).min()),
        "label_entropy_mean": float(_entropy(hist).mean()),  # nats; log(num_classes) when balanced
    }
    return {
        "dataset": data.name,
        "num_classes": data.num_classes,
        "input_shape": list(data.input_shape),
        "summary": summary,
        "clients": _rows(data, data.clients, 0),
        "new_clients": _rows(data, data.new_clients, data.num_clients),
    }


def client_label_stats(labels: list[int]) -> tuple[int, float, float]:
    """(classes present, label entropy in nats, share of the most frequent class) of one client's
    label counts; entropy is log(#classes) for a balanced client, 0 for a single-class one."""
    hist = np.asarray(labels, dtype=np.float64)[None]
    total = hist.sum()
    dominant = float(hist.max() / total) if total else 0.0
    return int((hist > 0).sum()), float(_entropy(hist)[0]), dominant


def format_stats(report: dict[str, Any]) -> str:
    """``federation_stats`` as a table: one row per client (id, name when the data has names, split
    sizes, classes present, label entropy, dominant-class share), the new clients after a rule, then
    the summary."""
    rows = [(False, r) for r in report["clients"]] + [(True, r) for r in report["new_clients"]]
    named = any("name" in r for _, r in rows)
    header = ["client", *(["name"] if named else []), "train", "val", "test", "classes", "entropy", "dominant"]
    table = [header]
    for is_new, r in rows:
        classes, entropy, dominant = client_label_stats(r["labels"])
        cells = [f"{r['id']}{'*' if is_new else ''}", *([str(r.get("name", ""))] if named else [])]
        cells += [str(r["train"]), str(r["val"]), str(r["test"]), str(classes), f"{entropy:.3f}", f"{dominant:.2f}"]
        table.append(cells)
    widths = [max(len(row[j]) for row in table) for j in range(len(header))]
    text_cols = {1} if named else set()

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if j in text_cols else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "  ".join("-" * w for w in widths)
    s = report["summary"]
    shape = "x".join(str(d) for d in report["input_shape"])
    out = [
        f"{report['dataset']}: {s['clients']} clients"
        + (f" + {s['new_clients']} new (marked *)" if s["new_clients"] else "")
        + f", {report['num_classes']} classes, input {shape}",
        line(header),
        rule,
    ]
    for k, cells in enumerate(table[1:]):
        if k == len(report["clients"]):  # the new clients follow a rule
            out.append(rule)
        out.append(line(cells))
    balanced = math.log(report["num_classes"]) if report["num_classes"] > 1 else 0.0
    out += [
        "",
        f"summary: {s['samples']} samples in all, {s['global_test']} of them in the global test set",
        f"  training clients: size {s['client_size_mean']:.1f} ± {s['client_size_std']:.1f} "
        f"(min {s['client_size_min']}, max {s['client_size_max']}), train split {s['train_size_mean']:.1f} on average",
        f"  classes per client {s['classes_per_client_mean']:.2f} (min {s['classes_per_client_min']}), "
        f"label entropy {s['label_entropy_mean']:.3f} nats on average ({balanced:.3f} when balanced)",
    ]
    if "plot" in report:
        out.append(f"heatmap: {report['plot']}")
    return "\n".join(out) + "\n"
