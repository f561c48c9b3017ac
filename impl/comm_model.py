"""Analytic cost of gradient Allreduce: ring and hierarchical ring, bytes and time.

Scales that cannot run here (16 to 256 GPUs) are projected from the per-iteration payloads a
real run measured in its communication hook (``comm_bytes_per_iter`` in metrics.jsonl, see
:mod:`impl.comm`), the way PruneTrain projects its Fig. 11 ("We model the recently-proposed
hierarchical ring-allreduce mechanism [26] for 128 GPUs", Lym et al., Sec. 5.3, Fig. 11).

The model is the usual latency-bandwidth (alpha-beta) model of a ring collective:

- **Ring Allreduce** of ``S`` bytes over ``p`` ranks is a reduce-scatter then an all-gather,
  each ``p - 1`` steps in which every rank sends one ``S / p`` chunk to its neighbour and
  receives one. Bytes each rank sends: ``2 (p - 1) / p * S``. Time: ``2 (p - 1)
  (alpha + S / (p * B))`` with ``B`` the bandwidth of the slowest link of the ring and
  ``alpha`` its per-step latency. A flat ring over several nodes crosses the network at
  every node boundary, so its steps run at the network's speed.
- **Hierarchical ring Allreduce** on ``n`` nodes of ``g`` GPUs (``p = n g``): a ring
  reduce-scatter inside each node (``g - 1`` steps of ``S / g``), then ``g`` concurrent ring
  Allreduces across the nodes, one per shard of ``S / g`` bytes (``2 (n - 1)`` steps of
  ``S / (g n)``, each over its own NIC), then a ring all-gather inside each node. Bytes per
  rank: ``2 (g - 1) / g * S`` inside the node plus ``2 (n - 1) / n * S / g`` over the
  network. This is the reduce-scatter / inter-node allreduce / all-gather form of
  hierarchical Allreduce that Horovod and NCCL use; PruneTrain cites Li et al. (MICRO 2018,
  its reference [26]) for hierarchical ring Allreduce, whose exact grouping we do not have,
  so this form is our reading, not a copy of [26].

Units: bytes, seconds, bytes per second. The link parameters are plain arguments with
defaults (:data:`NVLINK_H100`, :data:`INFINIBAND_NDR`) whose source or status as an
assumption is stated on each.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

ALGORITHMS: tuple[str, ...] = ("ring", "hierarchical")
#: GPU counts of the projections (4 to 256, as the issue and PruneTrain's 16-256 study).
DEFAULT_GPU_COUNTS: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Link:
    """One kind of link as the alpha-beta model sees it.

    Args:
        bandwidth: bytes per second one GPU can send in one direction over this link kind
            while it receives at the same rate (a ring uses both directions at once).
        latency: seconds of fixed cost per ring step (alpha): launch, synchronisation and
            wire latency together.
        source: where the numbers come from, or "assumption: ...".
    """

    bandwidth: float
    latency: float
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(
                f"bandwidth must be a positive number of bytes/s, got {self.bandwidth}"
            )
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise ValueError(f"latency must be >= 0 seconds, got {self.latency}")


#: Intra-node link: NVLink 4 of an H100 SXM5 (NVIDIA's H100 datasheet: 900 GB/s total
#: NVLink bandwidth per GPU, i.e. 450 GB/s each way). The per-step latency of 5 us is an
#: ASSUMPTION (the order of magnitude of NCCL's small-message step cost), not measured here.
NVLINK_H100 = Link(
    bandwidth=450e9,
    latency=5e-6,
    source="NVIDIA H100 SXM5 datasheet: NVLink 900 GB/s bidirectional per GPU -> 450 GB/s "
    "per direction; latency 5 us per step is an assumption",
)

#: Inter-node link: one InfiniBand NDR port per GPU (400 Gb/s = 50 GB/s each way; one NIC
#: per GPU as in a DGX H100). The per-step latency of 10 us is an ASSUMPTION.
INFINIBAND_NDR = Link(
    bandwidth=50e9,
    latency=10e-6,
    source="InfiniBand NDR 400 Gb/s per port = 50 GB/s per direction, one port per GPU "
    "(DGX H100 layout); latency 10 us per step is an assumption",
)

#: GPUs per node of the default projection (an 8-GPU HGX/DGX node): an assumption.
DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class AllreduceCost:
    """Cost of one Allreduce of ``payload`` bytes, per rank.

    Args:
        algorithm: "ring" or "hierarchical".
        ranks: number of GPUs ``p``.
        payload: bytes each rank contributes (the buffer handed to all_reduce).
        bytes_sent: bytes each rank sends in total (intra + inter).
        bytes_intra: of which over intra-node links.
        bytes_inter: of which over the network (per rank; averaged over the ranks of a node
            for the flat ring, where only node-boundary ranks use the network).
        steps: number of sequential ring steps.
        seconds: modelled time.
    """

    algorithm: str
    ranks: int
    payload: float
    bytes_sent: float
    bytes_intra: float
    bytes_inter: float
    steps: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form."""
        return asdict(self)


