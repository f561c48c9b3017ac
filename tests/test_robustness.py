"""FGSM: exact direction on a linear model, pixel-unit eps with normalisation, monotone accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from impl.robustness import (
    FGSM_FILE,
    _with_earlier_rows,
    check_attackable,
    check_finished_run,
    eval_fgsm_run,
    fgsm_accuracies,
    fgsm_accuracy,
    fgsm_attack,
)

MEAN, STD = (0.3, 0.6), (0.2, 0.45)


def _normalise(pixel: torch.Tensor) -> torch.Tensor:
    m = torch.tensor(MEAN).view(1, 2, 1, 1)
    s = torch.tensor(STD).view(1, 2, 1, 1)
    return (pixel - m) / s


def _pixel(x: torch.Tensor) -> torch.Tensor:
    m = torch.tensor(MEAN).view(1, 2, 1, 1)
    s = torch.tensor(STD).view(1, 2, 1, 1)
    return x * s + m


def _linear(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(2 * 5 * 3, 2))  # odd image size 5x3


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.3], ids=["eps0.05", "eps0.1", "eps0.3"])
def test_fgsm_direction_is_exact_on_a_linear_model(eps) -> None:
    """For 2 classes, d CE / d x = (1 - p_y) (w_other - w_y): the step is eps * sign of that."""
    model = _linear()
    g = torch.Generator().manual_seed(1)
    pixel = torch.rand(7, 2, 5, 3, generator=g)
    y = torch.randint(0, 2, (7,), generator=g)
    adv = fgsm_attack(model, _normalise(pixel), y, eps, mean=MEAN, std=STD)
    w = model[1].weight.detach()
    direction = (w[1 - y] - w[y]).sign().view(7, 2, 5, 3)
    expected = (pixel + eps * direction).clamp(0, 1)
    assert torch.allclose(_pixel(adv), expected, atol=1e-6)
    moved = (_pixel(adv) - pixel).abs()
    assert float(moved.max()) <= eps + 1e-6  # the budget is in pixel units on [0, 1]
    assert float(_pixel(adv).min()) >= -1e-6 and float(_pixel(adv).max()) <= 1 + 1e-6


def test_fgsm_eps_zero_returns_the_input_and_clean_accuracy() -> None:
    model = _linear()
    pixel = torch.rand(9, 2, 5, 3)
    y = torch.randint(0, 2, (9,))
    x = _normalise(pixel)
    assert torch.equal(fgsm_attack(model, x, y, 0.0, mean=MEAN, std=STD), x)
    loader = [(x[:4], y[:4]), (x[4:], y[4:])]
    clean = 100.0 * float((model(x).argmax(1) == y).float().mean())
    assert fgsm_accuracy(model, loader, 0.0, mean=MEAN, std=STD) == pytest.approx(clean)


def test_fgsm_leaves_model_mode_and_parameter_grads_alone() -> None:
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(27, 2))
    model.train()
    running = model[1].running_mean.clone()
    x = torch.randn(4, 2, 5, 5)
    fgsm_attack(model, x, torch.tensor([0, 1, 0, 1]), 0.1, mean=MEAN, std=STD)
    assert model.training and model[1].training
    assert torch.equal(model[1].running_mean, running)  # attacked in eval mode
    assert all(p.grad is None for p in model.parameters())
    # so does the accuracy over a loader, each module's own flag restored (one left in eval)
    model[3].eval()
    fgsm_accuracy(model, [(x, torch.tensor([0, 1, 0, 1]))], 0.1, mean=MEAN, std=STD)
    assert [m.training for m in model] == [True, True, True, False]
    assert torch.equal(model[1].running_mean, running)


def _separable(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    pixel = 0.5 + 0.15 * torch.randn(n, 2, 5, 3, generator=g)
    pixel[:, 0] += torch.where(y == 1, 0.12, -0.12).view(n, 1, 1)
    return _normalise(pixel.clamp(0, 1)), y


def test_fgsm_accuracy_does_not_increase_with_eps_on_a_trained_model() -> None:
    """For a binary linear classifier the margin falls monotonically with eps (clipping too)."""
    model = _linear(seed=2)
    x, y = _separable(256, seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(200):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    xt, yt = _separable(200, seed=4)
    loader = [(xt[i : i + 64], yt[i : i + 64]) for i in range(0, 200, 64)]
    eps = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2]
    acc = [fgsm_accuracy(model, loader, e, mean=MEAN, std=STD) for e in eps]
    assert acc[0] > 90.0  # it did learn
    assert all(b <= a for a, b in zip(acc, acc[1:], strict=False)), acc
    assert acc[-1] < acc[0] - 20.0  # and the attack does bite


def test_fgsm_accuracies_equal_each_eps_attacked_alone_from_one_gradient_a_batch() -> None:
    """One value per eps, each the accuracy on ``fgsm_attack``'s own examples at that eps, and
    one gradient a batch: 1 + (number of eps) forward passes per batch, not 2 per eps > 0."""
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 5 * 3, 3))  # fmt: skip
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(n, 2, 5, 3, generator=g), torch.randint(0, 3, (n,), generator=g))
               for n in (16, 16, 7)]  # fmt: skip
    eps = [0.0, 0.05, 0.1, 0.3]
    alone = []
    for e in eps:
        hits = sum(
            int((model(fgsm_attack(model, x, y, e, mean=MEAN, std=STD)).argmax(1) == y).sum())
            for x, y in batches
        )
        alone.append(100.0 * hits / 39)
    passes = []
    model.register_forward_hook(lambda *_: passes.append(1))
    model.train()
    assert fgsm_accuracies(model, batches, eps, mean=MEAN, std=STD) == alone
    assert len(set(alone)) > 1  # the eps do differ
    assert len(passes) == len(batches) * (1 + len(eps)) and model.training
    passes.clear()
    assert fgsm_accuracies(model, batches, [0.0], mean=MEAN, std=STD) == alone[:1]
    assert len(passes) == len(batches)  # clean accuracy alone needs no gradient
    with pytest.raises(ValueError, match="eps must be >= 0"):
        fgsm_accuracies(model, batches, [0.1, -0.1])


def test_fgsm_rejects_bad_input() -> None:
    model = _linear()
    x, y = torch.randn(2, 2, 5, 3), torch.tensor([0, 1])
    for bad in (-0.1, float("nan")):  # a NaN budget would turn every image into NaNs
        with pytest.raises(ValueError, match="eps must be >= 0"):
            fgsm_attack(model, x, y, bad)
    with pytest.raises(ValueError, match="mean/std"):
        fgsm_attack(model, x, y, 0.1, mean=(0.5,), std=(0.2,))
    with pytest.raises(ValueError, match="std"):
        fgsm_attack(model, x, y, 0.1, mean=(0.5, 0.5), std=(0.2, 0.0))
    with pytest.raises(ValueError, match="no samples"):
        fgsm_accuracy(model, [], 0.1)


@pytest.mark.slow
@pytest.mark.parametrize("size", [None, 16], ids=["default-32", "16"])
def test_eval_fgsm_run_on_a_finished_run(tmp_path, size, monkeypatch) -> None:
    import impl.data
    from impl.config import resolve
    from impl.train import train

    run = tmp_path / "run"
    options = {} if size is None else {"image_size": size}
    cfg = resolve("smoke", method="dense", model="resnet20", data="digits", out=str(run),
                  threads=1, data_options=options)  # fmt: skip
    summary = train(cfg, progress=False)
    rows = eval_fgsm_run(run, [0.0, 0.1])
    assert [r["eps"] for r in rows] == [0.0, 0.1]
    # eps = 0 is the clean test accuracy the Trainer measured: same loader, same normalisation
    assert rows[0]["top1"] == pytest.approx(summary["top1"])
    assert rows[1]["top1"] <= rows[0]["top1"]
    record = json.loads((run / FGSM_FILE).read_text())
    assert record["rows"] == rows and record["method"] == "dense"
    assert record["image_size"] == (size or 32)  # attacked on the images it was trained on
    assert "pixel" in record["eps_units"]
    for bad in ([-1.0], [0.1, 2.0], []):  # the budget is per pixel on the [0, 1] scale
        with pytest.raises(ValueError, match=r"--eps needs values in \[0, 1\]"):
            eval_fgsm_run(run, bad)
    # a dataset that moved since training is read from where it is now: the place reaches
    # the model's build and the test set (digits is read from no directory: the place is
    # refused there, so the check that a directory would be taken runs with that check off)
    real, dirs = impl.data.make_loaders, []
    monkeypatch.setattr(
        impl.data, "make_loaders", lambda *a, **k: dirs.append(k["data_dir"]) or real(*a, **k)
    )
    with pytest.raises(ValueError, match="digits is not read from a directory"):
        eval_fgsm_run(run, [0.0], data_dir=str(tmp_path / "moved"))
    monkeypatch.setattr(impl.train, "dataset_dir_for", lambda value, dataset: value)
    moved = eval_fgsm_run(run, [0.0], data_dir=str(tmp_path / "moved"))
    assert dirs == [str(tmp_path / "moved")] * 2  # the model's build and the test set
    assert moved[0]["top1"] == rows[0]["top1"]
    # a later call keeps the earlier rows beside its own (it replaced them): eps sorted
    more = eval_fgsm_run(run, [0.05])
    record = json.loads((run / FGSM_FILE).read_text())
    assert [r["eps"] for r in record["rows"]] == [0.0, 0.05, 0.1] and more == record["rows"][1:2]
    assert record["rows"][2] == rows[1]
    assert record["commit"]  # the code that attacked: rows of other code are not kept
    for field, other in (("device", "cuda:0"), ("image_size", 64), ("commit", "0" * 40)):
        (run / FGSM_FILE).write_text(json.dumps({**record, field: other}))
        eval_fgsm_run(run, [0.05])  # rows of another attack are not mixed in
        assert json.loads((run / FGSM_FILE).read_text())["rows"] == more, field


def test_fgsm_json_records_every_option_the_run_trained_with(tmp_path) -> None:
    """fgsm.json took its options from config.json, which keeps only those given: {}."""
    from impl.config import resolve
    from impl.train import train

    run = tmp_path / "run"
    cfg = resolve("smoke", method="sdgp", method_options={"m": 8}, out=str(run), threads=1,
                  epochs=1, max_steps_per_epoch=1, data_options={"image_size": 8})  # fmt: skip
    summary = train(cfg, progress=False)
    eval_fgsm_run(run, [0.0])
    options = json.loads((run / FGSM_FILE).read_text())["method_options"]
    assert options == summary["method_options"] and options["m"] == 8 and options["n"] == 2


@pytest.mark.parametrize(
    "make", ["missing", "empty", "file"], ids=["missing-dir", "no-config", "a-file"]
)
def test_eval_fgsm_refuses_what_is_not_a_run_directory(tmp_path, make) -> None:
    path = tmp_path / "run"
    if make == "empty":
        path.mkdir()
    elif make == "file":
        path.write_text("x")
    with pytest.raises(ValueError, match="is not a run directory"):
        eval_fgsm_run(path, [0.0])  # not a raw "[Errno 2] ... config.json"


@pytest.mark.parametrize(
    "summary",
    [None, '{"status": "running"}', "{torn"],
    ids=["no-summary", "not-complete", "unreadable"],
)
def test_eval_fgsm_refuses_an_unfinished_run_naming_its_epochs(tmp_path, summary) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"epochs": 31, "method": "dense"}))
    (run / "metrics.jsonl").write_text('{"epoch": 0}\n{"epoch": 1}\n{"epo')  # killed mid-line
    if summary is not None:
        (run / "summary.json").write_text(summary)
    with pytest.raises(ValueError, match=r"not a finished run .*2 of 31 epochs done") as err:
        eval_fgsm_run(run, [0.0, 0.1])
    assert f"pdtbench train --resume {run}" in str(err.value)
    assert not (run / FGSM_FILE).exists()


def test_eval_fgsm_on_a_run_being_trained_says_so_instead_of_resume_it(tmp_path) -> None:
    from impl import rundir

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"epochs": 3, "method": "dense"}))
    with rundir.locked(run), pytest.raises(ValueError, match="being trained by another") as err:
        check_finished_run(run)  # the lock's holder is training it: --resume is refused
    assert "wait for it to finish, then attack it" in str(err.value)
    with pytest.raises(ValueError, match="not a finished run"):  # lock released: resume it
        check_finished_run(run)


def test_check_finished_run_returns_the_summary_of_a_complete_run(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text('{"status": "complete", "top1": 91.5}')
    assert check_finished_run(tmp_path)["top1"] == 91.5


def test_eval_fgsm_refuses_a_read_only_run_before_attacking_any(tmp_path, monkeypatch, capsys):
    """A run directory the rows cannot be saved in is refused before the first attack (which
    took the whole attack, then failed to write fgsm.json), every RUN_DIR checked first."""
    import os

    import impl.train
    from impl import cli

    runs = [tmp_path / "ok", tmp_path / "read-only"]
    for run in runs:
        run.mkdir()
        (run / "config.json").write_text("{}")
        (run / "summary.json").write_text('{"status": "complete", "top1": 91.5}')
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != runs[1] and real_access(p, mode))

    def attacked(*args, **kwargs):
        raise AssertionError("a run was attacked before every RUN_DIR was checked")

    monkeypatch.setattr(impl.train, "load_trained_model", attacked)
    assert cli.main(["eval-fgsm", *map(str, runs), "--device", "cpu"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: RUN_DIR {runs[1]} is not writable" in err and FGSM_FILE in err


def _threshold_model() -> nn.Module:
    """One pixel in, two logits: class 1 where the pixel is above 0.45 (logits 0 and x - 0.45)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(1, 2))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[0.0], [1.0]]))
        model[1].bias.copy_(torch.tensor([0.0, -0.45]))
    return model


