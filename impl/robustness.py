"""Adversarial robustness under FGSM, as Campfire's Table 6 (Sec. 3.2 and 4.2).

The Fast Gradient Sign Method (Goodfellow et al., 2014) perturbs every pixel by ``eps`` in the
direction that increases the loss of the model being attacked ("to generate its own
adversarial examples", Campfire Sec. 3.2): ``x_adv = clip(x + eps * sign(grad_x L(f(x), y)))``.
Campfire used the PyTorch FGSM tutorial, which attacks images in ``[0, 1]`` with ``eps`` of
0.05 to 0.3 and clips to ``[0, 1]``.

Units: ``eps`` is in *pixel units*, on the ``[0, 1]`` scale of the raw images, before the
dataset's normalisation (the loaders deliver ``(pixel - mean) / std``). The attack therefore
un-normalises the batch, steps by ``eps * sign(grad)`` and clips in pixel space, then
normalises again. The sign of the gradient is the same in both spaces because ``std > 0``
(``d/d pixel = (d/d normalised) / std``). So ``eps = 0.1`` moves every pixel by a tenth of the
full intensity range, whatever the dataset's statistics.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FGSM_FILE = "fgsm.json"
PIXEL_RANGE = (0.0, 1.0)


def _stats(
    mean: Sequence[float] | None, std: Sequence[float] | None, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    channels = x.shape[1]
    shape = (1, channels) + (1,) * (x.dim() - 2)
    m = torch.zeros(channels) if mean is None else torch.as_tensor(mean, dtype=torch.float32)
    s = torch.ones(channels) if std is None else torch.as_tensor(std, dtype=torch.float32)
    if m.numel() != channels or s.numel() != channels:
        raise ValueError(f"mean/std need {channels} values, got {list(m)} / {list(s)}")
    if not bool((s > 0).all()):
        raise ValueError(f"std must be > 0, got {list(s)}")
    return m.to(x.device, x.dtype).view(shape), s.to(x.device, x.dtype).view(shape)


def fgsm_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    pixel_range: tuple[float, float] = PIXEL_RANGE,
) -> torch.Tensor:
    """FGSM adversarial examples of the batch ``(x, y)`` against ``model`` itself.

    Args:
        model: the classifier attacked; run in eval mode during the attack (its training
            flags are restored afterwards) and its parameter gradients are not touched.
        x: normalised images ``(pixel - mean) / std``, ``[N, C, H, W]``.
        y: integer labels ``[N]``.
        eps: perturbation per pixel in pixel units on ``pixel_range`` (see the module
            docstring), >= 0.
        mean, std: the per-channel normalisation of ``x`` (None: ``x`` is in pixel units).
        pixel_range: the valid pixel interval the adversarial image is clipped to.

    Returns:
        Normalised adversarial images shaped like ``x``: the clipped pixel image
        ``clip(pixel + eps * sign(grad_pixel CE(model(x), y)), *pixel_range)`` normalised again.
        ``eps = 0`` returns ``x`` unchanged.
    """
    _check_eps(eps)
    if eps == 0:
        return x.detach().clone()
    m, s = _stats(mean, std, x)
    return _step(x.detach() * s + m, _gradient_sign(model, x, y), eps, m, s, pixel_range)


def _check_eps(eps: float) -> None:
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0 (pixel units), got {eps!r}")


def _gradient_sign(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``sign(grad_x CE(model(x), y))`` with ``model`` in eval mode (its flags restored after).
    The same in pixel and normalised units (``std > 0``) and for every ``eps``."""
    modes = {mod: mod.training for mod in model.modules()}
    model.eval()
    try:
        with torch.enable_grad():
            xa = x.detach().clone().requires_grad_(True)
            loss = F.cross_entropy(model(xa), y)
            (grad,) = torch.autograd.grad(loss, xa)
    finally:
        for mod, mode in modes.items():
            mod.training = mode
    return grad.sign()


def _step(
    pixel: torch.Tensor,
    sign: torch.Tensor,
    eps: float,
    m: torch.Tensor,
    s: torch.Tensor,
    pixel_range: tuple[float, float],
) -> torch.Tensor:
    """The pixel image moved by ``eps`` along ``sign``, clipped, normalised by ``m``, ``s``
    (:func:`_stats`)."""
    adv = (pixel + eps * sign).clamp(pixel_range[0], pixel_range[1])
    return (adv - m) / s