def _check_payload(nbytes: float) -> float:
    if not (nbytes >= 0 and math.isfinite(nbytes)):
        raise ValueError(f"payload must be a finite number of bytes >= 0, got {nbytes}")
    return float(nbytes)


def _check_ranks(p: int, name: str = "ranks") -> int:
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"{name} must be an int >= 1, got {p!r}")
    return p


def ring_bytes_per_rank(nbytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring Allreduce of ``nbytes``: ``2 (p - 1) / p * S``."""
    p = _check_ranks(ranks)
    return 2.0 * (p - 1) / p * _check_payload(nbytes)


def ring_allreduce(nbytes: float, ranks: int, link: Link = INFINIBAND_NDR) -> AllreduceCost:
    """Ring Allreduce of ``nbytes`` over ``ranks`` GPUs joined by ``link`` (its slowest link).

    Time ``2 (p - 1) (alpha + S / (p B))``; bytes per rank ``2 (p - 1) / p * S``. Every byte
    is counted as ``inter`` (the ring is as fast as ``link``, whatever it is).
    """
    s = _check_payload(nbytes)
    p = _check_ranks(ranks)
    steps = 2 * (p - 1)
    sent = ring_bytes_per_rank(s, p)
    seconds = steps * (link.latency + s / p / link.bandwidth) if p > 1 else 0.0
    return AllreduceCost("ring", p, s, sent, 0.0, sent, steps, seconds)


def flat_ring_allreduce(
    nbytes: float,
    ranks: int,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    intra: Link = NVLINK_H100,
    inter: Link = INFINIBAND_NDR,
) -> AllreduceCost:
    """One ring over all GPUs, laid out node by node (the non-hierarchical baseline).

    Inside one node the ring runs on ``intra``; over several nodes every step waits for the
    network hop, so the time is that of a ring on ``inter``. Of each rank's
    ``2 (p - 1) / p * S`` bytes, a fraction ``n / p`` (one sender per node boundary) crosses
    the network on average.
    """
    s = _check_payload(nbytes)
    p = _check_ranks(ranks)
    g = min(_check_ranks(gpus_per_node, "gpus_per_node"), p)
    nodes = math.ceil(p / g)
    link = intra if nodes == 1 else inter
    base = ring_allreduce(s, p, link)
    inter_share = 0.0 if nodes == 1 else nodes / p
    return AllreduceCost(
        "ring",
        p,
        s,
        base.bytes_sent,
        base.bytes_sent * (1.0 - inter_share),
        base.bytes_sent * inter_share,
        base.steps,
        base.seconds,
    )


def hierarchical_ring_allreduce(
    nbytes: float,
    ranks: int,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    intra: Link = NVLINK_H100,
    inter: Link = INFINIBAND_NDR,
) -> AllreduceCost:
    """Hierarchical ring Allreduce (module docstring): intra-node reduce-scatter, ``g``
    concurrent inter-node ring Allreduces of ``S / g`` bytes, intra-node all-gather.

    Bytes per rank: ``2 (g - 1) / g * S`` intra plus ``2 (n - 1) / n * S / g`` inter.
    Time: ``2 (g - 1) (alpha_i + S / (g B_i)) + 2 (n - 1) (alpha_e + S / (g n B_e))``.
    ``ranks`` must be a multiple of ``gpus_per_node`` (or smaller than it: one node).
    """
    s = _check_payload(nbytes)
    p = _check_ranks(ranks)
    g = _check_ranks(gpus_per_node, "gpus_per_node")
    if p <= g:
        g, n = p, 1
    elif p % g:
        raise ValueError(
            f"hierarchical Allreduce needs whole nodes: ranks={p} is not a multiple of "
            f"gpus_per_node={g}"
        )
    else:
        n = p // g
    intra_bytes = 2.0 * (g - 1) / g * s
    inter_bytes = 2.0 * (n - 1) / n * s / g
    t_intra = 2 * (g - 1) * (intra.latency + s / g / intra.bandwidth) if g > 1 else 0.0
    t_inter = 2 * (n - 1) * (inter.latency + s / (g * n) / inter.bandwidth) if n > 1 else 0.0
    steps = 2 * (g - 1) + 2 * (n - 1)
    return AllreduceCost(
        "hierarchical",
        p,
        s,
        intra_bytes + inter_bytes,
        intra_bytes,
        inter_bytes,
        steps,
        t_intra + t_inter,
    )


def allreduce_cost(
    nbytes: float,
    ranks: int,
    algorithm: str = "hierarchical",
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    intra: Link = NVLINK_H100,
    inter: Link = INFINIBAND_NDR,
) -> AllreduceCost:
    """Cost of one Allreduce by ``algorithm`` ("ring": flat ring; "hierarchical")."""
    if algorithm == "ring":
        return flat_ring_allreduce(nbytes, ranks, gpus_per_node, intra, inter)
    if algorithm == "hierarchical":
        return hierarchical_ring_allreduce(nbytes, ranks, gpus_per_node, intra, inter)
    raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")


def iterations_per_epoch(train_size: int, global_batch: int, drop_last: bool = False) -> int:
    """Optimizer steps per epoch: ``ceil(N / B)`` (``floor`` with ``drop_last``).

    ``global_batch`` is the samples of one step over all ranks; a larger batch (PruneTrain's
    dynamic mini-batch, Sec. 4.3) means fewer steps and so fewer Allreduces per epoch.
    """
    if not isinstance(train_size, int) or train_size < 1:
        raise ValueError(f"train_size must be an int >= 1, got {train_size!r}")
    if not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be an int >= 1, got {global_batch!r}")
    return train_size // global_batch if drop_last else math.ceil(train_size / global_batch)


def project_run(
    rows: Iterable[dict[str, Any]],
    gpu_counts: Sequence[int] = DEFAULT_GPU_COUNTS,
    *,
    train_size: int,
    algorithm: str = "hierarchical",
    batch_scale: float = 1.0,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    intra: Link = NVLINK_H100,
    inter: Link = INFINIBAND_NDR,
    payload_key: str = "comm_bytes_per_iter",
) -> list[dict[str, Any]]:
    """Per epoch and GPU count: the modelled bytes and time per iteration and per epoch.

    Args:
        rows: a run's metrics.jsonl lines; each needs ``epoch``, ``batch_size`` (the global
            batch of that epoch) and ``payload_key`` (bytes each rank handed to all_reduce
            per iteration, measured in the hook).
        gpu_counts: the GPU counts to project to.
        train_size: samples per epoch of the projected dataset (e.g. 1,281,167 for
            ImageNet-1k; the run's own ``data_spec.train_size`` to model the run itself).
        algorithm: "hierarchical" (PruneTrain Fig. 11) or "ring".
        batch_scale: global batch of the projection = ``batch_size * batch_scale`` (to map
            a small run's batch onto a larger recipe; the ratios between epochs are kept,
            so a dynamic mini-batch keeps reducing the iterations per epoch).
        gpus_per_node, intra, inter: the machine (see :func:`hierarchical_ring_allreduce`).
        payload_key: which metric holds the payload.

    Returns one dict per (epoch, GPUs): ``epoch gpus payload batch_size iterations
    bytes_per_iter bytes_inter_per_iter seconds_per_iter bytes_per_epoch seconds_per_epoch``
    (bytes sent by each rank).
    """
    if not batch_scale > 0:
        raise ValueError(f"batch_scale must be > 0, got {batch_scale}")
    out = []
    for row in rows:
        missing = [k for k in ("epoch", "batch_size", payload_key) if row.get(k) is None]
        if missing:
            raise ValueError(f"metrics row of epoch {row.get('epoch')} lacks {missing}")
        batch = max(1, int(round(int(row["batch_size"]) * batch_scale)))
        iters = iterations_per_epoch(train_size, batch)
        payload = float(row[payload_key])
        for p in gpu_counts:
            cost = allreduce_cost(payload, p, algorithm, gpus_per_node, intra, inter)
            out.append(
                {
                    "epoch": int(row["epoch"]),
                    "gpus": p,
                    "algorithm": algorithm,
                    "payload": payload,
                    "batch_size": batch,
                    "iterations": iters,
                    "bytes_per_iter": cost.bytes_sent,
                    "bytes_inter_per_iter": cost.bytes_inter,
                    "seconds_per_iter": cost.seconds,
                    "bytes_per_epoch": cost.bytes_sent * iters,
                    "seconds_per_epoch": cost.seconds * iters,
                }
            )
    return out


def normalize(
    projection: list[dict[str, Any]], keys: Sequence[str] = ("bytes_per_iter", "bytes_per_epoch")
) -> list[dict[str, Any]]:
    """Each row's ``keys`` divided by those of the first epoch at the same GPU count (the
    dense start of the run), as ``<key>_norm``: the normalised axes of PruneTrain Fig. 11."""
    first: dict[int, dict[str, Any]] = {}
    for row in sorted(projection, key=lambda r: r["epoch"]):
        first.setdefault(row["gpus"], row)
    out = []
    for row in projection:
        ref = first[row["gpus"]]
        extra = {f"{k}_norm": (row[k] / ref[k] if ref[k] else float("nan")) for k in keys}
        out.append({**row, **extra})
    return out


def project_run_dir(
    run_dir: str | Path,
    gpu_counts: Sequence[int] = DEFAULT_GPU_COUNTS,
    *,
    train_size: int | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """:func:`project_run` of a run directory's metrics.jsonl; ``train_size`` defaults to
    the run's own (``data_spec.train_size`` of its summary.json)."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number} is not JSON: {err}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {number} is not a JSON object: {line[:60]}")
        rows.append(row)
    if train_size is None:
        summary = run_dir / "summary.json"
        spec = json.loads(summary.read_text()).get("data_spec", {}) if summary.exists() else {}
        if "train_size" not in spec:
            raise ValueError(
                f"{run_dir} has no summary.json with data_spec (an unfinished run?); "
                "give the samples per epoch (--train-size)"
            )
        train_size = int(spec["train_size"])
    return project_run(rows, gpu_counts, train_size=train_size, **kwargs)