def test_fgsm_clips_to_the_given_pixel_range() -> None:
    """A pixel of 0.55 of class 1 is pushed down by eps = 0.3: to 0.25 on [0, 1] (now class
    0), to 0.5 on [0.5, 1] (still class 1); the accuracies follow the range given."""
    model = _threshold_model()
    x, y = torch.tensor([0.55]).view(1, 1, 1, 1), torch.tensor([1])
    adv = fgsm_attack(model, x, y, 0.3)
    assert adv.flatten().tolist() == pytest.approx([0.25])
    adv = fgsm_attack(model, x, y, 0.3, pixel_range=(0.5, 1.0))
    assert adv.flatten().tolist() == pytest.approx([0.5])
    loader = [(x, y)]
    assert fgsm_accuracy(model, loader, 0.3) == 0.0
    assert fgsm_accuracy(model, loader, 0.3, pixel_range=(0.5, 1.0)) == 100.0
    assert fgsm_accuracies(model, loader, [0.0, 0.3], pixel_range=(0.5, 1.0)) == [100.0, 100.0]


def test_fgsm_eps_zero_returns_a_detached_copy() -> None:
    """``eps = 0``: the same values in a tensor of its own, outside the autograd graph."""
    model = _linear()
    x = torch.rand(3, 2, 5, 3).requires_grad_(True)
    adv = fgsm_attack(model, x, torch.tensor([0, 1, 0]), 0.0)
    assert torch.equal(adv, x.detach()) and adv is not x and not adv.requires_grad
    adv.zero_()
    assert float(x.detach().abs().sum()) > 0


