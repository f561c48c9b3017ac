"""The analytic Allreduce model: ring and hierarchical ring, per iteration and per epoch."""

from __future__ import annotations

import csv
import json
import math

import pytest

from impl import comm_model as cm

FAST = cm.Link(bandwidth=100e9, latency=2e-6, source="test")
SLOW = cm.Link(bandwidth=10e9, latency=8e-6, source="test")


@pytest.mark.parametrize(
    "p,s",
    [(2, 1000), (3, 7), (4, 1_000_003), (16, 4096), (256, 25_557_032 * 4)],
    ids=["p2", "p3-prime-bytes", "p4-odd", "p16", "p256-resnet50"],
)
def test_ring_bytes_per_rank(p, s):
    cost = cm.ring_allreduce(s, p, FAST)
    assert cost.bytes_sent == pytest.approx(2 * (p - 1) / p * s)
    assert cost.bytes_sent == pytest.approx(cm.ring_bytes_per_rank(s, p))
    assert cost.steps == 2 * (p - 1)
    assert cost.seconds == pytest.approx(2 * (p - 1) * (FAST.latency + s / p / FAST.bandwidth))


def test_ring_on_one_rank_costs_nothing():
    cost = cm.ring_allreduce(12345, 1, FAST)
    assert cost.bytes_sent == 0 and cost.seconds == 0 and cost.steps == 0


@pytest.mark.parametrize(
    "p,g,s",
    [(8, 8, 1000), (16, 8, 999_983), (24, 8, 4096), (256, 8, 1e8), (12, 4, 31), (6, 1, 500)],
    ids=["one-node", "two-nodes-prime", "three-nodes", "32-nodes", "g4", "g1"],
)
def test_hierarchical_ring_matches_its_formula(p, g, s):
    n = p // g
    cost = cm.hierarchical_ring_allreduce(s, p, g, FAST, SLOW)
    intra = 2 * (g - 1) / g * s
    inter = 2 * (n - 1) / n * s / g
    t = 2 * (g - 1) * (FAST.latency + s / g / FAST.bandwidth) if g > 1 else 0.0
    t += 2 * (n - 1) * (SLOW.latency + s / (g * n) / SLOW.bandwidth) if n > 1 else 0.0
    assert cost.bytes_intra == pytest.approx(intra)
    assert cost.bytes_inter == pytest.approx(inter)
    assert cost.bytes_sent == pytest.approx(intra + inter)
    assert cost.seconds == pytest.approx(t)
    assert cost.steps == 2 * (g - 1) + 2 * (n - 1)


def test_hierarchical_on_one_node_is_the_intra_node_ring():
    h = cm.hierarchical_ring_allreduce(10**6, 4, 8, FAST, SLOW)
    r = cm.ring_allreduce(10**6, 4, FAST)
    assert h.bytes_sent == pytest.approx(r.bytes_sent)
    assert h.seconds == pytest.approx(r.seconds)
    assert h.bytes_inter == 0


def test_hierarchical_needs_whole_nodes():
    with pytest.raises(ValueError, match="multiple of gpus_per_node"):
        cm.hierarchical_ring_allreduce(100, 12, 8)


def test_hierarchical_sends_fewer_network_bytes_than_the_flat_ring():
    s = 100e6
    for p in (16, 64, 256):
        h = cm.hierarchical_ring_allreduce(s, p)
        f = cm.flat_ring_allreduce(s, p)
        assert h.bytes_inter < f.bytes_inter
        assert h.seconds < f.seconds


