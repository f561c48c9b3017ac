"""Tests of impl.env: environment capture never crashes and records what ran where."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from impl import env

EXPECTED_KEYS = {
    "commit",
    "dirty",
    "date",
    "python",
    "torch",
    "cuda",
    "cudnn",
    "cupy",
    "numpy",
    "platform",
    "cpu_model",
    "cpu_capability",
    "cpu_count",
    "torch_threads",
    "tf32_matmul",
    "tf32_cudnn",
    "cudnn_benchmark",
    "gpu_name",
    "gpu_driver",
    "gpu_memory_mib",
    "gpu_sm_clock_mhz",
    "gpu_mem_clock_mhz",
    "nvml_error",
}


def test_collect_keys_and_types() -> None:
    info = env.collect()
    assert EXPECTED_KEYS <= set(info)
    assert re.fullmatch(r"[0-9a-f]{40}", info["commit"])  # the tests run inside the checkout
    assert isinstance(info["dirty"], bool)
    assert info["date"].endswith("+00:00") and info["date"][:2] == "20"
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["torch"] == torch.__version__
    assert info["cuda"] == torch.version.cuda
    assert info["numpy"] is not None
    assert isinstance(info["cpu_count"], int) and info["cpu_count"] >= 1
    assert info["torch_threads"] == torch.get_num_threads()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["tf32_matmul"] is torch.backends.cuda.matmul.allow_tf32
    assert info["tf32_cudnn"] is torch.backends.cudnn.allow_tf32
    assert info["cudnn_benchmark"] is torch.backends.cudnn.benchmark
    # GPU fields: filled together, or all None with a reason.
    if info["gpu_name"] is None:
        assert isinstance(info["nvml_error"], str) and info["nvml_error"]
    else:
        assert isinstance(info["gpu_memory_mib"], int) and info["gpu_memory_mib"] > 0
    json.dumps(info)  # recorded in summary.json: must serialise


def test_commit_matches_git() -> None:
    def head() -> str:
        return subprocess.run(
            ["git", "-C", str(env.REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    # HEAD may move while the suite runs in a shared tree: retry until it stood still.
    for _ in range(5):
        before, got, after = head(), env.git_state()[0], head()
        if before == after:
            assert got == before
            break
    else:
        pytest.fail("HEAD kept moving")


def test_git_state_outside_checkout(tmp_path: Path) -> None:
    assert env.git_state(tmp_path) == (None, None)


def test_git_state_dirty_flag(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    commit, dirty = env.git_state(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and dirty is False
    (tmp_path / "untracked.txt").write_text("b")
    assert env.git_state(tmp_path)[1] is False  # untracked files do not count
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "rows.csv").write_text("old")
    git("add", "reports/rows.csv")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "results")
    commit = env.git_state(tmp_path)[0]
    (tmp_path / "reports" / "rows.csv").write_text("new rows")
    assert env.git_state(tmp_path) == (commit, False)  # results rewritten: not code
    (tmp_path / "f.txt").write_text("changed")
    assert env.git_state(tmp_path) == (commit, True)


def _no_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "gpu_info_nvidia_smi", lambda **kw: None)
    monkeypatch.setattr(env, "gpu_info_torch", lambda **kw: None)


def test_nvml_missing_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    _no_fallbacks(monkeypatch)
    info = env.collect()
    assert info["gpu_name"] is None and info["gpu_sm_clock_mhz"] is None
    assert "pynvml" in info["nvml_error"]
    assert "pynvml" in env.format_env(info)


def test_nvml_init_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pynvml")

    def boom() -> None:
        raise RuntimeError("driver not loaded")

    fake.nvmlInit = boom
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    _no_fallbacks(monkeypatch)
    info = env.gpu_info()
    assert info["gpu_name"] is None and "driver not loaded" in info["nvml_error"]
    assert info["gpu_source"] is None


@pytest.fixture(autouse=True)
def _no_cuda_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch has set no CUDA up, and asking it about a GPU fails as on a machine without one:
    no test here makes a context on a GPU machine, or reads the real card's UUID."""

    def no_gpu(*args, **kwargs):
        raise AssertionError("a GPU was queried through torch")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_gpu)


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, count: int, **calls: Any) -> types.ModuleType:
    """A pynvml of ``count`` GPUs (handle = index; GPU ``h`` named "Fake GPU h", clocks
    1000 + h MHz, power limit 100 + h W, 1 GiB), ``calls`` replacing any of its functions."""
    fake = types.ModuleType("pynvml")
    fake.NVML_CLOCK_SM, fake.NVML_CLOCK_MEM = 1, 2
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: count
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: f"Fake GPU {h}".encode()
    fake.nvmlSystemGetDriverVersion = lambda: "999.01"
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=2**30)
    fake.nvmlDeviceGetClockInfo = fake.nvmlDeviceGetMaxClockInfo = lambda h, c: 1000 + h
    fake.nvmlDeviceGetEnforcedPowerLimit = lambda h: 1000 * (100 + h)  # NVML: milliwatts
    for name, fn in calls.items():
        setattr(fake, name, fn)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_nvml_fields_from_a_fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_power(h):
        raise RuntimeError("not supported")

    fake = _fake_nvml(
        monkeypatch,
        2,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=81559 * 2**20),
        nvmlDeviceGetClockInfo=lambda h, c: {1: 1755, 2: 2619}[c],
        nvmlDeviceGetMaxClockInfo=lambda h, c: {1: 1980, 2: 3201}[c],
        nvmlDeviceGetEnforcedPowerLimit=no_power,
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    info = env.gpu_info()
    assert info["gpu_name"] == "Fake GPU 1"  # the first visible device, not index 0
    assert info["gpus"] == ["Fake GPU 0", "Fake GPU 1"] and info["gpu_count"] == 2
    assert info["gpu_driver"] == "999.01" and info["gpu_memory_mib"] == 81559
    assert (info["gpu_sm_clock_mhz"], info["gpu_mem_clock_mhz"]) == (1755, 2619)
    assert info["gpu_sm_clock_max_mhz"] == 1980
    assert info["gpu_power_limit_w"] is None and info["nvml_error"] is None
    assert info["gpu_source"] == "nvml"
    # unset: GPU 0; a UUID: that GPU; set empty or -1: CUDA sees no GPU, and none is recorded
    fake.nvmlDeviceGetHandleByUUID = lambda u: {b"GPU-abc": 1}[u]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert env.gpu_info()["gpu_name"] == "Fake GPU 0"
    assert env.gpu_info()["gpu_mem_clock_max_mhz"] == 3201
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    info = env.gpu_info()
    assert info["gpu_name"] == "Fake GPU 1" and info["nvml_error"] is None
    monkeypatch.setitem(sys.modules, "torch", None)  # no fallback finds this machine's GPU
    monkeypatch.setenv("PATH", "/nonexistent")
    for hidden in ("", "-1", "NoDevFiles", " none,0"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        info = env.gpu_info()
        assert info["gpu_name"] is None and info["gpu_source"] is None
        assert info["nvml_error"] == "CUDA_VISIBLE_DEVICES hides every GPU from this process"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # past the last of the two GPUs
    info = env.gpu_info()
    assert info["gpu_name"] is None and info["gpu_count"] == 2
    assert info["nvml_error"] == "CUDA_VISIBLE_DEVICES names GPU 7 and NVML sees 2: CUDA sees none"


def test_the_visible_gpu_is_the_first_entry_cuda_can_read(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {" 1, 0": "1", "GPU-abc,1": "GPU-abc", "MIG-x": "MIG-x", "-1,0": None}
    cases.update({"": None, "NoDevFiles": None, "gpu0": None, "2": "2"})
    for value, selector in cases.items():
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert env._visible_gpu_selector() == selector, value
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert env._visible_gpu_selector() == "0"


def test_the_gpu_described_is_the_one_the_process_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU fields always named CUDA's GPU 0: a run on cuda:3 recorded GPU 0's name,
    # clocks and power limit beside device "cuda:3".
    _fake_nvml(monkeypatch, 8, nvmlDeviceGetHandleByUUID=lambda u: {b"GPU-abc": 6}[u])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    info = env.collect(3)
    assert info["gpu_name"] == "Fake GPU 3" and info["gpu_sm_clock_mhz"] == 1003
    assert info["gpu_power_limit_w"] == 103.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,GPU-abc,2")  # CUDA's GPU 1 is NVML's 6
    assert env.gpu_info(1)["gpu_name"] == "Fake GPU 6"
    assert env.gpu_info(2)["gpu_name"] == "Fake GPU 2"
    _no_fallbacks(monkeypatch)
    info = env.gpu_info(3)  # CUDA shows three GPUs here
    assert info["gpu_name"] is None
    assert info["nvml_error"] == "CUDA_VISIBLE_DEVICES shows this process no GPU 3"
    # no GPU named: the current one, where torch has set CUDA up (else GPU 0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert env.current_gpu() == 2 and env.gpu_info()["gpu_name"] == "Fake GPU 2"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert env.current_gpu() == 0 and env.gpu_info()["gpu_name"] == "Fake GPU 5"


class _CUuuid:
    """torch's ``_CUuuid`` as far as provenance reads it: ``str`` gives 8-4-4-4-12 hex."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _torch_running_on(monkeypatch: pytest.MonkeyPatch, uuids: dict[int, str]) -> None:
    """torch with CUDA set up, CUDA's GPU ``i`` of UUID ``uuids[i]``."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: types.SimpleNamespace(uuid=_CUuuid(uuids[i])),
    )


UUID_A = "0a1b2c3d-0000-1111-2222-333344445555"
UUID_B = "ffeeddcc-bbaa-9988-7766-554433221100"


def test_a_mixed_gpu_node_describes_the_card_torch_runs_on(monkeypatch, tmp_path) -> None:
    # CUDA numbers GPUs fastest first, NVML and nvidia-smi by PCI bus: on a node of mixed
    # GPUs, CUDA's GPU 0 (UUID_B here) is NVML's GPU 1, and index 0 named the other card.
    by_uuid = {f"GPU-{UUID_A}".encode(): 0, f"GPU-{UUID_B}".encode(): 1}
    _fake_nvml(monkeypatch, 2, nvmlDeviceGetHandleByUUID=lambda u: by_uuid[u])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _torch_running_on(monkeypatch, {0: UUID_B, 1: UUID_A})
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 1"
    assert env.collect(1)["gpu_name"] == "Fake GPU 0"
    assert env.gpu_info()["gpu_name"] == "Fake GPU 1"  # the current GPU, 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # indices are CUDA's order too
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 1"
    assert env.gpu_info(1)["gpu_name"] == "Fake GPU 0"
    # a UUID entry names the card itself (a MIG slice: its own UUID), and is kept
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"GPU-{UUID_A}")
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 0"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # a UUID NVML does not know, a malformed one, a failing query, or torch without CUDA set
    # up (no context is made for metadata): the CUDA_VISIBLE_DEVICES entry, as before
    _torch_running_on(monkeypatch, {0: "ffffffff-0000-0000-0000-000000000000"})
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 0"
    _torch_running_on(monkeypatch, {0: UUID_B.upper().replace("-", "")})
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 0"
    _torch_running_on(monkeypatch, {})  # get_device_properties raises KeyError
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 0"
    _torch_running_on(monkeypatch, {0: UUID_B})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 0"
    # nvidia-smi: the card of that UUID too, else the entry
    _torch_running_on(monkeypatch, {0: UUID_B})
    monkeypatch.setitem(sys.modules, "pynvml", None)
    rows = tmp_path / "rows.csv"
    rows.write_text(SMI_ROWS)
    body = (
        f'case "$*" in *"-i GPU-{UUID_B}"*) sed -n 2p {rows} ;; *"-i GPU-"*) exit 6 ;;'
        f' *"-i 0"*) sed -n 1p {rows} ;; *) cat {rows} ;; esac'
    )
    _fake_smi(tmp_path, monkeypatch, body)
    assert env.gpu_info_nvidia_smi(gpu=0)["gpu_name"] == "NVIDIA H200"
    _torch_running_on(monkeypatch, {0: UUID_A})  # one nvidia-smi does not find
    assert env.gpu_info_nvidia_smi(gpu=0)["gpu_name"] == "NVIDIA H100 80GB HBM3"