def plot_fig11(projection: list[dict[str, Any]], gpus: int, path: str | Path, title: str) -> None:
    """PruneTrain Fig. 11's axes: per-iteration and per-epoch bytes of each epoch, normalised
    to the first epoch, at ``gpus`` GPUs; written to ``path`` (PNG or SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in normalize(projection) if r["gpus"] == gpus), key=lambda r: r["epoch"])
    if not rows:
        raise ValueError(f"no projection rows for {gpus} GPUs")
    epochs = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.step(epochs, [r["bytes_per_iter_norm"] for r in rows], where="post", label="per iteration")
    ax.step(
        epochs, [r["bytes_per_epoch_norm"] for r in rows], where="post", ls="--", label="per epoch"
    )
    ax.set_xlabel("epoch")
    ax.set_ylabel("bytes sent per GPU (normalised)")
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``prog: error: message`` on stderr, exit status 2
    (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1 (GPU counts, GPUs per node, samples)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite float > 0 (the batch scale)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def _read_metrics(run_dir: Path) -> str:
    """The problem with ``run_dir`` as a run directory (one line), or ``""`` when it has a
    non-empty metrics.jsonl."""
    if not run_dir.exists():
        return f"run directory {str(run_dir)!r} does not exist"
    if not run_dir.is_dir():
        return f"{str(run_dir)!r} is not a directory (pass a run directory)"
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return f"{str(run_dir)!r} has no metrics.jsonl (not a run directory?)"
    if not metrics.read_text().strip():
        return f"{metrics} is empty: the run has no finished epoch"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m impl.comm_model RUN_DIR``: project a run's measured payloads to 4-256 GPUs
    (CSV on stdout or ``--csv``; PruneTrain Fig. 11's plot with ``--png``).

    Bad input (a missing run directory, a GPU count < 1, a ``--plot-gpus`` not among
    ``--gpus``, GPU counts that are not whole nodes for the hierarchical ring) ends with
    one ``error:`` line on stderr and exit status 2, as argparse does.
    """
    import csv
    import sys

    p = _Parser(prog="python -m impl.comm_model", description=main.__doc__)
    p.add_argument("run_dir", help="a run directory (its metrics.jsonl and summary.json)")
    p.add_argument(
        "--gpus",
        type=_positive_int,
        nargs="+",
        default=list(DEFAULT_GPU_COUNTS),
        help="GPU counts to project to (default: %(default)s)",
    )
    p.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="hierarchical",
        help="Allreduce algorithm of the cost model (default: %(default)s)",
    )
    p.add_argument(
        "--train-size", type=_positive_int, help="samples per epoch (default: the run's)"
    )
    p.add_argument(
        "--batch-scale",
        type=_positive_float,
        default=1.0,
        help="factor from the run's batch to the projected recipe's global batch (default 1)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=_positive_int,
        default=DEFAULT_GPUS_PER_NODE,
        help="GPUs per node of the hierarchical ring (default: %(default)s)",
    )
    p.add_argument("--csv", help="write the table here instead of stdout")
    p.add_argument("--png", help="write PruneTrain Fig. 11's plot here")
    p.add_argument(
        "--plot-gpus",
        type=_positive_int,
        help="GPU count of the plot, one of --gpus (default: the largest of --gpus)",
    )
    args = p.parse_args(argv)
    plot_gpus = max(args.gpus) if args.plot_gpus is None else args.plot_gpus
    if plot_gpus not in args.gpus:
        p.error(
            f"--plot-gpus {plot_gpus} is not among --gpus "
            f"({' '.join(map(str, args.gpus))}); add it to --gpus or pick one of them"
        )
    problem = _read_metrics(Path(args.run_dir))
    if problem:
        p.error(problem)
    try:
        proj = normalize(
            project_run_dir(
                args.run_dir,
                args.gpus,
                train_size=args.train_size,
                algorithm=args.algorithm,
                batch_scale=args.batch_scale,
                gpus_per_node=args.gpus_per_node,
            )
        )
    except (ValueError, OSError) as err:  # a bad metrics line, GPU counts not whole nodes
        p.error(" ".join(str(err).split()))
    try:
        out = open(args.csv, "w", newline="") if args.csv else sys.stdout
    except OSError as err:
        p.error(f"cannot write --csv: {err}")
    try:
        writer = csv.DictWriter(out, fieldnames=list(proj[0]))
        writer.writeheader()
        writer.writerows(proj)
    finally:
        if args.csv:
            out.close()
    if args.png:
        title = (
            f"{Path(args.run_dir).name}\nmodelled {args.algorithm} ring Allreduce on "
            f"{plot_gpus} GPUs, from the run's measured payloads"
        )
        try:
            plot_fig11(proj, plot_gpus, args.png, title)
        except (ValueError, OSError) as err:
            p.error(f"cannot write --png: {' '.join(str(err).split())}")
    return 0


__all__ = [
    "ALGORITHMS",
    "DEFAULT_GPUS_PER_NODE",
    "DEFAULT_GPU_COUNTS",
    "INFINIBAND_NDR",
    "NVLINK_H100",
    "AllreduceCost",
    "Link",
    "allreduce_cost",
    "flat_ring_allreduce",
    "hierarchical_ring_allreduce",
    "iterations_per_epoch",
    "main",
    "normalize",
    "plot_fig11",
    "project_run",
    "project_run_dir",
    "ring_allreduce",
    "ring_bytes_per_rank",
]


if __name__ == "__main__":
    raise SystemExit(main())
