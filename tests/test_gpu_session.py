"""The device scripts of ``scripts/gpu/`` (docs/gpu-session.md), checked without a GPU.

Each script is valid bash and names files, suites, targets and modules that exist; the wheel
list pins one version of each package and what travels to the device stays far under its
64 MiB; the plan table of docs/gpu-session.md fits the 15 device-minutes and 10-minute calls;
``session.sh`` runs every step of the four scripts as its parts, the checks side by side;
the step runner of ``common.sh`` records ok, failed, timed-out, skipped and out-of-budget steps;
and every device script runs to its end in ``DRY_RUN=1`` mode on this machine, its GPU steps
reported as skipped, its results packed as the device would return them. The helpers
``env_report.py`` and ``compile_kernels.py`` are tested directly.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "scripts" / "gpu"
DEVICE_SCRIPTS = ("kernels", "bench", "sdgp_semi", "reproduce")
#: The driver that runs the four as parts of one or two device calls.
SESSION = "session"
ALL_SH = sorted(p.name for p in GPU_DIR.glob("*.sh"))
#: What the device tool brings back: names of letters, digits, '.', '_', '-'; at most 8 files.
OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_OUT_FILES = 8
#: The lent GPU machine's limits.
CALL_LIMIT_S = 600
SESSION_LIMIT_S = 15 * 60
COMMAND_CHARS = 2000
TRANSFER_LIMIT = 64 * 2**20
HAS_GPU = torch.cuda.is_available()


def _module(name: str):
    """Import ``scripts/gpu/<name>.py`` (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _text(name: str) -> str:
    return (GPU_DIR / name).read_text()


def _wheels() -> list[Path]:
    return sorted((ROOT / ".whl").glob("*.whl"))


def _steps(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    head = lines[0].split("\t")
    return [dict(zip(head, line.split("\t"))) for line in lines[1:]]


def _default(script: str, var: str) -> str:
    m = re.search(rf"^{var}=(.*)$", _text(f"{script}.sh"), re.M)
    assert m, f"{script}.sh sets no {var}"
    return m.group(1)


# -- static checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_SH, ids=ALL_SH)
def test_script_is_valid_bash(name):
    res = subprocess.run(["bash", "-n", str(GPU_DIR / name)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name", (*DEVICE_SCRIPTS, SESSION), ids=(*DEVICE_SCRIPTS, SESSION))
def test_device_script_sources_common_and_names_its_report(name):
    text = _text(f"{name}.sh")
    assert _default(name, "NAME") == name
    assert _default(name, "REPORT").startswith("reports/")
    assert 0 < int(_default(name, "DEFAULT_BUDGET_S")) < CALL_LIMIT_S - 60
    assert 'source "$(dirname "$0")/common.sh"' in text
    assert "common_steps" in text  # environment, wheels, git first
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    assert ".venv" not in code and "bootstrap" not in code  # never on the device


_PATH_RE = re.compile(r"\b((?:scripts/gpu|tests|bench|impl|reproductions)/[\w./-]+\.(?:py|sh|txt))")
_MODULE_RE = re.compile(r"-m ((?:bench|impl|reproductions)(?:\.\w+)+)")


@pytest.mark.parametrize("name", ALL_SH, ids=ALL_SH)
def test_paths_and_modules_named_in_a_script_exist(name):
    text = _text(name)
    for path in _PATH_RE.findall(text):
        assert (ROOT / path).exists(), f"{name} names {path}, which does not exist"
    for mod in _MODULE_RE.findall(text):
        assert importlib.util.find_spec(mod) is not None, f"{name} runs -m {mod}: not found"


def test_suites_parts_and_targets_named_by_the_scripts_exist():
    from bench import cases
    from reproductions import TARGETS

    kernel_suites = _default("kernels", "KERNEL_BENCH_SUITES").split(':-"')[1].rstrip('"}')
    suites = set(re.findall(r"--suite (\w+)", _text("bench.sh"))) | set(kernel_suites.split())
    # make gpu-check: the kernel suites and csr, the suite of the pattern CSR conversion kernel
    makefile = (ROOT / "Makefile").read_text()
    gpu_check = re.search(r'KERNEL_BENCH_SUITES="([^"]*)" \\\n', makefile)
    assert set(gpu_check.group(1).split()) == set(kernel_suites.split()) | {"csr"}
    # and two conv cases, for the implicit conv and the sparse-gradient kernels vs cuDNN
    assert 'KERNEL_BENCH_CONV_CASES="$(GPU_CHECK_CONV_CASES)" bash scripts/gpu/kernels.sh' in (
        makefile
    )
    conv_cases = re.search(r"GPU_CHECK_CONV_CASES \?= (.*)", makefile).group(1).split()
    conv_pairs = {(c.name, i.name) for c, i in cases.pairs("conv", "gpu")}
    for case in conv_cases:
        timed = {i for c, i in conv_pairs if c == case}
        assert {"cudnn_fp32@cuda", "pattern_conv2d[cuda]@cuda"} <= timed, case
    assert any(c.endswith("fwdbwd-s90") for c in conv_cases)  # the SDDMM gradient path
    # every suite is measured by some step, but the Allreduce byte counts: deterministic, they
    # were measured once on the CPU and committed (no device minutes for them)
    assert suites == set(cases.SUITES) - {"allreduce"}
    cpu_rows = json.loads((ROOT / "reports" / "bench" / "cpu" / "rows.json").read_text())["rows"]
    assert any(r["suite"] == "allreduce" and r["status"] == "ok" for r in cpu_rows)
    assert "allreduce" not in _default("bench", "ASV_BENCH").lower()
    targets = _reproduce_targets()
    assert targets and set(targets) <= set(TARGETS)
    assert "prunetrain.fig7" in targets  # timed on the GPU at the paper's shapes


def _preflight(name: str) -> list[str]:
    text = _text(f"{name}.sh").replace("\\\n", " ")
    return re.search(r'^PREFLIGHT="([^"]*)"', text, re.M).group(1).split()


@pytest.mark.parametrize("name", (*DEVICE_SCRIPTS, SESSION), ids=(*DEVICE_SCRIPTS, SESSION))
def test_preflight_modules_of_the_project_exist(name):
    ours = [m for m in _preflight(name) if m.split(".")[0] in ("impl", "bench", "reproductions")]
    assert ours, f"{name}.sh checks no project module"
    for mod in ours:
        assert importlib.util.find_spec(mod) is not None, mod


def test_session_checks_every_module_the_four_scripts_need():
    """Its parts run with the environment step skipped, so it imports what they would."""
    need = {m for name in DEVICE_SCRIPTS for m in _preflight(name) if "${" not in m}
    need |= {f"reproductions.{t}" for t in _reproduce_targets()}
    assert need <= set(_preflight(SESSION)), need - set(_preflight(SESSION))


def _reproduce_targets() -> list[str]:
    """reproduce.sh's default targets."""
    text = _text("reproduce.sh").replace("\\\n", " ")
    return re.search(r"\|\| TARGETS=\(([^)]*)\)", text).group(1).split()


def _session_dispatch() -> list[tuple[str, int, str]]:
    """(part, limit in s, command) of every line of session.sh's dispatch, in order."""
    text = _text("session.sh").replace("\\\n", "")
    body = text[text.index("case $p in") :]
    found = re.findall(r'^\s*([\w-]+)\) part [\w"$-]+ (\d+) "?([^;]*?)"? ;;', body, re.M)
    return [(name, int(limit), cmd) for name, limit, cmd in found]


def _session_parts() -> dict[str, str]:
    """{part: its command} of session.sh's dispatch."""
    return {name: cmd for name, _, cmd in _session_dispatch()}


def test_session_runs_every_step_of_the_four_scripts_as_a_part():
    parts = _session_parts()
    text = _text("session.sh").replace("\\\n", "")
    order = re.search(r'^DEFAULT_PARTS="([^"]*)"', text, re.M).group(1).split()
    assert list(parts) == order  # dispatched in the order of value
    assert order[:3] == ["compile", "check", "kernel-bench"]  # the kernels first
    # (ONLY_STEPS=..., script) pairs, in the parts and in check's side-by-side commands
    only = re.findall(r"ONLY_STEPS=('[^']*'|[\w-]+)[^\n\"]*? sub [\w-]+ (\w+)", text)
    for script in ("kernels", "sdgp_semi"):
        steps = {n for n, _, _ in _steps_of(script)}
        named = {st for sts, sc in only if sc == script for st in sts.strip("'").split()}
        assert named == steps, script
    bench = re.findall(r"sub [\w-]+ bench (\w+)", text)
    bench_parts = re.search(r"\|\| PARTS=\(([^)]*)\)", _text("bench.sh")).group(1).split()
    assert sorted(bench) == sorted(bench_parts)
    repro = re.findall(r"sub [\w-]+ reproduce ([\w. ]+)", text)
    assert sorted(t for r in repro for t in r.split()) == sorted(_reproduce_targets())
    # the check part: the tests and sanitizers side by side, none of them a timing step
    check = text[text.index("check() {") :].split("\n}\n")[0]
    assert "together" in check
    assert "sanitizers=STEP_LIMIT_S= ONLY_STEPS=" in check  # racecheck keeps its own limit
    assert re.findall(r"ONLY_STEPS=('[^']*'|[\w-]+)", check) == [
        "tests",
        "tests-other",
        "tests",
        "'racecheck memcheck'",  # one after the other: never two sanitizers at once
    ]


def test_makefile_targets_the_docs_name_exist():
    doc = (ROOT / "docs" / "gpu-session.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"make ([\w-]+)", doc)):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target


def test_wheel_list_pins_one_version_of_each_package():
    reqs = [
        ln.strip()
        for ln in _text("wheels.txt").splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    names = [r.split("==")[0].lower().replace("_", "-") for r in reqs]
    assert all("==" in r for r in reqs) and len(names) == len(set(names))
    assert {"asv", "asv-runner", "mlxtend", "nvidia-ml-py"} <= set(names)  # pynvml: GPU name
    # the machine-code scan's disassembler: cuobjdump runs nvdisasm, one CUDA release for both
    disasm = ("nvidia-cuda-cuobjdump==", "nvidia-cuda-nvdisasm==")
    tools = [r.split("==")[1] for r in reqs if r.startswith(disasm)]
    assert len(tools) == 2 and tools[0] == tools[1], tools
    wheels = _wheels()
    if not wheels:
        pytest.skip("no .whl/ here: scripts/gpu/fetch_wheels.sh fetches it")
    got = {}
    for w in wheels:
        name, version = w.name.split("-")[:2]
        got[name.lower().replace("_", "-")] = version
    assert got == {n: r.split("==")[1] for n, r in zip(names, reqs)}


def test_transfer_size_plan_is_far_under_the_limit():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    res = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    files = [ROOT / p for p in res.stdout.decode().split("\0") if p]
    tree = sum(p.stat().st_size for p in files if p.is_file())
    carried = sum(p.stat().st_size for d in (".whl", ".gpu") for p in (ROOT / d).glob("*"))
    assert sum(w.stat().st_size for w in _wheels()) < 16 * 2**20
    assert tree + carried < TRANSFER_LIMIT // 2, f"{(tree + carried) / 2**20:.1f} MiB travels"


def _plan() -> list[dict[str, str]]:
    doc = (ROOT / "docs" / "gpu-session.md").read_text()
    start = doc.index("| # | command | carry |")
    rows = []
    for line in doc[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append(dict(zip(("n", "command", "carry", "timeout", "budget"), cells)))
    return rows


#: The session's accounting (docs/gpu-session.md): one cold start, a script's budget plus 30 s
#: (transfers, start-up and packaging beyond it), 15 s between calls, 60 s kept in hand.
START_S, PER_SCRIPT_S, GAP_S, MARGIN_S = 90, 30, 15, 60


def test_plan_fits_the_device_limits():
    plan = _plan()
    assert [r["n"] for r in plan] == [str(i) for i in range(1, len(plan) + 1)]
    total = START_S + GAP_S * (len(plan) - 1)
    for row in plan:
        command = row["command"].strip("`")
        assert len(command) <= COMMAND_CHARS
        assert re.findall(r"bash scripts/gpu/(\w+)\.sh", command) == [SESSION]
        assert {c.strip() for c in row["carry"].split(",")} == {".whl", ".gpu"}
        given = re.match(r"BUDGET_S=(\d+) ", command)
        budget = int(given.group(1)) if given else int(_default(SESSION, "DEFAULT_BUDGET_S"))
        assert int(row["budget"]) == budget  # the table says what the command does
        assert budget + PER_SCRIPT_S <= int(row["timeout"]) <= CALL_LIMIT_S
        total += budget + PER_SCRIPT_S
    assert total <= SESSION_LIMIT_S - MARGIN_S, f"{total} s of {SESSION_LIMIT_S} s"
    doc = (ROOT / "docs" / "gpu-session.md").read_text()
    assert f"= **{total} s of {SESSION_LIMIT_S}**" in doc  # the arithmetic the doc states


def test_session_parts_table_gives_each_part_its_limit():
    table = _doc_table("### `session.sh`: the parts")
    limits = {name: str(limit) for name, limit, _ in _session_dispatch()}
    assert table == limits


def _steps_of(script: str) -> list[tuple[str, str, int]]:
    """(name, kind, limit) of every literal ``step`` line of ``scripts/gpu/<script>.sh``."""
    found = re.findall(r"^\s*step ([\w-]+) (gpu|cpu) (\d+) ", _text(f"{script}.sh"), re.M)
    return [(n, k, int(s)) for n, k, s in found]


def _doc_table(title: str) -> dict[str, str]:
    """{step: limit (s)} of the first table under the heading that starts ``title`` in
    docs/gpu-session.md."""
    doc = (ROOT / "docs" / "gpu-session.md").read_text()
    heading = re.search(rf"^#+ (?:\d+\. )?{re.escape(title.lstrip('# '))}", doc, re.M)
    assert heading, title
    part = doc[heading.start() :]
    rows = {}
    for line in part[part.index("|---") :].splitlines()[1:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1]
    return rows


@pytest.mark.parametrize(
    ("script", "order"),
    [
        (
            "kernels",
            ["compile", "sass", "tests", "kernel-bench", "tests-other", "racecheck", "memcheck"],
        ),
        ("sdgp_semi", ["tests", "r18-bf16", "r50-bf16", "fp16"]),
    ],
    ids=["kernels", "sdgp_semi"],
)
def test_steps_run_in_order_of_value_with_the_documented_limits(script, order):
    steps = _steps_of(script)
    assert [n for n, _, _ in steps] == order  # kernel-bench before the sanitizers
    table = _doc_table(f"`{script}.sh`")
    for name, _, limit in steps:
        key = next(k for k in table if k.split()[-1] == name or k == name)
        assert table[key] == str(limit), (script, name)
    budget = int(_default(script, "DEFAULT_BUDGET_S"))
    assert max(limit for _, _, limit in steps) <= budget - 30 - 15


def test_bench_parts_run_iteration_first_and_its_cases_exist():
    from bench import cases

    text = _text("bench.sh")
    assert re.search(r"PARTS=\(iteration rows pytest asv\)", text)
    names = re.findall(r"[\w-]+-b\d+", _text("bench.sh").split("ITER_CASES=")[1].split("}")[0])
    grid = [c.name for c in cases.grid("iteration", "gpu")]
    assert sorted(names) == sorted(grid) and names[0] == "resnet18-cifar32-b128"
    assert names[-1] == "vgg16-imagenet224-b64"  # the dearest case last: a cut loses it first
    assert "--suite allreduce" not in text


def test_sanitizers_skip_api_errors_and_check_only_the_project_kernels():
    from impl.cuda import loader

    text = _text("kernels.sh")
    assert _default("kernels", "SAN_KERNELS") == "${SAN_KERNELS-pdt_}"
    flags = re.search(r'^SAN_FLAGS="([^"]*)"', text, re.M).group(1)
    assert "--report-api-errors no" in flags and "--kernel-name kns=$SAN_KERNELS" in flags
    for tool in ("racecheck", "memcheck"):
        cmd = re.search(rf"--tool {tool}(.*?)\| tee", text, re.S).group(1)
        assert "$SAN_FLAGS" in cmd, tool
    names = {k for ks in _module("compile_kernels").kernels_by_source().values() for k in ks}
    assert names and all(n.startswith("pdt_") for n in names)  # what kns=pdt_ selects
    for source in loader.SOURCES:  # extern "C": the mangled name is the name itself
        prefixes = re.findall(r"^(.*)__global__", loader.expand_source(source), re.M)
        code = [p for p in prefixes if not p.lstrip().startswith("//")]
        assert code and all('extern "C"' in p for p in code), source


# -- the step runner of common.sh --------------------------------------------------------------

FAKE = """NAME=fake
REPORT=reports/fake-check
DEFAULT_BUDGET_S=120
source {common}
step good cpu 30 'echo hello > "$DEST/good.txt"'
step where cpu 30 'echo "at $ROOT/impl, in $(pwd -P)" > "$DEST/where.txt"'
step bad cpu 30 'echo oops; exit 3'
step slow cpu 1 'sleep 30'
step gpu-one gpu 30 'echo never'
step gpu-broken gpu 30 'if then'
RESERVE_S=100000 step late cpu 30 'echo never'
"""


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PY=sys.executable, TMPDIR=str(tmp), OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    env.update(extra)
    return env


def test_step_runner_records_every_outcome_and_packs_the_results(tmp_path):
    script = tmp_path / "fake.sh"
    script.write_text(FAKE.format(common=GPU_DIR / "common.sh"))
    out = tmp_path / "out"
    res = subprocess.run(
        ["bash", str(script)],
        env=_env(tmp_path, OUT=str(out), DRY_RUN="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    steps = {s["step"]: s for s in _steps(out / "fake-steps.tsv")}
    assert steps["good"]["status"] == "ok"
    assert (steps["bad"]["status"], steps["bad"]["rc"]) == ("failed", "3")
    assert steps["slow"]["status"] == "timeout" and int(steps["slow"]["seconds"]) < 20
    assert steps["gpu-broken"]["status"] == "failed"  # skipped commands are syntax-checked
    assert steps["gpu-broken"]["note"].startswith("syntax error")
    assert (steps["late"]["status"], steps["late"]["note"]) == ("skipped", "out of time budget")
    if HAS_GPU:
        assert steps["gpu-one"]["status"] == "ok" and res.returncode == 1
    else:
        assert (steps["gpu-one"]["status"], steps["gpu-one"]["note"]) == ("skipped", "no GPU")
        assert res.returncode == 2, res.stdout  # no GPU on a run that is not a dry run
    with tarfile.open(out / "fake.tar.gz") as tar:
        good = tar.extractfile("./reports/fake-check/good.txt").read().decode()
        where = tar.extractfile("./reports/fake-check/where.txt").read().decode()
        status = tar.extractfile("./reports/fake-check/session/fake/STATUS.md").read().decode()
    assert good == "hello\n"
    assert where == "at <repo>/impl, in <repo>\n"  # the machine's path of the copy, not kept
    assert "| bad | cpu | failed | 3 |" in status
    assert res.stdout.rstrip().splitlines()[-1].startswith("late")  # the table is printed last
    assert "oops" in (out / "fake.log").read_text()


STOPPED = """NAME=fake3
REPORT=reports/fake-check
DEFAULT_BUDGET_S=120
source {common}
step good cpu 30 'echo hello > "$DEST/good.txt"'
step long cpu 100 'sleep 60'
"""


@pytest.mark.slow
def test_a_script_stopped_from_outside_mid_step_packs_what_ended_and_names_the_step(tmp_path):
    """The caller's `timeout` signals the script's whole process group, its console tee
    included: the script still packs what its finished steps wrote, records the step it was
    in as a timeout, exits 1, and leaves that step's command running on nothing. (15 s: on a
    loaded 2-core machine a stop after 6 s came before the steps had run, and left no steps
    file to read.)"""
    script = tmp_path / "fake3.sh"
    script.write_text(STOPPED.format(common=GPU_DIR / "common.sh"))
    out = tmp_path / "out"
    res = subprocess.run(
        ["timeout", "15", "bash", str(script)],
        env=_env(tmp_path, OUT=str(out), DRY_RUN="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 124  # timeout's own status: the script was stopped
    steps = {s["step"]: s for s in _steps(out / "fake3-steps.tsv")}
    assert steps["good"]["status"] == "ok"
    long = steps["long"]
    assert (long["status"], long["rc"], long["note"]) == (
        "timeout",
        "143",
        "the script was stopped from outside",
    )
    # stopped at 15 s, not at the sleep's 60 or the step's 100-s limit; the step's time runs
    # on through finish()'s wait of up to 5 s for its command to end, in whole seconds
    assert int(long["seconds"]) <= 22
    with tarfile.open(out / "fake3.tar.gz") as tar:
        assert tar.extractfile("./reports/fake-check/good.txt").read() == b"hello\n"
        status = tar.extractfile("./reports/fake-check/session/fake3/STATUS.md").read().decode()
    assert "| long | cpu | timeout | 143 |" in status and "exit code 1" in status
    assert not _processes_with(f"TMPDIR={tmp_path}", "sleep 60"), "the step's command still runs"


def _processes_with(env_entry: str, command: str) -> list[str]:
    """The pids of processes running ``command`` with ``env_entry`` in their environment."""
    found = subprocess.run(["pgrep", "-f", command], capture_output=True, text=True).stdout
    pids = []
    for pid in found.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if env_entry.encode() in environ:
            pids.append(pid)
    return pids


SIDE_BY_SIDE = """NAME=fake2
REPORT=reports/fake-check
DEFAULT_BUDGET_S=120
source {common}
common_steps
step pair cpu 30 'together a="sleep 2; echo from-a" b="sleep 2; echo from-b; exit 4"'
step quick cpu 30 'together c="echo from-c"'
step capped cpu 30 'sleep 5'
step left-out cpu 30 'echo never'
"""


@pytest.mark.slow
def test_together_runs_side_by_side_and_the_caller_selects_and_caps_steps(tmp_path):
    """``together`` runs its commands at once and fails when one fails; ONLY_STEPS keeps the
    named steps, STEP_LIMIT_S replaces their limits, COMMON_DONE=1 skips env, wheels and git."""
    script = tmp_path / "fake2.sh"
    script.write_text(SIDE_BY_SIDE.format(common=GPU_DIR / "common.sh"))
    out = tmp_path / "out"
    env = _env(
        tmp_path,
        OUT=str(out),
        DRY_RUN="1",
        ONLY_STEPS="pair quick capped",
        STEP_LIMIT_S="3",
        COMMON_DONE="1",
    )
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    steps = {s["step"]: s for s in _steps(out / "fake2-steps.tsv")}
    assert list(steps) == ["pair", "quick", "capped"], res.stdout  # no env/wheels/git, no left-out
    assert (steps["pair"]["status"], steps["pair"]["rc"]) == ("failed", "1")  # b exited 4
    assert int(steps["pair"]["seconds"]) < 4  # two 2-s sleeps at once, not one after the other
    assert steps["quick"]["status"] == "ok"
    assert steps["capped"]["status"] == "timeout" and steps["capped"]["limit_s"] == "3"
    assert res.returncode == 1
    assert "[b] ended, rc 4" in res.stdout and "from-b" in res.stdout  # each one's last lines
    with tarfile.open(out / "fake2.tar.gz") as tar:
        log_a = tar.extractfile("./reports/fake-check/session/fake2/logs/a.log").read().decode()
    assert log_a == "from-a\n"


@pytest.mark.parametrize(
    ("budget", "expect"), [("100.5", "budget 100s"), ("1e2", "must be a whole number")]
)
def test_a_budget_in_fractions_is_cut_to_whole_seconds_and_any_other_refused(
    tmp_path, budget, expect
):
    """BUDGET_S worked out from a float (a lease's seconds left) runs with its whole seconds;
    a budget that is no number stops the script (exit 2), where shell arithmetic would fail
    each step and the script still exit 0 having run nothing."""
    script = tmp_path / "fake5.sh"
    script.write_text(SIDE_BY_SIDE.replace("fake2", "fake5").format(common=GPU_DIR / "common.sh"))
    out = tmp_path / "out"
    env = _env(tmp_path, OUT=str(out), DRY_RUN="1", COMMON_DONE="1", BUDGET_S=budget)
    env["ONLY_STEPS"] = "quick"
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert expect in res.stdout + res.stderr
    if budget == "100.5":
        assert res.returncode == 0 and _steps(out / "fake5-steps.tsv")[0]["status"] == "ok"
    else:
        assert res.returncode == 2


STALE = """NAME=fake6
REPORT=reports/fake-check
DEFAULT_BUDGET_S=60
source {common}
echo "git: restored from .gpu/repo.bundle, HEAD abc" > "$SESSION/logs/git.log"
stale_tree_refused && echo REFUSED-CLEAN
echo "git: the tree differs from HEAD (results will say dirty):" >> "$SESSION/logs/git.log"
stale_tree_refused && echo REFUSED-STALE
ALLOW_DIRTY=1 stale_tree_refused && echo REFUSED-ALLOWED
"""


def test_stale_tree_refused_reads_the_git_steps_log(tmp_path):
    """A .gpu bundle made at an older commit would name that commit, marked dirty, on every
    result of the call: session.sh stops after its git step where this says so, unless
    ALLOW_DIRTY=1."""
    script = tmp_path / "fake6.sh"
    script.write_text(STALE.format(common=GPU_DIR / "common.sh"))
    env = _env(tmp_path, OUT=str(tmp_path / "out"), DRY_RUN="1", COMMON_DONE="1")
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert "REFUSED-STALE" in res.stdout and "scripts/gpu/prepare.sh" in res.stdout
    assert "REFUSED-CLEAN" not in res.stdout and "REFUSED-ALLOWED" not in res.stdout


FAKE_ASV_PY = """#!/usr/bin/env bash
case "$*" in
  "-m asv run"*) [ "$ASV_RUN" = cut ] && exit 124; exit 3 ;;  # 124: as timeout ends it
  *) exit 0 ;;
esac
"""


@pytest.mark.parametrize(("asv_run", "rc"), [("cut", 124), ("fail", 1)])
def test_asv_cut_at_its_cap_is_a_timeout_and_a_failure_a_failure(tmp_path, asv_run, rc):
    """bench.sh's asv step: a run cut at its cap returns 124 (the session reads a shortened
    part "partial" and runs it again), a run that fails returns 1; publish and the copy run
    either way."""
    py = tmp_path / "py"
    py.write_text(FAKE_ASV_PY)
    py.chmod(0o755)
    body = subprocess.run(
        ["sed", "-n", "/^run_asv()/,/^}/p", str(GPU_DIR / "bench.sh")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = _env(tmp_path, PY=str(py), ASV_RUN=asv_run, STEP_LIMIT="35", DEVICE_SLUG="fake")
    env.update(ASV_BENCH="^asv_kernels", STAGE=str(tmp_path / "stage"))
    res = subprocess.run(
        ["bash", "-c", body + "\nrun_asv"],
        cwd=GPU_DIR.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == rc, res.stdout + res.stderr
    assert ("asv kernels: cut at its 20s" in res.stdout) == (asv_run == "cut")
    assert (tmp_path / "stage" / "reports" / "asv").is_dir()  # the copy ran


PACKING = """NAME=fake4
REPORT=reports/fake-check
DEFAULT_BUDGET_S=120
source {common}
step pair cpu 2 'together a="trap \\"sleep 3; echo packed > \\$DEST/a.txt; exit 0\\" TERM; \
sleep 30 & wait"'
step after cpu 30 'echo after'
"""


@pytest.mark.slow
def test_together_cut_at_its_limit_waits_for_its_commands_to_write_their_results(tmp_path):
    """Cut at its step's limit, ``together`` waits while its commands, signalled too, write
    what they have (3 s here, within the limit's 10-s kill grace): the step does not end, and
    the session does not fold and remove their folders, while they are still writing."""
    script = tmp_path / "fake4.sh"
    script.write_text(PACKING.format(common=GPU_DIR / "common.sh"))
    out = tmp_path / "out"
    env = _env(tmp_path, OUT=str(out), DRY_RUN="1", COMMON_DONE="1")
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    steps = {s["step"]: s for s in _steps(out / "fake4-steps.tsv")}
    assert steps["pair"]["status"] == "timeout", res.stdout
    assert 4 <= int(steps["pair"]["seconds"]) < 12, steps["pair"]
    with tarfile.open(out / "fake4.tar.gz") as tar:
        assert tar.extractfile("./reports/fake-check/a.txt").read() == b"packed\n"


CUT = """NAME=fake3
REPORT=reports/fake-check
DEFAULT_BUDGET_S=120
CUT_OK_STEPS="runs-to-its-limit"
source {common}
step runs-to-its-limit cpu 1 'sleep 30'
step other-slow cpu 1 'sleep 30'
"""


def test_a_step_made_to_run_to_its_limit_reads_cut_not_failed(tmp_path):
    # memcheck takes what time is left: cut at its limit it is "cut" and fails nothing; any
    # other step cut at its limit is still a timeout that fails the script.
    out = tmp_path / "out"
    env = _env(tmp_path, OUT=str(out), DRY_RUN="1", COMMON_DONE="1")
    script = tmp_path / "fake3.sh"
    for text, rc in ((CUT, 1), (CUT.replace("step other-slow", "# step other-slow"), 0)):
        script.write_text(text.format(common=GPU_DIR / "common.sh"))
        res = subprocess.run(
            ["bash", str(script)], env=env, capture_output=True, text=True, timeout=90
        )
        steps = {s["step"]: s for s in _steps(out / "fake3-steps.tsv")}
        cut = steps["runs-to-its-limit"]
        assert (cut["status"], cut["rc"]) == ("cut", "124")
        assert res.returncode == rc, res.stdout  # a cut step alone fails nothing
    assert "other-slow" not in steps


@pytest.mark.slow
def test_a_cut_reproduction_target_leaves_time_to_render_the_finished_ones(tmp_path):
    # A target that runs into the budget must not take render's time: the pages and results
    # of the targets that ended are what the part brings back. (Budget 70 s: the target
    # starts with 70 - 10 - 35 (render's) = 25 s less the set-up; at 60 s a set-up of one
    # second on a loaded machine left it under the 15-s floor, skipped instead of cut.)
    fake_py = tmp_path / "py"
    fake_py.write_text(
        "#!/bin/bash\n"
        'for a in "$@"; do [ "$a" = impl.cli ] && { sleep 100; exit 0; }; done\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake_py.chmod(0o755)
    out = tmp_path / "out"
    env = _env(
        tmp_path, OUT=str(out), PY=str(fake_py), COMMON_DONE="1", CALLER_HAVE_GPU="1",
        CALLER_GPU_NAME="fake", BUDGET_S="70", RESERVE_S="10", RUNS_ROOT=str(tmp_path / "runs"),
    )  # fmt: skip
    res = subprocess.run(
        ["bash", str(GPU_DIR / "reproduce.sh"), "prunetrain.fig7"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    steps = {s["step"]: s for s in _steps(out / "reproduce-steps.tsv")}
    assert steps["prunetrain.fig7"]["status"] == "timeout", res.stdout
    assert steps["render"]["status"] == "ok", res.stdout
    with tarfile.open(out / "reproduce.tar.gz") as tar:
        assert "./reports/gpu-scale/index.html" in tar.getnames()


def test_git_state_names_the_copied_commit_where_there_is_no_git(tmp_path, monkeypatch):
    from impl.env import git_state

    monkeypatch.delenv("PDTBENCH_COMMIT", raising=False)
    assert git_state(tmp_path) == (None, None)  # not a checkout, nothing named
    monkeypatch.setenv("PDTBENCH_COMMIT", "a" * 40)
    assert git_state(tmp_path) == ("a" * 40, None)  # the copy's commit; dirty unknown
    assert git_state(ROOT)[0] != "a" * 40  # a real checkout says its own HEAD


# -- every device script in DRY_RUN mode -------------------------------------------------------


#: The dry-run tests share one module fixture (five scripts run once): under `pytest -n N
#: --dist loadgroup` they go to one worker, so that it runs once, not once per worker.
DRY_GROUP = pytest.mark.xdist_group("gpu-session-dry-runs")


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """Run the four device scripts and session.sh at once with DRY_RUN=1: {name: (rc, output,
    OUT)}.

    The carried wheels (if any) are installed once first, with the scripts' own function;
    the scripts then find them installed, as on a warm device machine."""
    tmp = tmp_path_factory.mktemp("dry")
    site = tmp / "site"
    subprocess.run(
        [
            "bash",
            "-c",
            f"source <(sed -n '/^install_wheels() {{/,/^}}/p' {GPU_DIR}/common.sh)"
            " && install_wheels",
        ],
        cwd=ROOT,
        env=_env(tmp, SITE=str(site)),
        capture_output=True,
        timeout=120,
    )
    procs = {}
    for name in (*DEVICE_SCRIPTS, SESSION):
        out = tmp / f"out-{name}"
        env = _env(tmp, DRY_RUN="1", OUT=str(out), GPU_SITE=str(site))
        if name == SESSION:
            env["RUN_TAG"] = "session-dry"  # its default names the UTC time
        procs[name] = (
            subprocess.Popen(
                ["bash", str(GPU_DIR / f"{name}.sh")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
            out,
        )
    results = {}
    for name, (proc, out) in procs.items():
        text, _ = proc.communicate(timeout=180)
        results[name] = (proc.returncode, text, out)
    return results


@pytest.mark.parametrize("name", DEVICE_SCRIPTS, ids=DEVICE_SCRIPTS)
@DRY_GROUP
@pytest.mark.slow
def test_dry_run_ends_with_gpu_steps_skipped_and_results_packed(dry_runs, name):
    rc, text, out = dry_runs[name]
    tag = "bench-iteration-rows-pytest-asv" if name == "bench" else name
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([f"{tag}.tar.gz", f"{tag}.log", f"{tag}-steps.tsv"]), files
    assert len(files) <= MAX_OUT_FILES and all(OUT_NAME.match(f) for f in files)
    steps = {s["step"]: s for s in _steps(out / f"{tag}-steps.tsv")}
    gpu = [s for s in steps.values() if s["kind"] == "gpu"]
    assert gpu and all(s["status"] == "skipped" for s in gpu)
    assert {s["note"] for s in gpu} == {"DRY_RUN=1" if HAS_GPU else "no GPU"}
    assert list(steps)[:3] == ["env", "wheels", "git"]  # the environment is printed first
    assert steps["env"]["status"] == "ok", (out / f"{tag}.log").read_text()[-3000:]
    assert steps["git"]["status"] == "ok"
    assert steps["wheels"]["status"] == ("ok" if _wheels() else "failed")
    cpu_ok = all(s["status"] == "ok" for s in steps.values() if s["kind"] == "cpu")
    assert rc == (0 if cpu_ok else 1), text[-3000:]
    assert text.rstrip().splitlines()[-1].split()[0] == list(steps)[-1]  # table printed last
    with tarfile.open(out / f"{tag}.tar.gz") as tar:
        members = tar.getnames()
    report = _default(name, "REPORT").replace("@DEVICE@", "no-gpu")
    assert all(m == "." or m.startswith("./reports") for m in members)
    for leaf in ("STATUS.md", "steps.tsv", "console.log", "env.json", "logs/git.log"):
        assert f"./{report}/session/{tag}/{leaf}" in members


@DRY_GROUP
@pytest.mark.slow
def test_dry_run_of_reproduce_renders_the_report(dry_runs):
    rc, _, out = dry_runs["reproduce"]
    with tarfile.open(out / "reproduce.tar.gz") as tar:
        members = set(tar.getnames())
    assert "./reports/gpu-scale/index.html" in members  # every target listed, none run here
    with tarfile.open(out / "reproduce.tar.gz") as tar:
        index = tar.extractfile("./reports/gpu-scale/index.html").read().decode()
    # a missing target names the command that makes it at this report's scale
    assert "--scale gpu" in index and "--scale cpu" not in index


@DRY_GROUP
@pytest.mark.slow
def test_dry_run_of_session_runs_every_part_and_returns_one_tarball(dry_runs):
    rc, text, out = dry_runs[SESSION]
    tag = "session-dry"
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([f"{tag}.tar.gz", f"{tag}.log", f"{tag}-steps.tsv"]), files
    steps = {s["step"]: s for s in _steps(out / f"{tag}-steps.tsv")}
    parts = [s for s in steps.values() if s["kind"] == "part"]
    assert [s["step"] for s in parts] == list(_session_parts())
    assert all(s["status"] == "ok" for s in parts), text[-3000:]
    assert list(steps)[:3] == ["env", "wheels", "git"]  # once, for every part
    assert rc == (0 if steps["wheels"]["status"] == "ok" else 1), text[-3000:]
    with tarfile.open(out / f"{tag}.tar.gz") as tar:
        members = set(tar.getnames())
        status = tar.extractfile(f"./reports/gpu/session/{tag}/STATUS.md").read().decode()
    # every script's results under its own report folder, one session folder per part
    for folder in (
        "reports/gpu/session/kernels-compile",
        "reports/gpu/session/kernels-tests",
        "reports/gpu/session/kernels-tests-other",
        "reports/gpu/session/kernels-sanitizers",
        "reports/gpu/session/kernels-bench",
        "reports/sdgp-semi/no-gpu/session/sdgp_semi-tests",
        "reports/bench/gpu/session/bench-iteration",
        "reports/bench/gpu/session/bench-asv",
        "reports/gpu-scale/session/reproduce-figs",
        "reports/gpu-scale/session/reproduce-fig7",
        "reports/sdgp-semi/no-gpu/session/sdgp_semi-fp16",
    ):
        assert f"./{folder}/STATUS.md" in members, folder
    assert "./reports/gpu-scale/index.html" in members
    # the session's status lists the steps of the scripts it ran, each skipped for want of a GPU
    sub = [ln for ln in status.splitlines() if ln.startswith("| kernels-sanitizers ")]
    assert [ln.split("|")[2].strip() for ln in sub] == ["racecheck", "memcheck"]
    assert all("| gpu | skipped |" in ln for ln in sub)
    assert "| reproduce-fig7 | prunetrain.fig7 | gpu | skipped |" in status


@pytest.mark.slow
def test_session_goes_on_where_an_earlier_call_or_lease_stopped(tmp_path):
    """A call that names no part leaves out the parts that ran before on the machine and those
    an earlier lease's committed step table says ended ok; a named part runs again; a part
    whose script had no time left for a step reads "partial" and is not noted as run."""
    state = tmp_path / "state"
    state.mkdir()
    earlier = tmp_path / "earlier-steps.tsv"  # as a lease commits it
    earlier.write_text(
        "step\tkind\tstatus\trc\tseconds\tlimit_s\tnote\n"
        "rows\tpart\tok\t0\t80\t140\t\n"
        "iteration\tpart\ttimeout\t124\t200\t200\t\n"
    )
    left = {"rows", "iteration", "figs"}
    others = [p for p in _session_parts() if p not in left]
    (state / "ran").write_text("".join(f"{p} ok 2026-01-01T00:00:00Z\n" for p in others))
    env = _env(
        tmp_path,
        DRY_RUN="1",
        DRY_STATE_DIR=str(state),
        COMMON_DONE="1",
        EARLIER_STEPS=str(earlier),
    )

    def call(tag: str, *parts: str, **extra: str) -> dict[str, dict[str, str]]:
        out = tmp_path / tag
        run_env = dict(env, OUT=str(out), RUN_TAG=tag, **extra)
        res = subprocess.run(
            ["bash", str(GPU_DIR / "session.sh"), *parts],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout[-3000:]
        return {s["step"]: s for s in _steps(out / f"{tag}-steps.tsv")}

    first = call("session-a")
    assert first["rows"]["note"].startswith("ran earlier: ok in an earlier lease")
    assert first["iteration"]["status"] == "ok"  # cut in that lease: runs again
    assert first["figs"]["status"] == "ok"
    for p in others:
        assert first[p]["status"] == "skipped" and first[p]["note"].startswith("ran earlier")
    ran = (state / "ran").read_text().splitlines()
    assert [ln.split()[0] for ln in ran[len(others) :]] == ["rows", "iteration", "figs"]
    assert ran[-1].startswith("figs ok ")

    (state / "ran").write_text("".join(f"{p} ok 2026-01-01T00:00:00Z\n" for p in others))
    # 47 s, 30 kept for packing: figs gets ~17 s, its script ~12, too few for its render step
    short = call("session-b", "figs", BUDGET_S="47", EARLIER_STEPS="/nonexistent")
    assert list(short) == ["figs"]
    assert (short["figs"]["status"], short["figs"]["note"]) == (
        "partial",
        "a step had no time left",
    )
    assert "figs" not in (state / "ran").read_text()  # the next call runs it

    again = call("session-c", "rows", "asv")  # named: run whatever the notes say
    assert list(again) == ["rows", "asv"] and again["asv"]["status"] == "ok"
    bad = subprocess.run(
        ["bash", str(GPU_DIR / "session.sh"), "no-such-part"],
        env=dict(env, OUT=str(tmp_path / "bad")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown part 'no-such-part'" in bad.stderr


# -- the helpers -------------------------------------------------------------------------------


def test_find_tool_takes_the_path_then_the_globs(tmp_path):
    env_report = _module("env_report")
    assert env_report.find_tool("bash") == shutil.which("bash")
    tool = tmp_path / "tool-42"
    tool.write_text("#!/bin/sh\n")
    (tmp_path / "tool-1").write_text("not executable")
    assert env_report.find_tool("no-such-tool-xyz", [str(tmp_path / "tool-*")]) is None
    tool.chmod(0o755)
    assert env_report.find_tool("no-such-tool-xyz", [str(tmp_path / "tool-*")]) == str(tool)


def test_versions_and_imports_report_what_is_missing():
    env_report = _module("env_report")
    got = env_report.versions(("pytest", "no-such-distribution-xyz"))
    assert got["pytest"] == pytest.__version__ and got["no-such-distribution-xyz"] is None
    imports = env_report.check_imports(["json", "no_such_module_xyz"])
    assert imports["json"] == "ok"
    assert imports["no_such_module_xyz"].startswith("ModuleNotFoundError")


def test_env_report_collects_torch_cupy_and_tools():
    env_report = _module("env_report")
    info = env_report.collect(["json"])
    assert info["torch"]["version"] == torch.__version__
    assert info["torch"]["cuda_available"] == HAS_GPU
    assert "version" in info["cupy"] or "error" in info["cupy"]
    assert set(info["tools"]) == {"nvidia-smi", "nvcc", "compute-sanitizer", "ncu", "git"}
    assert info["imports"] == {"json": "ok"}
    assert json.dumps(info, default=str)  # what --json writes


def test_env_report_main_exit_status_follows_the_imports(tmp_path, capsys):
    env_report = _module("env_report")
    path = tmp_path / "env.json"
    assert env_report.main(["--quiet", "--import", "json", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["imports"] == {"json": "ok"}
    assert env_report.main(["--quiet", "--import", "json", "no_such_module_xyz"]) == 1
    assert "import no_such_module_xyz: ModuleNotFoundError" in capsys.readouterr().out


def test_compile_kernels_lists_every_kernel_the_ops_launch():
    from impl.cuda import loader
    from impl.ops import nm_cuda, pack_cuda, pattern_cuda

    by_source = _module("compile_kernels").kernels_by_source()
    assert set(by_source) == set(loader.SOURCES)
    assert by_source["pattern.cu"] == pattern_cuda.KERNELS
    assert by_source["nm_prune.cu"] == nm_cuda.KERNELS
    assert by_source["pack.cu"] == pack_cuda.KERNELS


@pytest.mark.skipif(HAS_GPU, reason="checks the behaviour without a GPU")
def test_compile_kernels_without_gpu_reports_why(tmp_path):
    ck = _module("compile_kernels")
    assert ck.compile_all()["errors"] == ["no CUDA GPU visible to torch"]
    assert ck.main(["--json", str(tmp_path / "k.json")]) == 1
    assert json.loads((tmp_path / "k.json").read_text())["kernels"] == {}


@pytest.mark.gpu
def test_compile_kernels_on_a_gpu_reads_every_kernel():
    ck = _module("compile_kernels")
    report = ck.compile_all()
    assert report["errors"] == []
    wanted = {k for names in ck.kernels_by_source().values() for k in names}
    assert set(report["kernels"]) == wanted
    assert all(
        a["num_regs"] > 0 and a["max_threads_per_block"] > 0 for a in report["kernels"].values()
    )
    major, minor = torch.cuda.get_device_capability(0)
    assert report["arch"] == f"sm_{major}{minor}"
    assert "libnvrtc.so" in report["nvrtc_library"]  # the library CuPy compiled with


def test_compile_kernels_scans_the_machine_code_for_the_device(tmp_path, monkeypatch, capsys):
    """--sass compiles the sources again with the library CuPy used, for the device's
    architecture (here a stand-in writing SASS text), and writes the scan; exit 1 on a
    hazard, 0 without, 2 when the scan cannot run, and no scan when the compile failed."""
    from impl.cuda import nvrtc

    ck = _module("compile_kernels")
    report = {"sources": {}, "kernels": {}, "errors": [], "arch": "sm_90",
              "nvrtc_library": "/site/nvidia/cu13/lib/libnvrtc.so.13"}  # fmt: skip
    monkeypatch.setattr(ck, "compile_all", lambda: report)
    sass = {"text": ""}
    compiled = []

    def fake_compile(arch, out_dir, library=None):
        compiled.append((arch, library))
        path = Path(out_dir) / "pattern.sass"
        path.write_text(sass["text"])
        return [path]

    monkeypatch.setattr(nvrtc, "compile_loader_sources", fake_compile)
    monkeypatch.setattr(nvrtc, "load", lambda library=None: library)
    monkeypatch.setattr(nvrtc, "version", lambda lib: (13, 0))
    racy = (
        "\t\tFunction : pdt_k\n        /*0000*/ LDS R3, [UR11+0x8000] ;\n"
        "        /*0010*/ @!P1 STS [UR11+0x8000], RZ ;\n"
    )
    sass["text"] = racy
    out = tmp_path / "sass.json"
    assert ck.main(["--sass", str(out)]) == 1
    assert compiled == [("sm_90", "/site/nvidia/cu13/lib/libnvrtc.so.13")]
    scan = json.loads(out.read_text())
    assert scan["nvrtc"]["version"] == "13.0" and scan["kernels"] == 1
    assert len(scan["hazards"]) == 1 and "pdt_k: +0x0 LDS" in scan["hazards"][0]
    assert "HAZARD: pdt_k" in capsys.readouterr().out
    sass["text"] = racy.replace("STS", "STG.E")
    assert ck.main(["--sass", str(out)]) == 0
    assert json.loads(out.read_text())["hazards"] == []
    assert "(NVRTC 13.0, sm_90, /site/nvidia/cu13/lib/libnvrtc.so.13): 0 hazard(s) in 1" in (
        capsys.readouterr().out
    )
    assert ck.main([]) == 0 and len(compiled) == 2  # no --sass: no scan

    def no_tool(*a, **k):
        raise FileNotFoundError("no cuobjdump")

    monkeypatch.setattr(ck, "sass_scan", no_tool)
    assert ck.main(["--sass", str(tmp_path / "none.json")]) == 2
    assert "scan could not run: no cuobjdump" in capsys.readouterr().out
    assert not (tmp_path / "none.json").exists()
    report["errors"] = ["pattern.cu: nvrtc: error"]
    assert ck.main(["--sass", str(out)]) == 1
    # --report: the arch and library of an earlier --json, the kernels not loaded again
    monkeypatch.undo()  # the real sass_scan
    monkeypatch.setattr(ck, "compile_all", lambda: pytest.fail("compiled again"))
    monkeypatch.setattr(nvrtc, "compile_loader_sources", fake_compile)
    monkeypatch.setattr(nvrtc, "load", lambda library=None: library)
    monkeypatch.setattr(nvrtc, "version", lambda lib: (13, 0))
    earlier = tmp_path / "kernels.json"
    earlier.write_text(json.dumps(dict(report, errors=[], arch="sm_80")))
    assert ck.main(["--sass", str(out), "--report", str(earlier)]) == 0
    assert compiled[-1] == ("sm_80", "/site/nvidia/cu13/lib/libnvrtc.so.13")
    assert json.loads(out.read_text())["nvrtc"]["arch"] == "sm_80"
    assert ck.main(["--sass", str(out), "--report", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the report" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ck.main(["--report", str(earlier)])  # read only for --sass


# -- what a sanitizer run launched -------------------------------------------------------------

FAMILIES = {
    "pdt_csr_gather",
    "pdt_csr_scatter",
    "pdt_conv_implicit",
    "pdt_conv_implicit_tiled",
    "pdt_spmm",
    "pdt_spmm_tiled",
    "pdt_spmm_piped",
    "pdt_sddmm",
    "pdt_sddmm_tiled",
    "pdt_nm_select",
    "pdt_nm_gselect",
    "pdt_nm_gstats",
    "pdt_nm_cstats",
    "pdt_nm_stats",
    "pdt_nm_fused",
    "pdt_nm_ratio",
    "pdt_pack",
    "pdt_unpack",
    "pdt_expand",
}


def _all_kernels() -> list[str]:
    return [k for ks in _module("compile_kernels").kernels_by_source().values() for k in ks]


def test_kernel_families_strip_type_and_variant_only():
    cov = _module("sanitizer_coverage")
    assert cov.family("pdt_spmm_tiled_f32_vec") == "pdt_spmm_tiled"
    assert cov.family("pdt_nm_fused_bf16_w16") == "pdt_nm_fused"
    assert cov.family("pdt_pack_b8_i64") == "pdt_pack"
    assert cov.family("pdt_nm_ratio_f64") == "pdt_nm_ratio"
    assert {cov.family(k) for k in _all_kernels()} == FAMILIES


def _one_kernel_per_family() -> dict[str, str]:
    """{family: its first kernel name}."""
    cov = _module("sanitizer_coverage")
    first: dict[str, str] = {}
    for k in _all_kernels():
        first.setdefault(cov.family(k), k)
    return first


def _launch_log(path: Path, *records: dict[str, int]) -> Path:
    path.write_text("".join(json.dumps({"pid": 1, "launched": r}) + "\n" for r in records))
    return path


def test_sanitizer_coverage_fails_on_a_family_that_never_ran(tmp_path, capsys):
    cov = _module("sanitizer_coverage")
    one_each = _one_kernel_per_family()
    everything = _launch_log(tmp_path / "all.jsonl", {k: 2 for k in one_each.values()})
    out = tmp_path / "cov.json"
    assert cov.main([str(everything), "--tool", "memcheck", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["families_missing"] == [] and set(got["families_launched"]) == FAMILIES
    assert len(got["kernels_launched"]) == len(FAMILIES) and got["records"] == 1
    assert got["kernels_total"] == len(set(_all_kernels())) and got["launches"] == 2 * len(FAMILIES)
    # two processes' records add up; a family with no launch is named
    no_pack = {k: 1 for f, k in one_each.items() if f != "pdt_pack"}
    split = _launch_log(
        tmp_path / "split.jsonl", dict(list(no_pack.items())[:5]), dict(list(no_pack.items())[5:])
    )
    assert cov.main([str(split), "--tool", "memcheck"]) == 1
    assert "NOT LAUNCHED (not checked): pdt_pack" in capsys.readouterr().out
    # a cut run writes no record: not a pass
    assert cov.main([str(tmp_path / "absent.jsonl"), "--tool", "memcheck"]) == 1
    assert "no launch record" in capsys.readouterr().out


def test_racecheck_coverage_asks_for_the_families_with_shared_memory(tmp_path, capsys):
    cov = _module("sanitizer_coverage")
    kernels = _all_kernels()
    shared = [k for k in kernels if cov.family(k) in ("pdt_spmm", "pdt_nm_stats")]
    report = tmp_path / "kernels.json"
    report.write_text(
        json.dumps(
            {"kernels": {k: {"shared_size_bytes": 4096 if k in shared else 0} for k in kernels}}
        )
    )
    ran = _launch_log(tmp_path / "r.jsonl", {shared[0]: 1, "pdt_nm_stats_f32_w1": 3})
    argv = [str(ran), "--tool", "racecheck"]
    assert (
        cov.main([*argv, "--kernels", str(tmp_path / "none.json"), "--kernels", str(report)]) == 0
    )
    assert "required 2 (families with shared memory" in capsys.readouterr().out
    # without the compile step's report: the families ptxas reports shared memory for
    assert cov.main(argv) == 1
    out = capsys.readouterr().out
    assert "no kernels.json: the families with shared memory by ptxas" in out
    assert f"required {len(cov.SHARED_MEMORY_FAMILIES)} " in out
    assert "pdt_pack" not in out.split("NOT LAUNCHED")[1]  # no shared memory: not asked for
    first = _one_kernel_per_family()
    every_shared = {first[f]: 1 for f in cov.SHARED_MEMORY_FAMILIES}
    log = _launch_log(tmp_path / "s.jsonl", every_shared)
    assert cov.main([str(log), "--tool", "racecheck"]) == 0


@pytest.mark.slow
def test_sanitizer_step_keeps_the_runs_failure_and_else_the_coverages(tmp_path):
    """``covered`` of kernels.sh: a failed sanitizer run fails the step whatever the coverage;
    a clean run fails it only when a family it must check never ran."""
    one_each = _one_kernel_per_family()
    _launch_log(tmp_path / "memcheck-launches.jsonl", {k: 1 for k in one_each.values()})
    _launch_log(tmp_path / "racecheck-launches.jsonl", {"pdt_spmm_f32_vec": 1})
    fn = f"source <(sed -n '/^covered() {{/,/^}}/p' {GPU_DIR / 'kernels.sh'})"

    def rc(tool: str, run_rc: int) -> int:
        cmd = f"set -o pipefail; {fn}; covered {tool} {run_rc}"
        env = _env(tmp_path, DEST=str(tmp_path), PY=sys.executable)
        return subprocess.run(
            ["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True
        ).returncode

    assert rc("memcheck", 7) == 7  # the sanitizer found something: that is the result
    assert rc("racecheck", 0) == 1  # no kernels.json here: seven families asked, one ran
    # the coverage still ran after the failed run (all launched: it alone would pass)
    assert f"launched {len(FAMILIES)} kernel families" in (tmp_path / "memcheck.log").read_text()
    assert json.loads((tmp_path / "memcheck-coverage.json").read_text())["families_missing"] == []
    assert json.loads((tmp_path / "racecheck-coverage.json").read_text())["families_missing"]


#: compute-sanitizer's console as a cut racecheck run leaves it (pytest -v beside it): the
#: banner, two hazards (one after a test's name) and their continuation lines, no summary.
_RACECHECK_CUT_LOG = """\
========= COMPUTE-SANITIZER
============================= test session starts ==============================
tests/test_cuda_ops.py::test_a[f32-1x1x1] PASSED [  0%]
tests/test_cuda_ops.py::test_a[f32-7x13x29] ========= Warning: Race reported between Read \
access at pdt_spmm_f32_scalar+0x340
=========     and Write access at pdt_spmm_f32_scalar+0x370 [4 hazards]
=========\x20
PASSED [  1%]
========= Error: Race reported between Read access at pdt_spmm_tiled_f32_vec+0x7c0
=========     and Write access at pdt_spmm_tiled_f32_vec+0x800 [500 hazards]
"""


def test_sanitizer_findings_are_the_reports_first_lines_not_banners_or_rules():
    cov = _module("sanitizer_coverage")
    found = cov.sanitizer_findings(_RACECHECK_CUT_LOG)
    assert found == [
        "Warning: Race reported between Read access at pdt_spmm_f32_scalar+0x340",
        "Error: Race reported between Read access at pdt_spmm_tiled_f32_vec+0x7c0",
    ]
    clean = "========= COMPUTE-SANITIZER\n=== 3 passed ===\n========= ERROR SUMMARY: 0 errors\n"
    assert cov.sanitizer_findings(clean) == []
    memcheck = "========= Invalid __global__ read of size 4 bytes\n=========     at pdt_pack_b4\n"
    assert cov.sanitizer_findings(memcheck) == ["Invalid __global__ read of size 4 bytes"]
    assert cov.sanitizer_findings("========= RACECHECK SUMMARY: 0 hazards displayed\n") == []


def test_sanitizer_coverage_fails_on_a_report_in_the_log_of_a_cut_run(tmp_path, capsys):
    cov = _module("sanitizer_coverage")
    first = _one_kernel_per_family()
    ran = _launch_log(tmp_path / "r.jsonl", {first[f]: 1 for f in cov.SHARED_MEMORY_FAMILIES})
    log = tmp_path / "racecheck.log"
    log.write_text(_RACECHECK_CUT_LOG)
    out = tmp_path / "cov.json"
    argv = [str(ran), "--tool", "racecheck", "--json", str(out), "--sanitizer-log", str(log)]
    assert cov.main(argv) == 2  # every family ran: only the reports fail it
    assert "2 sanitizer report(s)" in capsys.readouterr().out
    got = json.loads(out.read_text())
    assert got["findings"] == 2 and got["families_missing"] == []
    assert got["finding_kinds"] == {
        "Warning: Race reported between Read access": 1,
        "Error: Race reported between Read access": 1,
    }
    log.write_text("========= COMPUTE-SANITIZER\n")
    assert cov.main(argv) == 0
    assert json.loads(out.read_text())["findings"] == 0


@pytest.mark.slow
def test_sanitizer_step_fails_a_cut_run_whose_log_holds_a_report(tmp_path):
    """A sanitizer cut at its limit (124) reads "cut" only while its log holds no report."""
    cov = _module("sanitizer_coverage")
    first = _one_kernel_per_family()
    _launch_log(
        tmp_path / "racecheck-launches.jsonl", {first[f]: 1 for f in cov.SHARED_MEMORY_FAMILIES}
    )
    fn = f"source <(sed -n '/^covered() {{/,/^}}/p' {GPU_DIR / 'kernels.sh'})"
    env = _env(tmp_path, DEST=str(tmp_path), PY=sys.executable)

    def rc() -> int:
        cmd = f"set -o pipefail; {fn}; covered racecheck 124"
        return subprocess.run(
            ["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True
        ).returncode

    (tmp_path / "racecheck.log").write_text("========= COMPUTE-SANITIZER\n")
    assert rc() == 124  # cut, nothing reported: still "cut"
    (tmp_path / "racecheck.log").write_text(_RACECHECK_CUT_LOG)
    assert rc() == 1


def test_loader_records_each_launch_by_kernel_name(monkeypatch):
    import types
    from contextlib import nullcontext

    from impl.cuda import loader

    ran = []
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(Device=lambda index: nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(loader, "_device_index", lambda device: 0)
    monkeypatch.setattr(
        loader, "get_function", lambda source, name, index: lambda *a, **k: ran.append(name)
    )
    monkeypatch.setattr(loader, "kernel_args", lambda args, index, name: tuple(args))
    monkeypatch.setattr(loader, "torch_stream", lambda index: nullcontext())
    monkeypatch.setattr(loader, "_launches", collections.Counter())
    for name in ("pdt_pack_b4_i64", "pdt_pack_b4_i64", "pdt_unpack_b4_i64"):
        loader.launch("pack.cu", name, (1, 1, 1), (32, 1, 1), [])
    assert ran == ["pdt_pack_b4_i64", "pdt_pack_b4_i64", "pdt_unpack_b4_i64"]
    assert loader.launched() == {"pdt_pack_b4_i64": 2, "pdt_unpack_b4_i64": 1}
    with pytest.raises(ValueError, match="empty launch"):
        loader.launch("pack.cu", "pdt_pack_b4_i64", (0, 1, 1), (32, 1, 1), [])
    assert loader.launched()["pdt_pack_b4_i64"] == 2  # a refused launch is not counted


def test_a_test_session_records_its_launches_as_it_goes_when_asked(tmp_path, monkeypatch):
    """The hooks of tests/conftest.py append, when PDT_KERNEL_LAUNCH_LOG is set, a JSON line
    per test that launched kernels (those since the last line: a run stopped at its time
    limit still shows what it checked) and one at the session's end with its exit status;
    the lines add up to the process's launches (what sanitizer_coverage.py sums). Nothing
    is written when the variable is not set."""
    spec = importlib.util.spec_from_file_location("pdt_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    from impl.cuda import loader

    launches = collections.Counter(pdt_spmm_f32_vec=3)
    monkeypatch.setattr(loader, "_launches", launches)
    log = tmp_path / "launches.jsonl"
    monkeypatch.delenv(conftest.LAUNCH_LOG_VARIABLE, raising=False)
    conftest.pytest_runtest_logfinish("t0", ("f", 0, "t0"))
    conftest.pytest_sessionfinish(None, 0)
    assert not log.exists()
    monkeypatch.setenv(conftest.LAUNCH_LOG_VARIABLE, str(log))
    conftest.pytest_runtest_logfinish("t1", ("f", 0, "t1"))
    conftest.pytest_runtest_logfinish("t2", ("f", 0, "t2"))  # launched nothing: no line
    launches.update(pdt_spmm_f32_vec=2, pdt_pack_b4_i64=1)
    conftest.pytest_runtest_logfinish("t3", ("f", 0, "t3"))
    conftest.pytest_sessionfinish(None, 1)
    rows = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [r["launched"] for r in rows] == [
        {"pdt_spmm_f32_vec": 3},
        {"pdt_spmm_f32_vec": 2, "pdt_pack_b4_i64": 1},
        {},
    ]
    assert [r.get("exitstatus") for r in rows] == [None, None, 1]
    assert all(r["pid"] == os.getpid() for r in rows)
    total, records = _module("sanitizer_coverage").read_launches(log)
    assert (total, records) == ({"pdt_spmm_f32_vec": 5, "pdt_pack_b4_i64": 1}, 3)


@pytest.mark.slow
def test_make_gpu_check_runs_the_kernels_script_and_unpacks_its_results(tmp_path):
    """``make gpu-check`` is kernels.sh with the installed Python and no wheels: its results
    land under reports/gpu/ even when a step fails, and a failure fails the target."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    stamp = ROOT / ".venv" / ".pdtbench-installed"
    if not stamp.exists():
        pytest.skip("needs the installed .venv (make's stamp), as make test makes it")
    into = tmp_path / "into"
    args = ["make", "-s", "-C", str(ROOT), "gpu-check", f"GPU_CHECK_INTO={into}"]
    # without a GPU, not a dry run: a failure (no GPU, exit 2), and the results still come back
    env = _env(tmp_path, DRY_RUN="1") if HAS_GPU else _env(tmp_path)
    res = subprocess.run(args, env=env, capture_output=True, text=True)
    assert "gpu-check: results in" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
    assert res.returncode == (0 if HAS_GPU else 2)
    steps = {s["step"]: s for s in _steps(into / "reports/gpu/session/kernels/steps.tsv")}
    assert steps["wheels"]["status"] == "ok"  # WHEELS=0: none wanted, none missing
    assert "none wanted" in (into / "reports/gpu/session/kernels/logs/wheels.log").read_text()
    assert list(steps)[3:] == [n for n, _, _ in _steps_of("kernels")]


def _fake_py(tmp_path: Path, bench_run: str) -> Path:
    """A PY that runs ``bench_run`` (bash) for ``-m bench.run`` and the real Python otherwise."""
    fake = tmp_path / "fake-py"
    fake.write_text(
        "#!/bin/bash\n"
        f'for a in "$@"; do [ "$a" = bench.run ] && {{ {bench_run}; }}; done\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    return fake


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bench_run", "status", "noted"),
    [("sleep 100; exit 0", "partial", False), ("exit 3", "failed", True)],
    ids=["out-of-time", "own-failure"],
)
def test_part_cut_by_a_shortened_limit_runs_again_in_the_next_call(
    tmp_path, bench_run, status, noted
):
    """The session's budget left the rows part 45 s of its 140: its script's step ran out of
    time, so the part reads "partial" and is not noted as run (the next call that names no
    part runs it), and the session does not fail for it. A failure of its own, within the
    same shortened limit, is a failure and noted. (At 40 s the script's own step had 15 s
    left at its first second, the least a step starts with: one second's tick skipped it.)"""
    state = tmp_path / "state"
    out = tmp_path / "out"
    # a tree of its own: with a GPU said present the session unpacks each part's results
    # into the tree it runs in (on the device, the repository), here tmp_path/tree
    tree = tmp_path / "tree"
    shutil.copytree(
        GPU_DIR, tree / "scripts" / "gpu"
    )  # the scripts take their tree from where they are
    env = _env(
        tmp_path,
        PY=str(_fake_py(tmp_path, bench_run)),
        COMMON_DONE="1",
        CALLER_HAVE_GPU="1",
        DRY_RUN="0",
        STATE_DIR=str(state),
        EARLIER_STEPS="/nonexistent",
        OUT=str(out),
        RUN_TAG="session-x",
        BUDGET_S="75",
    )
    res = subprocess.run(
        ["bash", str(tree / "scripts" / "gpu" / "session.sh"), "rows"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (row,) = _steps(out / "session-x-steps.tsv")
    assert (row["step"], row["status"]) == ("rows", status), res.stdout
    # 75 s of budget less 30 kept for packing, less the second that may tick before the part
    # starts on a loaded machine
    assert row["limit_s"] in ("45", "44"), res.stdout
    ran = (state / "ran").read_text() if (state / "ran").exists() else ""
    assert ("rows failed" in ran) is noted
    assert res.returncode == (1 if noted else 0)
    assert (tree / "reports" / "bench" / "gpu").is_dir()  # unpacked here, not into ROOT
    if not noted:
        assert row["note"] == "failed within a shortened limit (own limit 140s)"


def test_a_stopped_script_stops_the_step_it_was_running(tmp_path):
    # The step's command runs under `timeout` in a process group of its own: a SIGTERM to the
    # script (its caller's limit) must not leave it running on.
    pid_file = tmp_path / "pid"
    script = tmp_path / "long.sh"
    script.write_text(
        "NAME=long\nREPORT=reports/long-check\nDEFAULT_BUDGET_S=120\n"
        f"source {GPU_DIR / 'common.sh'}\n"
        f'step long cpu 60 \'trap "echo last > \\"\\$DEST/last.txt\\"; exit 0" TERM; '
        f"sleep 45 & echo $! > {pid_file}; wait'\n"
    )
    proc = subprocess.Popen(
        ["bash", str(script)],
        env=_env(tmp_path, OUT=str(tmp_path / "out"), DRY_RUN="0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    sleeper = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(sleeper, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(sleeper, signal.SIGKILL)
        pytest.fail("the step's command outlived its stopped script")
    # what the step wrote as it was stopped is in the tarball
    with tarfile.open(tmp_path / "out" / "long.tar.gz") as tar:
        last = tar.extractfile("./reports/long-check/last.txt")
        assert last is not None and last.read() == b"last\n"


@pytest.mark.parametrize(("status", "packed"), [(0, True), (1, True), (2, False)])
def test_pack_stage_takes_a_file_changed_while_read(tmp_path, status, packed):
    # GNU tar's status 1 ("file changed as we read it": a stopped step writing its last rows)
    # still leaves a whole archive; 2 and above are failures.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "tar").write_text(f'#!/bin/bash\necho archive > "$4"\nexit {status}\n')
    (fake / "tar").chmod(0o755)
    fn = f"source <(sed -n '/^pack_stage() {{/,/^}}/p' {GPU_DIR / 'common.sh'})"
    cmd = f'{fn}; STAGE={tmp_path}; pack_stage "{tmp_path}/x.tgz" && echo packed'
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    res = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True)
    assert ("packed" in res.stdout) is packed, res.stderr


@pytest.mark.slow
def test_a_later_call_on_the_same_machine_skips_the_environment_report(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    env = _env(tmp_path, DRY_RUN="1", DRY_STATE_DIR=str(state), EARLIER_STEPS="/nonexistent")

    def env_row(tag: str) -> dict[str, str]:
        out = tmp_path / tag
        subprocess.run(
            ["bash", str(GPU_DIR / "session.sh"), "compile"],
            env=dict(env, OUT=str(out), RUN_TAG=tag),
            capture_output=True,
            text=True,
            timeout=300,
        )
        return {s["step"]: s for s in _steps(out / f"{tag}-steps.tsv")}["env"]

    assert env_row("session-a")["status"] == "ok"
    assert (state / "env-reported").read_text().startswith("session-a ")
    second = env_row("session-b")
    assert second["status"] == "skipped"
    assert second["note"].startswith("reported by an earlier call on this machine (session-a ")


def _fake_venv(tmp_path: Path, first_status: int) -> tuple[Path, Path]:
    """A VENV whose python and asv log each call to ``calls`` and succeed, but for the first
    ``bench.run``, which exits ``first_status``; make's stamp newer than what it depends on."""
    venv, log = tmp_path / "venv", tmp_path / "calls"
    (venv / "bin").mkdir(parents=True)
    for name in ("python", "asv"):
        tool = venv / "bin" / name
        tool.write_text(
            "#!/bin/bash\n"
            f'echo "{name} $*" >> {log}\n'
            f'case "$*" in "-m bench.run "*) [ -e {log}.first ] || '
            f"{{ touch {log}.first; exit {first_status}; }} ;; esac\n"
            "exit 0\n"
        )
        tool.chmod(0o755)
    (venv / ".pdtbench-installed").touch()
    return venv, log


@pytest.mark.parametrize(
    ("first_status", "make_fails", "calls"), [(1, True, 7), (0, False, 7), (130, True, 2)]
)
def test_make_bench_gpu_runs_every_step_and_stops_only_on_a_signal(
    tmp_path, first_status, make_fails, calls
):
    """``make bench-gpu``: a failed step (a kernel's error row: bench.run exits 1) does not
    cost the steps after it, and fails the target at the end; a step stopped by Ctrl-C (its
    status 128 or more) stops the target at once."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    venv, log = _fake_venv(tmp_path, first_status)
    res = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "bench-gpu", f"VENV={venv}"],
        capture_output=True,
        text=True,
    )
    lines = log.read_text().splitlines()
    assert len(lines) == calls, lines
    assert "impl.cuda.preflight bench-gpu" in lines[0]
    if calls == 7:
        assert [line.split()[0] for line in lines] == ["python"] * 4 + ["asv"] * 3
        assert "--suite iteration" in lines[2] and "--benchmark-only" in lines[3]
        assert lines[5].startswith("asv run -E existing:same --quick --set-commit-hash ")
        assert "bench-gpu: every step ran" in res.stdout
    assert (res.returncode != 0) == make_fails, res.stdout + res.stderr


def test_a_shallow_bundle_of_head_restores_that_commit_in_a_copy_without_git(tmp_path):
    """prepare.sh's bundle holds HEAD without its parents; restore_git (common.sh) makes a
    repository at that commit from it in a copy that has only files."""
    src = tmp_path / "src"
    src.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]

    def run(cwd: Path, *args: str) -> str:
        return subprocess.run(
            [*git, *args], cwd=cwd, check=True, capture_output=True, text=True
        ).stdout.strip()

    run(src, "init", "-q", ".")
    for i in range(3):
        (src / "big.txt").write_text(f"{i}\n" * 50_000)
        run(src, "add", "-A")
        run(src, "commit", "-q", "-m", f"c{i}")
    head = run(src, "rev-parse", "HEAD")
    fn = f"source <(sed -n '/^shallow_bundle() {{/,/^}}/p' {GPU_DIR / 'prepare.sh'})"
    bundle = tmp_path / "repo.bundle"
    env = _env(tmp_path)
    subprocess.run(["bash", "-c", f"{fn}; shallow_bundle {bundle}"], cwd=src, env=env, check=True)
    listed = subprocess.run(
        ["git", "bundle", "list-heads", str(bundle)], capture_output=True, text=True, check=True
    ).stdout
    assert listed.split()[0] == head
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "big.txt").write_text((src / "big.txt").read_text())
    (copy / ".gpu").mkdir()
    (copy / ".gpu" / "commit.txt").write_text(head + "\n")
    (copy / ".gpu" / "repo.bundle").write_bytes(bundle.read_bytes())
    fn = f"source <(sed -n '/^restore_git() {{/,/^}}/p' {GPU_DIR / 'common.sh'})"
    res = subprocess.run(
        ["bash", "-c", f"{fn}; restore_git"], cwd=copy, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"restored from .gpu/repo.bundle, HEAD {head}" in res.stdout
    assert run(copy, "rev-parse", "HEAD") == head
    assert run(copy, "rev-list", "--count", "HEAD") == "1"
    parent = run(src, "rev-parse", "HEAD~1")
    absent = subprocess.run(["git", "cat-file", "-e", parent], cwd=copy, capture_output=True)
    assert absent.returncode != 0  # HEAD alone travelled, not its history
    assert run(copy, "status", "--porcelain", "--untracked-files=no") == ""


def test_sanitizer_coverage_reads_unknown_kernels_missing_logs_and_summaries(tmp_path):
    cov = _module("sanitizer_coverage")
    first = _one_kernel_per_family()
    launched = {first[f]: 1 for f in cov.SHARED_MEMORY_FAMILIES}
    log = _launch_log(tmp_path / "r.jsonl", {**launched, "pdt_gone_f32": 2})
    out = tmp_path / "cov.json"
    argv = [str(log), "--tool", "racecheck", "--json", str(out)]
    # a sanitizer log that was never written (the run died first) is no report, not a crash
    assert cov.main([*argv, "--sanitizer-log", str(tmp_path / "absent.log")]) == 0
    got = json.loads(out.read_text())
    assert got["findings"] == 0 and got["unknown_launched"] == ["pdt_gone_f32"]
    assert "pdt_gone" not in got["families_launched"]  # a kernel the sources do not have
    assert cov.sanitizer_findings("========= LEAK SUMMARY: 0 bytes leaked in 0 allocations\n") == []
    report = tmp_path / "racecheck.log"
    report.write_text("========= Error: hazard in pdt_spmm_f32_vec+0x7c0 and more\n")
    assert cov.main([*argv, "--sanitizer-log", str(report)]) == 2
    assert json.loads(out.read_text())["finding_kinds"] == {"Error: hazard in pdt_spmm_f32_vec": 1}


def test_racecheck_coverage_of_an_empty_or_shared_memory_free_compile_report(tmp_path):
    cov = _module("sanitizer_coverage")
    log = _launch_log(tmp_path / "r.jsonl", {"pdt_pack_b4_i64": 1})
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"kernels": {}}))  # a compile step cut before any kernel
    out = tmp_path / "cov.json"
    argv = [str(log), "--tool", "racecheck", "--json", str(out)]
    assert cov.main([*argv, "--kernels", str(empty)]) == 1  # the ptxas list is asked for
    assert json.loads(out.read_text())["families_required"] == sorted(cov.SHARED_MEMORY_FAMILIES)
    none_shared = tmp_path / "none.json"
    none_shared.write_text(
        json.dumps({"kernels": {k: {"shared_size_bytes": 0} for k in _all_kernels()}})
    )
    no_record = tmp_path / "empty.jsonl"
    no_record.write_text("")
    # nothing required, but no test ended either: not a pass
    assert cov.main([str(no_record), "--tool", "racecheck", "--kernels", str(none_shared)]) == 1
    assert cov.main([str(log), "--tool", "racecheck", "--kernels", str(none_shared)]) == 0


@pytest.mark.parametrize("var, tool", [("MEMCHECK_K", "memcheck"), ("RACECHECK_K", "racecheck")])
def test_the_sanitizer_selections_docs_kernels_md_prints_are_the_scripts(var, tool):
    """docs/kernels.md prints the by-hand sanitizer commands with kernels.sh's selections; its
    racecheck one had stayed the selection the first H200 run found too large."""
    expr = subprocess.run(
        ["bash", "-c", f"eval \"$(sed -n '/^{var}=/,/}}$/p' kernels.sh)\"; printf %s \"${var}\""],
        cwd=GPU_DIR, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "not dense-grads" in expr
    doc = (ROOT / "docs" / "kernels.md").read_text()
    commands = re.findall(rf"--tool {tool} \$SAN \\\n.*\\\n\s+-k \"(.*)\"", doc)
    assert commands == [expr]
