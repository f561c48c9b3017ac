"""The pieces of the SDGP authors' CIFAR-10 training script, built on ffcv's example (Sec. IV:
"We use the FFCV dataloader and training regime"): ffcv's mean-filled translation and cutout
and test-time flip averaging, no weight decay on BatchNorm, the rate ramped from 1e-4."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from impl import config, data
from impl.config import TrainConfig, resolve
from impl.data import CropFlip, make_loaders
from impl.schedules import lr_multiplier
from impl.train import evaluate, parameter_groups

MEAN = (0.25, 0.5, 0.75)


def test_the_recipe_names_agree():
    assert config.AUGMENT_RECIPES == data.AUGMENT_RECIPES


def test_translation_pads_with_the_fill_value():
    crop = CropFlip(pad=2, flip=False, fill=MEAN)
    x = torch.ones(1, 3, 6, 6)
    # offset 0 in the padded frame: the top two rows and left two columns are padding
    out = crop.apply(x, torch.tensor([0]), torch.tensor([0]), torch.tensor([False]))
    for c, m in enumerate(MEAN):
        assert torch.all(out[0, c, :2, :] == m) and torch.all(out[0, c, :, :2] == m)
        assert torch.all(out[0, c, 2:, 2:] == 1)
    zero = CropFlip(pad=2, flip=False).apply(
        x, torch.tensor([0]), torch.tensor([0]), torch.tensor([False])
    )
    assert torch.all(zero[0, :, :2, :] == 0)


def test_cutout_fills_one_square_inside_the_image():
    crop = CropFlip(pad=2, flip=False, fill=MEAN, cutout=4)
    n, size = 200, (8, 8)
    dy, dx, flip, cy, cx = crop.draw(n, torch.Generator().manual_seed(0), size)
    assert int(cy.min()) == 0 and int(cy.max()) == 4 and int(cx.max()) == 4  # uniform, inside
    x = torch.ones(n, 3, *size)
    centred = torch.full((n,), 2)  # no translation: only the cutout changes pixels
    out = crop.apply(x, centred, centred, flip, cy, cx)
    for c, m in enumerate(MEAN):
        filled = out[:, c] == m
        assert torch.all(filled.flatten(1).sum(1) == 16)
        for i in (0, 7, 199):
            y0, x0 = int(cy[i]), int(cx[i])
            assert torch.all(filled[i, y0 : y0 + 4, x0 : x0 + 4])
    with pytest.raises(ValueError, match="does not fit"):
        crop.draw(1, torch.Generator(), (3, 3))


def test_cutout_of_non_square_images_fits_each_side():
    """On H x W = 3 x 8 images a 2 x 2 cutout's corner takes every row 0..1 and column 0..6;
    a 4 x 4 one fits the width but not the height, and is refused."""
    crop = CropFlip(pad=1, flip=False, cutout=2)
    *_, cy, cx = crop.draw(500, torch.Generator().manual_seed(0), (3, 8))
    assert set(cy.tolist()) == {0, 1} and set(cx.tolist()) == set(range(7))
    with pytest.raises(ValueError, match="cutout 4 does not fit images of 3x8"):
        CropFlip(pad=1, flip=False, cutout=4).draw(1, torch.Generator(), (3, 8))


def test_the_standard_recipe_draws_what_it_drew_before():
    # a cutout is drawn after the other draws, so they stay those of the standard recipe
    g1, g2 = (torch.Generator().manual_seed(5) for _ in range(2))
    plain = CropFlip(pad=4, flip=True).draw(50, g1, (32, 32))
    ffcv = CropFlip(pad=4, flip=True, cutout=4).draw(50, g2, (32, 32))
    assert len(plain) == 3 and all(torch.equal(a, b) for a, b in zip(plain, ffcv[:3]))


def test_make_loaders_applies_the_ffcv_recipe():
    train, _, spec = make_loaders("digits", 16, augment_recipe="ffcv", image_size=16)
    assert train.augment.pad == 2 and train.augment.cutout == 4
    assert train.augment.fill == tuple(spec.mean) and not train.augment.flip  # digits: no flip
    assert "4x4 mean cutout" in spec.augmentation
    x, _ = next(iter(train))
    assert x.shape == (16, 1, 16, 16)
    with pytest.raises(ValueError, match="unknown augment_recipe"):
        make_loaders("digits", 16, augment_recipe="autoaugment")
    with pytest.raises(ValueError, match="not imagenet"):
        make_loaders("imagenet", 16, augment_recipe="ffcv")


def test_flip_evaluation_scores_the_sum_of_both_views():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    grad_on = []
    model.register_forward_hook(lambda m, i, o: grad_on.append(torch.is_grad_enabled()))
    x, y = torch.randn(5, 1, 3, 4), torch.tensor([0, 1, 2, 0, 1])
    loss, top1 = evaluate(model, [(x, y)], torch.device("cpu"), flip=True)
    assert grad_on == [False, False]  # both views, no autograd graph
    with torch.no_grad():
        both = model(x) + model(x.flip(-1))
        assert not torch.allclose(model(x), model(x.flip(-1)))
    assert loss == pytest.approx(float(F.cross_entropy(both, y)), rel=1e-6)
    assert top1 == pytest.approx(100.0 * float((both.argmax(1) == y).float().mean()))


def test_batchnorm_parameters_can_skip_weight_decay():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 2))
    (one,) = parameter_groups(model, 5e-4)
    assert len(one["params"]) == 6 and one["weight_decay"] == 5e-4
    decay, free = parameter_groups(model, 5e-4, bn_weight_decay=False)
    bn = {id(p) for p in model[1].parameters()}
    assert {id(p) for p in free["params"]} == bn and free["weight_decay"] == 0.0
    assert len(decay["params"]) == 4 and decay["weight_decay"] == 5e-4
    opt = torch.optim.SGD(parameter_groups(model, 0.5, bn_weight_decay=False), lr=1.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    for p, b in zip(model.parameters(), before):
        if id(p) in bn:
            assert torch.equal(p, b)  # no decay: unchanged by a zero gradient
        else:
            assert torch.allclose(p, 0.5 * b)


def test_the_one_cycle_starts_at_warmup_start():
    assert lr_multiplier("onecycle", 0.0, 150, warmup_fraction=2 / 150) == pytest.approx(0.04)
    ffcv = lr_multiplier("onecycle", 0.0, 150, warmup_fraction=2 / 150, warmup_start=1e-4)
    assert ffcv == pytest.approx(1e-4)
    assert lr_multiplier("onecycle", 2.0, 150, warmup_fraction=2 / 150, warmup_start=1e-4) == 1
    with pytest.raises(ValueError, match="warmup_start is a setting of schedule 'onecycle'"):
        resolve("cpu", schedule="cosine", warmup_start=1e-4)
    with pytest.raises(ValueError, match="warmup_start must be in"):
        TrainConfig(warmup_start=2.0).validate()
    with pytest.raises(ValueError, match="unknown augment_recipe"):
        TrainConfig(augment_recipe="x").validate()


@pytest.mark.slow
def test_a_run_trains_with_the_whole_recipe(tmp_path):
    from impl.train import train

    cfg = resolve("smoke", augment_recipe="ffcv", eval_flip=True, bn_weight_decay=False,
                  warmup_start=1e-4, out=str(tmp_path / "run"), threads=1)  # fmt: skip
    summary = train(cfg, progress=False)
    assert summary["status"] == "complete"
    assert TrainConfig().digest() != cfg.digest()


def test_two_parameter_groups_survive_a_reconfiguration_and_its_resume():
    """Without BatchNorm weight decay the optimizer has two groups; PruneTrain's
    reconfiguration takes removed parameters out of both, and a resumed run's optimizer, built
    on the rebuilt model, loads the saved state group for group."""
    import impl.models as M
    from impl.methods.channel_graph import build_graph, zero_channels
    from impl.methods.prunetrain_reconfig import apply_architecture, architecture, reconfigure

    torch.manual_seed(0)
    model = M.create("resnet20")
    graph = build_graph(model)
    zero_channels(model, graph, "layer2.1.conv1", torch.arange(32))  # the path goes
    zero_channels(model, graph, "layer1.0.conv1", torch.arange(5))
    opt = torch.optim.SGD(parameter_groups(model, 5e-4, bn_weight_decay=False), lr=0.1,
                          momentum=0.9)  # fmt: skip
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    rep = reconfigure(model, opt)
    assert rep.removed_paths == ["layer2.1"]
    fresh = M.create("resnet20")
    apply_architecture(fresh, architecture(model))
    fresh.load_state_dict(model.state_dict())
    again = torch.optim.SGD(parameter_groups(fresh, 5e-4, bn_weight_decay=False), lr=0.1,
                            momentum=0.9)  # fmt: skip
    again.load_state_dict(opt.state_dict())
    assert [len(g["params"]) for g in again.param_groups] == [
        len(g["params"]) for g in opt.param_groups
    ]
    for p in fresh.parameters():
        assert again.state[p]["momentum_buffer"].shape == p.shape


def test_the_recipe_flags_reach_the_config_and_resume_accepts_them(tmp_path, capsys):
    from impl import cli, rundir

    out = tmp_path / "run"
    flags = ["--augment-recipe", "ffcv", "--eval-flip", "--no-bn-weight-decay",
             "--warmup-start", "1e-4"]  # fmt: skip
    args = ["train", "--scale", "smoke", "--epochs", "1", "--threads", "1", "--no-progress"]
    assert cli.main([*args, *flags, "--out", str(out)]) == 0
    saved = TrainConfig.from_dict(rundir.read_json(out / rundir.CONFIG_FILE))
    assert (saved.augment_recipe, saved.eval_flip, saved.bn_weight_decay) == ("ffcv", True, False)
    assert saved.warmup_start == 1e-4
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress", *flags]) == 0
    assert cli.main(["train", "--resume", str(out), "--warmup-start", "0.04"]) == 2
    assert "--warmup-start cannot change it" in capsys.readouterr().err


def test_inputs_a_model_or_the_cutout_cannot_take_are_refused_before_writing(tmp_path):
    from impl.train import train

    small = resolve("smoke", model="resnet9", data_options={"image_size": 8},
                    out=str(tmp_path / "r9"))  # fmt: skip
    with pytest.raises(ValueError, match="cannot take 8x8 images"):
        train(small, progress=False)
    assert not (tmp_path / "r9").exists()
    tiny = resolve("smoke", data="synthetic", data_options={"image_size": 3},
                   augment_recipe="ffcv", out=str(tmp_path / "syn"))  # fmt: skip
    with pytest.raises(ValueError, match="cuts out 4x4 squares"):
        train(tiny, progress=False)
    assert not (tmp_path / "syn").exists()