@pytest.mark.parametrize(
    ("mean", "std"),
    [((0.5,), (0.2, 0.2)), ((0.5, 0.5), (0.2,)), ((0.5, 0.5, 0.5), (0.2, 0.2))],
    ids=["short-mean", "short-std", "long-mean"],
)
def test_fgsm_refuses_statistics_of_another_channel_count(mean, std) -> None:
    """mean and std need one value per channel of ``x``, each checked."""
    model = _linear()
    x, y = torch.randn(2, 2, 5, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="mean/std need 2 values"):
        fgsm_attack(model, x, y, 0.1, mean=mean, std=std)


def test_eps_of_exactly_1_is_a_valid_budget(tmp_path) -> None:
    """The budget range [0, 1] is closed: 0 and 1 pass the eps check, and the call goes on to
    refuse the directory instead."""
    with pytest.raises(ValueError, match="is not a run directory"):
        eval_fgsm_run(tmp_path / "missing", [0.0, 1.0])
    with pytest.raises(ValueError, match=r"--eps needs values in \[0, 1\]"):
        eval_fgsm_run(tmp_path / "missing", [1.0 + 1e-9])


HEADER = {"run_dir": "/a/run", "device": "cpu", "image_size": 16, "commit": "c" * 40}


def _earlier(path: Path, header: dict, rows: list) -> Path:
    path.write_text(json.dumps({**header, "rows": rows}))
    return path