def test_flat_ring_splits_its_bytes_by_node_boundaries():
    # 16 ranks on 2 nodes of 8: each rank sends 2 * 15 / 16 * S; on average 2 of 16 ranks
    # send across the network (one per node boundary), the rest stays inside a node.
    s = 1024.0
    f = cm.flat_ring_allreduce(s, 16, 8)
    assert f.bytes_sent == pytest.approx(2 * 15 / 16 * s)
    assert f.bytes_inter == pytest.approx(f.bytes_sent * 2 / 16)
    assert f.bytes_intra == pytest.approx(f.bytes_sent * 14 / 16)
    one_node = cm.flat_ring_allreduce(s, 8, 8)  # no network at all
    assert one_node.bytes_inter == 0.0 and one_node.bytes_intra == one_node.bytes_sent
    # a partial last node: 12 ranks on nodes of 8 make 2 nodes
    assert cm.flat_ring_allreduce(s, 12, 8).bytes_inter == pytest.approx(2 * 11 / 12 * s * 2 / 12)
    # the time is a ring on the slowest link it crosses
    assert one_node.seconds == pytest.approx(cm.ring_allreduce(s, 8, cm.NVLINK_H100).seconds)
    assert f.seconds == pytest.approx(cm.ring_allreduce(s, 16, cm.INFINIBAND_NDR).seconds)
    assert cm.ring_allreduce(s, 1).seconds == 0.0  # nothing to exchange


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS, ids=list(cm.ALGORITHMS))
def test_monotone_in_payload_and_ranks(algorithm):
    payloads = [1, 1000, 10**6, 10**8]
    for p in cm.DEFAULT_GPU_COUNTS:
        costs = [cm.allreduce_cost(s, p, algorithm) for s in payloads]
        assert all(a.seconds < b.seconds for a, b in zip(costs, costs[1:]))
        assert all(a.bytes_sent < b.bytes_sent for a, b in zip(costs, costs[1:]))
    by_p = [cm.allreduce_cost(10**8, p, algorithm) for p in cm.DEFAULT_GPU_COUNTS]
    assert all(a.seconds <= b.seconds for a, b in zip(by_p, by_p[1:]))
    assert all(a.bytes_sent <= b.bytes_sent for a, b in zip(by_p, by_p[1:]))
    # a faster network never makes it slower
    fast = cm.allreduce_cost(10**8, 64, algorithm, inter=cm.Link(100e9, 1e-6))
    slow = cm.allreduce_cost(10**8, 64, algorithm, inter=cm.Link(10e9, 1e-6))
    assert fast.seconds < slow.seconds


def test_allreduce_cost_rejects_unknown_algorithm_and_bad_input():
    with pytest.raises(ValueError, match="valid: ring, hierarchical"):
        cm.allreduce_cost(10, 4, "tree")
    with pytest.raises(ValueError, match="payload"):
        cm.ring_allreduce(-1, 4)
    with pytest.raises(ValueError, match="ranks"):
        cm.ring_allreduce(10, 0)
    with pytest.raises(ValueError, match="bandwidth"):
        cm.Link(0, 1e-6)
    with pytest.raises(ValueError, match="latency"):
        cm.Link(1e9, -1)


def test_default_links_say_where_their_numbers_come_from():
    for link in (cm.NVLINK_H100, cm.INFINIBAND_NDR):
        assert "assumption" in link.source and "GB/s" in link.source
    assert cm.NVLINK_H100.bandwidth > cm.INFINIBAND_NDR.bandwidth


@pytest.mark.parametrize(
    "n,b,expect,expect_drop",
    [(1_281_167, 256, 5005, 5004), (1437, 32, 45, 44), (1437, 1437, 1, 1), (7, 2, 4, 3)],
    ids=["imagenet", "digits", "one-batch", "odd"],
)
def test_iterations_per_epoch(n, b, expect, expect_drop):
    assert cm.iterations_per_epoch(n, b) == expect
    assert cm.iterations_per_epoch(n, b, drop_last=True) == expect_drop
    with pytest.raises(ValueError, match="global_batch"):
        cm.iterations_per_epoch(n, 0)


