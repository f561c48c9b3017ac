"""Report renderer: run directories -> DataFrames -> figures -> self-contained HTML."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from impl.report import (
    FigureSpec,
    ResultSet,
    ci95_half_width,
    comparison_frame,
    draw,
    figure_data_uri,
    find_run_dirs,
    format_mean_sd,
    format_number,
    load_metrics,
    load_result,
    load_runs,
    main,
    mean_ci95,
    render_html,
    render_reports,
    result_section,
    save_result,
    time_to_accuracy,
)
from impl.report.figures import crowded_axis, figure_width, group_palette, t_interval
from impl.report.html import Section, Table, provenance_rows
from impl.report.pages import run_environment, runs_section, unfilled
from impl.report.results import load_results

ENV = {"commit": "a" * 40, "dirty": False, "date": "2025-01-02T03:04:05+00:00", "torch": "2.x",
       "cpu_model": "Test CPU", "tf32_matmul": False, "tf32_cudnn": True}  # fmt: skip


def _run(
    root, name, *, method="dense", seed=0, top1=90.0, epochs=3, status="complete", scale="smoke"
):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"method": method, "seed": seed}))
    with open(d / "metrics.jsonl", "w") as f:
        for e in range(epochs):
            f.write(
                json.dumps(
                    {
                        "epoch": e,
                        "test_top1": top1 * (e + 1) / epochs,
                        "wall_seconds": 10.0 * (e + 1),
                        "channels": {"a": 1},
                    }
                )
                + "\n"
            )
    if status is not None:
        summary = {
            "status": status,
            "method": method,
            "model": "resnet20",
            "data": "digits",
            "scale": scale,
            "seed": seed,
            "epochs": epochs,
            "top1": top1,
            "compression_ratio": 2.5,
            "fwd_ms": 1.5,
            "bwd_ms": 3.0,
            "method_options": {"n": 2},
            "environment": ENV,
            "layer_sparsity": {"x": 0.5},
        }
        (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.fixture
def runs_root(tmp_path):
    root = tmp_path / "runs"
    _run(root, "dense-s0", seed=0, top1=90.0)
    _run(root, "dense-s1", seed=1, top1=92.0)
    _run(root, "sdgp-s0", method="sdgp", top1=88.0, epochs=2)
    _run(root, "killed", status=None)
    _run(root, "failed", status="failed")
    bad = root / "corrupt"
    bad.mkdir()
    (bad / "summary.json").write_text("{not json")
    return root


def test_load_runs_reads_complete_runs_and_lists_the_others(runs_root):
    runs = load_runs([runs_root])
    assert sorted(runs["run"]) == ["dense-s0", "dense-s1", "sdgp-s0"]
    assert list(runs.columns[:6]) == ["run", "method", "options", "model", "data", "scale"]
    assert (runs["scale"] == "smoke").all()
    assert runs.set_index("run").loc["dense-s1", "top1"] == 92.0
    assert runs["commit"].iloc[0] == "a" * 40
    assert json.loads(runs["method_options"].iloc[0]) == {"n": 2}
    # the options tell runs of one method apart in the runs table
    assert runs.set_index("run").loc["sdgp-s0", "options"] == "n=2"
    assert "layer_sparsity" not in runs.columns  # nested fields are not columns
    incomplete = {r["path"].rsplit("/", 1)[-1]: r["status"] for r in runs.attrs["incomplete"]}
    assert incomplete == {
        "killed": "running or killed",
        "failed": "failed",
        "corrupt": "unreadable",
    }
    (killed,) = [r for r in runs.attrs["incomplete"] if r["status"] == "running or killed"]
    assert killed["reason"].endswith(f"`pdtbench train --resume {runs_root / 'killed'}`")
    (corrupt,) = [r for r in runs.attrs["incomplete"] if r["status"] == "unreadable"]
    assert corrupt["reason"].startswith(str(runs_root / "corrupt" / "summary.json"))


def test_load_runs_takes_one_path_as_well_as_a_list(runs_root):
    """One path was read character by character ("t does not exist")."""
    listed = sorted(load_runs([runs_root])["run"])
    assert sorted(load_runs(runs_root)["run"]) == listed
    assert sorted(load_runs(str(runs_root))["run"]) == listed
    assert find_run_dirs(str(runs_root / "dense-s0")) == [runs_root / "dense-s0"]
    with pytest.raises(TypeError, match=r"load_metrics\(load_runs\(paths\)\)"):
        load_metrics([str(runs_root)])


def test_load_runs_of_nothing_is_an_empty_frame(tmp_path):
    runs = load_runs([tmp_path])
    assert runs.empty and "top1" in runs.columns
    assert runs.attrs["incomplete"] == []


def test_find_run_dirs_rejects_a_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError):
        find_run_dirs([tmp_path / "nope"])


def test_a_folder_named_like_a_runs_file_makes_no_run(runs_root):
    (runs_root / "notes" / "config.json").mkdir(parents=True)
    (runs_root / "summary.json").mkdir()
    found = find_run_dirs([runs_root])
    assert runs_root / "notes" not in found and runs_root not in found
    assert runs_root / "dense-s0" in found


def test_find_run_dirs_accepts_a_run_dir_and_a_file(runs_root):
    assert find_run_dirs([runs_root / "dense-s0"]) == [runs_root / "dense-s0"]
    assert find_run_dirs([runs_root / "dense-s0" / "summary.json"]) == [runs_root / "dense-s0"]


def test_report_of_a_file_outside_any_run_is_refused_not_its_folder(runs_root, capsys):
    """A file beside runs (notes.txt) made the report of every run in its folder."""
    from impl import cli

    notes = runs_root / "notes.txt"
    notes.write_text("x")
    with pytest.raises(ValueError, match=r"notes.txt is a file, neither in a run directory"):
        find_run_dirs([notes])
    out = runs_root.parent / "report"
    assert cli.main(["report", str(notes), "--out", str(out)]) == cli.EXIT_USAGE
    assert "give a run directory, a folder of runs or results, or a result.json" in (
        capsys.readouterr().err
    )
    assert not out.exists()
    # a file of a run stands for its run; a result.json holds no run (its folder is not read)
    assert find_run_dirs([runs_root / "dense-s0" / "metrics.jsonl"]) == [runs_root / "dense-s0"]
    (runs_root / "result.json").write_text("{}")
    assert find_run_dirs([runs_root / "result.json"]) == []


def test_pdtbench_report_renders_without_importing_torch(runs_root):
    """Rendering reads saved files only: `pdtbench report` imports no torch (2-3 s of a
    small machine's start-up), and a training error it could meet is still reported."""
    import subprocess
    import sys

    out = runs_root.parent / "report"
    script = (
        "import sys\n"
        "from impl import cli\n"
        f"rc = cli.main(['report', {str(runs_root)!r}, '--out', {str(out)!r}])\n"
        "print('torch imported:', 'torch' in sys.modules, 'rc:', rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch imported: False rc: 0" in proc.stdout
    assert (out / "runs.html").is_file()


def test_a_training_error_is_reported_once_its_module_is_loaded(tmp_path, monkeypatch, capsys):
    """The errors of impl.train / impl.rundir are caught as usage errors (exit 2) and a
    diverged run as a failure (exit 1), though `_main` catches them without importing them."""
    from impl import cli
    from impl.rundir import RunBusyError
    from impl.train import TrainingDiverged

    def busy(argv):
        raise RunBusyError("runs/x is busy: pid 7 trains into it", holder="7")

    def diverged(argv):
        raise TrainingDiverged(tmp_path, {"diverged_epoch": 1, "epochs": 3, "reason": "nan"})

    monkeypatch.setitem(cli.COMMANDS, "report", busy)
    assert cli.main(["report"]) == cli.EXIT_USAGE
    assert "pdtbench report: error: runs/x is busy: pid 7" in capsys.readouterr().err
    monkeypatch.setitem(cli.COMMANDS, "report", diverged)
    assert cli.main(["report"]) == cli.EXIT_FAILED
    assert "pdtbench report: error: training diverged in epoch 2 of 3" in capsys.readouterr().err


def test_load_metrics_long_form(runs_root):
    metrics = load_metrics(load_runs([runs_root]))
    assert len(metrics) == 3 + 3 + 2
    assert set(metrics["method"]) == {"dense", "sdgp"}
    assert "channels" not in metrics.columns
    one = metrics[metrics["run"] == "sdgp-s0"]
    assert list(one["epoch"]) == [0, 1]


def test_load_metrics_leaves_out_per_layer_lists_and_dicts(tmp_path):
    """A metrics line's per-layer fields (a list of densities, a dict of channels) are no
    column of the long form: one row per epoch holds the run's numbers only."""
    d = _run(tmp_path, "r", epochs=2)
    lines = [
        {"epoch": e, "test_top1": 50.0 + e, "wall_seconds": 10.0 * (e + 1),
         "densities": [1.0, 0.5], "channels": {"a": 1}}
        for e in range(2)
    ]  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    metrics = load_metrics(load_runs([tmp_path]))
    assert "densities" not in metrics.columns and "channels" not in metrics.columns
    assert list(metrics["test_top1"]) == [50.0, 51.0] and list(metrics["epoch"]) == [0, 1]


def test_a_complete_runs_metrics_short_of_its_epochs_are_listed_not_plotted(tmp_path):
    """A complete run writes its summary after its last metrics line: a file cut short,
    emptied or missing beside it was damaged since, and its curves were drawn as the run's."""
    _run(tmp_path, "missing", epochs=2)
    _run(tmp_path, "torn", epochs=3, seed=1)
    _run(tmp_path, "unreadable", epochs=2, seed=2)
    _run(tmp_path, "whole", epochs=2, seed=3)
    (tmp_path / "missing" / "metrics.jsonl").unlink()
    torn = tmp_path / "torn" / "metrics.jsonl"
    torn.write_text(torn.read_text()[:-20])  # the last line is cut
    (tmp_path / "unreadable" / "metrics.jsonl").write_text('{"epoch": 0, "test_')
    runs = load_runs([tmp_path])
    metrics = load_metrics(runs)
    assert list(metrics["run"]) == ["whole", "whole"] and list(metrics["epoch"]) == [0, 1]
    listed = {Path(r["path"]).name: r["reason"] for r in runs.attrs["incomplete"]}
    assert set(listed) == {"missing", "torn", "unreadable"}
    assert "completed 3 epoch(s), the file holds 2 row(s), epochs 0 to 1" in listed["torn"]
    assert listed["missing"].startswith(str(tmp_path / "missing" / "metrics.jsonl"))
    # no run with a readable line: an empty frame that still has the columns to select on
    none = load_metrics(runs[runs["run"] != "whole"])
    assert none.empty and {"run", "method", "seed", "epoch"} <= set(none.columns)


def test_a_run_whose_metrics_are_damaged_is_listed_and_the_report_renders(tmp_path, capsys):
    """A metrics file damaged before its last line (or not text) stopped the whole report."""
    _run(tmp_path, "good", epochs=2)
    _run(tmp_path, "binary", epochs=2, seed=1)
    _run(tmp_path, "middle", epochs=3, seed=2)
    (tmp_path / "binary" / "metrics.jsonl").write_bytes(b"\xff\xfe\x00\x01")
    middle = tmp_path / "middle" / "metrics.jsonl"
    middle.write_text(middle.read_text().replace('"epoch": 1', '"epoch": 1,,'))
    runs = load_runs([tmp_path])
    metrics = load_metrics(runs)
    assert sorted(set(metrics["run"])) == ["good"]
    listed = {r["path"].rsplit("/", 1)[-1]: r for r in runs.attrs["incomplete"]}
    assert listed["binary"]["status"] == "metrics unreadable"
    assert "not a text file" in listed["binary"]["reason"]
    assert "line 2 of 3 is not JSON" in listed["middle"]["reason"]
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "line 2 of 3 is not JSON" in (tmp_path / "out" / "runs.html").read_text()
    printed = capsys.readouterr().out  # three complete runs, not three plus two incomplete
    assert "3 complete runs, 2 of them with unreadable metrics (listed), 0 incomplete" in printed


@pytest.mark.parametrize(
    ("target", "expected"),
    [(40.0, 20.0), (59.9, 20.0), (90.0, 30.0), (90.1, math.nan), (0.0, 10.0)],
    ids=["mid", "just-below", "exact-last", "never", "first"],
)
def test_time_to_accuracy(target, expected):
    m = pd.DataFrame({"epoch": [2, 0, 1], "test_top1": [90.0, 30.0, 60.0],
                      "wall_seconds": [30.0, 10.0, 20.0]})  # fmt: skip
    got = time_to_accuracy(m, target)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected
    # the evaluations up to the epoch are left out: 1 + 2 + 3 s of the 30 at epoch 2
    m["eval_seconds"] = [3.0, 1.0, 2.0]
    got = time_to_accuracy(m, target)
    less = {10.0: 9.0, 20.0: 17.0, 30.0: 24.0}.get(expected, math.nan)
    assert (math.isnan(got) and math.isnan(less)) or got == less


@pytest.mark.parametrize(
    ("eval_seconds", "expected"),
    [([1.0, None, 2.0], 19.0), ([None, None, None], 20.0)],
    ids=["one-missing", "all-missing"],
)
def test_time_to_accuracy_counts_an_epoch_without_its_eval_time_as_no_evaluation(
    eval_seconds, expected
):
    """An epoch whose ``eval_seconds`` is missing subtracts nothing, and the evaluations of
    the epochs before it are still left out (60% first reached at 20 s, after 1 s of
    evaluation)."""
    m = pd.DataFrame({"epoch": [0, 1, 2], "test_top1": [30.0, 60.0, 90.0],
                      "wall_seconds": [10.0, 20.0, 30.0],
                      "eval_seconds": eval_seconds})  # fmt: skip
    assert time_to_accuracy(m, 50.0) == expected


def test_time_to_accuracy_of_metrics_without_test_accuracy_is_nan():
    """Metrics that hold no ``test_top1`` never reach an accuracy."""
    m = pd.DataFrame({"epoch": [0, 1], "wall_seconds": [10.0, 20.0]})
    assert math.isnan(time_to_accuracy(m, 10.0))


@pytest.mark.parametrize("fmt", ["png", "svg"], ids=["png", "svg"])
def test_figure_data_uri_embeds_the_image(fmt):
    data = pd.DataFrame({"m": ["a", "b", "b"], "v": [1.0, 2.0, 3.0]})
    uri = figure_data_uri(draw("bar", data, x="m", y="v"), fmt=fmt)
    head, _, payload = uri.partition(",")
    raw = base64.b64decode(payload)
    if fmt == "png":
        assert head == "data:image/png;base64" and raw[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert head == "data:image/svg+xml;base64" and b"<svg" in raw[:500]


def test_figure_bad_format_kind_and_column():
    data = pd.DataFrame({"x": [1, 2], "y": [3, 4], "h": ["p", "q"]})
    with pytest.raises(ValueError, match="image format"):
        figure_data_uri(draw("line", data, x="x", y="y"), fmt="jpg")
    with pytest.raises(ValueError, match="figure kind"):
        draw("pie", data, x="x", y="y")
    with pytest.raises(ValueError, match="not in the data"):
        draw("bar", data, x="x", y="nope")
    with pytest.raises(ValueError, match="hue"):
        draw("heatmap", data, x="x", y="y")


@pytest.mark.parametrize(
    "kind", ["bar", "line", "scatter", "heatmap", "interval", "tradeoff"], ids=str
)
def test_draw_every_kind_labels_axes(kind):
    data = pd.DataFrame({"x": [1, 2, 3, 1], "y": [3.0, 4.0, 5.0, 2.0], "h": ["p", "q", "p", "q"]})
    fig = draw(kind, data, x="x", y="y", hue="h", title="T", xlabel="X label", ylabel="Y label")
    ax = fig.axes[0]
    assert ax.get_title() == "T" and ax.get_xlabel() == "X label" and ax.get_ylabel() == "Y label"


def _colours(ax, kind):
    """Each legend entry's colour, by label."""
    legend = ax.get_legend()
    handles = legend.legend_handles
    out = {}
    for text, handle in zip(legend.get_texts(), handles):
        colour = handle.get_facecolor() if kind == "bar" else handle.get_color()
        out[text.get_text()] = tuple(np.ravel(colour)[:3])
    return out


@pytest.mark.parametrize("kind", ["bar", "line"], ids=str)
def test_a_method_keeps_its_colour_from_figure_to_figure(kind):
    with_dense = pd.DataFrame({"x": [1, 1, 1], "y": [1.0, 2.0, 3.0],
                               "m": ["dense", "clicktrain", "sdgp"]})  # fmt: skip
    without = pd.DataFrame({"x": [1, 1], "y": [2.0, 3.0], "m": ["sdgp", "clicktrain"]})
    a = _colours(draw(kind, with_dense, x="x", y="y", hue="m").axes[0], kind)
    b = _colours(draw(kind, without, x="x", y="y", hue="m").axes[0], kind)
    assert a["clicktrain"] == b["clicktrain"] and a["sdgp"] == b["sdgp"]
    assert len(set(a.values())) == 3
    # groups that are not all methods keep seaborn's order of appearance
    assert group_palette(["dense", "other"]) is None
    assert list(group_palette(["sdgp", "dense"])) == ["dense", "sdgp"]


def test_the_papers_bars_keep_their_colour_with_or_without_ours_beside_them():
    both = pd.DataFrame({"x": ["a", "a"], "y": [1.0, 2.0], "s": ["paper", "ours (cpu)"]})
    alone = pd.DataFrame({"x": ["b"], "y": [3.0], "s": ["paper"]})
    a = _colours(draw("bar", both, x="x", y="y", hue="s").axes[0], "bar")
    b = _colours(draw("bar", alone, x="x", y="y", hue="s").axes[0], "bar")
    assert a["paper"] == b["paper"] != a["ours (cpu)"]
    flipped = both.iloc[::-1]  # the order of appearance does not decide
    assert _colours(draw("bar", flipped, x="x", y="y", hue="s").axes[0], "bar") == a
    assert group_palette(["paper", "other"]) is None
    # a paper source named with its setting takes the paper's colour too
    named = group_palette(["ours (cpu)", "paper (Quadro RTX 5000)"])
    assert named["paper (Quadro RTX 5000)"] == group_palette(["paper"])["paper"]


def test_the_legend_stands_beside_the_axes_and_zero_bars_are_marked():
    data = pd.DataFrame({"x": ["a", "b", "a", "b"], "y": [0.0, 4.0, 3.0, 2.0],
                         "h": ["p", "p", "q", "q"]})  # fmt: skip
    fig = draw("bar", data, x="x", y="y", hue="h")
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend_box = ax.get_legend().get_window_extent(renderer)
    assert legend_box.x0 >= ax.get_window_extent(renderer).x1  # outside, to the right
    labels = [t.get_text() for t in ax.texts]
    assert labels.count("0") == 1  # the one zero bar, not the others
    assert ax.get_legend().get_title().get_text() == "h"


def test_coinciding_scatter_points_of_two_groups_both_show():
    """Two PruneTrain penalties' runs ended at the same top-1 and training FLOPs, and the one
    drawn second hid the first: each group has its own marker, and later groups are drawn
    smaller and on top, so the first shows around the second."""
    data = pd.DataFrame({"f": [100.0, 100.0, 98.8], "t": [98.9, 98.9, 98.6],
                         "ratio": ["0.05", "0.1", "0.2"]})  # fmt: skip
    ax = draw("scatter", data, x="f", y="t", hue="ratio").axes[0]
    first, second, third = ax.collections
    assert first.get_sizes()[0] > second.get_sizes()[0] > third.get_sizes()[0]
    assert first.get_zorder() < second.get_zorder() < third.get_zorder()
    assert not np.array_equal(first.get_paths()[0].vertices, second.get_paths()[0].vertices)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["0.05", "0.1", "0.2"]
    assert ax.get_legend().get_title().get_text() == "ratio"


def test_scatter_markers_shrink_in_equal_steps_from_the_first_group_to_the_last():
    """Three groups' markers: 140, 97.5 and 55 points^2, the first and last the given areas
    and the middle one halfway."""
    data = pd.DataFrame({"f": [1.0, 2.0, 3.0], "t": [1.0, 2.0, 3.0], "g": ["a", "b", "c"]})
    ax = draw("scatter", data, x="f", y="t", hue="g").axes[0]
    assert [c.get_sizes()[0] for c in ax.collections] == pytest.approx([140.0, 97.5, 55.0])


def test_category_labels_stand_right_aligned_and_an_empty_x_label_is_kept():
    """Tilted category labels end under their bar (right-aligned); an x label given as ""
    leaves the axis unlabelled instead of naming the column."""
    data = pd.DataFrame({"row": ["dense", "sdgp"], "top1": [90.0, 89.0]})
    ax = draw("bar", data, x="row", y="top1", xlabel="").axes[0]
    assert {t.get_horizontalalignment() for t in ax.get_xticklabels()} == {"right"}
    assert ax.get_xlabel() == ""


def test_two_scales_of_ours_beside_the_paper_each_get_their_own_colour():
    """The paper keeps the second colour; ours at two scales take the first and the third,
    never the paper's."""
    import seaborn as sns

    colours = sns.color_palette(n_colors=4)
    palette = group_palette(["paper", "ours (gpu)", "ours (cpu)"])
    assert palette["paper"] == colours[1]
    assert palette["ours (cpu)"] == colours[0] and palette["ours (gpu)"] == colours[2]


def test_two_paper_sources_get_no_fixed_colours():
    """The paper's colour is fixed for one paper source; with two (two GPUs' numbers, say)
    the groups keep seaborn's order of appearance."""
    assert group_palette(["ours (cpu)", "paper", "paper (V100)"]) is None
    assert group_palette(["ours (cpu)", "paper (V100)"]) is not None


def test_two_equal_lines_differ_in_dashes_so_the_one_drawn_first_shows():
    """Without a style column each group gets its own dashes: a line drawn over an equal one
    shows the first through its gaps."""
    data = pd.DataFrame({"epoch": [1, 2, 1, 2], "top1": [50.0, 60.0, 50.0, 60.0],
                         "row": ["dense", "dense", "campfire", "campfire"]})  # fmt: skip
    ax = draw("line", data, x="epoch", y="top1", hue="row").axes[0]
    drawn = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
    assert len(drawn) == 2 and drawn[0].get_linestyle() != drawn[1].get_linestyle()


def test_a_schedule_is_drawn_in_steps():
    data = pd.DataFrame({"epoch": [0, 20, 30], "batch": [128.0, 192.0, 224.0]})
    stepped = draw("line", data, x="epoch", y="batch", steps=True).axes[0].lines[0]
    assert stepped.get_drawstyle() == "steps-post"
    assert draw("line", data, x="epoch", y="batch").axes[0].lines[0].get_drawstyle() == "default"


def test_a_log_axis_under_a_decade_labels_plain_numbers():
    short = pd.DataFrame({"s": [55, 75, 90], "t": [29.0, 17.0, 9.0]})
    axis = draw("line", short, x="s", y="t", logy=True).axes[0].yaxis
    assert axis.get_minor_formatter()(20.0, 0) == "20"  # not "2 x 10^1"
    assert axis.get_major_formatter()(10.0, 0) == "10"
    wide = pd.DataFrame({"s": [55, 75, 90], "t": [290.0, 17.0, 0.9]})
    axis = draw("line", wide, x="s", y="t", logy=True).axes[0].yaxis
    assert "10^" in axis.get_major_formatter()(100.0, 0)  # decades keep their powers


def test_a_log_x_axis_under_a_decade_labels_plain_numbers_whatever_y_spans():
    """Whether the x ticks read as plain numbers depends on the x values (55 to 90: under a
    decade), not on y (0.9 to 290)."""
    data = pd.DataFrame({"s": [55, 75, 90], "t": [290.0, 17.0, 0.9]})
    axis = draw("line", data, x="s", y="t", logx=True).axes[0].xaxis
    assert axis.get_minor_formatter()(60.0, 0) == "60"
    assert axis.get_major_formatter()(100.0, 0) == "100"


def test_a_log_x_axis_of_whole_numbers_keeps_its_log_ticks():
    """Batch sizes 32 to 1024 on a log axis: the ticks stay at powers, not the whole-number
    ticks of a linear epoch axis."""
    from matplotlib.ticker import LogLocator

    data = pd.DataFrame({"batch": [32, 128, 512, 1024], "ms": [1.0, 3.0, 11.0, 20.0]})
    for kind in ("line", "scatter"):
        ax = draw(kind, data, x="batch", y="ms", logx=True).axes[0]
        assert isinstance(ax.xaxis.get_major_locator(), LogLocator)


def test_an_epoch_axis_has_whole_ticks_and_a_long_title_wraps():
    data = pd.DataFrame({"epoch": [1, 2, 3], "top1": [50.0, 80.0, 90.0]})
    title = "Fig. 4 (top left): top-1 per epoch, pruning from paper epoch 30 (cpu scale)"
    fig = draw("line", data, x="epoch", y="top1", title=title)
    ax = fig.axes[0]
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(t == int(t) for t in ticks)  # no 1.5, 2.5
    assert ax.title.get_wrap()
    renderer = fig.canvas.get_renderer()
    assert ax.title.get_window_extent(renderer).x0 >= 0  # inside the figure
    share = pd.DataFrame({"frac": [0.0, 0.5, 1.0], "b": [1.0, 2.0, 3.0]})
    ticks = draw("line", share, x="frac", y="b").axes[0].get_xticks()
    assert any(t != int(t) for t in ticks)  # fractions keep their fractional ticks


def test_an_amount_starts_its_axis_at_zero():
    data = pd.DataFrame({"epoch": [0, 1, 2], "mib": [15.0, 14.8, 14.3]})
    assert draw("line", data, x="epoch", y="mib").axes[0].get_ylim()[0] > 14.0
    assert draw("line", data, x="epoch", y="mib", y_from_zero=True).axes[0].get_ylim()[0] == 0


def test_a_heatmap_cell_with_no_value_says_not_run():
    data = pd.DataFrame({"m": [4, 8, 8], "r": ["r=2", "r=2", "r=8"], "top1": [99.2, 98.6, 98.3]})
    ax = draw("heatmap", data, x="m", y="top1", hue="r").axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("not run") == 1 and "99.2" in texts


def test_a_crowded_axis_widens_the_figure():
    few = pd.DataFrame({"x": list("abc"), "y": [1.0, 2.0, 3.0]})
    many = pd.DataFrame({"x": [f"layer{i}" for i in range(20)], "y": [1.0] * 20})
    assert figure_width(few, "bar", "x") == 6.4 and figure_width(many, "line", "x") == 6.4
    assert figure_width(many, "bar", "x") == pytest.approx(9.0)
    crowd = pd.DataFrame({"x": [f"layer{i}" for i in range(50)], "y": [1.0] * 50})
    assert figure_width(crowd, "interval", "x") == 14.0  # 22.5 in for 50 at most 14
    fig = draw("bar", many, x="x", y="y")
    assert fig.get_figwidth() == pytest.approx(9.0)
    assert {t.get_rotation() for t in fig.axes[0].get_xticklabels()} == {45.0}
    # few categories with long labels stand steeper without widening the figure
    long = pd.DataFrame({"x": [f"combined, start {i}, sparsity 70%" for i in range(4)],
                         "y": [1.0] * 4})  # fmt: skip
    assert crowded_axis(long, "bar", "x") and not crowded_axis(few, "bar", "x")
    assert not crowded_axis(many, "line", "x")
    fig = draw("bar", long, x="x", y="y")
    assert fig.get_figwidth() == pytest.approx(6.4)
    assert {t.get_rotation() for t in fig.axes[0].get_xticklabels()} == {45.0}
    assert {t.get_rotation() for t in draw("bar", few, x="x", y="y").axes[0].get_xticklabels()} == {
        20.0
    }


def test_eight_short_categories_are_not_crowded_and_nine_are():
    """CROWDED_X is 8: "more than 8" categories stand steeper, exactly 8 do not."""
    eight = pd.DataFrame({"x": list("abcdefgh"), "y": [1.0] * 8})
    nine = pd.DataFrame({"x": list("abcdefghi"), "y": [1.0] * 9})
    assert not crowded_axis(eight, "bar", "x") and crowded_axis(nine, "bar", "x")
    labels = draw("bar", eight, x="x", y="y").axes[0].get_xticklabels()
    assert {t.get_rotation() for t in labels} == {20.0}


def test_t_interval_is_the_students_t_interval_of_the_mean():
    lo, hi = t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t(0.975, 2) = 4.302653
    assert (lo, hi) == pytest.approx((2 - 4.302653 / math.sqrt(3), 2 + 4.302653 / math.sqrt(3)))
    assert t_interval([5.0, math.nan]) == (5.0, 5.0)


def test_interval_figure_draws_the_ci_of_each_group_and_the_zero_line():
    data = pd.DataFrame({"m": ["a", "a", "a", "b", "b"], "d": [1.0, 2.0, 3.0, -1.0, -1.0]})
    ax = draw("interval", data, x="m", y="d").axes[0]
    extents = [  # each error bar (with its caps) is one line broken by NaNs
        (float(np.nanmin(line.get_ydata())), float(np.nanmax(line.get_ydata())))
        for line in ax.lines
        if np.isnan(np.asarray(line.get_ydata(), dtype=float)).any()
    ]
    half = 4.302653 / math.sqrt(3)
    flat = [v for extent in sorted(extents) for v in extent]
    assert flat == pytest.approx([-1.0, -1.0, 2 - half, 2 + half])
    assert any(list(line.get_ydata()) == [0.0, 0.0] for line in ax.lines)  # the zero line


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (math.nan, "-"), (3, "3"), (95.25, "95.25"), (0.000123456, "0.0001235"),
     (2.5e9, "2.5G"), (41_000_000.0, "41M"), (123_457.0, "123,457"), (1.0, "1"), ("x", "x"),
     (True, "True"), (math.inf, "inf"), (-math.inf, "-inf"), (10_000.0, "10,000"),
     (9_999.0, "9999"), (1e6, "1M"), (999_999.0, "999,999"), (-2.5e9, "-2.5G"),
     (9_999.5, "10,000"), (-9_999.7, "-10,000"), (9_999.4, "9999")],
    ids=["none", "nan", "int", "float", "small", "giga", "mega", "thousands", "whole", "str",
         "bool", "inf", "minus-inf", "ten-thousand", "under-ten-thousand", "one-million",
         "under-a-million", "minus-giga", "rounds-to-ten-thousand", "minus-rounds-up",
         "rounds-down"],
)  # fmt: skip
def test_format_number(value, text):
    assert format_number(value) == text


def test_format_number_groups_from_1e5_or_from_its_digits():
    assert format_number(100_000.0, 6) == "100,000"  # 1e5 groups whatever the digits
    assert format_number(99_999.0, 6) == "99999"
    assert format_number(150.0, 2) == "150"
    assert format_number(1_500.0, 3) == "1,500"


def test_ci95_half_width_is_students_t_over_root_n():
    # t(0.975, 2) = 4.302653, t(0.975, 4) = 2.776445 (standard tables)
    assert ci95_half_width(1.0, 3) == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert ci95_half_width(0.5, 5) == pytest.approx(0.5 * 2.776445 / math.sqrt(5), rel=1e-6)
    assert math.isnan(ci95_half_width(1.0, 1)) and math.isnan(ci95_half_width(math.nan, 3))


def test_mean_ci95_drops_nans_and_gives_the_t_interval():
    mean, low, high = mean_ci95([1.0, 2.0, math.nan, 3.0])  # mean 2, sd 1, n 3
    half = 4.302653 / math.sqrt(3)
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert mean_ci95([5.0]) == (5.0, 5.0, 5.0)
    assert all(math.isnan(v) for v in mean_ci95([]))


@pytest.mark.parametrize(
    ("args", "text"),
    [((99.3519, 0.1604, 3), "99.35 ± 0.16 (n=3)"),
     ((-0.3704, 0.42, 3), "-0.37 ± 0.42 (n=3)"),
     ((42.1, 0.00016, 3), "42.10 ± 0.00016 (n=3)"),
     ((10.91, 4.9, 3), "10.9 ± 4.9 (n=3)"),
     ((1.0, 0.0, 3), "1 ± 0 (n=3)"),
     ((953_355.0, 71_801.0, 3), "953,355 ± 71,801 (n=3)"),
     ((5.0, None, 1), "5 (n=1)"),
     ((-1.6667, None, 1, False, "pp", [0]), "-1.67 (n=1, seed 0)"),
     ((1.703, None, 1, False, "x", [3]), "1.703 (n=1, seed 3)"),
     # paired: mean -2.13, sd 0.42, n 3 -> half-width 4.302653 * 0.42 / sqrt(3) = 1.043
     ((-2.13, 0.42, 3, True), "-2.13 ± 0.42 (n=3) [95% CI -3.2, -1.1]"),
     ((0.0, 0.28, 3, True), "0.00 ± 0.28 (n=3) [95% CI -0.70, 0.70]"),
     ((0.5, 0.0, 3, True), "0.5 ± 0 (n=3)"),
     ((1234.0, 250.0, 5), "1,234 ± 250 (n=5)"),
     ((5.0, 0.1, 3), "5.00 ± 0.10 (n=3)"),
     ((50_000.0, 1000.0, 3), "50,000 ± 1,000 (n=3)"),
     ((12_345.678, 1.5, 3), "12,346 ± 1.5 (n=3)"),  # at most 4 significant digits
     ((100_000.0, None, 1, False, "%"), "100,000 (n=1)"),
     ((99_999.0, None, 1, False, "%"), "99999.00 (n=1)"),
     # two seeds: t(0.975, 1) = 12.706205; half-width 12.706205 * 0.5 / sqrt(2) = 4.49
     ((1.0, 0.5, 2, True), "1.00 ± 0.50 (n=2) [95% CI -3.5, 5.5]"),
     ((17_382_000.0, 964_322.0, 5), "17.38M ± 0.96M (n=5)"),  # the sd in the mean's multiple
     ((1_029_000.0, 48_123.0, 5), "1.029M ± 0.048M (n=5)"),
     ((61_410_000.0, 0.0, 5), "61.41M ± 0 (n=5)"),
     ((2.5e9, 3.1e8, 3), "2.5G ± 0.31G (n=3)"),
     ((2.5e9, 12.0, 3), "2.5G ± 12 (n=3)"),
     ((1_500_000.0, 5_000.0, 3), "1.5M ± 0.0050M (n=3)"),  # sd at the multiple's 1e-3 and over
     ((1_500_000.0, 500.0, 3), "1.5M ± 500 (n=3)")],
    ids=["pct", "small", "tiny-sd", "coarse", "exact", "thousands", "single", "single-seed",
         "single-seed-ratio", "paired",
         "paired-zero", "paired-no-spread", "sd-hundreds", "sd-tenth", "sd-thousand",
         "grouped-mean", "single-pct-1e5", "single-pct-under-1e5", "paired-two-seeds",
         "millions", "millions-small-sd", "millions-no-spread", "billions", "billions-tiny-sd",
         "millions-sd-at-1e-3", "millions-sd-under-1e-3"],
)  # fmt: skip
def test_format_mean_sd_rounds_to_the_sd_and_gives_the_ci_of_a_paired_difference(args, text):
    assert format_mean_sd(*args) == text


def test_comparison_frame_shows_single_accuracies_to_two_decimals():
    frame = comparison_frame([
        {"row": "sdgp", "metric": "delta_top1", "ours": -0.5556, "n": 1, "unit": "pp"},
        {"row": "sdgp", "metric": "top1", "ours": 99.4444, "n": 1, "unit": "%"},
        {"row": "fig9", "metric": "speedup", "ours": 3.6161, "n": 1, "unit": "x"},
        {"row": "claim", "metric": "difference", "ours": 1.7778, "n": 5, "unit": "pp"},
    ])  # fmt: skip
    assert list(frame["Ours"]) == ["-0.56 (n=1)", "99.44 (n=1)", "3.616 (n=1)", "1.78 (n=5)"]


def test_every_single_seed_number_says_so_in_every_table():
    rows = [
        {"row": "PruneTrain", "metric": "delta_top1", "ours": -1.6667, "n": 1, "unit": "pp",
         "scale": "cpu", "seeds": [0], "values": [-1.6667]},
        {"row": "ClickTrain", "metric": "compression_ratio", "ours": 1.703, "n": 1, "unit": "x",
         "scale": "cpu", "seeds": [0], "values": [1.703]},
        {"row": "dense", "metric": "top1", "ours": 99.28, "ours_sd": 0.25, "n": 5, "unit": "%",
         "scale": "cpu"},
    ]  # fmt: skip
    long = comparison_frame(rows)
    assert list(long["Ours"]) == ["-1.67 (n=1, seed 0)", "1.703 (n=1, seed 0)",
                                  "99.28 ± 0.25 (n=5)"]  # fmt: skip
    from impl.report.html import wide_frame

    wide = wide_frame(rows).set_index("Metric")
    assert wide.loc["top-1 change vs dense (pp)", "PruneTrain"] == "-1.67 (n=1, seed 0)"
    assert wide.loc["conv compression (total / nonzero, x)", "ClickTrain"] == "1.703 (n=1, seed 0)"


def test_the_long_table_gives_each_number_its_scale_unit_and_source_in_their_columns():
    row = {"row": "PruneTrain", "metric": "top1", "ours": 91.234, "ours_sd": 0.1234, "n": 3,
           "scale": "gpu", "paper": 91.8, "unit": "%", "paper_source": "Table 2",
           "note": "ratio 0.2"}  # fmt: skip
    frame = comparison_frame([row])
    assert frame.to_dict("records") == [{
        "Row": "PruneTrain", "Metric": "top-1", "Ours": "91.23 ± 0.12 (n=3)", "Scale": "gpu",
        "Paper": "91.8", "Unit": "%", "Paper source": "Table 2", "Note": "ratio 0.2",
    }]  # fmt: skip


def test_comparison_frame_adds_the_ci_to_delta_metrics_only():
    frame = comparison_frame([
        {"row": "sdgp", "metric": "delta_top1", "ours": -0.37, "ours_sd": 0.42, "n": 3},
        {"row": "sdgp", "metric": "top1", "ours": 98.98, "ours_sd": 0.42, "n": 3},
    ])  # fmt: skip
    assert "95% CI -1.4, 0.7" in frame.loc[0, "Ours"] and "CI" not in frame.loc[1, "Ours"]


def test_comparison_frame_keeps_scale_beside_every_number():
    frame = comparison_frame([
        {"row": "dense", "metric": "top1", "ours": 97.5, "ours_sd": 0.4, "n": 3, "scale": "cpu",
         "paper": 95.3, "unit": "%", "paper_source": "Table I", "note": ""},
        {"row": "sdgp", "metric": "top1", "ours": None, "scale": None, "paper": 95.2},
    ])  # fmt: skip
    assert list(frame.columns[:5]) == ["Row", "Metric", "Ours", "Scale", "Paper"]
    assert frame.loc[0, "Ours"] == "97.50 ± 0.40 (n=3)" and frame.loc[0, "Scale"] == "cpu"
    assert frame.loc[1, "Ours"] == "-" and frame.loc[1, "Paper"] == "95.2"


def _result(scale="smoke", target="sdgp.table1"):
    return ResultSet(
        target=target,
        title="SDGP Table I",
        scale=scale,
        rows=[{"row": "dense", "metric": "top1", "ours": 97.0, "ours_sd": math.nan, "n": 1,
               "scale": scale, "paper": 95.3, "unit": "%", "paper_source": "Table I",
               "note": "<b>digits</b>"}],
        figures=[FigureSpec(kind="bar", x="row", y="top1", hue="source",
                            data=[{"row": "dense", "top1": 97.0, "source": f"ours ({scale})"},
                                  {"row": "dense", "top1": 95.3, "source": "paper"}],
                            title="top-1")],
        missing=[{"row": "imagenet rows", "reason": "needs the paper scale (ImageNet)"}],
        environment=ENV,
    )  # fmt: skip


def test_result_roundtrip_and_validation(tmp_path):
    path = save_result(_result(), tmp_path / "r")
    back = load_result(path.parent)
    assert back.rows[0]["ours"] == 97.0 and back.rows[0]["ours_sd"] is None  # NaN -> null
    assert back.figures[0].kind == "bar" and back.paper == "sdgp" and back.item == "table1"
    bad = _result()
    bad.rows[0]["scale"] = None
    with pytest.raises(ValueError, match="without its scale"):
        save_result(bad, tmp_path / "bad")
    with pytest.raises(ValueError, match="unknown scale"):
        save_result(_result(scale="huge"), tmp_path / "bad")
    with pytest.raises(ValueError, match="<paper>.<item>"):
        save_result(_result(target="nodot"), tmp_path / "bad")


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda d: d.update(target="/abs/place.x"), "is not '<paper>.<item>'"),
        (lambda d: d.update(target="a/../../up.x"), "is not '<paper>.<item>'"),
        (lambda d: d["rows"][0].update(ours="n/a"), "'ours' is not a number"),
        (lambda d: d["rows"][0].update(ours_sd="0.3"), "'ours_sd' is not a number"),
        (lambda d: d["rows"][0].update(n="5"), "'n' is not a count"),
        (lambda d: d.update(environment=None), "environment must be an object"),
        (lambda d: d.update(notes="one text"), "notes must be a list of texts"),
        (lambda d: d["figures"][0].update(kind="pie"), "unknown figure kind 'pie'"),
        (lambda d: d["figures"][0].update(data={"row": "dense"}), "data must be a list"),
        (lambda d: d.update(figures={"kind": "bar"}), "figures must be a list"),
    ],
    ids=["absolute-target", "climbing-target", "ours-text", "sd-text", "n-text", "env-null",
         "notes-text", "figure-kind", "figure-data", "figures-object"],
)  # fmt: skip
def test_a_result_of_the_wrong_form_is_refused_and_listed_not_rendered(tmp_path, damage, match):
    """A result.json that parses but whose fields have the wrong form is refused when read,
    naming the field, and `load_results` lists it beside the others instead of stopping the
    report (a target naming a path would have written a page outside --out)."""
    good = save_result(_result(), tmp_path / "results" / "sdgp.table1" / "smoke")
    data = json.loads(good.read_text())
    damage(data)
    bad = tmp_path / "results" / "sdgp.fig9" / "smoke" / "result.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(match)):
        load_result(bad)
    results, unreadable = load_results([tmp_path / "results"])
    assert [r.target for r in results] == ["sdgp.table1"]
    assert [u["target"] for u in unreadable] == ["sdgp.fig9"]


