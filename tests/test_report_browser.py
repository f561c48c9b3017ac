"""The rendered report opens in headless Chromium: every figure decodes, no table is empty.

Needs Debian's ``chromium`` (``.ci/run`` installs it where missing); skipped, with that reason,
where it is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from impl.report import FigureSpec, ResultSet, render_reports
from reproductions.claims import evaluate as claim_rows

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)

# Appended to a copy of each page: after load, writes what it found into the DOM.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const tables = [...document.querySelectorAll('table')];
  const out = {images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length,
    tables: tables.length,
    empty_tables: tables.filter(t => t.querySelectorAll('tbody tr').length === 0).length};
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = 'PROBE' + JSON.stringify(out) + 'END';
  document.body.appendChild(pre);
});
</script>"""


def _probe(page) -> dict:
    probed = page.with_name("probe-" + page.name)
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
         "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    found = re.search(r"PROBE(\{.*?\})END", proc.stdout)
    assert found, f"no probe output from chromium (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(found.group(1))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_smoke_report_opens_in_headless_chromium(tmp_path):
    results = []
    for target in ("sdgp.table1", "cross.methods"):
        results.append(
            ResultSet(
                target=target,
                title=target,
                scale="smoke",
                rows=[
                    {
                        "row": "dense",
                        "metric": "top1",
                        "ours": 97.0,
                        "scale": "smoke",
                        "paper": 95.3,
                        "unit": "%",
                        "paper_source": "Table I",
                    }
                ],
                figures=[
                    FigureSpec(
                        kind="bar",
                        x="row",
                        y="top1",
                        hue="source",
                        data=[
                            {"row": "dense", "top1": 97.0, "source": "ours"},
                            {"row": "dense", "top1": 95.3, "source": "paper"},
                        ],
                    ),
                    FigureSpec(
                        kind="line",
                        x="epoch",
                        y="top1",
                        hue="row",
                        data=[{"epoch": e, "top1": 50.0 + e, "row": "dense"} for e in range(3)],
                    ),
                ],
            )  # fmt: skip
        )
    results[1].figures.append(
        FigureSpec(kind="interval", x="row", y="delta_top1",
                   data=[{"row": "sdgp", "delta_top1": d} for d in (-0.5, 0.1, -0.2)])
    )  # fmt: skip
    claims = claim_rows({r.target: r for r in results}, "smoke")
    results.append(ResultSet(target="claims.headline", title="claims", scale="smoke", rows=claims))
    index = render_reports(results, tmp_path / "reports")
    pages = sorted(index.parent.glob("*.html"))
    assert {p.name for p in pages} == {"index.html", "sdgp.html", "cross.html", "claims.html"}
    images = {"index.html": 0, "claims.html": 0, "sdgp.html": 2, "cross.html": 3}
    for page in pages:
        probe = _probe(page)
        assert probe["broken"] == 0, (page.name, probe)
        assert probe["tables"] >= 1 and probe["empty_tables"] == 0, (page.name, probe)
        assert probe["images"] == images[page.name], (page.name, probe)
    assert _probe(index)["tables"] >= 2  # the claims, then the list of targets


# Committed cpu-scale results whose figures are of the kinds the test above does not draw:
# scatter (PruneTrain Figs. 8 and 10), heatmap (SDGP Fig. 8), trade-off and interval (the
# cross-method table).
REAL_TARGETS = ("prunetrain.fig8", "prunetrain.fig10", "sdgp.fig8", "cross.methods")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_committed_cpu_results_render_and_open_in_headless_chromium(tmp_path):
    # Real results, rendered as `pdtbench report` renders them: every figure kind decodes in
    # a browser and no table is empty.
    from pathlib import Path

    from impl.report.results import load_result

    root = Path(__file__).resolve().parents[1] / "reports" / "cpu" / "results"
    results = [load_result(root / t / "cpu") for t in REAL_TARGETS]
    kinds = {f.kind for r in results for f in r.figures}
    assert {"scatter", "heatmap", "tradeoff", "interval"} <= kinds
    index = render_reports(results, tmp_path / "reports")
    pages = {p.name: p for p in index.parent.glob("*.html")}
    assert set(pages) == {"index.html", "prunetrain.html", "sdgp.html", "cross.html"}
    for name in ("prunetrain.html", "sdgp.html", "cross.html"):
        probe = _probe(pages[name])
        assert probe["broken"] == 0, (name, probe)
        assert probe["tables"] >= 1 and probe["empty_tables"] == 0, (name, probe)
        want = sum(len(r.figures) for r in results if r.target.startswith(name[:-5] + "."))
        assert probe["images"] == want, (name, probe)