def test_nvml_power_limit_is_in_watts_and_no_gpu_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml(monkeypatch, 1, nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert env.gpu_info()["gpu_power_limit_w"] == 700.0
    fake.nvmlDeviceGetCount = lambda: 0
    _no_fallbacks(monkeypatch)
    info = env.gpu_info()
    assert info["gpu_count"] == 0 and info["nvml_error"] == "NVML sees no GPU"


def test_format_env_mentions_versions() -> None:
    info = env.collect()
    text = env.format_env(info)
    assert torch.__version__ in text
    assert info["commit"] in text
    lines = text.splitlines()
    assert len(lines) == len(info)
    # Aligned: every value starts at the same column.
    col = len(max(info, key=len)) + 2
    assert all(line[col - 2 : col] == "  " for line in lines)


def test_format_env_renders_none_lists_and_dicts() -> None:
    text = env.format_env({"a": None, "bb": ["x", "y"], "c": {"K": "v"}})
    assert text.splitlines() == ["a   -", "bb  x; y", "c   K=v"]


def test_import_does_not_touch_gpu() -> None:
    code = "import impl.env, impl.data, torch, sys; sys.exit(int(torch.cuda.is_initialized()))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_python_executable_is_relative_inside_the_checkout(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))
    assert env.python_executable(tmp_path) == ".venv/bin/python"
    outside = tmp_path / "elsewhere"
    assert env.python_executable(outside) == str(tmp_path / ".venv" / "bin" / "python")
    assert env.collect()["python_executable"] == env.python_executable()


# -- without NVML: nvidia-smi, then torch.cuda ---------------------------------------------------


def _fake_torch_cuda(monkeypatch: pytest.MonkeyPatch, names: list[str], total: int) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: names[i])
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i=0: types.SimpleNamespace(total_memory=total)
    )


