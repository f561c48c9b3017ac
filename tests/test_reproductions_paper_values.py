"""The published numbers: every file parses, every row cites its source, anchors match."""

from __future__ import annotations

import pandas as pd
import pytest

from reproductions.published import (
    COLUMNS,
    lookup,
    paper_values,
    read_value_file,
    value_files,
)

REQUIRED = {
    "clicktrain": [
        "table1", "table2", "fig9", "fig10", "fig11", "fig12", "fig13", "fig14", "fig15",
    ],
    "prunetrain": [
        "table1", "table2", "table3", "table4", "fig2", "fig6", "fig8", "fig9", "fig10", "fig11",
    ],
    "sdgp": ["table1", "fig8", "fig9", "fig10"],
    "campfire": ["table1", "table2", "table3", "table4", "table5", "table6", "table8", "table9"],
}  # fmt: skip


@pytest.fixture(scope="module")
def values() -> pd.DataFrame:
    return paper_values()


def test_every_file_parses_and_cites_a_source():
    files = value_files()
    assert len(files) >= sum(len(v) for v in REQUIRED.values())
    for path in files:
        frame = read_value_file(path)
        assert list(frame.columns) == list(COLUMNS)
        assert len(frame) > 0, path.name
        assert frame["source"].str.strip().str.len().gt(0).all(), path.name
        assert frame["value"].map(lambda v: isinstance(v, float)).all(), path.name


@pytest.mark.parametrize(
    ("paper", "item"),
    [(p, i) for p, items in REQUIRED.items() for i in items],
    ids=[f"{p}.{i}" for p, items in REQUIRED.items() for i in items],
)
def test_required_item_present(values, paper, item):
    rows = values[(values.paper == paper) & (values.item == item)]
    assert len(rows) > 0


def _one(values, **match) -> float:
    rows = values
    for k, v in match.items():
        rows = rows[rows[k] == v]
    assert len(rows) == 1, (match, rows)
    return float(rows["value"].iloc[0])