def test_a_figure_whose_data_lacks_a_column_is_listed_and_the_page_goes_on():
    result = _result()
    result.figures[0].y = "top5"
    section = result_section(result)
    assert section.figures == []
    assert section.missing[-1]["row"] == "top-1"
    assert section.missing[-1]["reason"].startswith("figure could not be drawn: columns")


def test_dollar_signs_in_labels_are_drawn_as_themselves_not_as_mathtext():
    # a run named with dollars made matplotlib parse mathtext: an unknown symbol stopped the
    # report, and "$5 and $6" came out in italics without its dollars
    data = pd.DataFrame({"method": ["dense$\\foo$", "run $5 and $6"], "top1": [90.0, 80.0]})
    fig = draw("bar", data, x="method", y="top1", title="a_$^$", xlabel="$x$")
    figure_data_uri(fig)  # renders every text
    ax = fig.axes[0]
    assert ax.get_title() == "a_\\$^\\$" and ax.get_xlabel() == "\\$x\\$"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense\\$\\foo\\$", "run \\$5 and \\$6"]


def test_a_results_rows_as_csv_carry_ours_the_papers_the_scale_and_provenance():
    from impl.report.results import rows_csv

    result = _result(scale="cpu")
    result.rows.append(
        {
            "row": "sdgp",
            "metric": "top1",
            "ours": 96.5,
            "n": 2,
            "scale": "cpu",
            "paper": None,
            "unit": "%",
            "seeds": [0, 1],
            "values": [96.0, 97.0],
        }
    )
    text = rows_csv(result)
    header, *lines = list(csv.reader(io.StringIO(text)))
    assert header == ["target", "row", "metric", "ours", "ours_sd", "n", "scale", "paper",
                      "unit", "paper_source", "note", "seeds", "values",
                      "commit", "date", "device", "torch"]  # fmt: skip
    rows = [dict(zip(header, line, strict=True)) for line in lines]
    assert rows[0]["target"] == "sdgp.table1" and rows[0]["ours"] == "97.0"
    assert rows[0]["ours_sd"] == "" and rows[0]["paper"] == "95.3"  # NaN and None: empty
    assert rows[0]["note"] == "<b>digits</b>" and rows[0]["seeds"] == ""
    assert json.loads(rows[1]["values"]) == [96.0, 97.0] and rows[1]["paper"] == ""
    assert {(r["commit"], r["device"], r["torch"], r["scale"]) for r in rows} == {
        ("a" * 40, "Test CPU", "2.x", "cpu")}  # fmt: skip
    result.environment = {**ENV, "gpu_name": "NVIDIA H200"}
    assert "NVIDIA H200" in rows_csv(result) and "Test CPU" not in rows_csv(result)