def test_earlier_rows_of_the_same_attack_are_kept_sorted_and_replaced(tmp_path) -> None:
    """Rows of an earlier identical attack at other eps are kept (even from a copy of the run
    at another path), a repeated eps takes the new value, and all come sorted by eps."""
    copied = {**HEADER, "run_dir": "/elsewhere/run"}
    earlier = [{"eps": 0.3, "top1": 10.0}, {"eps": 0.1, "top1": 50.0}, {"eps": 0.0, "top1": 90.0}]
    path = _earlier(tmp_path / FGSM_FILE, copied, earlier)
    rows = [{"eps": 0.1, "top1": 55.0}, {"eps": 0.05, "top1": 70.0}]
    assert _with_earlier_rows(path, rows, HEADER) == [
        {"eps": 0.0, "top1": 90.0},
        {"eps": 0.05, "top1": 70.0},
        {"eps": 0.1, "top1": 55.0},
        {"eps": 0.3, "top1": 10.0},
    ]


@pytest.mark.parametrize(
    "change",
    [{"commit": None}, {"device": "cuda:0"}, {"image_size": 32}],
    ids=["no-commit", "other-device", "other-images"],
)
def test_earlier_rows_of_another_or_unknown_attack_are_dropped(tmp_path, change) -> None:
    """An earlier file of another device or images, or of a tree without a commit (its code
    unknown), contributes no row."""
    header = {**HEADER, **change}
    earlier = header if change.get("commit", "") is None else HEADER
    path = _earlier(tmp_path / FGSM_FILE, earlier, [{"eps": 0.3, "top1": 10.0}])
    rows = [{"eps": 0.1, "top1": 55.0}]
    assert _with_earlier_rows(path, rows, header) == rows


