"""``python -m bench.gpu`` in its small (CPU) size: one table, every cell a positive figure or a reason."""

from __future__ import annotations

import json
import re

from bench.gpu import HEADER, LABELS, main
from bench.gpu_paths import PATHS
from bench.gpu_workloads import workloads

ONLY = ["fedavg-cnn", "pgfed-resnet18-gn"]  # a FedAvg row group (vs the plain loop) and a method's (vs sequential)
NUMBER = re.compile(r"^\d[\d ]*$")


def test_the_small_table_has_every_path_with_a_figure_or_a_reason(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert main(["--small", "--procs", "2", "--only", ",".join(ONLY), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bench.gpu on cpu") and "small" in lines[0]
    table = [line for line in lines if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert tuple(rows[0]) == HEADER and len(rows) == 2 + len(ONLY) * len(PATHS)
    labels = [LABELS[p].replace("N processes", "2 processes") for p in PATHS]
    assert [(r[0], r[1]) for r in rows[2:]] == [(w, label) for w in ONLY for label in labels]
    reason = re.compile(r"^(refused|failed|stopped|skipped|not run|the plain)")
    for _, path, rate, ratio, memory, note in rows[2:]:
        if NUMBER.match(rate):
            assert int(rate.replace(" ", "")) > 0 and re.match(r"^\d+\.\d\dx (plain|sequential)$", ratio), (path, ratio)
        else:
            assert rate == "-" and ratio == "-" and reason.match(note), (path, note)
        assert memory == "-"  # no GPU: no allocator peak
    by_path = {(r[0], r[1]): r for r in rows[2:]}
    assert by_path["fedavg-cnn", "plain PyTorch loop"][3] == "1.00x plain"
    assert by_path["pgfed-resnet18-gn", "pfl sequential"][3] == "1.00x sequential"
    for workload in ONLY:  # the paths that run on any CPU did run
        for label in ("pfl sequential", "pfl 2 processes"):
            assert NUMBER.match(by_path[workload, label][2]), by_path[workload, label]
    assert NUMBER.match(by_path["fedavg-cnn", "pfl vectorized"][2])
    record = json.loads(out.read_text())
    assert record["small"] is True and record["processes"] == 2
    cells = record["cells"]
    assert [(c["workload"], c["path"]) for c in cells] == [(w, p) for w in ONLY for p in PATHS]
    for c in cells:
        assert (c["samples_per_s"] is not None and c["samples_per_s"] > 0) != bool(c["reason"]), c


def test_the_workloads_are_the_ones_the_table_promises():
    full = {w.name: w for w in workloads(small=False)}
    assert list(full) == [
        "fedavg-cnn",
        "fedavg-resnet18-gn",
        "fedavg-resnet18-gn-bf16",
        "pgfed-resnet18-gn",
        "fedrep-resnet18-gn",
        "plgu_lf-resnet18-gn",
    ]
    cnn, resnet = full["fedavg-cnn"], full["fedavg-resnet18-gn"]
    assert (cnn.model.channels, cnn.model.fc, cnn.per_round, cnn.batch_size, cnn.side) == ([32, 64], 512, 20, 10, 28)
    assert (resnet.model.name, resnet.model.norm, resnet.model.stem) == ("timm:resnet18", "group", "cifar")
    assert (resnet.num_clients, resnet.samples_per_client, resnet.per_round, resnet.batch_size) == (50, 500, 10, 32)
    assert full["fedavg-resnet18-gn-bf16"].precision == "bf16-mixed"
    assert [w.baseline for w in full.values()] == ["plain"] * 3 + ["sequential"] * 3
    assert [w.name for w in workloads(small=True)] == list(full)
    optional = workloads(small=False, optional=True)[len(full) :]
    assert [(w.name, w.method, w.model, w.baseline) for w in optional] == [
        (f"{m}-cnn", m, cnn.model, "sequential") for m in ("apfl", "fedrod", "pfedme", "perfedavg")
    ]


def test_optional_rows_run_when_named_and_their_methods_train_stacked(tmp_path):
    out = tmp_path / "gpu.json"
    only = "apfl-cnn,pfedme-cnn"
    assert main(["--small", "--only", only, "--paths", "sequential,vectorized", "--json", str(out)]) == 0
    cells = {(c["workload"], c["path"]): c for c in json.loads(out.read_text())["cells"]}
    for workload in only.split(","):
        for path in ("sequential", "vectorized"):
            assert cells[workload, path]["samples_per_s"] > 0, cells[workload, path]


def test_paths_left_out_say_so_and_the_others_still_run(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    # sequential alone (the processes path runs in the table above; its children cost seconds to start)
    assert main(["--small", "--only", "fedavg-cnn", "--paths", "sequential", "--json", str(out)]) == 0
    cells = {c["path"]: c for c in json.loads(out.read_text())["cells"]}
    assert list(cells) == list(PATHS)
    assert cells["sequential"]["samples_per_s"] > 0, cells["sequential"]
    for path in ("plain", "vectorized", "captured", "processes", "compiled"):
        assert cells[path]["reason"] == "not run: --paths leaves it out", cells[path]
    progress = capsys.readouterr().err
    assert "fedavg-cnn / sequential:" in progress and "samples/s" in progress


def test_an_unknown_path_is_refused_by_name(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--small", "--paths", "vectorised"])
    assert "--paths: unknown path(s) vectorised" in capsys.readouterr().err


def test_a_cuda_allocator_that_refuses_to_empty_its_cache_does_not_stop_the_table(monkeypatch):
    import types

    import torch

    import bench.gpu_paths as gpu_paths

    calls = []

    def refuse() -> None:  # what torch does after a failed capture left the allocator marked as capturing
        calls.append("empty_cache")
        raise RuntimeError("captures_underway.empty() INTERNAL ASSERT FAILED")

    cuda = types.SimpleNamespace(empty_cache=refuse, reset_peak_memory_stats=lambda device: calls.append("reset"))
    fake = types.SimpleNamespace(cuda=cuda, empty=lambda *args, **kwargs: None)
    monkeypatch.setattr(gpu_paths, "torch", fake)
    gpu_paths.fresh_memory(torch.device("cuda"))
    assert calls == ["empty_cache", "reset"]  # the peak is still reset for the next path