def test_report_pages_link_each_results_csv_and_write_none_for_a_result_of_no_row(tmp_path):
    from impl.report.pages import render_reports

    empty = _result(target="sdgp.fig8")
    empty.rows = []
    render_reports([_result(scale="cpu"), empty], tmp_path / "out")
    written = sorted(p.name for p in (tmp_path / "out" / "csv").iterdir())
    assert written == ["sdgp.table1.cpu.csv"]  # no temporary file left, no empty file
    page = (tmp_path / "out" / "sdgp.html").read_text()
    assert page.count('The rows as CSV: <a href="csv/sdgp.table1.cpu.csv">') == 1
    assert "csv/sdgp.fig8" not in page
    text = (tmp_path / "out" / "csv" / "sdgp.table1.cpu.csv").read_text()
    assert text.splitlines()[1].startswith("sdgp.table1,dense,top1,97.0,")


@pytest.mark.parametrize(
    ("part", "value", "message"),
    [("rows", [["row", "metric"]], "rows must be a list of objects"),
     ("settings", [["row"]], "settings must be a list of objects"),
     ("missing", "none", "missing must be a list of objects"),
     ("rows", [{"row": "x", "metric": "top1", "bogus": 1}], r"unknown keys \['bogus'\]"),
     ("rows", [{"row": "x"}], "without 'row' and 'metric'"),
     ("rows", [{"metric": "top1"}], "without 'row' and 'metric'")],
    ids=["row-not-object", "settings-not-object", "missing-not-list", "unknown-key",
         "no-metric", "no-row"],
)  # fmt: skip
def test_a_result_of_a_wrong_shape_is_refused(part, value, message):
    """Rows, missing entries and settings lines must be lists of objects; a comparison row
    needs its row and its metric and no key outside the comparison columns."""
    bad = _result()
    setattr(bad, part, value)
    with pytest.raises(ValueError, match=message):
        bad.validate()


def test_a_row_of_the_papers_number_alone_needs_no_scale():
    """Only a number of ours carries a scale: a row with the paper's number and none of ours
    is valid without one."""
    res = _result()
    res.rows.append({"row": "imagenet", "metric": "top1", "paper": 91.0, "unit": "%"})
    res.validate()


def test_a_result_saves_tuples_numpy_values_and_keys_as_plain_json(tmp_path):
    """Tuples are saved as lists with their NaNs as null, numpy keys as strings, and a numpy
    value with no single Python value as its text."""
    res = _result()
    res.rows[0]["values"] = (1.5, math.nan, np.float32(2.5))
    res.environment = {np.int64(16): "batch", "shape": np.array([1, 2])}
    path = save_result(res, tmp_path / "r")
    data = json.loads(path.read_text())
    assert data["rows"][0]["values"] == [1.5, None, 2.5]
    assert data["environment"] == {"16": "batch", "shape": "[1 2]"}
    assert load_result(path).environment == {"16": "batch", "shape": "[1 2]"}