def test_check_attackable_asks_for_write_and_search_access(tmp_path, monkeypatch) -> None:
    """A run directory is attackable only with both write and search (execute) permission,
    the rights that creating fgsm.json in it needs; read access alone is not enough."""
    import os

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text('{"status": "complete", "top1": 91.5}')
    for missing in (os.W_OK, os.X_OK):
        monkeypatch.setattr(os, "access", lambda p, mode, missing=missing: not mode & missing)
        with pytest.raises(ValueError, match="is not writable"):
            check_attackable(tmp_path)
    monkeypatch.setattr(os, "access", lambda p, mode: mode & (os.W_OK | os.X_OK) == mode)
    assert check_attackable(tmp_path)["top1"] == 91.5


def test_unfinished_run_without_configured_epochs_names_the_epochs_done(tmp_path) -> None:
    """A config.json without ``epochs``: the message names the epochs done alone."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 0}\n{"epoch": 1}\n')
    with pytest.raises(ValueError, match=r"no complete summary\.json; 2 epochs done\)"):
        check_finished_run(tmp_path)


def test_unfinished_run_with_an_unreadable_config_does_not_advise_resume(tmp_path) -> None:
    """A torn config.json: --resume refuses such a run, so the message says why instead."""
    (tmp_path / "config.json").write_text('{"epochs": 3, "meth')
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 0}\n')
    with pytest.raises(ValueError, match=r"config\.json: not a JSON file") as err:
        check_finished_run(tmp_path)
    assert "cannot be resumed" in str(err.value)
    assert "--resume" not in str(err.value)


def test_eval_fgsm_run_attacks_with_the_datasets_normalisation(tmp_path, monkeypatch) -> None:
    """The attack gets the test set's mean and std as the loaders give them (None where the
    dataset has none), so eps stays in pixel units."""
    import types

    import impl.data
    import impl.robustness
    import impl.train

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text('{"status": "complete", "top1": 91.5}')
    cfg = types.SimpleNamespace(
        data="digits", batch_size=8, data_dir=None, seed=0, eval_batch_size=8,
        data_options={}, method="dense", method_options={}, model="m", scale="smoke",
    )  # fmt: skip
    monkeypatch.setattr(impl.train, "load_trained_model", lambda *a, **k: (None, cfg))
    seen = []

    def accuracies(model, loader, eps, *, mean=None, std=None):
        seen.append((mean, std))
        return [50.0 for _ in eps]

    monkeypatch.setattr(impl.robustness, "fgsm_accuracies", accuracies)
    for mean, std, want in (
        ((0.1, 0.2), (0.3, 0.4), ((0.1, 0.2), (0.3, 0.4))),
        ((), (), (None, None)),
    ):
        spec = types.SimpleNamespace(mean=mean, std=std, test_size=4, image_size=8)
        monkeypatch.setattr(impl.data, "make_loaders", lambda *a, spec=spec, **k: (None, [], spec))
        assert eval_fgsm_run(tmp_path, [0.1]) == [{"eps": 0.1, "top1": 50.0}]
        assert seen.pop() == want


class _Well(nn.Module):
    """One pixel in; logits ``0`` and ``0.05 - (x - 0.5)^2``: class 1 within about 0.22 of 0.5,
    and its loss rises as the pixel moves away from 0.5."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return torch.cat([torch.zeros_like(x), 0.05 - (x - 0.5) ** 2], dim=1)


