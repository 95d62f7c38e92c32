"""A run records where its numbers were computed, and says it in one line."""

from __future__ import annotations

import torch

from pfl import numeric_platform
from tests.conftest import make_loop, tiny_config


def test_a_cpu_run_records_torch_the_cpu_its_kernels_threads_and_the_kernel_switches_set(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("OMP_PROC_BIND", "true")  # not a kernel switch: not recorded
    torch.set_num_threads(1)
    rec = numeric_platform.record(torch.device("cpu"))
    assert rec == {
        "torch": torch.__version__,
        "cpu": numeric_platform.cpu_name(),
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "threads": 1,
        "env": {"MKL_CBWR": "COMPATIBLE"},
    }
    monkeypatch.delenv("MKL_CBWR")
    assert "env" not in numeric_platform.record(torch.device("cpu"))  # nothing set, nothing recorded


def test_the_cpu_name_is_read_from_cpuinfo_and_falls_back_where_there_is_none(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n")
    assert numeric_platform.cpu_name(info) == "AMD EPYC 7B13"
    info.write_text("processor\t: 0\nmodel name\t:\n")  # listed but empty
    fallback = numeric_platform.cpu_name(tmp_path / "absent")
    assert numeric_platform.cpu_name(info) == fallback and fallback


def test_without_cpuinfo_the_processor_then_the_machine_names_the_cpu(tmp_path, monkeypatch):
    absent = tmp_path / "absent"
    monkeypatch.setattr(numeric_platform.platform, "processor", lambda: "")
    monkeypatch.setattr(numeric_platform.platform, "machine", lambda: "x86_64")
    assert numeric_platform.cpu_name(absent) == "x86_64"
    monkeypatch.setattr(numeric_platform.platform, "processor", lambda: "arm")
    assert numeric_platform.cpu_name(absent) == "arm"
    monkeypatch.setattr(numeric_platform.platform, "machine", lambda: "")
    assert numeric_platform.cpu_name(absent) == "arm"
    monkeypatch.setattr(numeric_platform.platform, "processor", lambda: "")
    assert numeric_platform.cpu_name(absent) == "unknown CPU"


def test_a_cuda_run_also_records_its_gpu_and_cudnn(monkeypatch):
    class Cuda:
        type = "cuda"

    device = Cuda()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA H200" if d is device else "other")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 92400)
    rec = numeric_platform.record(device)
    assert (rec["gpu"], rec["cudnn"]) == ("NVIDIA H200", 92400)
    assert rec == {**numeric_platform.record(torch.device("cpu")), "gpu": "NVIDIA H200", "cudnn": 92400}


def test_a_platform_reads_as_one_line_and_a_missing_record_says_so():
    rec = {"torch": "2.14.1", "cpu": "AMD EPYC", "cpu_kernels": "AVX2", "threads": 1}
    assert numeric_platform.label(rec) == "torch 2.14.1, AMD EPYC (AVX2 kernels, 1 thread)"
    gpu = {**rec, "threads": 4, "gpu": "NVIDIA H200", "cudnn": 92400, "env": {"MKL_CBWR": "AVX2", "B": "1"}}
    assert numeric_platform.label(gpu) == (
        "torch 2.14.1, AMD EPYC (AVX2 kernels, 4 threads), NVIDIA H200 (cuDNN 92400), B=1, MKL_CBWR=AVX2"
    )
    for missing in (None, {}, "text"):
        assert numeric_platform.label(missing) == "a platform not recorded (runs of an older pfl)"


def test_a_runs_summary_carries_its_platform_beside_its_metrics():
    summary = make_loop(tiny_config("fedavg", trainer={"rounds": 1})).fit()
    assert summary["platform"] == numeric_platform.record(torch.device("cpu"))
    assert not any(key.startswith(("platform", "cpu", "torch")) for key in summary["metrics"])


def test_the_cpu_is_read_once_per_process_however_many_checkpoints_record_it(monkeypatch):
    reads = []
    monkeypatch.setattr(numeric_platform, "cpu_name", lambda: reads.append(1) or "Some CPU")
    numeric_platform.this_cpu.cache_clear()
    try:
        assert [numeric_platform.record(torch.device("cpu"))["cpu"] for _ in range(3)] == ["Some CPU"] * 3
        assert len(reads) == 1
    finally:
        numeric_platform.this_cpu.cache_clear()  # the next caller reads the real one