def test_a_result_of_the_wrong_types_names_the_error_and_a_folder_named_like_one_is_listed(
    tmp_path,
):
    """A result whose figure has a key no figure has is refused naming the error type and
    the file, one whose figure is no object naming what it must be; a folder named
    result.json is listed as unreadable, not raised."""
    path = save_result(_result(), tmp_path / "results" / "sdgp.table1" / "smoke")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "figures": [{**data["figures"][0], "colour": "red"}]}))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: TypeError: "):
        load_result(path)
    path.write_text(json.dumps({**data, "figures": [1]}))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: figures must be a list of"):
        load_result(path)
    path.write_text(json.dumps(data))
    odd = tmp_path / "results" / "sdgp.fig9" / "smoke" / "result.json"
    odd.mkdir(parents=True)
    results, unreadable = load_results([tmp_path / "results"])
    assert [r.target for r in results] == ["sdgp.table1"]
    assert [(u["path"], u["target"]) for u in unreadable] == [(str(odd), "sdgp.fig9")]


def _assert_self_contained(text: str) -> None:
    srcs = re.findall(r'(?:src|href)="([^"#]+)"', text)
    for s in srcs:
        assert s.startswith("data:image/") or s.endswith(".html"), s
    assert "<script" not in text and "<link" not in text


def test_provenance_rows_shorten_the_commit_and_date_and_flag_a_modified_tree():
    rows = provenance_rows([("cpu", ENV), ("cpu", ENV), ("smoke", {**ENV, "dirty": True})])
    assert len(rows) == 2  # the same environment twice is one row
    first, second = rows.to_dict("records")
    assert first["commit"] == "a" * 12 and first["date"] == "2025-01-02"
    assert second["commit"] == "a" * 12 + " (modified tree)" and second["scale"] == "smoke"
    assert first["device"] == "Test CPU" and first["tf32 (matmul/cudnn)"] == "False/True"


def test_provenance_names_the_commits_a_results_runs_were_trained_at():
    """A result compared at one commit from runs trained at another says both: the footer's
    commit alone read as if the runs had been trained at it."""
    reused = {**ENV, "runs_trained_at": ["b" * 12, "c" * 12 + "+"]}
    rows = provenance_rows([("cpu", ENV), ("cpu", reused)]).to_dict("records")
    assert rows[1]["runs trained at"] == f"{'b' * 12}, {'c' * 12}+"
    assert rows[1]["commit"] == "a" * 12 and pd.isna(rows[0]["runs trained at"])


def test_provenance_rows_name_the_results_each_holds_for_where_they_differ():
    """Two results of one page whose runs were trained at different commits: each footer row
    names its results; one row for the whole page needs no such column."""
    later = {**ENV, "runs_trained_at": ["b" * 12]}
    items = [("cpu", ENV, "campfire.table2"), ("cpu", later, "campfire.table3"),
             ("cpu", ENV, "campfire.table8"), ("cpu", ENV, "campfire.table8")]  # fmt: skip
    rows = provenance_rows(items).to_dict("records")
    assert [r["results"] for r in rows] == ["campfire.table2, campfire.table8", "campfire.table3"]
    alone = provenance_rows([("cpu", ENV, "campfire.table2"), ("cpu", ENV, "campfire.table8")])
    assert "results" not in alone.columns and len(alone) == 1


def test_provenance_tf32_is_blank_where_nothing_ran_under_it():
    """A result of the paper's numbers only (both flags None) and a CPU-only torch (no CUDA
    version) show "-" for TF32; a CUDA build shows its matmul/cuDNN flags."""
    none = {**ENV, "tf32_matmul": None, "tf32_cudnn": None}
    cpu_only = {**ENV, "cuda": None, "date": "2025-02-01"}
    cuda = {**ENV, "cuda": "12.4", "date": "2025-03-01"}
    rows = provenance_rows([("cpu", none), ("cpu", cpu_only), ("gpu", cuda)])
    assert list(rows["tf32 (matmul/cudnn)"]) == ["-", "-", "False/True"]


def test_a_figure_title_naming_its_scale_word_elsewhere_still_gets_its_scale():
    """Only a title that says "<scale> scale" keeps its own wording; one that merely holds the
    scale's word (a "gpu" kernel) is still labelled with the scale of its numbers."""
    from impl.report.html import scaled_title

    assert scaled_title("Time of the gpu kernels", "gpu") == "Time of the gpu kernels (gpu scale)"
    assert scaled_title("Fig. 9 (cpu scale)", "cpu") == "Fig. 9 (cpu scale)"
    assert scaled_title("", "smoke") == "smoke scale" and scaled_title("Fig. 9", None) == "Fig. 9"


def test_provenance_device_names_the_cpus_vector_isa_so_two_cpus_of_one_model_differ():
    # Two "AMD EPYC" machines, one with AVX-512 and one without, trained the same commit to
    # different cpu-scale accuracies: the footer must tell them apart.
    avx2, avx512 = {**ENV, "cpu_capability": "AVX2"}, {**ENV, "cpu_capability": "AVX512"}
    gpu = {**avx2, "gpu_name": "NVIDIA H100"}
    rows = provenance_rows([("cpu", avx2), ("cpu", avx512), ("gpu", gpu)])
    assert list(rows["device"]) == ["Test CPU (AVX2)", "Test CPU (AVX512)", "NVIDIA H100"]


def test_render_html_is_self_contained_and_escaped(tmp_path):
    section = result_section(_result())
    section.tables.append(Table(pd.DataFrame({"a": [1.5e9], "b": ["<x>"]}), "raw"))
    out = render_html("Title <1>", [section, Section(title="Empty")], tmp_path / "p.html",
                      provenance=provenance_rows([("smoke", ENV)]))  # fmt: skip
    text = out.read_text()
    _assert_self_contained(text)
    assert "Title &lt;1&gt;" in text and "&lt;b&gt;digits&lt;/b&gt;" in text
    assert text.count('<img src="data:image/png;base64,') == 1
    assert "scale: smoke" in text and "95.3" in text and "1.5G" in text
    assert "needs the paper scale (ImageNet)" in text
    assert "aaaaaaaaaaaa" in text and "Test CPU" in text  # provenance: commit and device


def test_an_empty_cell_of_a_page_table_is_marked_not_available(tmp_path):
    """A missing number reads "-" in a cell of its own class, so that it shows as not
    available rather than as a value."""
    frame = pd.DataFrame({"Row": ["dense", "sdgp"], "Ours": [97.0, None]})
    out = render_html("t", [Section(title="s", tables=[Table(frame)])], tmp_path / "p.html")
    text = out.read_text()
    assert text.count('<td class="na">-</td>') == 1 and "<td>97</td>" in text


def test_a_page_of_several_sections_opens_with_links_to_each_and_its_scale(tmp_path):
    """A page of two sections or more lists them first, each linked to its anchor with the
    scale of its numbers; a page of one section has no such list."""
    sections = [Section(title="SDGP Table I", anchor="sdgp-table1", scale="cpu"),
                Section(title="SDGP Fig. 9", anchor="sdgp-fig9", scale="gpu")]  # fmt: skip
    page = render_html("t", sections, tmp_path / "two.html").read_text()
    head = page.split("<section")[0]
    assert '<li><a href="#sdgp-table1">SDGP Table I</a><span class="scale">cpu' in head
    assert '<li><a href="#sdgp-fig9">SDGP Fig. 9</a><span class="scale">gpu' in head
    assert '<section id="sdgp-fig9">' in page and "scale: gpu</span></h2>" in page
    one = render_html("t", sections[:1], tmp_path / "one.html").read_text()
    assert '<a href="#' not in one


def test_a_glance_cell_shows_a_papers_number_of_zero():
    """A paper's number of 0 (no change) is a number: it is shown in brackets as any other."""
    from impl.report.html import glance_frame

    rows = [
        {"row": "dense", "metric": "top1", "ours": 97.25, "paper": 93.6, "unit": "%"},
        {"row": "dense", "metric": "delta_top1", "ours": 0.0, "paper": 0.0, "unit": "pp"},
        {"row": "sdgp", "metric": "top1", "ours": 96.5, "unit": "%"},
        {"row": "sdgp", "metric": "delta_top1", "ours": -0.75, "paper": -0.2, "unit": "pp"},
    ]  # fmt: skip
    frame = glance_frame(rows).set_index("Row")
    assert list(frame.loc["dense"]) == ["97.25 (paper 93.6)", "0 (paper 0)"]
    assert list(frame.loc["sdgp"]) == ["96.5", "-0.75 (paper -0.2)"]


def test_a_missing_rows_reason_is_listed_escaped(tmp_path):
    """What is not shown is listed under its section with its reason as text: markup in a
    reason (an error message quoting a type) is escaped, never read as HTML."""
    missing = [{"row": "resnet<50>", "reason": "failed: TypeError: <class 'int'> & more"}]
    section = Section(title="s", missing=missing)
    text = render_html("t", [section], tmp_path / "p.html").read_text()
    assert "Not shown here:" in text
    assert (
        "<li>resnet&lt;50&gt;: failed: TypeError: &lt;class &#x27;int&#x27;&gt; &amp; more</li>"
        in text
    )
    assert "<class" not in text


def test_the_papers_bars_of_rows_not_run_here_are_drawn_in_a_figure_of_their_own():
    result = _result("cpu")
    result.figures[0].data.append({"row": "resnet50", "top1": 20.0, "source": "paper"})
    section = result_section(result)
    assert [f.alt for f in section.figures] == ["top-1", "top-1: the paper's other rows"]
    assert "not run at scale cpu" in section.figures[1].caption
    # every row compared (or none): one figure
    assert len(result_section(_result("cpu")).figures) == 1
    result.figures[0].data = [r for r in result.figures[0].data if r["source"] == "paper"]
    assert len(result_section(result).figures) == 1


def test_only_a_bar_figure_of_ours_beside_the_papers_is_split():
    """The paper's bars move to a figure of their own only in a figure coloured by source
    (ours against the paper's); a figure coloured otherwise is drawn as one."""
    from impl.report.html import paper_only_apart

    data = [{"row": "dense", "top1": 97.0, "source": "ours (cpu)", "method": "dense"},
            {"row": "resnet50", "top1": 76.1, "source": "paper", "method": "dense"}]  # fmt: skip
    by_method = FigureSpec(kind="bar", x="row", y="top1", hue="method", data=data, title="t")
    assert paper_only_apart(by_method, "cpu") == [by_method]
    line = FigureSpec(kind="line", x="row", y="top1", hue="source", data=data, title="t")
    assert paper_only_apart(line, "cpu") == [line]
    by_source = FigureSpec(kind="bar", x="row", y="top1", hue="source", data=data, title="t")
    parts = paper_only_apart(by_source, "cpu")
    assert [[r["row"] for r in p.data] for p in parts] == [["dense"], ["resnet50"]]


def test_render_reports_pages_index_and_missing_targets(tmp_path, runs_root):
    runs = load_runs([runs_root])
    index = render_reports(
        [_result("smoke"), _result("cpu"), _result("smoke", target="cross.methods")],
        tmp_path / "rep",
        runs=runs,
        metrics=load_metrics(runs),
        expected=[{"target": "sdgp.fig9", "title": "SDGP Fig. 9", "needs": "gpu scale"}],
    )
    names = sorted(p.name for p in index.parent.iterdir())
    assert names == ["cross.html", "csv", "index.html", "runs.html", "sdgp.html"]
    text = index.read_text()
    _assert_self_contained(text)
    assert "sdgp.fig9" in text and "not run: gpu scale" in text
    sdgp = (index.parent / "sdgp.html").read_text()
    assert "scale: smoke" in sdgp and "scale: cpu" in sdgp and "SDGP Fig. 9" in sdgp
    runs_page = (index.parent / "runs.html").read_text()
    assert runs_page.count("data:image/png;base64,") == 2
    assert "killed" in runs_page and "corrupt" in runs_page  # incomplete runs listed
    # headers in words with units, not the summary's keys
    table = runs_page.split('<table class="dataframe data">')[1].split("</thead>")[0]
    heads = re.findall(r"<th>(.*?)</th>", table)
    after_epochs = heads[heads.index("epochs") + 1 :][:3]
    assert after_epochs == ["top-1 (%)", "conv compression (x)", "forward (ms)"]
    assert "forward (ms)" in heads and not {"top1", "fwd_ms", "wall_seconds"} & set(heads)
    alts = re.findall(r'<img src="data:image/png;base64,[^"]*" alt="([^"]*)"', runs_page)
    assert alts == ["Final top-1 per method", "Test top-1 per epoch"]