def test_fgsm_gradient_is_taken_at_the_image_itself() -> None:
    """On a nonlinear model the step follows the loss gradient at ``x`` (not at any other
    point): class-1 pixels at 0.3 and 0.7 are pushed away from 0.5, to 0.2 and 0.8, where
    class 0 wins."""
    x = torch.tensor([0.3, 0.7]).view(2, 1, 1, 1)
    y = torch.tensor([1, 1])
    adv = fgsm_attack(_Well(), x, y, 0.1)
    assert adv.flatten().tolist() == pytest.approx([0.2, 0.8])
    assert fgsm_accuracies(_Well(), [(x, y)], [0.0, 0.1]) == [100.0, 0.0]


def test_a_diverged_run_is_refused_naming_its_epoch_one_based(tmp_path) -> None:
    """A run whose summary records a divergence in epoch index 2 (0-based, as in
    ``metrics.jsonl``) is refused as having diverged in its third epoch, with the reason."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"epochs": 5, "method": "dense"}))
    diverged = {"status": "diverged", "diverged_epoch": 2, "reason": "non-finite weights"}
    (run / "summary.json").write_text(json.dumps(diverged))
    with pytest.raises(ValueError, match=r"diverged in epoch 3 \(non-finite weights\)") as err:
        eval_fgsm_run(run, [0.1])
    assert "no trained model to attack" in str(err.value)
    assert not (run / FGSM_FILE).exists()


def test_eval_fgsm_refuses_an_empty_list_of_eps(tmp_path) -> None:
    """No ``eps`` at all is refused like a bad one, before the run is looked at (no rows of
    nothing written)."""
    with pytest.raises(ValueError, match=r"--eps needs values in \[0, 1\].*got \[\]"):
        eval_fgsm_run(tmp_path / "absent", [])


def test_the_eps_0_row_is_the_clean_accuracy_of_the_images_as_given() -> None:
    """``eps = 0`` among others reads the images as they are, unclipped (the clean top-1, as
    :func:`fgsm_attack` returns them at ``eps = 0``). Pixels at 2.0, above the range, are
    class 1 (``x > 1.5``): 100% clean; clipped to 1.0 they would read as class 0. At
    ``eps = 0.1`` the step (down, away from class 1) is clipped to 1.0: 0%."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(1, 2))
    with torch.no_grad():  # logits 0 and x - 1.5
        model[1].weight.copy_(torch.tensor([[0.0], [1.0]]))
        model[1].bias.copy_(torch.tensor([0.0, -1.5]))
    x = torch.full((4, 1, 1, 1), 2.0)
    y = torch.ones(4, dtype=torch.long)
    assert fgsm_accuracies(model, [(x, y)], [0.0, 0.1]) == [100.0, 0.0]
    assert fgsm_accuracy(model, [(x, y)], 0.0) == 100.0