def test_project_run_reproduces_the_shape_of_prunetrain_fig11():
    """Smaller payloads after each reconfiguration and a larger batch both cut the bytes per
    epoch (PruneTrain Fig. 11): per-iteration bytes follow the payload, per-epoch bytes also
    fall with the iterations."""
    rows = [
        {"epoch": 0, "batch_size": 128, "comm_bytes_per_iter": 100e6},
        {"epoch": 1, "batch_size": 128, "comm_bytes_per_iter": 80e6},  # reconfigured
        {"epoch": 2, "batch_size": 192, "comm_bytes_per_iter": 60e6},  # and a bigger batch
    ]
    proj = cm.project_run(rows, (16, 128), train_size=1_281_167, batch_scale=2.0)
    assert len(proj) == 6
    norm = cm.normalize(proj)
    for p in (16, 128):
        series = sorted((r for r in norm if r["gpus"] == p), key=lambda r: r["epoch"])
        per_iter = [r["bytes_per_iter_norm"] for r in series]
        per_epoch = [r["bytes_per_epoch_norm"] for r in series]
        assert per_iter == pytest.approx([1.0, 0.8, 0.6])
        iters = [math.ceil(1_281_167 / b) for b in (256, 256, 384)]
        assert [r["iterations"] for r in series] == iters
        assert per_epoch == pytest.approx([1.0, 0.8, 0.6 * iters[2] / iters[0]])
        assert per_epoch[2] < per_iter[2]  # the dynamic batch cut the epoch's share further
    first = [r for r in proj if r["epoch"] == 0 and r["gpus"] == 128][0]
    cost = cm.hierarchical_ring_allreduce(100e6, 128)
    assert first["bytes_per_iter"] == pytest.approx(cost.bytes_sent)
    assert first["seconds_per_iter"] == pytest.approx(cost.seconds)
    for r in proj:  # an epoch is its iterations' worth of Allreduces, in bytes and in time
        assert r["bytes_per_epoch"] == pytest.approx(r["bytes_per_iter"] * r["iterations"])
        assert r["seconds_per_epoch"] == pytest.approx(r["seconds_per_iter"] * r["iterations"])


def test_the_smallest_valid_inputs_are_accepted():
    """One sample, a batch of one, an empty payload, a zero-latency link, a sub-byte/s one,
    and a batch scale small enough to round a batch to nothing (it stays one sample)."""
    assert cm.iterations_per_epoch(1, 1) == 1 == cm.iterations_per_epoch(1, 1, drop_last=True)
    with pytest.raises(ValueError, match="train_size"):
        cm.iterations_per_epoch(0, 1)
    slow = cm.Link(bandwidth=0.5, latency=0.0)
    assert (slow.bandwidth, slow.latency) == (0.5, 0.0)
    empty = cm.allreduce_cost(0, 8, "ring")
    assert empty.bytes_sent == 0
    rows = [{"epoch": 0, "batch_size": 8, "comm_bytes_per_iter": 1000}]
    (row,) = cm.project_run(rows, (8,), train_size=10, batch_scale=0.01)
    assert (row["batch_size"], row["iterations"]) == (1, 10)


def test_project_run_rejects_rows_without_payload():
    with pytest.raises(ValueError, match="lacks"):
        cm.project_run([{"epoch": 0, "batch_size": 8}], train_size=100)
    rows = [{"epoch": 0, "batch_size": 8, "comm_bytes_per_iter": 1000}]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="batch_scale must be > 0"):
            cm.project_run(rows, (8,), train_size=100, batch_scale=bad)


def test_normalize_divides_by_the_first_epoch_whatever_the_rows_order():
    """The reference of each GPU count is its earliest epoch, even where the rows come in
    another order; a zero reference gives NaN, not a ratio of 0."""
    rows = [
        {"epoch": 2, "gpus": 8, "bytes_per_iter": 50.0},
        {"epoch": 0, "gpus": 8, "bytes_per_iter": 100.0},
        {"epoch": 1, "gpus": 8, "bytes_per_iter": 80.0},
        {"epoch": 0, "gpus": 16, "bytes_per_iter": 0.0},
        {"epoch": 1, "gpus": 16, "bytes_per_iter": 10.0},
    ]
    norm = cm.normalize(rows, keys=("bytes_per_iter",))
    assert [r["bytes_per_iter_norm"] for r in norm[:3]] == [0.5, 1.0, 0.8]
    assert all(math.isnan(r["bytes_per_iter_norm"]) for r in norm[3:])