def fgsm_accuracies(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    eps_list: Sequence[float],
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    pixel_range: tuple[float, float] = PIXEL_RANGE,
) -> list[float]:
    """Top-1 accuracy in % on FGSM examples of every batch of ``loader``, one value per entry
    of ``eps_list`` in order (Campfire Table 6; each equals :func:`fgsm_accuracy` at that
    ``eps``). The loader is read once and each batch's gradient is taken once: FGSM's step
    direction does not depend on ``eps``, so k values cost one backward and k + 1 forward
    passes a batch instead of k backward and 2k forward."""
    eps_values = [float(e) for e in eps_list]
    for e in eps_values:
        _check_eps(e)
    correct = [0] * len(eps_values)
    seen = 0
    modes = {mod: mod.training for mod in model.modules()}
    model.eval()
    try:
        for x, y in loader:
            m, s = _stats(mean, std, x)  # refuses bad statistics before any pass
            pixel = x.detach() * s + m
            sign = _gradient_sign(model, x, y) if any(e > 0 for e in eps_values) else None
            for i, e in enumerate(eps_values):
                adv = x if e == 0 else _step(pixel, sign, e, m, s, pixel_range)
                with torch.no_grad():
                    correct[i] += int((model(adv).argmax(dim=1) == y).sum())
            seen += int(y.numel())
    finally:
        for mod, mode in modes.items():
            mod.training = mode
    if seen == 0:
        raise ValueError("the loader yielded no samples")
    return [100.0 * c / seen for c in correct]


def fgsm_accuracy(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    eps: float,
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    pixel_range: tuple[float, float] = PIXEL_RANGE,
) -> float:
    """Top-1 accuracy in % on FGSM examples of every batch of ``loader`` (Campfire Table 6)."""
    return fgsm_accuracies(model, loader, [eps], mean=mean, std=std, pixel_range=pixel_range)[0]


def check_finished_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The summary of the finished run in ``run_dir``; a clear ValueError for anything else.

    Refuses a directory that is not a run directory (no ``config.json``, as
    :func:`impl.train.resume` does) and a run whose ``summary.json`` is missing, unreadable or
    not ``"status": "complete"`` (killed or still training): its checkpoint holds the
    weights of an unfinished schedule, and its top-1 under attack would read like a result.
    The message names the epochs done (the lines of ``metrics.jsonl``) out of the configured
    ones and the command that finishes it.
    """
    from impl import rundir
    from impl.train import TrainingDiverged, finished_summary_to_resume

    run_dir = Path(run_dir)
    try:
        summary = finished_summary_to_resume(run_dir)  # the reading resume makes of a run
    except FileNotFoundError as err:  # the same words as --resume's
        raise ValueError(str(err)) from None
    except TrainingDiverged as err:
        diverged = err.record
        raise ValueError(
            f"{run_dir} diverged in epoch {int(diverged.get('diverged_epoch', 0)) + 1} "
            f"({diverged.get('reason')}): it has no trained model to attack"
        ) from None
    if summary is not None:
        return summary
    if (run_dir / rundir.LOCK_FILE).exists():  # one being trained: not "resume it"
        with contextlib.suppress(OSError):  # a read-only copy: no lock to take
            try:
                with rundir.locked(run_dir, busy="wait for it to finish, then attack it"):
                    pass
            except rundir.RunBusyError as err:
                raise ValueError(str(err)) from None
    done = len(rundir.read_metrics(run_dir))
    unfinished = f"{run_dir} is not a finished run (no complete {rundir.SUMMARY_FILE}"
    try:
        config = rundir.read_json(run_dir / rundir.CONFIG_FILE)
    except (OSError, ValueError) as err:  # --resume would refuse it too: say why
        raise ValueError(
            f"{unfinished}) and its config cannot be read, so it cannot be resumed either: {err}"
        ) from None
    total = config.get("epochs")
    epochs = f"{done} of {total}" if total is not None else str(done)
    raise ValueError(
        f"{unfinished}; {epochs} epochs done): finish it with "
        f"`pdtbench train --resume {run_dir}` before attacking it"
    )


def check_attackable(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Refuse, before any attack, what :func:`eval_fgsm_run` could attack but not save the
    rows of: a directory that is not a finished run (:func:`check_finished_run`), or one
    that cannot be written (read-only). Raises ``ValueError`` naming the directory; returns
    the finished run's summary."""
    run_dir = Path(run_dir)
    summary = check_finished_run(run_dir)
    if not os.access(run_dir, os.W_OK | os.X_OK):  # as impl.out_dir.check_out_dir
        raise ValueError(
            f"RUN_DIR {run_dir} is not writable, and the rows are saved to its {FGSM_FILE}: "
            "make it writable, or attack a copy of the run"
        )
    return summary