def test_eval_fgsm_run_attacks_the_runs_own_test_loader(tmp_path, monkeypatch) -> None:
    """The test loader is rebuilt as the run trained: its data, batch sizes, seed and data
    options (e.g. digits at 16x16), never augmented."""
    import types

    import impl.data
    import impl.robustness
    import impl.train

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text('{"status": "complete", "top1": 91.5}')
    cfg = types.SimpleNamespace(
        data="digits", batch_size=8, data_dir="/data/here", seed=3, eval_batch_size=32,
        data_options={"image_size": 16}, method="dense", method_options={}, model="m",
        scale="smoke",
    )  # fmt: skip
    monkeypatch.setattr(impl.train, "load_trained_model", lambda *a, **k: (None, cfg))
    monkeypatch.setattr(
        impl.robustness, "fgsm_accuracies", lambda m, loader, eps, **k: [1.0] * len(eps)
    )
    calls = []
    spec = types.SimpleNamespace(mean=(), std=(), test_size=4, image_size=16)

    def loaders(*args, **kwargs):
        calls.append((args, kwargs))
        return None, [], spec

    monkeypatch.setattr(impl.data, "make_loaders", loaders)
    eval_fgsm_run(tmp_path, [0.1])
    ((args, kwargs),) = calls
    assert args == ("digits", 8)
    assert kwargs == {
        "data_dir": "/data/here", "seed": 3, "augment": False, "device": "cpu",
        "eval_batch_size": 32, "image_size": 16,
    }  # fmt: skip


def test_eval_fgsm_run_pairs_each_eps_with_its_own_top1_and_records_the_attack(
    tmp_path, monkeypatch
) -> None:
    """Each row holds its eps's top-1, in the order the eps were given; fgsm.json says what
    was attacked (the run's method, its options as the summary records them, model, data,
    scale, test set, device) and in which units eps is."""
    import types

    import impl.data
    import impl.robustness
    import impl.train

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text(
        json.dumps({"status": "complete", "top1": 91.5, "method_options": {"m": 8, "n": 2}})
    )
    cfg = types.SimpleNamespace(
        data="cifar10", batch_size=8, data_dir=None, seed=0, eval_batch_size=8,
        data_options={}, method="sdgp", method_options={"m": 8}, model="resnet20", scale="cpu",
    )  # fmt: skip
    monkeypatch.setattr(impl.train, "load_trained_model", lambda *a, **k: (None, cfg))
    top1 = {0.0: 90.0, 0.1: 40.0, 0.3: 10.0}  # falling with eps, as under attack
    monkeypatch.setattr(
        impl.robustness, "fgsm_accuracies", lambda m, loader, eps, **k: [top1[e] for e in eps]
    )
    spec = types.SimpleNamespace(mean=(), std=(), test_size=10000, image_size=32)
    monkeypatch.setattr(impl.data, "make_loaders", lambda *a, **k: (None, [], spec))
    rows = eval_fgsm_run(tmp_path, [0.3, 0.0, 0.1])
    assert rows == [
        {"eps": 0.3, "top1": 10.0},
        {"eps": 0.0, "top1": 90.0},
        {"eps": 0.1, "top1": 40.0},
    ]
    record = json.loads((tmp_path / FGSM_FILE).read_text())
    assert record["rows"] == sorted(rows, key=lambda r: r["eps"])
    assert record["attack"].startswith("FGSM against the model itself (Goodfellow et al. 2014")
    assert record["eps_units"].startswith("pixel intensity on [0, 1], before normalisation")
    assert {k: record[k] for k in ("method", "model", "data", "scale", "device")} == {
        "method": "sdgp", "model": "resnet20", "data": "cifar10", "scale": "cpu", "device": "cpu"
    }  # fmt: skip
    assert record["method_options"] == {"m": 8, "n": 2}  # the summary's, not the config's
    assert (record["test_size"], record["image_size"]) == (10000, 32)
    assert record["run_dir"] == str(tmp_path)


def test_fgsm_step_worked_by_hand_on_a_two_pixel_linear_model() -> None:
    """Logits W x with W = [[1, -1], [0, 2]] and label 0: d CE / d x = W^T (p - e_0)
    = (p0 - 1) [1, -1] + p1 [0, 2] = p1 [-1, 3], of sign [-1, +1]. Pixels [0.5, 0.98]
    under mean 0.5 and std 0.25 (x = [0, 1.92]) move by eps = 0.1 to [0.4, 1.08], the second
    clipped to 1: normalised again, [-0.4, 2.0]."""
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0], [0.0, 2.0]]))
    x = torch.tensor([[0.0, 1.92]])
    adv = fgsm_attack(model, x, torch.tensor([0]), 0.1, mean=(0.5, 0.5), std=(0.25, 0.25))
    assert torch.allclose(adv, torch.tensor([[-0.4, 2.0]]), atol=1e-6)
