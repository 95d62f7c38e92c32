"""The FedORA claim's analogue (its data) and its checks on hand-made summaries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from pfl.data.config import build_data
from pfl.data.rotation import rotate_images
from pfl.runner.args import parse_fit_args
from pfl.runner.claims import fedora
from pfl.runner.claims.fedora import FEDORA_BIG, FEDORA_RUNS, K_GRID, chosen_k, chosen_k_notes, ptr_contrasts

ROOT = Path(__file__).resolve().parents[2]


def data_config(base: list[str]):
    return parse_fit_args([*base, *FEDORA_RUNS["fedavg"]])[0].data


@pytest.fixture(scope="module", params=["balanced", "big"])
def analogue(request):
    cfg = data_config(fedora.FEDORA_BALANCED if request.param == "balanced" else FEDORA_BIG)
    return cfg, build_data(cfg, seed=0)


def test_every_client_sees_its_own_angle(analogue):
    cfg, data = analogue
    upright = build_data(dataclasses.replace(cfg, rotation_groups=0), seed=0)  # same split, no rotation
    angles = [360.0 * k / cfg.num_clients for k in range(cfg.num_clients)]
    assert len(set(angles)) == cfg.num_clients == 12 and angles[1] == 30.0  # 0, 30, ..., 330: none repeated
    for k, (client, plain) in enumerate(zip(data.clients, upright.clients, strict=True)):
        assert client.test.tolist() == plain.test.tolist()
        idx = client.train[:8].numpy()
        expected = rotate_images(upright.x[idx].numpy(), angles[k])
        np.testing.assert_allclose(data.x[idx].numpy(), expected, atol=1e-6)
        if k:  # a different angle gives different images
            assert not np.allclose(data.x[idx].numpy(), rotate_images(upright.x[idx].numpy(), angles[k - 1]))


def test_every_client_has_at_least_100_test_samples(analogue):
    _, data = analogue
    assert min(len(c.test) for c in data.clients) >= 100
    assert min(len(c.val) for c in data.clients) >= 50


def test_the_big_client_is_far_larger_than_the_rest():
    data = build_data(data_config(FEDORA_BIG), seed=0)
    big, rest = len(data.clients[0].train), [len(c.train) for c in data.clients[1:]]
    assert big == 807 and max(rest) == 100 and big >= 8 * max(rest)


def summaries(ptr: dict[str, list[float]], val: dict[str, list[float]] | None = None, clients: int = 12) -> dict:
    """seed -> label -> summary with the given per-seed PTRs (and validation accuracies)."""
    seeds = range(len(next(iter(ptr.values()))))
    val = val or {}
    return {
        s: {
            lab: {"num_clients": clients, "metrics": {"ptr": p[s], "pm.val_acc.mean": val.get(lab, [0.5] * 3)[s]}}
            for lab, p in ptr.items()
        }
        for s in seeds
    }


def test_k_is_chosen_on_validation_per_seed():
    val = {"ifca_k2": [0.70, 0.90, 0.80], "ifca_k4": [0.80, 0.60, 0.80], "ifca_k6": [0.75, 0.65, 0.70]}
    s = summaries({lab: [0.5] * 3 for lab in val}, val)
    assert [chosen_k(s[seed], "ifca") for seed in range(3)] == ["ifca_k4", "ifca_k2", "ifca_k2"]  # tie: smaller k
    assert chosen_k(s[0], "fesem") is None
    assert chosen_k_notes(s) == [f"ifca: k chosen from {K_GRID} by `pm.val_acc.mean`: seed 0: k = 4, seed 1: k = 2, "
                                 "seed 2: k = 2."]  # fmt: skip


def test_ptr_contrasts_give_the_paired_differences():
    ptr = {
        "local": [1.0] * 3,
        "fedavg": [0.25, 0.0, 0.5],
        "ditto": [0.75, 1.0, 0.5],
        "ifca_k2": [1.0, 1.0, 1.0],  # the better PTR, but the worse validation: not the one compared
        "ifca_k4": [0.5, 0.5, 0.5],
        "fedora": [11 / 12, 1.0, 0.5],
    }
    val = {"ifca_k2": [0.1] * 3, "ifca_k4": [0.9] * 3}
    by_name = {c.name: c for c in ptr_contrasts()(summaries(ptr, val))}
    assert set(by_name) == {
        "fedora PTR - 0.9",
        "fedora PTR - fedavg PTR",
        "fedora PTR - ditto PTR",
        "fedora PTR - ifca PTR",
        "0.5 - fedavg PTR",
    }
    high = by_name["fedora PTR - 0.9"]
    assert high.diffs == pytest.approx({0: 11 / 12 - 0.9, 1: 0.1, 2: -0.4})
    assert high.margin == pytest.approx(-1 / 24)  # a tie with the threshold or a baseline counts
    assert by_name["fedora PTR - ditto PTR"].diffs == pytest.approx({0: 11 / 12 - 0.75, 1: 0.0, 2: 0.0})
    assert by_name["fedora PTR - ifca PTR"].diffs == pytest.approx({0: 11 / 12 - 0.5, 1: 0.5, 2: 0.0})
    assert by_name["0.5 - fedavg PTR"].diffs == pytest.approx({0: 0.25, 1: 0.5, 2: 0.0})


def _client_run(tmp_path, label: str, accs: list[float], metrics_rows: str | None = None) -> dict:
    d = tmp_path / label
    d.mkdir()
    d.joinpath("clients.csv").write_text("client,pm.l_acc\n" + "".join(f"{i},{a}\n" for i, a in enumerate(accs)))
    if metrics_rows is not None:
        d.joinpath("metrics.csv").write_text("round,fedora.lambda.mean\n" + metrics_rows)
    return {"run_dir": str(d), "metrics": {"ptr": 0.5}, "num_clients": len(accs)}


def test_diagnose_counts_clients_at_and_below_local(tmp_path):
    local = _client_run(tmp_path, "local", [0.8, 0.7, 0.9, 0.6])
    s = {0: {"local": local, "fedora": _client_run(tmp_path, "fedora", [0.8, 0.6, 0.95, 0.5], "1,9\n2,0.25\n")}}
    assert fedora.notes(s)[-1] == (
        "fedora: PTR per seed 0.500 (the claim needs >= 0.9); clients exactly at LOCAL's test accuracy (a tie "
        "counts as a pass) per seed: 1."
    )
    (line,) = fedora.diagnose(s)
    assert line == (
        "fedora: PTR 0.500 over 1 seed(s); of 4 client-runs 1 end exactly at LOCAL's test accuracy and 2 below it "
        "(by 0.100 on average, at most 0.100); logged at the last round: fedora.lambda.mean 0.25."
    )


def test_the_k_grid_is_the_documented_one():
    docs = (ROOT / "docs" / "reproduce_analogues.md").read_text()
    assert "k ∈ {" + ", ".join(map(str, K_GRID)) + "}" in docs


def test_only_the_clustered_baselines_are_noted_as_chosen_on_validation():
    ptr = {"local": [1.0], "fedavg": [0.5], "ditto": [0.5], "ifca_k2": [0.5], "fedora": [1.0]}
    by_name = {c.name: c for c in ptr_contrasts()(summaries(ptr, {"ifca_k2": [0.9]}))}
    assert by_name["fedora PTR - ifca PTR"].note == "k chosen on validation per seed"
    assert by_name["fedora PTR - ditto PTR"].note == ""


def test_diagnose_reads_the_last_evaluation_and_every_seed_and_variant_that_ran(tmp_path):
    local0, local1 = _client_run(tmp_path, "l0", [0.8, 0.7]), _client_run(tmp_path, "l1", [0.8, 0.7])
    graph = _client_run(tmp_path, "g", [0.8, 0.6], "1,9\n2,8\n3,0.25\n")
    s = {0: {"local": local0}, 1: {"local": local1, "fedora_graph": graph}}  # no fedora run; graph on seed 1 only
    (line,) = fedora.diagnose(s)
    assert line.startswith("fedora_graph: PTR 0.500 over 1 seed(s); of 2 client-runs 1 end exactly")
    assert line.endswith("fedora.lambda.mean 0.25.")


def test_a_run_and_its_local_reference_must_have_the_same_clients(tmp_path):
    with pytest.raises(ValueError, match="its clients are not those of "):
        fedora.versus_local(_client_run(tmp_path, "a", [0.8, 0.7, 0.6]), _client_run(tmp_path, "b", [0.8, 0.7]))
    with pytest.raises(ValueError, match="its clients are not those of "):
        fedora.versus_local(_client_run(tmp_path, "c", [0.8]), _client_run(tmp_path, "d", [0.9, 0.7]))