ANCHORS = [
    ({"paper": "sdgp", "item": "table1", "model": "resnet9", "method": "dense"}, 95.3),
    ({"paper": "sdgp", "item": "table1", "model": "resnet9", "setting": "random 2:4"}, 94.5),
    ({"paper": "sdgp", "item": "table1", "model": "resnet9", "setting": "magnitude 2:4"}, 95.2),
    ({"paper": "sdgp", "item": "table1", "model": "resnet9", "setting": "rescaled 2:4"}, 95.2),
    ({"paper": "sdgp", "item": "table1", "model": "resnet50", "setting": "random 2:4"}, 70.3),
    ({"paper": "sdgp", "item": "fig9", "metric": "data_grad_time_share"}, 33.17),
    (
        {"paper": "clicktrain", "item": "table1", "model": "resnet50", "dataset": "cifar10",
         "setting": "higher compression", "metric": "compression_ratio"},
        10.8,
    ),
    (
        {"paper": "clicktrain", "item": "table1", "model": "vgg13", "dataset": "cifar100",
         "method": "prunetrain", "metric": "compression_ratio"},
        2.4,
    ),
    ({"paper": "clicktrain", "item": "fig9", "metric": "conversion_time"}, 800.0),
    ({"paper": "clicktrain", "item": "fig10", "metric": "speedup_vs_cusparse"}, 3.2),
    (
        {"paper": "prunetrain", "item": "table1", "model": "resnet32", "dataset": "cifar10",
         "metric": "inference_flops"},
        34.0,
    ),
    ({"paper": "prunetrain", "item": "table3", "method": "AMC", "metric": "inference_flops"}, 50.0),
    ({"paper": "campfire", "item": "table2", "method": "dense"}, 76.29),
    (
        {"paper": "campfire", "item": "table2", "setting": "ck, start 30, sparsity 70%",
         "metric": "top1"},
        74.72,
    ),
    ({"paper": "campfire", "item": "table5", "method": "dense"}, 76.53),
    ({"paper": "campfire", "item": "table4", "method": "dense"}, 74.94),  # App. B.2
    (
        {"paper": "campfire", "item": "table6", "method": "dense", "setting": "eps 0.1"},
        30.47,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("match", "expected"), ANCHORS, ids=[str(i) for i in range(len(ANCHORS))])
def test_anchor_values(values, match, expected):
    assert _one(values, **match) == pytest.approx(expected)


@pytest.mark.parametrize("item", ["table2", "table3", "table5"], ids=["table2", "table3", "table5"])
def test_campfire_deltas_match_accuracies(values, item):
    """Each printed delta equals accuracy minus the dense baseline (to rounding): a check on the
    transcription of both numbers."""
    rows = values[(values.paper == "campfire") & (values.item == item)]
    dense = float(rows[rows.method == "dense"]["value"].iloc[0])
    top1 = rows[rows.metric == "top1"].set_index("setting")["value"]
    delta = rows[rows.metric == "delta_top1"].set_index("setting")["value"]
    top1 = top1.drop(index="", errors="ignore")
    assert set(top1.index) == set(delta.index)
    for setting in top1.index:
        assert top1[setting] - dense == pytest.approx(delta[setting], abs=0.021), setting


def test_prunetrain_table2_speedups_match_throughputs(values):
    rows = values[(values.paper == "prunetrain") & (values.item == "table2")]
    checked = 0
    for _key, group in rows.groupby(["model", "dataset", "setting"]):
        for bs in (10, 100):
            metric = f"images_per_second_bs{bs}"
            base = group[(group.method == "dense") & (group.metric == metric)]["value"]
            pt = group[(group.method == "prunetrain") & (group.metric == metric)]["value"]
            speedup = group[group.metric == f"speedup_bs{bs}"]["value"]
            if len(base) and len(pt):
                assert pt.iloc[0] / base.iloc[0] == pytest.approx(speedup.iloc[0], abs=0.011)
                checked += 1
    assert checked == 11


def test_unknown_paper_or_item_is_an_error():
    with pytest.raises(ValueError, match="valid papers"):
        paper_values("nopaper")
    with pytest.raises(ValueError, match="valid items"):
        paper_values("sdgp", "table7")


def test_malformed_file_is_rejected(tmp_path):
    bad = tmp_path / "sdgp_table1.csv"
    bad.write_text(",".join(COLUMNS) + "\nsdgp,table1,m,d,x,,top1,95.3,%,,\n")
    with pytest.raises(ValueError, match=r"sdgp_table1.csv:2: row without a source"):
        read_value_file(bad)  # the first row after the header is line 2 of the file
    bad.write_text(",".join(COLUMNS) + "\nsdgp,table1,m,d,x,,top1,95.3,%,   ,\n")
    with pytest.raises(ValueError, match="row without a source"):  # blanks are no source
        read_value_file(bad)
    bad.write_text(",".join(COLUMNS) + "\nsdgp,table1,m,d,x,,top1,n/a,%,Table I,\n")
    with pytest.raises(ValueError, match="not a number"):
        read_value_file(bad)
    wrong = tmp_path / "sdgp_fig9.csv"
    wrong.write_text(",".join(COLUMNS) + "\nsdgp,table1,m,d,x,,top1,1,%,Table I,\n")
    with pytest.raises(ValueError, match="file name"):
        read_value_file(wrong)


def test_one_papers_values_and_one_items_are_selected_exactly():
    sdgp = paper_values("sdgp")
    assert len(sdgp) and set(sdgp["paper"]) == {"sdgp"}
    table1 = paper_values("sdgp", "table1")
    assert len(table1) and set(table1["item"]) == {"table1"} and set(table1["paper"]) == {"sdgp"}
    assert len(table1) < len(sdgp)
    rows = lookup(table1, method="dense", dataset="cifar10")
    assert len(rows) == 1 and rows["value"].iloc[0] == 95.3  # Table I: the dense baseline
    with pytest.raises(ValueError, match="unknown column"):
        lookup(table1, colour="red")


def test_lookup_compares_every_column_as_text():
    """A selector is matched as text, so a number given as written in the CSV finds its row:
    SDGP Table I's dense ResNet-9 on CIFAR-10 at 95.3%."""
    table1 = paper_values("sdgp", "table1")
    rows = lookup(table1, value="95.3", method="dense")
    assert len(rows) == 1 and rows["dataset"].iloc[0] == "cifar10"
    assert len(lookup(table1, value=95.3, method="dense")) == 1


def test_values_of_several_files_are_numbered_as_one_table():
    """The rows read from several CSVs are labelled 0, 1, ... through the whole frame, so a
    row's label names one published number (not one per file)."""
    sdgp = paper_values("sdgp")
    assert len(paper_values("sdgp", "table1")) < len(sdgp)  # several files
    assert list(sdgp.index) == list(range(len(sdgp)))
    first = sdgp.loc[0]
    assert first["paper"] == "sdgp" and first["item"] == sdgp["item"].iloc[0]


def test_a_value_file_with_an_extra_column_is_refused(tmp_path):
    path = tmp_path / "sdgp_table1.csv"
    row = "sdgp,table1,resnet9,cifar10,dense,,top1,95.3,%,Table I p. 5,"
    path.write_text(",".join(COLUMNS) + ",extra\n" + row + ",x\n")
    with pytest.raises(ValueError, match=r"sdgp_table1.csv: header"):
        read_value_file(path)
    path.write_text(",".join(COLUMNS) + "\n" + row + "\n")  # the same row, the right header
    assert read_value_file(path)["value"].tolist() == [95.3]


def test_no_value_files_give_an_empty_frame_that_lookups_still_read(tmp_path):
    frame = paper_values(directory=tmp_path)
    assert list(frame.columns) == list(COLUMNS) and len(frame) == 0
    assert len(lookup(frame, metric="top1")) == 0


def test_every_published_metric_has_words_on_the_page(values):
    """A paper row no reproduction row compares is shown by its metric's label alone: an
    internal key such as ``top1_loss_vs_dense_max`` would be all a reader sees of it."""
    from impl.report.labels import METRIC_LABELS

    assert sorted(set(values["metric"]) - set(METRIC_LABELS)) == []
