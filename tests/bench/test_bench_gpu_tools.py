"""bench.gpu_profile and bench.gpu_capture_check run on a CPU (small) and report what they say they do."""

from __future__ import annotations

import re

from bench import gpu_capture_check, gpu_profile


def test_the_profile_reports_each_rounds_time_kernels_and_ops_and_the_three_ways_of_a_step(tmp_path, capsys):
    assert gpu_profile.main(["--device", "cpu", "--out", str(tmp_path), "--only", "fedavg-cnn"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["round_fedavg-cnn_sequential.txt", "round_fedavg-cnn_vectorized.txt", "steps.txt"]
    for path in ("sequential", "vectorized"):
        text = (tmp_path / f"round_fedavg-cnn_{path}.txt").read_text()
        head = re.match(r"== fedavg-cnn / (\w+): (\d+) samples in [\d.]+ ms \(([\d,]+) samples/s\)", text)
        assert head and head[1] == path and int(head[2]) > 0
        assert "device kernels: 0" in text and "by host time:" in text and "aten::" in text
    steps = (tmp_path / "steps.txt").read_text().splitlines()
    ways = [line.split("|")[3].strip() for line in steps[3:]]
    assert ways == ["sequential", "stacked", "one model"] * 2  # fp32 and bf16, no autotuner on a CPU
    assert all(float(line.split("|")[4]) > 0 for line in steps[3:])
    assert capsys.readouterr().out.startswith("bench.gpu_profile on cpu")


def test_the_capture_check_compares_the_two_paths_and_says_nothing_is_captured_off_cuda(capsys):
    assert gpu_capture_check.main(["--only", "fedavg-cnn", "--rounds", "1", "--device", "cpu"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == (
        "fedavg-cnn: 1 rounds, max |captured - vectorized| of the global state 0.00e+00 "
        "(not captured: CUDA graphs need CUDA (this ran as vectorized))"
    )