def test_main_renders_from_saved_files_only(tmp_path, runs_root, capsys):
    save_result(_result(), runs_root / "reproductions" / "sdgp.table1" / "smoke")
    assert main([str(runs_root), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert (
        "1 results, 3 complete runs, 3 incomplete (listed: 1 failed, 1 running or killed, "
        "1 unreadable)" in printed
    )  # the page's words for each
    assert (tmp_path / "out" / "index.html").exists() and (tmp_path / "out" / "sdgp.html").exists()
    # A target without a saved result is listed, with the command that makes it at the
    # results' scale, not dropped (here every target but sdgp.table1).
    index = (tmp_path / "out" / "index.html").read_text()
    assert "not run: pdtbench reproduce sdgp.fig9 --scale smoke" in index
    assert "not run: pdtbench reproduce sdgp.table1" not in index
    assert "clicktrain.html" in index  # a paper with no result at all still has its page
    # The papers' figures without a target of their own: each with where it is drawn or why
    # it is not.
    assert "the papers&#x27; other figures" in index
    assert "drawn under Table I (sdgp.table1) from its runs" in index
    assert "no one-time selection variant" in index
    # Plain runs without reproduction results list no reproduction target, nor those figures.
    assert main([str(runs_root / "dense-s0"), "--out", str(tmp_path / "runs-only")]) == 0
    runs_only = (tmp_path / "runs-only" / "index.html").read_text()
    assert "not run:" not in runs_only and "other figures" not in runs_only
    with pytest.raises(FileNotFoundError):
        main([str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no result.json"):
        main([str(tmp_path / "empty"), "--out", str(tmp_path / "o2")])


def test_report_lists_missing_targets_with_the_command_at_the_results_scale():
    """The missing targets' commands name the scale of the reproduction results read; results
    of several scales get `pdtbench reproduce`'s default (cpu); results of no reproduction
    target list nothing missing."""
    from types import SimpleNamespace

    from impl.report.cli import _reproduction_index
    from reproductions.other_figures import other_figures

    def needs(results):
        expected, others = _reproduction_index(results)
        return {e["target"]: e["needs"] for e in expected}, others

    one = [SimpleNamespace(target="sdgp.table1", scale="smoke")]
    got, others = needs(one)
    assert got["sdgp.table1"] == "pdtbench reproduce sdgp.table1 --scale smoke"
    assert got["clicktrain.fig9"] == "pdtbench reproduce clicktrain.fig9 --scale smoke"
    assert others == other_figures() and others
    two = [*one, SimpleNamespace(target="prunetrain.table1", scale="gpu")]
    assert needs(two)[0]["sdgp.table1"] == "pdtbench reproduce sdgp.table1 --scale cpu"
    # a result of no reproduction target, beside one, does not change the scale
    mine = SimpleNamespace(target="mine.table1", scale="gpu")
    assert needs([*one, mine])[0]["sdgp.table1"].endswith("--scale smoke")
    assert needs([mine]) == ({}, [])


def test_report_writes_reports_by_default_and_no_runs_leaves_the_runs_out(
    tmp_path, runs_root, capsys, monkeypatch
):
    save_result(_result(), runs_root / "reproductions" / "sdgp.table1" / "smoke")
    monkeypatch.chdir(tmp_path)
    assert main([str(runs_root)]) == 0  # the documented default folder: ./reports
    assert (tmp_path / "reports" / "index.html").is_file()
    assert capsys.readouterr().out.splitlines()[-1] == "report: reports/index.html"
    # --no-runs: the results only, no runs page, though the folder holds runs
    assert main([str(runs_root), "--no-runs", "--out", str(tmp_path / "o")]) == 0
    assert "1 results, 0 complete runs, 0 incomplete" in capsys.readouterr().out
    assert not (tmp_path / "o" / "runs.html").exists()
    assert (tmp_path / "reports" / "runs.html").is_file()  # as it is without the flag
    # a missing path is refused with --no-runs too, not skipped
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        main([str(runs_root), str(tmp_path / "missing"), "--no-runs", "--out", str(tmp_path)])
    # runs only, and --no-runs: the error says the flag left them out
    only_runs = tmp_path / "only-runs"
    (only_runs / "r1").mkdir(parents=True)
    (only_runs / "r1" / "config.json").write_text('{"method": "dense"}')
    with pytest.raises(ValueError, match="--no-runs leaves out the run directories"):
        main([str(only_runs), "--no-runs", "--out", str(tmp_path / "o3")])
    assert not (tmp_path / "o3").exists()
    # an empty folder with --no-runs: there are no runs to blame the flag for
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no result.json and no run directory under"):
        main([str(empty), "--no-runs", "--out", str(tmp_path / "o4")])


def test_an_unreadable_result_is_listed_and_the_others_are_rendered(tmp_path, capsys):
    results = tmp_path / "results"
    save_result(_result(), results / "sdgp.table1" / "smoke")
    broken = save_result(_result(target="sdgp.fig9"), results / "sdgp.fig9" / "smoke")
    broken.write_text('{"target": "sdgp.fig9", "ti')  # a torn write
    assert main([str(results), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "1 results" in captured.out
    assert f"unreadable, listed on the index: {broken}: Unterminated string" in captured.err
    index = (tmp_path / "out" / "index.html").read_text()
    assert f"unreadable: {broken}" in index  # the target's row, not "not run"
    assert "not run: pdtbench reproduce sdgp.fig9" not in index
    assert "unreadable result, not shown: Unterminated string" in index
    assert "SDGP Table I" in (tmp_path / "out" / "sdgp.html").read_text()
    broken.write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"^{broken}: a JSON list, not an object"):
        load_result(broken)
    valid = json.loads(save_result(_result(), tmp_path / "v").read_text())
    for key in ("rows", "scale"):  # a result without its rows read as one of no row
        broken.write_text(json.dumps({k: v for k, v in valid.items() if k != key}))
        with pytest.raises(ValueError, match=rf"^{broken}: missing keys \['{key}'\]$"):
            load_result(broken)
    broken.write_text(json.dumps({**valid, "bogus": 1, "also": 2}))
    with pytest.raises(ValueError, match=rf"^{broken}: unknown keys \['also', 'bogus'\]$"):
        load_result(broken)
    for shape in ('{"rows": [["row", "metric"]]}', '{"missing": [1]}', '{"figures": [1]}'):
        valid = json.loads(save_result(_result(), tmp_path / "v").read_text())
        broken.write_text(json.dumps({**valid, **json.loads(shape)}))  # JSON of a wrong shape
        with pytest.raises(ValueError, match=f"^{broken}: "):
            load_result(broken)
    broken.write_text("[1, 2]")
    (results / "sdgp.table1" / "smoke" / "result.json").write_text('{"target": "x.y", "n": 1}')
    with pytest.raises(ValueError, match="no readable result.json .*a JSON list, not an object"):
        main([str(results), "--out", str(tmp_path / "o2")])


def test_wide_frame_one_line_per_metric_one_column_per_row_with_scale():
    from impl.report.html import wide_frame

    rows = [
        {"row": "dense", "metric": "top1", "ours": 97.0, "scale": "cpu", "unit": "%"},
        {"row": "sdgp", "metric": "top1", "ours": 96.0, "ours_sd": 0.5, "n": 3, "scale": "cpu",
         "unit": "%"},
        {"row": "sdgp", "metric": "delta_top1", "ours": -1.0, "scale": "cpu", "unit": "pp"},
        {"row": "campfire", "metric": "top1", "ours": None, "scale": None, "unit": "%"},
    ]  # fmt: skip
    wide = wide_frame(rows).set_index("Metric")
    assert list(wide.columns) == ["dense", "sdgp", "campfire"]
    assert list(wide.index) == ["top-1 (%)", "top-1 change vs dense (pp)", "Scale"]
    assert wide.loc["top-1 (%)", "sdgp"] == "96.00 ± 0.50 (n=3)"
    assert wide.loc["top-1 change vs dense (pp)", "dense"] == "-"
    assert list(wide.loc["Scale"]) == ["cpu", "cpu", "-"]


def test_wide_frame_takes_its_metric_order_from_the_row_with_the_most_metrics():
    """The row with the most metrics sets the lines' order, whatever row comes first."""
    from impl.report.html import wide_frame

    rows = [
        {"row": "dense", "metric": "delta_top1", "ours": 0.0, "scale": "cpu", "unit": "pp"},
        {"row": "sdgp", "metric": "top1", "ours": 96.0, "scale": "cpu", "unit": "%"},
        {"row": "sdgp", "metric": "delta_top1", "ours": -1.0, "scale": "cpu", "unit": "pp"},
    ]  # fmt: skip
    wide = wide_frame(rows)
    assert list(wide["Metric"]) == ["top-1 (%)", "top-1 change vs dense (pp)", "Scale"]
    assert list(wide["dense"]) == ["-", "0.00", "cpu"]


def test_index_links_pages_and_tells_filled_from_paper_only(tmp_path):
    only_paper = ResultSet(
        target="prunetrain.fig6", title="Fig. 6", scale="cpu",
        rows=[{"row": "union vs gating", "metric": "d", "ours": None, "scale": None,
               "paper": 6.0}],
        missing=[{"row": "union vs gating", "reason": "channel gating is not implemented"}],
    )  # fmt: skip
    index = render_reports([_result("cpu"), only_paper], tmp_path)
    text = index.read_text()
    assert '<a href="sdgp.html">sdgp.html</a>' in text and '<a href="prunetrain.html">' in text
    assert "paper numbers only: channel gating is not implemented" in text
    assert text.index("prunetrain.fig6") < text.index("sdgp.table1")  # papers in order
    # each target links to its own section of its paper's page
    assert '<a href="sdgp.html#sdgp-table1">sdgp.table1</a>' in text
    assert 'id="sdgp-table1"' in (tmp_path / "sdgp.html").read_text()


def test_tradeoff_figure_puts_one_labelled_point_per_group_with_both_intervals():
    data = pd.DataFrame({"saved": [10.0, 12.0, 14.0, 40.0], "d": [1.0, 2.0, 3.0, -1.0],
                         "m": ["a", "a", "a", "b"]})  # fmt: skip
    ax = draw("tradeoff", data, x="saved", y="d", hue="m").axes[0]
    points = {
        (float(line.get_xdata()[0]), float(line.get_ydata()[0]))
        for line in ax.lines
        if len(line.get_xdata()) == 1 and line.get_marker() == "o"
    }
    assert points == {(12.0, 2.0), (40.0, -1.0)}  # the means of each group
    assert sorted(t.get_text() for t in ax.texts) == ["a", "b"]
    half = 4.302653 / math.sqrt(3)  # both spreads are sd 1 over 3 repeats (x: sd 2)
    segments = [seg for coll in ax.collections for seg in coll.get_segments()]
    spans = sorted(round(float(abs(seg[1] - seg[0]).max()), 6) for seg in segments)
    assert spans == pytest.approx(sorted([0.0, 0.0, 2 * half, 2 * 2 * half]))
    # and each on its own axis: the y interval upright (sd 1), the x interval across (sd 2)
    upright = [float(seg[1][1] - seg[0][1]) for seg in segments if seg[0][0] == seg[1][0]]
    across = [float(seg[1][0] - seg[0][0]) for seg in segments if seg[0][1] == seg[1][1]]
    assert max(map(abs, upright)) == pytest.approx(2 * half)
    assert max(map(abs, across)) == pytest.approx(4 * half)
    assert any(list(line.get_ydata()) == [0.0, 0.0] for line in ax.lines)  # the zero line
    with pytest.raises(ValueError, match="hue"):
        draw("tradeoff", data, x="saved", y="d")


@pytest.mark.parametrize(
    ("metric", "unit", "label"),
    [("delta_top1", "pp", "top-1 change vs dense (pp)"),
     ("train_flops_saved", "%", "training FLOPs saved (nominal, %)"),
     ("iter_ms", "ms", "time per iteration (forward + backward + step, ms)"),
     ("comm_bytes_per_iter", "B", "Allreduce bytes per iteration"),
     ("train_flops_per_sample", "FLOPs", "final model's training FLOPs per sample (nominal)"),
     ("not_a_metric_key", "x", "not_a_metric_key (x)"),
     ("speedup_vs_cusparse", "x",
      "speedup over the generic CSR routine (mean of per-sweep speedups, x)"),
     ("wall_seconds", "s", "wall time incl. evaluation (s)"),
     ("top1", "", "top-1"),
     ("train_flops_per_sample", "flops", "final model's training FLOPs per sample (nominal)"),
     ("bn_cost", "%", "BN-layer memory traffic (% of dense)"),
     ("wall (ms)", "ms", "wall (ms)"),
     ("wall (ms, median)", "ms", "wall (ms, median)")],
    ids=["delta", "saved-nominal", "ms", "bytes-named", "flops-named", "unknown-key",
         "clicktrain-speedup", "wall-incl-eval", "no-unit", "named-in-other-case",
         "named-after-parenthesis", "named-before-parenthesis", "named-before-comma"],
)  # fmt: skip
def test_metric_labels_are_words_with_their_unit(metric, unit, label):
    from impl.report.labels import metric_label

    assert metric_label(metric, unit) == label


def test_model_data_seed_and_n_labels():
    from impl.report.labels import data_name, model_name, n_label, seeds_text

    assert (model_name("resnet20"), model_name("resnet110"), model_name("vgg13")) == (
        "ResNet-20", "ResNet-110", "VGG-13")  # fmt: skip
    assert model_name("regnetx_400mf") == "RegNetX-400MF" and model_name("mlp7") == "mlp7"
    assert (data_name("cifar10"), data_name("imagenet"), data_name("digits")) == (
        "CIFAR-10", "ImageNet", "digits")  # fmt: skip
    assert (seeds_text([4, 0, 1, 2, 3]), seeds_text([0]), seeds_text([0, 2, 7])) == (
        "0-4", "0", "0, 2, 7")  # fmt: skip
    assert (seeds_text([1, 0]), seeds_text([0, 1, 2]), seeds_text([])) == ("0, 1", "0-2", "-")
    assert (n_label(1, [3]), n_label(1), n_label(5, [0, 1, 2, 3, 4]), n_label(0)) == (
        "(n=1, seed 3)", "(n=1)", "(n=5)", "")  # fmt: skip
    assert (n_label(1, [0, 1]), n_label(1, [])) == ("(n=1)", "(n=1)")  # seeds that are not one
    assert (model_name("vgg8"), model_name("resnet8")) == ("VGG-8", "ResNet-8")  # not listed


@pytest.mark.parametrize(
    ("name", "key", "words"),
    [("data", "tiny_imagenet", "Tiny-ImageNet"),
     ("data", "tinyimagenet", "Tiny-ImageNet"),
     ("data", "synthetic", "synthetic data"),
     ("data", None, "?"),
     ("data", "", "?"),
     ("model", "resnet18_cifar", "resnet18_cifar"),
     ("model", "vgg16bn", "vgg16bn"),
     ("model", "resnet50_v1", "ResNet-50 v1"),
     ("model", "alexnet", "AlexNet")],
    ids=["tiny-imagenet", "tinyimagenet", "synthetic", "no-data", "empty-data",
         "resnet-variant", "vgg-variant", "resnet50-v1", "alexnet"],
)  # fmt: skip
def test_model_and_data_keys_read_as_the_papers_spell_them(name, key, words):
    """Model and data keys read as the papers spell them; a key that merely starts like a
    known family stays as given, and a missing key reads "?"."""
    from impl.report.labels import data_name, model_name

    assert {"data": data_name, "model": model_name}[name](key) == words


def test_settings_table_is_shown_under_the_numbers_with_the_shared_setup(tmp_path):
    from impl.report.html import settings_frame

    res = _result("cpu", "cross.methods")
    res.settings = [
        {"row": "dense", "method": "dense", "options": "no pruning (the baseline)",
         "seeds": "0-4", "differs": ""},
        {"row": "prunetrain", "method": "prunetrain", "seeds": "0-4", "differs": "",
         "options": "penalty ratio 0.8 (the paper's 0.2, mapped onto the short run)"},
    ]  # fmt: skip
    res.setup = "ResNet-20 on digits (16x16 px), 8 epochs, batch 32"
    frame = settings_frame(res.settings)
    assert list(frame.columns) == ["Row", "Method", "Options (as run)", "Seeds"]
    with_diff = settings_frame([{**res.settings[0], "differs": "label smoothing 0.1"}])
    assert with_diff.loc[0, "Differs from the shared setup"] == "label smoothing 0.1"
    back = load_result(save_result(res, tmp_path / "r"))
    assert back.settings == res.settings and back.setup == res.setup
    render_reports([back], tmp_path / "out")
    page = (tmp_path / "out" / "cross.html").read_text()
    assert (
        "penalty ratio 0.8 (the paper&#x27;s 0.2" in page
        or "penalty ratio 0.8 (the paper's 0.2" in page
    )
    assert "Shared by every run: ResNet-20 on digits (16x16 px), 8 epochs, batch 32" in page
    bad = _result("cpu")
    bad.settings = [{"row": "x", "colour": "red"}]
    with pytest.raises(ValueError, match="valid keys"):
        bad.validate()


def test_every_verdict_of_a_claims_table_is_coloured_with_or_without_its_reason(tmp_path):
    from impl.report.html import _frame_html

    rows = [{"row": f"claim {v}", "metric": "m", "ours": 1.0, "n": 3, "scale": "cpu",
             "verdict": v, "verdict_reason": reason}
            for v, reason in (("holds", ""), ("does not hold", "below the bound"),
                              ("inconclusive", "the intervals overlap"))]  # fmt: skip
    body = _frame_html(comparison_frame(rows))
    assert '<td class="verdict v-holds">holds</td>' in body
    assert '<td class="verdict v-not">does not hold: below the bound</td>' in body
    assert '<td class="verdict v-open">inconclusive: the intervals overlap</td>' in body
    page = render_html("t", [Section(title="s", tables=[Table(comparison_frame(rows))])],
                       tmp_path / "p.html").read_text()  # fmt: skip
    # three colours a reader can tell apart
    colours = {c: re.search(rf"td\.{c}\{{background:(#[0-9a-f]+)\}}", page).group(1)
               for c in ("v-holds", "v-not", "v-open")}  # fmt: skip
    assert len(set(colours.values())) == 3


def test_a_settings_table_caption_names_the_target_and_its_scale():
    from impl.report.html import settings_caption

    res = _result("cpu", "cross.methods")
    assert settings_caption(res) == (
        "Settings of the runs of cross.methods at scale cpu, from their saved configs."
    )
    res.setup = "ResNet-20 on digits, 8 epochs"
    assert settings_caption(res).endswith(" Shared by every run: ResNet-20 on digits, 8 epochs.")


def test_row_label_names_both_models_and_data_where_they_differ():
    from impl.report.html import row_label

    row = {"row": "dense", "ours_setup": "ResNet-20 on digits (16x16 px)",
           "paper_setup": "ResNet-9 on CIFAR-10"}  # fmt: skip
    assert row_label(row) == (
        "dense (ours: ResNet-20 on digits (16x16 px); paper: ResNet-9 on CIFAR-10)"
    )
    same = {**row, "ours_setup": "ResNet-9 on CIFAR-10"}
    assert row_label(same) == "dense" and row_label({"row": "x"}) == "x"
    frame = comparison_frame([{**row, "metric": "top1", "ours": 99.28, "n": 1, "paper": 95.3}])
    assert frame.loc[0, "Row"].startswith("dense (ours: ResNet-20")


def test_every_figure_carries_its_scale_in_its_own_title(monkeypatch):
    import impl.report.html as report_html

    titles: list[str] = []
    real_draw = report_html.draw

    def spying_draw(kind, data, **kw):
        titles.append(kw["title"])
        return real_draw(kind, data, **kw)

    monkeypatch.setattr(report_html, "draw", spying_draw)
    result_section(_result("cpu"))
    assert titles == ["top-1 (cpu scale)"]
    assert report_html.scaled_title("", "gpu") == "gpu scale"
    assert report_html.scaled_title("Fig. 9", None) == "Fig. 9"
    # a title naming its scale already: not "(cpu scale) (cpu scale)"
    assert report_html.scaled_title("CSR time (cpu scale)", "cpu") == "CSR time (cpu scale)"
    assert report_html.scaled_title("fwd (cpu scale, 3 runs)", "cpu") == "fwd (cpu scale, 3 runs)"
    assert report_html.scaled_title("CSR time (cpu scale)", "gpu") == (
        "CSR time (cpu scale) (gpu scale)"  # another scale's title is not this one's
    )


@pytest.mark.parametrize("n", [1, 6], ids=["one-method", "five-plus-plugin"])
def test_cross_page_title_counts_the_methods_shown(tmp_path, n):
    names = ["dense", "clicktrain", "prunetrain", "sdgp", "campfire", "gradual_magnitude"][:n]
    rows = [{"row": m, "metric": k, "ours": 1.0, "n": 1, "scale": "cpu"}
            for m in names for k in ("top1", "iter_ms")]  # fmt: skip
    cross = ResultSet(target="cross.methods", title="Cross-method table", scale="cpu",
                      rows=rows, wide=True)  # fmt: skip
    render_reports([cross], tmp_path)
    page = (tmp_path / "cross.html").read_text()
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert title.startswith(f"{n} method{'s' if n > 1 else ''} on equal terms")
    assert "five" not in page.lower().split("<body")[0]


def test_page_titles_cite_each_paper_and_count_two_methods_in_the_plural():
    from impl.report.html import page_title

    # the venues of docs/methods.md: ClickTrain (ICS 2021), PruneTrain (SC 2019)
    assert page_title("clicktrain") == "ClickTrain (ICS 2021)"
    assert page_title("prunetrain") == "PruneTrain (SC 2019)"
    assert page_title("sdgp") == "SDGP: Structured Data Gradient Pruning (2022)"
    assert page_title("campfire") == "Campfire (2020)"
    two = ResultSet(target="cross.methods", title="t", scale="cpu", wide=True,
                    rows=[{"row": m, "metric": "top1", "ours": 1.0, "n": 1, "scale": "cpu"}
                          for m in ("dense", "sdgp")])  # fmt: skip
    assert page_title("cross", [two]) == "2 methods on equal terms (no paper has this table)"
    one = ResultSet(target="cross.methods", title="t", scale="cpu", wide=True,
                    rows=two.rows[:1] * 2)  # fmt: skip
    assert page_title("cross", [one]) == "1 method on equal terms (no paper has this table)"
    assert page_title("cross") == "Every method on equal terms (no paper has this table)"


def test_report_of_plain_runs_says_there_are_no_reproductions(tmp_path, runs_root):
    # the index used to show an empty "Reproductions" table, headers only
    assert main([str(runs_root), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "index.html").read_text()
    assert "No reproduction results" in text and "runs.html" in text
    assert "<table" not in text.split("<footer>")[0]  # no empty table above the footer
    assert "<th>target</th>" not in text


def test_runs_page_footer_shows_the_whole_environment(tmp_path, runs_root):
    runs = load_runs([runs_root])
    assert runs.attrs["environments"][str(runs_root / "dense-s0")] == ENV
    render_reports([], tmp_path, runs=runs, metrics=load_metrics(runs))
    footer = (tmp_path / "runs.html").read_text().split("<footer>")[1]
    assert "?/?" not in footer and "False/True" in footer  # tf32 matmul/cudnn of ENV
    assert "aaaaaaaaaaaa" in footer and "Test CPU" in footer


def test_report_renders_a_run_saved_without_an_environment_beside_others(tmp_path, runs_root):
    # a summary without "environment" (hand-made, or from an older version) beside runs with
    # one: its NaN cells used to crash the runs page's footer (commit[:12] of a float)
    summary_path = runs_root / "dense-s1" / "summary.json"
    summary = json.loads(summary_path.read_text())
    del summary["environment"]
    summary_path.write_text(json.dumps(summary))
    assert main([str(runs_root), "--out", str(tmp_path / "out")]) == 0
    footer = (tmp_path / "out" / "runs.html").read_text().split("<footer>")[1]
    assert "aaaaaaaaaaaa" in footer and ">nan<" not in footer.lower()


def test_report_out_that_is_a_file_is_refused_before_anything_is_read(tmp_path, runs_root):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        with pytest.raises(ValueError, match="afile is a file, not a directory"):
            main([str(runs_root), "--out", str(out)])


def test_report_out_that_cannot_be_written_is_refused_before_anything_is_read(
    tmp_path, runs_root, monkeypatch
):
    """A read-only --out ended in a bare OS error ("[Errno 30] Read-only file system") after
    every run had been loaded; it is refused first, in the words train and reproduce use."""
    import os
    from pathlib import Path

    from impl.report import cli as report_cli

    read_only = tmp_path / "ro"
    read_only.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m: Path(p) != read_only and real_access(p, m))

    def loaded(*args, **kwargs):
        raise AssertionError("runs were read before --out was checked")

    monkeypatch.setattr(report_cli, "load_results", loaded)
    with pytest.raises(ValueError, match=f"--out {read_only}/rep: {read_only} is not writable"):
        main([str(runs_root), "--out", str(read_only / "rep")])


def _index_rows(html: str) -> list[list[str]]:
    """The cells of the index table's body rows, as text."""
    table = html.split("<footer>")[0].split('<table class="dataframe data">')[1]
    table = table.split("</table>")[0]
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S)
    ]


def _index_cells(text, target):
    """The cells of ``target``'s row in the index table after its target cell, as text."""
    rows = [row for row in _index_rows(text) if row[1] == target]
    assert len(rows) == 1, target
    return rows[0][2:]


def test_index_counts_paper_rows_without_ours_whether_or_not_listed_as_missing(tmp_path):
    # clicktrain.table2 at the cpu scale: 36 paper rows with no number of ours (methods we do
    # not implement, ImageNet) were counted "missing 0" because no entry of result.missing named
    # them, while sdgp.table1 counted its 9 listed entries
    paper_rows = [{"row": f"paper: resnet18 / imagenet / m{k}", "metric": "top1", "ours": None,
                   "scale": None, "paper": 70.0 + k} for k in range(5)]  # fmt: skip
    unlisted = ResultSet(
        target="clicktrain.table2", title="T2", scale="cpu",
        rows=[{"row": "ours: clicktrain", "metric": "top1", "ours": 90.0, "scale": "cpu"},
              *paper_rows],
    )  # fmt: skip
    listed = _result("cpu")
    listed.rows = listed.rows + paper_rows[:2]
    listed.missing = [{"row": r["row"], "reason": "needs the paper scale"} for r in paper_rows[:2]]
    listed.missing.append({"row": "regnetx (all rows)", "reason": "not in impl.models"})
    text = render_reports(
        [unlisted, listed], tmp_path,
        expected=[{"target": "sdgp.fig9", "title": "SDGP Fig. 9", "needs": "gpu scale"}],
    ).read_text()  # fmt: skip
    assert "<th>no number of ours</th>" in text and "<th>missing</th>" not in text
    # ours, no number of ours, status
    assert _index_cells(text, "clicktrain.table2")[2:] == [
        "1", "5", "filled (some rows need more; see the page)"
    ]  # fmt: skip
    # listed rows are counted once, a listed item naming no row of the table is counted too
    assert _index_cells(text, "sdgp.table1")[2:4] == ["1", "3"]
    assert _index_cells(text, "sdgp.fig9")[2:4] == ["0", "all"]
    filled = ResultSet(target="sdgp.fig8", title="F8", scale="cpu",
                       rows=[{"row": "a", "metric": "m", "ours": 1.0, "scale": "cpu"}])  # fmt: skip
    assert unfilled(filled) == 0 and unfilled(unlisted) == 5 and unfilled(listed) == 3


def test_a_papers_items_are_ordered_tables_then_figures_by_number():
    from impl.report.pages import _item_key

    targets = ["cp.fig10", "cp.table10", "cp.notes", "cp.fig9", "cp.table2", "cp.headline"]
    assert sorted(targets, key=_item_key) == [
        "cp.table2", "cp.table10", "cp.fig9", "cp.fig10", "cp.headline", "cp.notes"]  # fmt: skip


def test_a_result_without_numbers_of_ours_says_why_in_the_index():
    from types import SimpleNamespace

    from impl.report.pages import _status

    need = [{"row": "a", "reason": "needs gpu"}, {"row": "b", "reason": "needs ImageNet"}]
    paper_only = SimpleNamespace(rows=[{"row": "a", "ours": None}], missing=need)
    assert _status(paper_only) == "paper numbers only: needs ImageNet (+1 other reason)"
    three = SimpleNamespace(rows=[], missing=[*need, {"row": "c", "reason": "needs time"}])
    assert _status(three) == "paper numbers only: needs ImageNet (+2 other reasons)"
    one = SimpleNamespace(rows=[], missing=need[:1])
    assert _status(one) == "paper numbers only: needs gpu"
    assert _status(SimpleNamespace(rows=[], missing=[])) == "empty"
    rows = [{"row": "a", "ours": 1.0}, {"row": "b", "ours": None}]
    partly = SimpleNamespace(rows=rows, missing=[])
    assert _status(partly) == "filled (some rows need more; see the page)"
    assert _status(SimpleNamespace(rows=[{"row": "a", "ours": 1.0}], missing=[])) == "filled"


def test_the_index_lists_papers_in_their_order_before_their_items(tmp_path):
    """ClickTrain comes before SDGP although its item (a figure) sorts after SDGP's table."""
    index = render_reports(
        [_result(target="sdgp.table1"), _result(target="prunetrain.table2"),
         _result(target="clicktrain.fig10")],
        tmp_path,
    )  # fmt: skip
    text = index.read_text().split("<footer>")[0]
    assert (
        text.index("clicktrain.fig10</")
        < text.index("prunetrain.table2</")
        < text.index("sdgp.table1</")
    )


def test_a_comparison_table_opens_with_our_means_beside_the_papers_at_a_glance():
    from impl.report.html import glance_frame, glance_subject, result_section

    rows = [
        {"row": "dense", "metric": "top1", "ours": 99.44, "paper": 93.6, "unit": "%",
         "scale": "cpu"},
        {"row": "dense", "metric": "train_flops", "ours": 100.0, "unit": "% of dense",
         "scale": "cpu"},
        {"row": "PruneTrain", "metric": "top1", "ours": 98.61, "paper": 91.8, "unit": "%",
         "scale": "cpu"},
        {"row": "PruneTrain", "metric": "delta_top1", "ours": -0.8333, "paper": -1.8,
         "unit": "pp", "scale": "cpu"},
        {"row": "PruneTrain", "metric": "train_flops", "ours": 98.79, "paper": 47.0,
         "unit": "% of dense", "scale": "cpu"},
        {"row": "paper: vgg11", "metric": "top1", "ours": None, "paper": 92.1, "unit": "%"},
    ]  # fmt: skip
    frame = glance_frame(rows)
    assert list(frame["Row"]) == ["dense", "PruneTrain"]  # the paper-only row is not ours
    top1, flops = frame.columns[1], frame.columns[2]
    assert frame.iloc[1][top1] == "98.61 (paper 91.8)" and frame.iloc[0][flops] == "100"
    assert frame.iloc[1][flops] == "98.79 (paper 47)"
    assert glance_frame([{**r, "ours": 4.0} for r in rows[:2]] + rows[2:4]).iloc[0][top1] == (
        "4 (paper 93.6)"  # a whole number (an epoch) without decimals
    )
    delta = frame.columns[3]
    assert frame.iloc[1][delta] == "-0.83 (paper -1.8)" and frame.iloc[0][delta] == "-"
    tiny = glance_frame([{**r, "ours": -0.00403} if r["metric"] == "delta_top1" else r
                         for r in rows])  # fmt: skip
    assert tiny.iloc[1][delta] == "-0.00403 (paper -1.8)"  # not "-0.00": its sign and size kept
    result = ResultSet(target="prunetrain.table1", title="t", scale="cpu", rows=rows)
    tables = result_section(result).tables
    assert len(tables) == 2 and "At a glance" in tables[0].caption
    assert "our means at scale cpu" in tables[0].caption  # no row says how many seeds
    five = ResultSet(target="p.t", title="t", scale="cpu", rows=[{**r, "n": 5} for r in rows])
    assert (
        "At a glance: our means over 5 seeds at scale cpu" in result_section(five).tables[0].caption
    )
    mixed = [{**r, "n": 5 if r["row"] == "dense" else 3} for r in rows]
    assert glance_subject(mixed) == "our means (seeds per row: see below)"
    assert glance_subject([{**rows[0], "n": 1}]) == "our values (one seed each)"
    # a measurement's rows count its repeats (SDGP Fig. 9's timings), not seeds
    timed = [{**r, "n_of": "repeats", "n": 2} for r in rows]
    assert glance_subject(timed) == "our means over 2 repeats"
    assert glance_subject([{**timed[0], "n": 1}]) == "our values (one repeat each)"
    assert glance_subject([timed[0], {**rows[0], "n": 2}]) == "our means over 2 seeds or repeats"
    assert glance_subject([{**rows[5], "n": 5}]) == "our means"  # the paper's row is not ours
    one = ResultSet(target="x.y", title="t", scale="cpu", rows=rows[:1] + rows[2:3])
    assert len(result_section(one).tables) == 1  # one metric: the long table alone
    claims = [{**r, "verdict": "holds"} for r in rows]
    assert glance_frame(claims).empty  # each claim its own metric: no grid


def test_a_glance_cell_of_ten_or_more_keeps_its_significant_digits():
    """Only a mean between 0.01 and 10 is written to two decimals at a glance; from 10 on it
    reads as the long table's numbers, to four significant digits (12.5, not 12.50)."""
    from impl.report.html import glance_frame

    rows = [
        {"row": "dense", "metric": "top1", "ours": 12.5, "unit": "%", "scale": "cpu"},
        {"row": "dense", "metric": "speedup", "ours": 1.5, "unit": "x", "scale": "cpu"},
        {"row": "sdgp", "metric": "top1", "ours": 98.25, "unit": "%", "scale": "cpu"},
        {"row": "sdgp", "metric": "speedup", "ours": 2.0, "unit": "x", "scale": "cpu"},
    ]  # fmt: skip
    frame = glance_frame(rows)
    assert [list(r) for r in frame.itertuples(index=False)] == [
        ["dense", "12.5", "1.50"], ["sdgp", "98.25", "2"]
    ]  # fmt: skip


def test_runs_page_counts_epochs_from_one_as_every_epoch_axis(monkeypatch):
    """metrics.jsonl numbers epochs from 0; the runs page drew them so (0, 1, 2) while the
    reproductions' epoch axes and the training log count from 1."""
    import impl.report.pages as pages

    drawn: dict[str, pd.DataFrame] = {}
    real_draw = pages.draw

    def spying_draw(kind, data, **kw):
        drawn[kw["title"]] = data
        return real_draw(kind, data, **kw)

    monkeypatch.setattr(pages, "draw", spying_draw)
    runs = pd.DataFrame([{"run": "r", "method": "dense", "scale": "cpu", "top1": 90.0}])
    metrics = pd.DataFrame(
        [
            {"run": "r", "method": "dense", "scale": "cpu", "epoch": e, "test_top1": t}
            for e, t in enumerate([50.0, 80.0, 90.0])
        ]  # fmt: skip
    )
    pages.runs_section(runs, metrics)
    assert list(drawn["Test top-1 per epoch"]["epoch"]) == [1, 2, 3]
    assert list(metrics["epoch"]) == [0, 1, 2]  # the caller's frame is left as it was


def test_an_axis_from_zero_leaves_room_above_the_highest_value():
    """A memory budget line at the top of its axis lay on the frame."""
    data = pd.DataFrame({"epoch": [1, 2, 3], "mib": [15.0, 15.0, 14.3]})
    low, high = draw("line", data, x="epoch", y="mib", y_from_zero=True).axes[0].get_ylim()
    assert low == 0.0 and high >= 1.05 * 15.0


def test_long_category_labels_do_not_squeeze_the_plot():
    """Seven labels of 45 characters, slanted at 45 degrees, left Campfire Table 4's bars
    about 70 pixels of height: labels now break into lines and the figure grows for them."""
    labels = [f"combined, start 40, sparsity 60% (epoch {e})" for e in range(90, 97)]
    data = pd.DataFrame({"x": labels, "y": [99.0] * 7, "h": ["ours"] * 7})
    fig = draw("bar", data, x="x", y="y", hue="h")
    ax = fig.axes[0]
    fig.canvas.draw()
    plot_height_in = ax.get_window_extent().height / fig.dpi
    assert plot_height_in >= 2.0, plot_height_in
    texts = [t.get_text() for t in ax.get_xticklabels()]
    assert all(max(map(len, t.splitlines())) <= 24 for t in texts), texts
    assert texts[0].replace("\n", " ") == labels[0]  # broken at spaces, nothing lost


def test_equal_lines_of_two_groups_both_show():
    """Campfire's three masks reached the same sparsity each epoch, and the line drawn last
    hid the others: each group now has its own dashes and its markers are smaller than the
    previous group's, so the first shows around and between the later ones."""
    data = pd.DataFrame({"epoch": [1, 2, 3] * 2, "s": [0.0, 0.6, 0.7] * 2,
                         "row": ["ck"] * 3 + ["window"] * 3})  # fmt: skip
    ax = draw("line", data, x="epoch", y="s", hue="row").axes[0]
    first, second = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
    assert first.get_markersize() > second.get_markersize()
    assert first.get_linestyle() != second.get_linestyle()
    assert first.get_markerfacecolor()[3] < 1.0  # a pale fill inside a solid outline


def test_long_legend_entries_break_into_lines():
    """Entries of 60 characters ("dense, ours, ResNet-20 on digits, projected (cpu)") left
    the axes a third of the figure's width."""
    long = "PruneTrain (ratio 0.25, run at 0.85), dynamic mini-batch"
    data = pd.DataFrame({"x": [1, 2, 1, 2], "y": [1.0, 0.9, 1.0, 0.8],
                         "h": [long, long, "dense", "dense"]})  # fmt: skip
    ax = draw("line", data, x="x", y="y", hue="h").axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert long not in texts  # broken into lines
    assert all(max(map(len, t.splitlines())) <= 30 for t in texts), texts
    assert any(t.replace("\n", " ") == long for t in texts)


@pytest.mark.parametrize(
    "kind, values, want",
    [
        ("bar", [1.0, 2.0, 3.0], "Error bars: the standard deviation"),
        ("line", [1.0, 2.0, 3.0], "Bands: the standard deviation"),
        ("bar", [1.0], ""),  # one value a bar: nothing spreads
        ("scatter", [1.0, 2.0], ""),
        ("heatmap", [1.0], "Each cell is one run"),
        ("heatmap", [1.0, 2.0], "Each cell is the mean of its runs"),
    ],
)
def test_a_figures_caption_says_what_its_error_bars_show(kind, values, want):
    from impl.report.figures import spread_note

    data = pd.DataFrame({"x": ["a"] * len(values), "y": values})
    note = spread_note(kind, data, "x")
    assert note.startswith(want) if want else note == ""
    # beside a bar or cell of one value (the paper's number beside our seeds), the note is
    # the one of the group that has repeats: some bar, not every bar, decides
    mixed = pd.concat([data, pd.DataFrame({"x": ["paper"], "y": [9.0]})], ignore_index=True)
    assert spread_note(kind, mixed, "x") == note


def test_a_bar_figures_caption_gains_the_error_bar_note_once(monkeypatch):
    spec = FigureSpec(kind="bar", x="row", y="v", data=[{"row": "a", "v": v} for v in (1, 2)],
                      caption="ours per seed")  # fmt: skip
    said = FigureSpec(kind="bar", x="row", y="v", data=spec.data, caption="mean and sd")
    result = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[],
                       figures=[spec, said])  # fmt: skip
    captions = [f.caption for f in result_section(result).figures]
    assert captions[0].startswith("ours per seed Error bars: the standard deviation")
    assert captions[1] == "mean and sd"  # already said


@pytest.mark.parametrize(
    "n_of, over", [(None, "seeds"), ("seeds", "seeds"), ("repeats", "repeats")]
)
def test_error_bars_name_what_they_spread_over(n_of, over):
    """SDGP Table I's bars, sd over 5 seeds, were captioned "over the repeats of a value"."""
    spec = FigureSpec(kind="bar", x="row", y="v", data=[{"row": "a", "v": v} for v in (1, 2)],
                      caption="ours")  # fmt: skip
    row = {"label": "a", "metric": "v", "ours": 1.5, "n": 2, "n_of": n_of}
    result = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[row], figures=[spec])
    (caption,) = [f.caption for f in result_section(result).figures]
    assert caption.endswith(f"the standard deviation over the {over} of a value (mean drawn).")


def test_scatter_points_of_methods_take_the_methods_colours():
    data = pd.DataFrame({"f": [1.0, 2.0], "t": [90.0, 91.0], "m": ["sdgp", "dense"]})
    ax = draw("scatter", data, x="f", y="t", hue="m").axes[0]
    palette = group_palette(data["m"])
    for collection, method in zip(ax.collections, ["sdgp", "dense"], strict=True):
        face = collection.get_facecolor()[0]
        assert tuple(face[:3]) == pytest.approx(tuple(palette[method][:3]))
        assert face[3] == pytest.approx(0.3)


def test_load_runs_lists_a_summary_without_status_and_gives_a_failures_reason_only_if_diverged(
    tmp_path,
):
    """A summary with no ``status`` is not a finished run; the summary's own ``reason`` is
    shown only for a diverged run (its words say why), else "summary not complete"."""
    root = tmp_path / "runs"
    _run(root, "done", seed=0)
    for name, status in (("nostatus", None), ("stopped", "failed"), ("nan", "diverged")):
        d = _run(root, name, seed=1)
        summary = json.loads((d / "summary.json").read_text())
        summary.pop("status")
        if status is not None:
            summary["status"] = status
        summary["reason"] = f"{name}'s own words"
        (d / "summary.json").write_text(json.dumps(summary))
    runs = load_runs([root])
    assert list(runs["run"]) == ["done"]
    why = {
        r["path"].rsplit("/", 1)[-1]: (r["status"], r["reason"]) for r in runs.attrs["incomplete"]
    }
    assert why == {
        "nostatus": ("None", "summary not complete"),
        "stopped": ("failed", "summary not complete"),
        "nan": ("diverged", "nan's own words"),
    }


def test_a_result_is_refused_without_what_its_tables_need_and_saved_as_strict_json(tmp_path):
    """A missing entry needs both its row and its reason, a settings line its row; an
    infinite value is saved as null (strict JSON), and only result.json files are found."""
    from impl.report.results import find_results

    for missing in ({"row": "x"}, {"reason": "y"}):
        bad = _result("cpu")
        bad.missing = [missing]
        with pytest.raises(ValueError, match="missing entry without 'row' and 'reason'"):
            bad.validate()
    bad = _result("cpu")
    bad.settings = [{"method": "dense"}]
    with pytest.raises(ValueError, match="needs 'row'"):
        bad.validate()
    res = _result("cpu")
    res.rows[0]["ours_sd"] = float("inf")
    res.rows[0]["paper"] = float("-inf")
    path = save_result(res, tmp_path / "r")
    text = path.read_text()
    assert "Infinity" not in text
    row = json.loads(text)["rows"][0]
    assert row["ours_sd"] is None and row["paper"] is None
    other = tmp_path / "r" / "summary.json"
    other.write_text("{}")
    assert find_results([other]) == [] and find_results([path]) == [path]


# ----------------------------------------------------------------------------- what a page says


def test_labels_spell_models_data_and_counts_as_the_papers():
    from impl.report.labels import data_name, metric_label, model_name, n_label

    assert data_name("cifar100") == "CIFAR-100" and data_name("cifar10") == "CIFAR-10"
    assert model_name("resnet50_v1.5") == "ResNet-50 v1.5"
    assert model_name(None) == "?" and model_name("") == "?"
    assert n_label(3, [0]) == "(n=3)"  # three measurements of one seed are not one
    assert metric_label("sparsity", "%") == (
        "sparsity (Campfire: zero weights; PruneTrain: inference FLOPs saved, %)"
    )


def test_runs_page_keeps_every_scale_and_puts_methods_on_the_x_axis(monkeypatch):
    import impl.report.pages as pages

    kept = {}
    real_draw = pages.draw

    def spying_draw(kind, data, **kw):
        kept[kw["title"]] = fig = real_draw(kind, data, **kw)
        return fig

    monkeypatch.setattr(pages, "draw", spying_draw)
    runs = pd.DataFrame([{"run": "a", "method": "dense", "scale": "smoke", "top1": 90.0},
                         {"run": "b", "method": "sdgp", "scale": "cpu", "top1": 80.0}])  # fmt: skip
    section = pages.runs_section(runs)
    assert section.scale == "cpu, smoke"
    assert "scale" in section.tables[0].frame.columns
    ax = kept["Final top-1 per method"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense", "sdgp"]
    assert ax.get_legend().get_title().get_text() == "scale"
    # summaries without a scale (written by hand, older code): shown, with "?" as the scale
    section = pages.runs_section(runs.drop(columns="scale"))
    assert section.scale == "?" and list(section.tables[0].frame["scale"]) == ["?", "?"]


def test_index_shows_each_results_scale_and_every_commit_and_links_the_runs(tmp_path, runs_root):
    other = _result("cpu", target="clicktrain.table1")
    other.environment = {**ENV, "commit": "b" * 40}
    render_reports([_result("cpu"), other], tmp_path, runs=load_runs([runs_root]))
    index = (tmp_path / "index.html").read_text()
    body, footer = index.split("<footer>")
    assert "<td>cpu</td>" in body
    assert "aaaaaaaaaaaa" in footer and "bbbbbbbbbbbb" in footer
    page = (tmp_path / "sdgp.html").read_text()
    assert '<a href="runs.html">runs</a>' in page.split("<h1>")[0]


def test_a_paper_page_says_a_targets_result_is_unreadable_not_unrun(tmp_path):
    expected = [{"target": "sdgp.fig9", "title": "F9", "needs": "gpu scale"}]
    unreadable = [{"target": "sdgp.fig9", "path": "/x/result.json", "reason": "bad"}]
    render_reports([], tmp_path, expected=expected, unreadable=unreadable)
    assert "its result is unreadable (/x/result.json)" in (tmp_path / "sdgp.html").read_text()


def test_comparison_cells_ci_of_every_delta_unknown_scale_and_verdict_colour():
    from impl.report.html import _frame_html

    frame = comparison_frame(
        [{"row": "pt", "metric": "delta_top1_finetuned", "ours": -0.37, "ours_sd": 0.42, "n": 3}]
    )
    assert "95% CI -1.4, 0.7" in frame.loc[0, "Ours"]
    assert (
        comparison_frame([{"row": "x", "metric": "top1", "ours": 1.0, "n": 1}]).loc[0, "Scale"]
        == "?"
    )  # a number of ours without its scale is not "-"
    assert format_number(-0.0) == "0"
    verdict = comparison_frame([{"row": "c", "metric": "claim", "ours": 1.0, "n": 1, "scale": "cpu",
                                 "verdict": "does not hold", "verdict_reason": "r"}])  # fmt: skip
    assert 'class="verdict v-not"' in _frame_html(verdict)


def test_result_figures_keep_their_axes_and_an_empty_one_is_listed(monkeypatch):
    import impl.report.html as html

    kept = []
    real_draw = html.draw

    def spying_draw(kind, data, **kw):
        kept.append(fig := real_draw(kind, data, **kw))
        return fig

    monkeypatch.setattr(html, "draw", spying_draw)
    r = _result("cpu")
    r.figures = [
        FigureSpec(kind="line", x="e", y="v", data=[{"e": 1, "v": 2.0}, {"e": 2, "v": 30.0}],
                   xlabel="X", ylabel="Y", logy=True, title="t"),
        FigureSpec(kind="bar", x="row", y="v", data=[], title="empty fig"),
    ]  # fmt: skip
    section = result_section(r)
    ax = kept[0].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("X", "Y")
    assert (ax.get_yscale(), ax.get_xscale()) == ("log", "linear")
    assert {"row": "empty fig", "reason": "no data to plot"} in section.missing
    assert result_section(_result("cpu")).missing == _result("cpu").missing  # nothing added


def test_provenance_reads_the_gpu_driver_and_pages_embed_only_their_own_images(tmp_path):
    from impl.report.html import FigureBlock

    rows = provenance_rows([("gpu", {**ENV, "gpu_name": "H100", "gpu_driver": "550.54"})])
    assert rows.loc[0, "driver"] == "550.54"
    out = tmp_path / "p.html"
    render_html("p", [Section(title="s", figures=[FigureBlock("https://example.org/x.png")])], out)
    assert "example.org" not in out.read_text()


def test_run_options_are_listed_in_name_order_and_an_old_gpu_key_is_read(tmp_path):
    d = _run(tmp_path, "r")
    summary = json.loads((d / "summary.json").read_text())
    summary["method_options"] = {"n": 2, "m": 1}
    summary["environment"] = {**ENV, "gpu": "Tesla V100"}
    (d / "summary.json").write_text(json.dumps(summary))
    runs = load_runs([tmp_path])
    assert runs.loc[0, "options"] == "m=1, n=2"
    assert runs.loc[0, "gpu_name"] == "Tesla V100"
    # values as the flags take them, not Python's reprs (True, None, 1.52587890625e-09)
    summary["method_options"] = {"prune_fc": True, "cap": None, "eps": 2.0**-29 * 0.8192,
                                 "sizes": [1, 2], "mask": "ck"}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    options = load_runs([tmp_path]).loc[0, "options"]
    assert options == "cap=none, eps=1.52588e-09, mask=ck, prune_fc=true, sizes=1 2"


def test_runs_are_found_in_name_order_and_read_with_null_fields_and_sorted_options(tmp_path):
    """Run directories come sorted by path; a summary field saved as null is still a column;
    the options' JSON has its keys sorted; an environment that is not an object is read as
    an empty one."""
    for name in ("b", "c", "a"):
        _run(tmp_path, name)
    assert find_run_dirs(tmp_path) == [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    summary.update(method_options={"n": 2, "m": 1}, comm_bytes_per_iter=None, environment="n/a")
    (tmp_path / "b" / "summary.json").write_text(json.dumps(summary))
    runs = load_runs(tmp_path).set_index("run")
    assert list(runs.index) == ["a", "b", "c"]
    assert runs.loc["b", "method_options"] == '{"m": 1, "n": 2}'
    assert "comm_bytes_per_iter" in runs.columns and pd.isna(runs.loc["b", "comm_bytes_per_iter"])
    assert runs.attrs["environments"][str(tmp_path / "b")] == {}
    assert runs.attrs["environments"][str(tmp_path / "a")] == ENV


def test_bars_and_lines_show_the_standard_deviation_their_captions_name():
    bars = draw("bar", pd.DataFrame({"x": ["a"] * 3, "y": [1.0, 2.0, 3.0]}), x="x", y="y")
    assert sorted(bars.axes[0].lines[0].get_ydata()) == [1.0, 3.0]  # mean 2 +- sd 1
    band = draw("line", pd.DataFrame({"x": [1, 1, 1, 2, 2, 2], "y": [1.0, 2.0, 3.0] * 2}),
                x="x", y="y").axes[0].collections[0].get_paths()[0].vertices  # fmt: skip
    assert (band[:, 1].min(), band[:, 1].max()) == pytest.approx((1.0, 3.0))


def test_a_figure_without_labels_names_its_y_column_and_reads_numbers_in_text():
    ax = draw("bar", pd.DataFrame({"x": ["a", "b"], "y": ["1.5", "2"]}), x="x", y="y").axes[0]
    assert ax.get_ylabel() == "y"
    assert sorted(p.get_height() for p in ax.patches) == [1.5, 2.0]
    nine = pd.DataFrame({"x": list("abcdefghi"), "y": [1.0] * 9})
    assert crowded_axis(nine, "bar", "x")


def test_a_heatmap_puts_x_across_and_hue_down_with_the_mean_of_repeats():
    data = pd.DataFrame({"m": [4, 4, 8], "r": ["r=2"] * 2 + ["r=8"], "top1": [99.0, 98.0, 97.0]})
    ax = draw("heatmap", data, x="m", y="top1", hue="r").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["r=2", "r=8"]
    assert "98.5" in [t.get_text() for t in ax.texts]


def test_a_log_axis_over_more_than_a_decade_keeps_its_powers_of_ten():
    data = pd.DataFrame({"x": ["a", "b", "c"], "t": [60.0, 17.0, 3.0]})  # 20x: over a decade
    ax = draw("bar", data, x="x", y="t", logy=True).axes[0]
    assert "10^" in ax.yaxis.get_major_formatter()(100.0, 0)
    narrow = draw("bar", data.assign(t=[6.0, 4.0, 3.0]), x="x", y="t", logy=True).axes[0]
    assert narrow.yaxis.get_major_formatter()(5.0, 0) == "5"  # under a decade: plain numbers


def test_a_complete_summary_without_its_fields_is_listed_not_shown(tmp_path):
    """A summary edited to {"status": "complete"} stopped the report on columns it lacked
    (naming no file); one with a text top-1 showed the text as the run's top-1."""
    from impl.run_files import summary_fields_wrong

    _run(tmp_path, "good", epochs=2)
    bare, text = _run(tmp_path, "bare", seed=1), _run(tmp_path, "text", seed=2)
    (bare / "summary.json").write_text('{"status": "complete"}')
    edited = json.loads((text / "summary.json").read_text())
    (text / "summary.json").write_text(json.dumps({**edited, "top1": "abc", "seed": True}))
    runs = load_runs(tmp_path)
    assert list(runs["run"]) == ["good"]
    listed = {Path(r["path"]).name: r["reason"] for r in runs.attrs["incomplete"]}
    assert listed["bare"].startswith(f"{bare / 'summary.json'}: says complete, but it lacks ")
    assert listed["text"].endswith("seed is True; top1 is 'abc'")
    assert summary_fields_wrong(edited) == ""


@pytest.mark.parametrize(
    "value, types, held",
    [(3, (int,), True), (2.5, (int, float), True), (True, (int,), False),
     (False, (int, float), False), ("3", (int, float), False), (None, (int,), False)],
)  # fmt: skip
def test_holds_type_counts_no_bool_as_a_number(value, types, held):
    from impl.run_files import holds_type

    assert holds_type(value, types) is held


def test_index_rows_of_targets_without_a_result_say_what_they_need_or_which_file_is_unreadable(
    tmp_path,
):
    expected = [
        {"target": "sdgp.fig9", "title": "SDGP Fig. 9", "needs": "gpu scale"},
        {"target": "sdgp.fig8", "title": "SDGP Fig. 8", "needs": "paper scale"},
        {"target": "sdgp.table1", "title": "SDGP Table I", "needs": "cpu scale"},  # has one
    ]
    unreadable = [{"target": "sdgp.fig8", "path": "/r/sdgp.fig8.json", "reason": "bad JSON"}]
    index = render_reports(
        [_result("smoke", target="sdgp.fig10"), _result("smoke")],
        tmp_path,
        expected=expected,
        unreadable=unreadable,
    )
    filled = "filled (some rows need more; see the page)"  # one row of ours, one item not shown
    assert _index_rows(index.read_text()) == [
        ["sdgp.html", "sdgp.table1", "SDGP Table I", "smoke", "1", "1", filled],
        ["sdgp.html", "sdgp.fig8", "SDGP Fig. 8", "-", "0", "all",
         "unreadable: /r/sdgp.fig8.json"],
        ["sdgp.html", "sdgp.fig9", "SDGP Fig. 9", "-", "0", "all", "not run: gpu scale"],
        ["sdgp.html", "sdgp.fig10", "SDGP Table I", "smoke", "1", "1", filled],
    ]  # fmt: skip
    text = index.read_text()
    assert "/r/sdgp.fig8.json: unreadable result, not shown: bad JSON" in text
    # the paper page: its results by number, then the targets without one, each under the
    # anchor the index links to, saying why
    page = (tmp_path / "sdgp.html").read_text().split("<footer>")[0]
    anchors = re.findall(r'<section id="([^"]*)"', page)
    assert anchors == ["sdgp-table1", "sdgp-fig10", "sdgp-fig8", "sdgp-fig9"]
    assert "<h2>SDGP Fig. 8</h2>" in page and "<h2>SDGP Fig. 9</h2>" in page
    assert "sdgp.fig8: its result is unreadable (/r/sdgp.fig8.json)" in page
    assert "sdgp.fig9: gpu scale" in page


def test_an_expected_target_without_title_or_needs_is_named_by_its_key_and_not_run(tmp_path):
    index = render_reports([_result()], tmp_path, expected=[{"target": "sdgp.fig9"}])
    assert _index_rows(index.read_text())[1] == [
        "sdgp.html", "sdgp.fig9", "", "-", "0", "all", "not run"]  # fmt: skip
    page = (tmp_path / "sdgp.html").read_text()
    assert "<h2>sdgp.fig9</h2>" in page and "sdgp.fig9: not run" in page


def test_runs_section_says_a_run_with_unreadable_metrics_misses_only_its_curve():
    # such a run is complete: its row and top-1 are shown, its per-epoch curve is not
    runs = pd.DataFrame([{"run": "a", "method": "dense", "scale": "cpu", "top1": 90.0,
                          "path": "/r/a"}])  # fmt: skip
    runs.attrs["incomplete"] = [
        {"path": "/r/a", "status": "metrics unreadable", "reason": "line 2 torn"}
    ]
    assert runs_section(runs).missing == [
        {"row": "/r/a", "reason": "metrics unreadable: line 2 torn (its per-epoch curve not shown)"}
    ]


def test_runs_section_lists_incomplete_runs_by_path_and_says_when_none_is_complete():
    runs = pd.DataFrame()
    runs.attrs["incomplete"] = [
        {"path": "/r/killed-s0", "status": "killed", "reason": "no summary.json"}
    ]
    section = runs_section(runs)
    assert section.missing == [
        {"row": "/r/killed-s0", "reason": "killed: no summary.json (not shown)"}
    ]
    assert section.text == "No complete run was found."
    assert section.tables == [] and section.figures == []


def test_runs_table_leaves_out_provenance_and_best_top1_and_names_fields_in_words():
    runs = pd.DataFrame([{"run": "a", "method": "dense", "scale": "cpu", "top1": 90.0,
                          "best_top1": 91.0, "fwd_ms": 2.5, "device": "cpu", "commit": "c",
                          "path": "/r/a"}])  # fmt: skip
    frame = runs_section(runs).tables[0].frame
    assert list(frame.columns) == ["run", "method", "scale", "top-1 (%)", "forward (ms)"]
    assert frame.iloc[0].tolist() == ["a", "dense", "cpu", 90.0, 2.5]


def test_runs_section_skips_unknown_scales_and_draws_top1_when_some_run_has_it():
    runs = pd.DataFrame([{"run": "a", "method": "dense", "scale": "cpu", "top1": 90.0},
                         {"run": "b", "method": "sdgp", "scale": math.nan,
                          "top1": math.nan}])  # fmt: skip
    section = runs_section(runs)
    assert section.scale == "cpu"
    assert [f.alt for f in section.figures] == ["Final top-1 per method"]
    # no top-1 at all: the table alone; metrics without a row: no epoch figure
    no_top1 = runs_section(runs.drop(columns="top1"), pd.DataFrame(columns=["epoch", "test_top1"]))
    assert no_top1.figures == [] and len(no_top1.tables) == 1


def test_run_environment_is_the_saved_one_else_the_text_fields_of_its_row():
    runs = pd.DataFrame([{"path": "/r/a", "commit": "c" * 40},
                         {"path": "/r/b", "commit": math.nan, "date": math.nan, "torch": "2.x",
                          "gpu_name": math.nan, "cpu_model": "Test CPU"}])  # fmt: skip
    saved = {"commit": "c" * 40, "cuda": "12.4", "dirty": True, "tf32_matmul": False}
    runs.attrs["environments"] = {"/r/a": saved}
    first, second = runs.to_dict("records")
    assert run_environment(runs, first) == saved
    assert run_environment(runs, second) == {"torch": "2.x", "cpu_model": "Test CPU"}


def test_an_index_without_results_points_to_the_runs_page_only_when_there_are_runs(tmp_path):
    runs = pd.DataFrame([{"run": "a", "method": "dense", "scale": "cpu", "top1": 90.0}])
    with_runs = render_reports([], tmp_path / "a", runs=runs).read_text().split("<footer>")[0]
    assert (
        "No reproduction results: the paths given held no result.json; the training runs are "
        "on the runs page (runs.html)." in with_runs
    )
    without = render_reports([], tmp_path / "b").read_text().split("<footer>")[0]
    assert "No reproduction results: the paths given held no result.json." in without
    assert "runs.html" not in without


def test_papers_keep_the_papers_order_and_others_follow_by_name(tmp_path):
    """SDGP before Campfire, as the papers are numbered, though Campfire sorts first."""
    targets = ["zz.table1", "campfire.table1", "aa.table1", "sdgp.table1"]
    index = render_reports([_result(target=t) for t in targets], tmp_path)
    text = index.read_text()
    order = ["sdgp.table1", "campfire.table1", "aa.table1", "zz.table1"]
    assert [row[1] for row in _index_rows(text)] == order
    nav = re.findall(r'<a href="(\w+)\.html">', text.split("<h1>")[0])
    assert nav == ["index", "sdgp", "campfire", "aa", "zz"]


def test_runs_page_footer_gives_each_runs_scale(tmp_path):
    runs = pd.DataFrame(
        [
            {"run": "a", "method": "dense", "scale": "cpu", "top1": 90.0, "path": "/r/a"},
            {"run": "b", "method": "dense", "scale": "smoke", "top1": 80.0, "path": "/r/b"},
        ]
    )
    runs.attrs["environments"] = {"/r/a": ENV, "/r/b": ENV}
    render_reports([], tmp_path, runs=runs)
    footer = (tmp_path / "runs.html").read_text().split("<footer>")[1]
    assert re.findall(r"<td>(cpu|smoke|\?)</td>", footer) == ["cpu", "smoke"]


# ------------------------------------------------------------------ labels and saved results


def test_metric_labels_say_the_batch_gpu_epoch_share_and_end_their_keys_name():
    """A key's batch size, GPU, share of epochs and low or high end read in its words: the
    PruneTrain Table 2 speedups at batch 10 and 100 are two columns, "_v100" rows ran on
    V100s, "_min" is the low end of a range and "_max" the high end."""
    from impl.report.labels import METRIC_LABELS

    for key, label in METRIC_LABELS.items():
        if m := re.search(r"_bs(\d+)$", key):
            assert re.search(rf"\bbatch {m.group(1)}\b", label), key
            word = "speedup" if key.startswith("speedup") else "throughput"
            assert word in label, key
        if key.endswith("_v100"):
            assert "V100" in label, key
        if key.endswith("_min"):
            assert re.search(r"low end|least", label) and not re.search(r"high|most", label), key
        if key.endswith("_max"):
            assert re.search(r"high end|most|largest", label) and "low" not in label, key
    assert "90% of the epochs" in METRIC_LABELS["top1_at_90"]
    # SDGP Fig. 8: each N:M setting's top-1 against that of 2:4, not against dense
    assert METRIC_LABELS["top1_change"] == "top-1 change vs 2:4"
    # a compression ratio is above 1: all weights over the nonzero ones
    assert "total / nonzero" in METRIC_LABELS["compression_ratio"]


def test_every_listed_resnet_and_vgg_keeps_its_depth():
    from impl.report.labels import MODEL_NAMES

    for key, name in MODEL_NAMES.items():
        if m := re.match(r"(resnet|vgg)(\d+)", key):
            family = "ResNet" if m.group(1) == "resnet" else "VGG"
            assert name.startswith(f"{family}-{m.group(2)}"), key
            assert not name[len(family) + 1 + len(m.group(2)) :][:1].isdigit(), key


@pytest.mark.parametrize("scale", ["smoke", "cpu", "gpu", "paper"])
def test_a_result_of_every_scale_is_saved_and_read_back(tmp_path, scale):
    back = load_result(save_result(_result(scale=scale), tmp_path / scale))
    assert back.scale == scale and back.rows[0]["scale"] == scale


def test_a_crash_while_writing_rows_csv_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    from impl.report.results import write_rows_csv

    path = tmp_path / "sdgp.table1.cpu.csv"
    path.write_text("previous\n")
    real = Path.write_text

    def half_then_crash(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", half_then_crash)
    with pytest.raises(OSError, match="disk full"):
        write_rows_csv(_result(scale="cpu"), path)
    monkeypatch.undo()
    assert path.read_text() == "previous\n"
    write_rows_csv(_result(scale="cpu"), path)
    assert path.read_text().startswith("target,row,metric,ours,")


def test_a_half_width_of_no_values_or_of_a_missing_sd_is_nan():
    """No interval from fewer than two values, nor from an sd that was never measured (None,
    as a row without a spread carries it): NaN, not an error."""
    assert math.isnan(ci95_half_width(1.0, 0))
    assert math.isnan(ci95_half_width(None, 3)) and math.isnan(ci95_half_width(None, 1))
    # two values, sd 1: t(0.975, 1) = 12.706205 (t table), over sqrt(2)
    assert ci95_half_width(1.0, 2) == pytest.approx(12.706205 / math.sqrt(2), rel=1e-6)


def test_timing_labels_name_their_phase():
    """The per-iteration timings read as the phase each one times: forward, backward, and the
    optimizer step, in milliseconds."""
    from impl.report.labels import metric_label

    assert metric_label("fwd_ms", "ms") == "forward time per iteration (ms)"
    assert metric_label("bwd_ms", "ms") == "backward time per iteration (ms)"
    assert metric_label("step_ms", "ms") == (
        "optimizer step and per-step method work per iteration (ms)"
    )


def test_campfire_labels_give_the_papers_epochs_and_the_convergence_threshold():
    """Campfire Table 9 moves the last learning-rate drop to epoch 80 instead of 90
    (reproductions/paper_values/campfire_table9.csv); Table 1's "epoch of convergence" is read
    as the first epoch within 0.5 pp of the run's best top-1 (docs/reproductions.md)."""
    from impl.report.labels import metric_label

    assert metric_label("top1_improvement", "pp") == (
        "top-1 gain of the last lr drop at epoch 80 over 90 (pp)"
    )
    # the label names its unit already ("epoch ..."): it is not repeated
    assert metric_label("epoch_of_convergence", "epoch") == (
        "epoch of convergence (within 0.5 pp of the best top-1)"
    )


def test_prunetrains_cifar_resnet50_is_named_apart_from_the_imagenet_one():
    """PruneTrain's CIFAR ResNet-50 has its own layout: its name says so, so that it is not
    read as the ImageNet ResNet-50 (v1 or v1.5) of the other papers."""
    from impl.report.labels import model_name

    assert model_name("prunetrain_resnet50") == "ResNet-50 (PruneTrain's CIFAR layout)"
    assert model_name("resnet50") == "ResNet-50"


def test_trillions_read_as_t_and_their_sd_in_the_same_multiple():
    """A training-FLOPs count of trillions reads "3.2T", not "3200G"; its sd of 3e11 is
    0.3 of a trillion, to two significant digits: "0.30T"."""
    assert format_number(3.2e12) == "3.2T" and format_number(-1.25e12) == "-1.25T"
    assert format_number(999e9) == "999G"
    assert format_mean_sd(2.5e12, 3e11, 3) == "2.5T ± 0.30T (n=3)"


def test_what_our_numbers_count_leaves_the_papers_rows_out():
    """A timing result counts repeats; the paper's rows beside it (no number of ours) count
    nothing, so the error bars still read "over repeats", not "over seeds or repeats"."""
    from impl.report.html import _counted_over

    timed = {"row": "2:4", "metric": "iter_ms", "ours": 3.1, "n": 5, "n_of": "repeats"}
    paper = {"row": "paper: 2:4", "metric": "iter_ms", "ours": None, "paper": 2.0}
    assert _counted_over([timed, paper]) == "repeats"
    assert _counted_over([paper, {**timed, "n_of": None}]) == "seeds"
    assert _counted_over([timed, {**timed, "n_of": None}]) == "seeds or repeats"