def test_torch_fills_the_gpu_fields_when_nvml_and_nvidia_smi_fail(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(env, "gpu_info_nvidia_smi", lambda **kw: None)
    _fake_torch_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"], 81559 * 2**20 + 123)
    info = env.gpu_info()
    assert info["gpu_name"] == "NVIDIA H100 80GB HBM3" and info["gpu_source"] == "torch"
    assert info["gpu_memory_mib"] == 81559 and info["gpu_count"] == 1
    assert info["gpus"] == ["NVIDIA H100 80GB HBM3"] and info["gpu_cuda_runtime"] == "13.0"
    assert info["gpu_sm_clock_mhz"] is None and info["gpu_driver"] is None  # torch has none
    assert "pynvml" in info["nvml_error"]  # why NVML was not used stays on record


def test_torch_fallback_is_none_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert env.gpu_info_torch() is None


def test_a_failing_fallback_never_raises(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)

    def boom():
        raise RuntimeError("CUDA driver too old")

    monkeypatch.setattr(env, "gpu_info_nvidia_smi", boom)
    monkeypatch.setattr(env, "gpu_info_torch", boom)
    info = env.gpu_info()
    assert info["gpu_name"] is None and info["gpu_source"] is None


SMI_ROWS = (
    "NVIDIA H100 80GB HBM3, 580.65.06, 81559, 1980, 2619, 1980, 2619, 700.00\n"
    "NVIDIA H200, 580.65.06, 143771, [N/A], 3201, 1980, 3201, [Not Supported]\n"
)


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """An nvidia-smi on PATH that logs its arguments and runs ``body``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "args.log"
    smi = bindir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{body}\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return log


def test_nvidia_smi_fills_the_gpu_fields_of_the_visible_gpu(tmp_path, monkeypatch) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text(SMI_ROWS)
    body = f'case "$*" in *"-i 1"*) sed -n 2p {rows} ;; *) cat {rows} ;; esac'
    log = _fake_smi(tmp_path, monkeypatch, body)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    info = env.gpu_info()
    assert info["gpu_source"] == "nvidia-smi" and info["gpu_name"] == "NVIDIA H200"
    assert info["gpu_driver"] == "580.65.06" and info["gpu_memory_mib"] == 143771
    assert info["gpu_sm_clock_mhz"] is None and info["gpu_mem_clock_mhz"] == 3201
    assert info["gpu_power_limit_w"] is None and info["gpu_count"] == 2
    assert info["gpus"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert "--format=csv,noheader,nounits" in log.read_text()


def test_nvidia_smi_skips_warning_lines_and_reads_each_column(tmp_path, monkeypatch) -> None:
    row = "NVIDIA H200, 580.65.06, 143771, 1755, 2619, 1980, 3201, 262.50"
    _fake_smi(tmp_path, monkeypatch, f"echo 'WARNING: infoROM is corrupted'; echo '{row}'")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    info = env.gpu_info_nvidia_smi()
    assert info["gpu_count"] == 1 and info["gpus"] == ["NVIDIA H200"]
    assert (info["gpu_sm_clock_mhz"], info["gpu_mem_clock_mhz"]) == (1755, 2619)
    assert (info["gpu_sm_clock_max_mhz"], info["gpu_mem_clock_max_mhz"]) == (1980, 3201)
    assert info["gpu_power_limit_w"] == 262.5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden from this process
    assert env.gpu_info_nvidia_smi() is None


def test_nvidia_smi_records_no_gpu_for_an_index_past_the_last(tmp_path, monkeypatch) -> None:
    """nvidia-smi refuses `-i 7` with one GPU; CUDA sees none then, so none is recorded. A UUID
    it refuses (MIG's) still gives the first GPU it lists."""
    row = "NVIDIA H200, 580.65.06, 143771, 1755, 2619, 1980, 3201, 262.50"
    body = f'case "$*" in *"-i "*) echo "No devices were found"; exit 6 ;; *) echo "{row}" ;; esac'
    _fake_smi(tmp_path, monkeypatch, body)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert env.gpu_info_nvidia_smi() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    assert env.gpu_info_nvidia_smi()["gpu_name"] == "NVIDIA H200"


def test_nvidia_smi_without_a_gpu_gives_none(tmp_path, monkeypatch) -> None:
    _fake_smi(tmp_path, monkeypatch, "echo 'No devices were found'; exit 6")
    assert env.gpu_info_nvidia_smi() is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi at all
    assert env.gpu_info_nvidia_smi() is None


def test_bench_sees_a_gpu_through_torch_not_nvml(monkeypatch) -> None:
    from bench import cases

    monkeypatch.setitem(sys.modules, "pynvml", None)
    _fake_torch_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"], 80 * 2**30)
    cases._gpu_visible.cache_clear()
    monkeypatch.delenv("PDTBENCH_BENCH_SCALE", raising=False)
    monkeypatch.delenv("PDTBENCH_BENCH_SMALL", raising=False)
    try:
        assert cases._gpu_visible() is True and cases.resolve_scale() == "gpu"
    finally:
        cases._gpu_visible.cache_clear()


def test_env_vars_record_what_changes_timings_or_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PDT_CPU_KERNELS", "0")
    monkeypatch.delenv("CC", raising=False)
    got = env.collect()["env_vars"]
    assert got["OMP_NUM_THREADS"] == "1" and got["PDT_CPU_KERNELS"] == "0"
    assert "CC" not in got


def test_git_state_of_a_copy_without_git_names_the_commit_it_was_copied_at(
    tmp_path, monkeypatch
) -> None:
    """Outside a checkout, ``$PDTBENCH_COMMIT`` (stripped) is the commit and ``dirty`` is
    unknown (None); unset or blank, both are None."""
    monkeypatch.setenv("PDTBENCH_COMMIT", "  " + "ab" * 20 + "\n")
    assert env.git_state(tmp_path) == ("ab" * 20, None)
    monkeypatch.setenv("PDTBENCH_COMMIT", "   ")
    assert env.git_state(tmp_path) == (None, None)
    monkeypatch.delenv("PDTBENCH_COMMIT")
    assert env.git_state(tmp_path) == (None, None)


def test_git_state_dirty_is_unknown_where_git_status_fails(tmp_path, monkeypatch) -> None:
    """A git that gives HEAD but fails ``status``: the commit, with ``dirty`` None (not
    False: a clean tree is not known)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    git = bindir / "git"
    git.write_text(
        '#!/bin/sh\ncase "$*" in *rev-parse*) echo ' + "cd" * 20 + " ;; *) exit 128 ;; esac\n"
    )
    git.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    assert env.git_state(tmp_path) == ("cd" * 20, None)


def test_version_is_that_of_the_first_installed_distribution(monkeypatch) -> None:
    """``_version`` skips names that are not installed; CuPy is found under any
    ``cupy-cudaXXx`` wheel name, and is None where none is installed."""
    from importlib import metadata

    assert env._version("no-such-distribution-pdt", "numpy") == metadata.version("numpy")
    assert env._version("no-such-distribution-pdt") is None

    def dist(name: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(metadata={"Name": name})

    versions = {"cupy-cuda12x": "13.3.0"}

    def version(name: str) -> str:
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(
        metadata, "distributions", lambda: [dist("numpy"), dist("cupy-cuda12x"), dist("torch")]
    )
    assert env._cupy_version() == "13.3.0"
    monkeypatch.setattr(metadata, "distributions", lambda: [dist("numpy")])
    assert env._cupy_version() is None


def _fake_cpuinfo(monkeypatch, text: str) -> None:
    """``env`` reads ``text`` as /proc/cpuinfo (and no other file)."""

    class FakePath:
        def __init__(self, path: str) -> None:
            assert path == "/proc/cpuinfo"

        def read_text(self) -> str:
            return text

    monkeypatch.setattr(env, "Path", FakePath)


def test_cpu_model_is_the_text_after_the_first_colon(monkeypatch) -> None:
    """The ``model name`` line of /proc/cpuinfo, everything after its first colon, stripped."""
    text = "processor\t: 0\nvendor_id\t: Fake\nmodel name\t: Fake CPU @ 2.00GHz: rev 1  \n"
    _fake_cpuinfo(monkeypatch, text)
    assert env._cpu_model() == "Fake CPU @ 2.00GHz: rev 1"


@pytest.mark.parametrize(
    "uuid",
    [UUID_B + "0", "x" + UUID_B, UUID_B.replace("-", "_"), ""],
    ids=["trailing-digit", "leading-char", "underscores", "empty"],
)
def test_a_torch_uuid_not_exactly_8_4_4_4_12_hex_names_no_card(monkeypatch, uuid) -> None:
    """Only a whole 8-4-4-4-12 hex UUID from torch becomes an NVML name ``GPU-<uuid>``."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _torch_running_on(monkeypatch, {0: UUID_B})
    assert env._torch_gpu_uuid(0) == f"GPU-{UUID_B}"
    _torch_running_on(monkeypatch, {0: uuid})
    assert env._torch_gpu_uuid(0) is None


def test_a_uuid_lookup_nvml_refuses_falls_back_to_the_visible_entry(monkeypatch) -> None:
    """NVML refusing the UUID torch gives (its own error type, a MIG UUID say) is no failure:
    the ``CUDA_VISIBLE_DEVICES`` entry names the card."""

    def not_found(uuid: bytes) -> None:
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    _fake_nvml(monkeypatch, 2, nvmlDeviceGetHandleByUUID=not_found)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    _torch_running_on(monkeypatch, {0: UUID_A})
    info = env.gpu_info(0)
    assert info["gpu_name"] == "Fake GPU 1" and info["nvml_error"] is None


def test_an_index_equal_to_the_gpu_count_is_past_the_last(monkeypatch) -> None:
    """NVML numbers GPUs from 0: with two, entry ``2`` names none; the reason names it."""
    _fake_nvml(monkeypatch, 2)
    _no_fallbacks(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    info = env.gpu_info(0)
    assert info["gpu_name"] is None
    assert info["nvml_error"] == "CUDA_VISIBLE_DEVICES names GPU 2 and NVML sees 2: CUDA sees none"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert env.gpu_info(0)["gpu_name"] == "Fake GPU 1"


def test_a_hidden_gpu_other_than_the_first_is_said_as_every_gpu_hidden(monkeypatch) -> None:
    """Every GPU hidden: that reason whichever GPU was asked for; one GPU shown and GPU 1
    asked for: no such GPU."""
    _fake_nvml(monkeypatch, 2)
    _no_fallbacks(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    want = "CUDA_VISIBLE_DEVICES hides every GPU from this process"
    assert env.gpu_info(1)["nvml_error"] == want
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert env.gpu_info(1)["nvml_error"] == "CUDA_VISIBLE_DEVICES shows this process no GPU 1"


def test_fallbacks_nvidia_smi_first_and_only_one_that_names_a_gpu(monkeypatch) -> None:
    """Without NVML: nvidia-smi before torch; a fallback that names no GPU is passed over; a
    field the fallback leaves None keeps what NVML had read (the driver of a count of 0)."""
    _fake_nvml(monkeypatch, 0)
    smi = {"gpu_name": "SMI GPU", "gpu_driver": None, "gpu_count": 1, "gpus": ["SMI GPU"]}
    torch_found = {"gpu_name": "Torch GPU", "gpu_count": 1, "gpus": ["Torch GPU"]}
    monkeypatch.setattr(env, "gpu_info_nvidia_smi", lambda **kw: dict(smi))
    monkeypatch.setattr(env, "gpu_info_torch", lambda **kw: dict(torch_found))
    info = env.gpu_info(0)
    assert (info["gpu_name"], info["gpu_source"]) == ("SMI GPU", "nvidia-smi")
    assert info["gpu_driver"] == "999.01" and info["gpu_count"] == 1
    assert info["nvml_error"] == "NVML sees no GPU"
    smi["gpu_name"] = None  # nvidia-smi answered, but named no GPU
    info = env.gpu_info(0)
    assert (info["gpu_name"], info["gpu_source"]) == ("Torch GPU", "torch")


def test_torch_fallback_describes_the_gpu_asked_for(monkeypatch) -> None:
    """``gpu_info_torch(gpu=i)``: GPU ``i``'s name and memory, not the current device's."""
    _fake_torch_cuda(monkeypatch, ["NVIDIA A100", "NVIDIA H100"], 3 * 2**30)
    info = env.gpu_info_torch(gpu=1)
    assert info["gpu_name"] == "NVIDIA H100" and info["gpu_memory_mib"] == 3 * 1024
    assert info["gpus"] == ["NVIDIA A100", "NVIDIA H100"]
    assert env.gpu_info_torch()["gpu_name"] == "NVIDIA A100"  # the current device, 0


def test_python_executable_under_a_symlinked_checkout(tmp_path, monkeypatch) -> None:
    """An interpreter reached through a link to the checkout, with the checkout named by that
    link, is relative to it too."""
    real = tmp_path / "real"
    (real / ".venv" / "bin").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setattr(sys, "executable", str(link / ".venv" / "bin" / "python"))
    assert env.python_executable(link) == ".venv/bin/python"
    monkeypatch.setattr(sys, "executable", str(real / ".venv" / "bin" / "python"))
    assert env.python_executable(link) == ".venv/bin/python"


def test_env_vars_record_each_variable_that_is_set(monkeypatch) -> None:
    """Every thread, float-math, memory and CPU-path variable that is set is recorded with
    its value; one that is unset, or not among them, is left out."""
    # those that change a result's threads, float32 math or CPU path, named by hand
    assert {"OMP_NUM_THREADS", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
            "PDT_CPU_KERNELS", "CUDA_VISIBLE_DEVICES"} <= set(env.RECORDED_ENV_VARS)  # fmt: skip
    monkeypatch.setattr(env, "gpu_info", lambda gpu=None: {})
    for i, name in enumerate(env.RECORDED_ENV_VARS):
        monkeypatch.setenv(name, f"v{i}")
    monkeypatch.setenv("PDT_UNRELATED_VARIABLE", "x")
    got = env.collect()["env_vars"]
    assert got == {name: f"v{i}" for i, name in enumerate(env.RECORDED_ENV_VARS)}
    for name in env.RECORDED_ENV_VARS:
        monkeypatch.delenv(name)
    assert env.collect()["env_vars"] == {}


def test_cpu_affinity_counts_the_cores_this_process_may_use(monkeypatch) -> None:
    """``cpu_affinity``: the cores of the process's affinity mask, not every core."""
    monkeypatch.setattr(env, "gpu_info", lambda gpu=None: {})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    info = env.collect()
    assert info["cpu_affinity"] == 1 and info["cpu_count"] == 64


def test_format_env_renders_empty_lists_and_dicts_as_a_dash() -> None:
    """An empty list or dict is shown as ``-``, as None is."""
    text = env.format_env({"gpus": [], "env_vars": {}, "x": ()})
    assert text.splitlines() == ["gpus      -", "env_vars  -", "x         -"]


def test_cpu_model_is_the_model_name_not_the_model_number(monkeypatch) -> None:
    """/proc/cpuinfo lists ``model`` (a number) before ``model name``: the name is recorded."""
    text = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\nstepping\t: 8\n"
    )
    _fake_cpuinfo(monkeypatch, text)
    assert env._cpu_model() == "Intel(R) Xeon(R) Platinum 8480+"


def test_tf32_flags_read_fp32_precision_per_backend_where_allow_tf32_is_refused(
    monkeypatch,
) -> None:
    """A process that set ``fp32_precision`` per backend (reading ``allow_tf32`` then raises):
    matmul in IEEE and convolutions in TF32 is recorded as (False, True), each from its own
    backend."""

    class Refused:
        def __init__(self, precision: str) -> None:
            self.fp32_precision = precision

        @property
        def allow_tf32(self) -> bool:
            raise RuntimeError("mixing allow_tf32 and fp32_precision")

    matmul = Refused("ieee")
    cudnn = Refused("none")
    cudnn.conv = types.SimpleNamespace(fp32_precision="tf32")
    monkeypatch.setattr(torch.backends, "cuda", types.SimpleNamespace(matmul=matmul))
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    assert env.tf32_enabled() == (False, True)
    matmul.fp32_precision, cudnn.conv.fp32_precision = "tf32", "ieee"
    assert env.tf32_enabled() == (True, False)


def test_torch_settings_recorded_are_those_the_process_set(monkeypatch) -> None:
    """``cudnn_benchmark`` and ``float32_matmul_precision`` follow what the process set, not
    torch's defaults (False, ``"highest"``)."""
    before = torch.get_float32_matmul_precision()
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    torch.set_float32_matmul_precision("medium")
    try:
        info = env._torch_info()
    finally:
        torch.set_float32_matmul_precision(before)
    assert info["cudnn_benchmark"] is True
    assert info["float32_matmul_precision"] == "medium"


def test_collect_dates_a_result_to_the_second_in_utc(monkeypatch) -> None:
    """``date``: ISO 8601 with seconds and the UTC offset, e.g. 2026-01-02T03:04:05+00:00."""
    monkeypatch.setattr(env, "gpu_info", lambda gpu=None: {})
    date = env.collect()["date"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", date), date


def test_a_fallbacks_fields_nvml_never_had_are_recorded_even_when_none(monkeypatch) -> None:
    """A field only the fallback knows (torch's CUDA runtime) is in the record, None or not,
    so that every record of one source has the same keys."""
    _fake_nvml(monkeypatch, 0)
    found = {"gpu_name": "Torch GPU", "gpu_count": 1, "gpus": ["Torch GPU"]}
    monkeypatch.setattr(env, "gpu_info_nvidia_smi", lambda **kw: None)
    monkeypatch.setattr(env, "gpu_info_torch", lambda **kw: {**found, "gpu_cuda_runtime": None})
    info = env.gpu_info(0)
    assert info["gpu_source"] == "torch"
    assert "gpu_cuda_runtime" in info and info["gpu_cuda_runtime"] is None
