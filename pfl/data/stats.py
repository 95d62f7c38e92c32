"""Describe a federation: per-client split sizes, label histograms and summary figures."""

from __future__ import annotations

from pathlib import Path
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


def plot_heatmap(data: FederatedData, path: Path) -> None:
    """A clients x classes heatmap of sample counts (training clients, then new clients)."""
    from matplotlib.ticker import MaxNLocator

    from pfl.metrics.plots import plt, save_figure

    hist = label_histograms(data, [*data.clients, *data.new_clients])
    fig, ax = plt.subplots(figsize=(min(2 + 0.25 * data.num_classes, 20), min(2 + 0.15 * len(hist), 30)))
    image = ax.imshow(hist, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(f"{data.name}: samples per client and class")
    if data.new_clients:
        ax.axhline(data.num_clients - 0.5, color="red", linewidth=1)
    fig.colorbar(image, ax=ax, label="samples")
    save_figure(fig, path)