def test_the_default_cost_model_is_the_hierarchical_ring():
    """The default of :func:`allreduce_cost` and of :func:`project_run`."""
    flat = cm.allreduce_cost(10**8, 64, "ring")
    hier = cm.allreduce_cost(10**8, 64, "hierarchical")
    assert flat.bytes_inter != hier.bytes_inter  # the two differ on several nodes
    assert cm.allreduce_cost(10**8, 64) == hier
    rows = [{"epoch": 0, "batch_size": 8, "comm_bytes_per_iter": 10**8}]
    (row,) = cm.project_run(rows, (64,), train_size=100)
    assert row["algorithm"] == "hierarchical" and row["bytes_inter_per_iter"] == hier.bytes_inter


def fake_run(tmp_path, train_size=1437):
    rows = [
        {"epoch": 0, "batch_size": 32, "comm_bytes_per_iter": 1_000_000},
        {"epoch": 1, "batch_size": 32, "comm_bytes_per_iter": 700_000},
        {"epoch": 2, "batch_size": 64, "comm_bytes_per_iter": 500_000},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": "complete", "data_spec": {"train_size": train_size}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    return tmp_path


def test_project_run_dir_reads_the_runs_own_train_size(tmp_path):
    run = fake_run(tmp_path)
    proj = cm.project_run_dir(run, (8,))
    assert [r["iterations"] for r in proj] == [45, 45, 23]
    assert cm.project_run_dir(run, (8,), train_size=100)[2]["iterations"] == 2
    (run / "summary.json").unlink()
    with pytest.raises(
        ValueError, match=r"an unfinished run\?\); give the samples per epoch \(--train-size\)"
    ):
        cm.project_run_dir(run, (8,))


def test_main_writes_csv_and_fig11_plot(tmp_path):
    (tmp_path / "run").mkdir()
    run = fake_run(tmp_path / "run")
    csv_path, png = tmp_path / "p.csv", tmp_path / "p.png"
    argv = [str(run), "--gpus", "16", "128", "--csv", str(csv_path), "--png", str(png)]
    assert cm.main(argv) == 0
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6
    last = [r for r in table if r["gpus"] == "128" and r["epoch"] == "2"][0]
    assert float(last["bytes_per_iter_norm"]) == pytest.approx(0.5)
    assert float(last["bytes_per_epoch_norm"]) == pytest.approx(0.5 * 23 / 45)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no projection rows for 4 GPUs"):
        cm.plot_fig11(cm.project_run_dir(run, (8,)), 4, tmp_path / "x.png", "t")


def test_main_plots_the_largest_gpu_count_by_default(tmp_path, capsys, monkeypatch):
    (tmp_path / "run").mkdir()
    run = fake_run(tmp_path / "run")
    plotted = []
    monkeypatch.setattr(cm, "plot_fig11", lambda proj, gpus, path, title: plotted.append(gpus))
    assert cm.main([str(run), "--gpus", "4", "8", "--png", str(tmp_path / "p.png")]) == 0
    assert cm.main([str(run), "--gpus", "8", "4", "--png", str(tmp_path / "p.png")]) == 0
    assert cm.main([str(run), "--gpus", "4", "8", "--plot-gpus", "4", "--png", "x.png"]) == 0
    assert plotted == [8, 8, 4]
    assert capsys.readouterr().err == ""


def _metrics_line(**row) -> str:
    return json.dumps(row) + "\n"


@pytest.mark.parametrize(
    "make,argv_tail,message",
    [
        (None, [], "does not exist"),
        ("file", [], "is not a directory"),
        ("empty-dir", [], "has no metrics.jsonl"),
        ("empty-metrics", [], "is empty"),
        ("run", ["--gpus", "0"], "argument --gpus: expected an int >= 1, got 0"),
        ("run", ["--gpus", "4", "-3"], "argument --gpus: expected an int >= 1, got -3"),
        ("run", ["--gpus", "four"], "argument --gpus: expected an int >= 1, got 'four'"),
        ("run", ["--gpus", "4", "8", "--plot-gpus", "128"], "--plot-gpus 128 is not among"),
        ("run", ["--gpus", "12"], "ranks=12 is not a multiple of gpus_per_node=8"),
        ("run", ["--gpus-per-node", "0"], "argument --gpus-per-node: expected an int >= 1"),
        ("run", ["--train-size", "0"], "argument --train-size: expected an int >= 1"),
        ("run", ["--batch-scale", "0"], "argument --batch-scale: expected a finite number > 0"),
        ("run", ["--batch-scale", "nan"], "argument --batch-scale: expected a finite number"),
        ("no-payload", ["--gpus", "8"], "lacks ['comm_bytes_per_iter']"),
        ("not-json", ["--gpus", "8"], "metrics.jsonl line 1 is not JSON"),
        ("not-object", ["--gpus", "8"], "metrics.jsonl line 1 is not a JSON object"),
        ("run", ["--gpus", "8", "--csv", "/nonexistent-dir/p.csv"], "cannot write --csv"),
    ],
    ids=[
        "missing-dir",
        "a-file",
        "no-metrics",
        "empty-metrics",
        "gpus-0",
        "gpus-negative",
        "gpus-not-int",
        "plot-gpus-not-projected",
        "not-whole-nodes-12",
        "gpus-per-node-0",
        "train-size-0",
        "batch-scale-0",
        "batch-scale-nan",
        "row-without-payload",
        "line-not-json",
        "line-not-object",
        "csv-unwritable",
    ],
)
def test_main_bad_input_is_one_error_line_and_status_2(tmp_path, capsys, make, argv_tail, message):
    run = tmp_path / "run"
    if make == "file":
        run.write_text("x")
    elif make in ("empty-dir", "empty-metrics", "no-payload", "not-json", "not-object"):
        run.mkdir()
        text = {
            "empty-dir": None,
            "empty-metrics": "\n",
            "no-payload": _metrics_line(epoch=0, batch_size=32),
            "not-json": "{epoch: 0\n",
            "not-object": "[1, 2]\n",
        }[make]
        if text is not None:
            (run / "metrics.jsonl").write_text(text)
        (run / "summary.json").write_text(json.dumps({"data_spec": {"train_size": 100}}))
    elif make == "run":
        run.mkdir()
        fake_run(run)
    with pytest.raises(SystemExit) as exit_info:
        cm.main([str(run), *argv_tail])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("python -m impl.comm_model: error: ")
    assert message in lines[0]


def test_the_module_fails_in_one_line_from_the_shell(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "impl.comm_model", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"python -m impl.comm_model: error: run directory {str(tmp_path / 'absent')!r} "
        "does not exist"
    ]


def test_project_run_projects_the_algorithm_it_is_given():
    """algorithm="ring" projects the flat ring: 16 GPUs on nodes of 8, a payload of 1024
    bytes: each rank sends 2 * 15/16 * 1024 = 1920 bytes (as the hierarchical ring does), of
    which 2 of 16 ranks' share, 240, crosses the network (the hierarchical ring: 2 * 1/2 *
    1024 / 8 = 128)."""
    rows = [{"epoch": 0, "batch_size": 8, "comm_bytes_per_iter": 1024}]
    (ring,) = cm.project_run(rows, (16,), train_size=80, algorithm="ring", gpus_per_node=8)
    assert ring["algorithm"] == "ring"
    assert ring["bytes_per_iter"] == pytest.approx(1920)
    assert ring["bytes_inter_per_iter"] == pytest.approx(240)
    assert ring["bytes_per_epoch"] == pytest.approx(1920 * 10)
    (hier,) = cm.project_run(rows, (16,), train_size=80, gpus_per_node=8)
    assert hier["bytes_inter_per_iter"] == pytest.approx(128)


def test_a_bool_is_not_a_rank_count():
    """True is an int to Python, but not a number of GPUs."""
    with pytest.raises(ValueError, match="ranks must be an int >= 1, got True"):
        cm.ring_allreduce(10, True)
    with pytest.raises(ValueError, match="gpus_per_node must be an int >= 1, got True"):
        cm.hierarchical_ring_allreduce(10, 8, True)
