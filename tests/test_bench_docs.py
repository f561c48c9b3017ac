"""docs/benchmarks.md and docs/distributed.md say what the Makefile and the code do."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start() -> list[str]:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_quick_start_describes_the_machine_before_the_first_asv_run():
    lines = _quick_start()
    first_run = next(i for i, line in enumerate(lines) if re.search(r"asv run\b", line))
    assert any("asv machine --yes" in line for line in lines[:first_run])


def test_quick_start_gpu_pytest_line_is_the_makefiles():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\nbench-gpu:", 1)[1].split("\n\n", 1)[0]
    ours = next(line for line in recipe.splitlines() if "-m pytest" in line and "bench" in line)
    json_path = re.search(r"--benchmark-json ([^\s;]+)", ours).group(1)
    select = re.search(r'-k "([^"]+)"', ours).group(1)
    doc = next(line for line in _quick_start() if "--benchmark-json" in line)
    assert f"--benchmark-json {json_path}" in doc and f'-k "{select}"' in doc


def test_distributed_doc_describes_the_comm_masks_the_methods_implement():
    from impl.methods import available_methods, method_class
    from impl.methods.base import Method

    text = (ROOT / "docs" / "distributed.md").read_text()
    section = text.split("**How a method publishes its masks.**", 1)[1].split("\n## ", 1)[0]
    assert "Proposed" not in section and "Until then" not in section
    assert "def comm_masks" in (ROOT / "impl" / "methods" / "base.py").read_text()
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    for name in available_methods():
        cls = method_class(name)
        row = next((r for r in rows if re.search(rf"\b{cls.__name__}\b", r, re.I)), None)
        assert row is not None, f"{name} ({cls.__name__}) missing from the table"
        publishes = cls.comm_masks is not Method.comm_masks
        assert ("| None (the base class)" not in row) == publishes, name
    assert "examples/gradual_magnitude.py" in section
    assert "def comm_masks" in (ROOT / "examples" / "gradual_magnitude.py").read_text()
    for test in re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", section):
        path, name = test
        assert (ROOT / path).exists(), path
        assert not name or f"def {name}(" in (ROOT / path).read_text(), name