def eval_fgsm_run(
    run_dir: str | os.PathLike,
    eps_list: Sequence[float],
    device: str = "cpu",
    data_dir: str | None = None,
) -> list[dict[str, Any]]:
    """FGSM top-1 of a finished run's model on its test set, for each ``eps`` (pixel units:
    a value in [0, 1], the raw images' scale, else ``ValueError``).
    ``data_dir``: where the run's dataset is now, where it moved since training (None: the
    run's own).

    Refuses, with a ValueError, a directory that is not a finished run or cannot be
    written (:func:`check_attackable`), before attacking. Loads the model with
    :func:`impl.train.load_trained_model`, rebuilds the test loader with
    :func:`impl.data.make_loaders` from the run's config (no augmentation), and writes
    ``fgsm.json`` into ``run_dir`` (the rows plus what was attacked and how). Rows of an
    earlier call that attacked the same way (the same code, device, model, images: every
    field of the file but its rows) are kept there beside these (an ``eps`` given again is
    measured again), sorted by ``eps``.

    Returns:
        One ``{"eps": float, "top1": float}`` per entry of ``eps_list``, in order.
    """
    from impl.data import make_loaders
    from impl.env import git_state
    from impl.rundir import write_json
    from impl.train import load_trained_model

    eps_values = [float(e) for e in eps_list]
    bad = [e for e in eps_values if not 0 <= e <= 1]
    if not eps_values or bad:
        raise ValueError(
            "--eps needs values in [0, 1] (a perturbation per pixel of the raw images, on "
            f"their [0, 1] scale), got {eps_values}"
        )
    run_dir = Path(run_dir)
    summary = check_attackable(run_dir)
    model, cfg = load_trained_model(run_dir, device=device, data_dir=data_dir)
    _, test_loader, spec = make_loaders(
        cfg.data,
        cfg.batch_size,
        data_dir=cfg.data_dir,
        seed=cfg.seed,
        augment=False,
        device=device,
        eval_batch_size=cfg.eval_batch_size,
        **cfg.data_options,  # the images the model was trained on (e.g. digits at 16x16)
    )
    mean = spec.mean or None
    std = spec.std or None
    top1 = fgsm_accuracies(model, test_loader, eps_values, mean=mean, std=std)
    rows = [{"eps": e, "top1": t} for e, t in zip(eps_values, top1, strict=True)]
    record = {
        "attack": "FGSM against the model itself (Goodfellow et al. 2014; Campfire Sec. 3.2)",
        "eps_units": "pixel intensity on [0, 1], before normalisation; clipped to [0, 1]",
        "run_dir": str(run_dir),
        "method": cfg.method,
        # every option as the run trained with it (its config keeps only those given)
        "method_options": summary.get("method_options", cfg.method_options),
        "model": cfg.model,
        "data": cfg.data,
        "scale": cfg.scale,
        "test_size": spec.test_size,
        "image_size": spec.image_size,
        "device": str(device),
        "commit": git_state()[0],
    }
    record["rows"] = _with_earlier_rows(run_dir / FGSM_FILE, rows, record)
    write_json(run_dir / FGSM_FILE, record)
    return rows


def _with_earlier_rows(
    path: Path, rows: list[dict[str, Any]], header: dict[str, Any]
) -> list[dict[str, Any]]:
    """``rows`` and the rows of ``path`` (an earlier call's ``fgsm.json``) at other ``eps``,
    sorted by ``eps``; the earlier rows only where every other field of that file equals
    ``header``'s (the same commit, device, model, data and images; an unreadable file, or
    one of a tree without a commit: ``rows`` alone)."""
    try:
        earlier = json.loads(path.read_text())
        same = header.get("commit") is not None and all(
            earlier.get(k) == v for k, v in header.items() if k != "run_dir"
        )
        kept = [{"eps": float(r["eps"]), "top1": float(r["top1"])} for r in earlier["rows"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        same, kept = False, []
    if not same:
        kept = []
    merged = {r["eps"]: r for r in kept}
    merged.update({r["eps"]: r for r in rows})
    return [merged[e] for e in sorted(merged)]


__all__ = [
    "FGSM_FILE",
    "check_attackable",
    "check_finished_run",
    "eval_fgsm_run",
    "fgsm_accuracies",
    "fgsm_accuracy",
    "fgsm_attack",
]
