"""The papers' figures that have no reproduction target of their own: where each is drawn
instead, or why it is not, so that the index accounts for every figure of the four papers and
not only those the targets reproduce (:data:`reproductions.TARGETS`).

Figures that are diagrams of a method carry no data to reproduce; the others are either drawn
from the runs of a target (named in ``where``) or left out for the reason given.
"""

from __future__ import annotations

OTHER_FIGURES: tuple[dict[str, str], ...] = (
    {"paper": "clicktrain", "figure": "Fig. 1, 4, 6, 7",
     "shows": "pattern-based pruning, the framework's stages, pattern pool generation, the "
              "CSR and SpMM design",
     "where": "diagrams of the method: no data"},
    {"paper": "clicktrain", "figure": "Fig. 2",
     "shows": "ResNet-32 top-1 of full training, PruneTrain and training the reduced "
              "architecture (the paper's motivation)",
     "where": "not reproduced; PruneTrain's top-1 beside ClickTrain's is in Table 1 and "
              "Fig. 15"},
    {"paper": "clicktrain", "figure": "Fig. 3",
     "shows": "share of training FLOPs in the forward and backward passes",
     "where": "not drawn; impl.flops counts training FLOPs (forward, data and weight "
              "gradients) and inference FLOPs (forward) apart: the cross-method table shows "
              "both"},
    {"paper": "clicktrain", "figure": "Fig. 5",
     "shows": "training loss over epochs, the signal of stage 1's loss-derivative rule",
     "where": "not drawn; every run's metrics.jsonl holds its training loss per epoch"},
    {"paper": "clicktrain", "figure": "Fig. 8",
     "shows": "12 dynamic patterns against a one-time pattern selection (+2 points on "
              "CIFAR-10, Sec. 4.3)",
     "where": "not reproduced: pdtbench has no one-time selection variant; the paper's number "
              "is in paper_values/clicktrain_fig8.csv"},
    {"paper": "prunetrain", "figure": "Fig. 1, 3, 5",
     "shows": "the training process, the group-lasso structure, channel indexing with "
              "shortcuts",
     "where": "diagrams of the method: no data"},
    {"paper": "prunetrain", "figure": "Fig. 4",
     "shows": "largest |weight| of each output channel over epochs, three convs of one "
              "residual path",
     "where": "not reproduced: runs do not record per-channel weight magnitudes"},
    {"paper": "prunetrain", "figure": "Fig. 12",
     "shows": "channel and weight density of each layer of the final ResNet-50 (ImageNet)",
     "where": "not reproduced: runs record each layer's output channels per epoch "
              "(metrics.jsonl 'channels'), not its input channels or near-zero weights"},
    {"paper": "sdgp", "figure": "Fig. 1-5",
     "shows": "the method, the data-gradient GEMM, and the pruning functions on example "
              "tensors",
     "where": "diagrams and illustrations: no data"},
    {"paper": "sdgp", "figure": "Fig. 6, 7",
     "shows": "training loss and top-1 per epoch (CIFAR-10, ImageNet)",
     "where": "drawn under Table I (sdgp.table1) from its runs"},
    {"paper": "campfire", "figure": "Fig. 1-3",
     "shows": "the sparsity mechanism, window and CK sparsity, pruning the FC layer",
     "where": "diagrams of the method: no data"},
    {"paper": "campfire", "figure": "Fig. 4",
     "shows": "convergence and sparsity per epoch, pruning from epoch 30; CK from different "
              "epochs; ResNet-50 v1 against v1.5",
     "where": "drawn under Table 2 (campfire.table2) from its runs, but the v1 against v1.5 "
              "panel: the scales below paper train one ResNet"},
    {"paper": "campfire", "figure": "Fig. 5",
     "shows": "per-layer sparsity of CK pruning from 30 to 70%",
     "where": "not drawn: every pruned layer is pruned to the target (runs record each "
              "layer's sparsity per epoch, metrics.jsonl 'layer_sparsity')"},
    {"paper": "campfire", "figure": "Fig. 6",
     "shows": "convergence with window and CK pruning (Tiny-ImageNet)",
     "where": "drawn under Table 1 (campfire.table1) from its runs"},
    {"paper": "campfire", "figure": "Fig. 7, 8, 10, 11",
     "shows": "convergence and sparsity per mask at several sparsities, pruning from 30 "
              "(ImageNet); at 60%, top-1 and top-5",
     "where": "the Table 2 runs of each mask are drawn together in Fig. 4's panels under "
              "Table 2; top-5 is not recorded"},
    {"paper": "campfire", "figure": "Table 7",
     "shows": "a qualitative comparison of training methods that yield sparse networks "
              "(focus, regularization, when pruning happens, budget, granularity)",
     "where": "not reproduced: a table of words, no numbers to measure"},
)  # fmt: skip


def other_figures() -> list[dict[str, str]]:
    """:data:`OTHER_FIGURES` as a list of rows (paper, figure, shows, where), for the index of
    a report."""
    return [dict(f) for f in OTHER_FIGURES]


__all__ = ["OTHER_FIGURES", "other_figures"]
