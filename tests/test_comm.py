"""impl.comm in one process: pack/unpack, masks, byte counts, and the hook on a 1-rank group."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from impl import comm


def small_model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 3 * 3, 7), nn.Linear(7, 2))


@pytest.mark.parametrize("n,k", [(1, 1), (13, 5), (1000, 0), (4099, 4099)], ids=str)
def test_pack_unpack_round_trip(n, k):
    g = torch.Generator().manual_seed(n)
    flat = torch.randn(n, generator=g)
    index = torch.randperm(n, generator=g)[:k].sort().values
    packed = comm.pack(flat, index, impl="ref")
    assert packed.shape == (k,)
    assert torch.equal(packed, flat[index])
    out = torch.full((n,), 7.0)
    back = comm.unpack(packed, index, out, impl="ref")
    assert back is out
    expect = torch.zeros(n)
    expect[index] = flat[index]
    assert torch.equal(out, expect)


def test_pack_unpack_reject_bad_input():
    flat = torch.arange(6.0)
    idx = torch.tensor([0, 2])
    with pytest.raises(ValueError, match="1-D"):
        comm.pack(flat.view(2, 3), idx)
    with pytest.raises(ValueError, match="valid: auto, ref, cuda"):
        comm.pack(flat, idx, impl="triton")
    with pytest.raises(ValueError, match="CUDA device"):
        comm.pack(flat, idx, impl="cuda")
    with pytest.raises(ValueError, match="3 elements, index 2"):
        comm.unpack(torch.ones(3), idx, torch.zeros(6))
    out = torch.full((6,), 7.0)
    with pytest.raises(ValueError, match="one dtype and device"):
        comm.unpack(torch.ones(2, dtype=torch.float16), idx, out)
    assert bool((out == 7.0).all())  # refused before it was zeroed


@pytest.mark.gpu
def test_pack_unpack_on_gpu_match_the_reference():
    g = torch.Generator().manual_seed(0)
    for n in (1, 17, 1 << 20):
        flat = torch.randn(n, generator=g).cuda()
        index = torch.randperm(n, generator=g)[: n // 3 + 1].sort().values.cuda()
        assert torch.equal(comm.pack(flat, index), flat[index])
        out = torch.empty(n, device="cuda")
        comm.unpack(flat[index], index, out)
        ref = torch.zeros(n, device="cuda")
        ref[index] = flat[index]
        assert torch.equal(out, ref)


def test_resolve_masks_checks_names_and_shapes():
    m = small_model()
    keep = torch.ones(4, 3, 3, 3, dtype=torch.bool)
    by_id = comm.resolve_masks(m, {"0.weight": keep})
    assert list(by_id) == [id(m[0].weight)] and by_id[id(m[0].weight)].shape == (108,)
    with pytest.raises(ValueError, match="not a parameter"):
        comm.resolve_masks(m, {"0.kernel": keep})
    with pytest.raises(ValueError, match=r"shape \(3, 3, 3\), parameter \(4, 3, 3, 3\)"):
        comm.resolve_masks(m, {"0.weight": keep[0]})
    assert comm.resolve_masks(m, None) == {}


def test_payload_index_follows_ddp_layout():
    m = small_model()
    params = list(m.parameters())
    keep = torch.rand(m[2].weight.shape) < 0.3
    by_id = comm.resolve_masks(m, {"2.weight": keep})
    index = comm.payload_index(params, by_id)
    sizes = [p.numel() for p in params]
    offset = sum(sizes[:2])  # conv weight and bias come first
    expect = torch.cat(
        [
            torch.arange(offset),
            keep.reshape(-1).nonzero().reshape(-1) + offset,
            torch.arange(offset + sizes[2], sum(sizes)),
        ]
    )
    assert torch.equal(index, expect)
    assert comm.payload_index(params[:2], by_id) is None  # no masked parameter: send all


def test_a_mask_is_flattened_in_its_parameters_memory_order():
    keep = torch.rand(4, 3, 2, 5) < 0.5
    nchw = torch.empty(4, 3, 2, 5)
    assert torch.equal(comm.memory_order(keep, nchw), keep.reshape(-1))
    nhwc = nchw.to(memory_format=torch.channels_last)
    # element i of the parameter's memory holds logical position (n, h, w, c)
    assert torch.equal(comm.memory_order(keep, nhwc), keep.permute(0, 2, 3, 1).reshape(-1))
    one_channel = torch.empty(4, 1, 2, 5).to(memory_format=torch.channels_last)
    assert torch.equal(comm.memory_order(keep[:, :1], one_channel), keep[:, :1].reshape(-1))
    overlapping = torch.empty(3).expand(4, 3)  # no single order: the logical one
    assert torch.equal(
        comm.memory_order(keep[0, :, 0, :4].T, overlapping), keep[0, :, 0, :4].T.reshape(-1)
    )


def test_payload_bytes_counts_kept_entries():
    m = small_model()
    dense = sum(p.numel() for p in m.parameters()) * 4
    assert comm.payload_bytes(m) == dense
    keep = torch.zeros(m[0].weight.shape, dtype=torch.bool)
    keep[0, 0, 1, 1] = True
    assert comm.payload_bytes(m, {"0.weight": keep}) == dense - (keep.numel() - 1) * 4
    m[3].bias.requires_grad_(False)
    assert comm.payload_bytes(m) == dense - 2 * 4
    assert comm.payload_bytes(m.double()) == (dense - 8) * 2


def test_comm_stats_per_iteration_and_epoch():
    s = comm.CommStats()
    assert s.epoch_metrics() == {}
    s.record(100, 0.002)
    s.record(50, 0.001)
    s.record_aux(8)
    s.end_iteration()
    s.record(100, 0.004, sparse=True)
    s.end_iteration()
    row = s.epoch_metrics()
    assert row["comm_bytes_per_iter"] == 125.0  # mean of 150 and 100
    assert row["comm_bytes_epoch"] == 250
    assert (row["comm_bytes_per_iter_min"], row["comm_bytes_per_iter_max"]) == (100, 150)
    assert row["comm_aux_bytes_per_iter"] == 4.0
    assert row["comm_ms"] == pytest.approx(3.5)
    assert row["comm_calls_per_iter"] == 1.5
    assert row["comm_sparse_iters"] == 1
    s.reset_epoch()
    s.record(64)
    s.end_iteration()
    s.record(64)
    s.end_iteration()
    assert s.epoch_metrics()["comm_bytes_per_iter"] == 64  # constant: the exact int
    s.reset_epoch()
    s.record(32)
    s.end_iteration()
    assert s.epoch_metrics()["comm_bytes_per_iter"] == 32  # an epoch of one iteration
    s.reset_epoch()
    for nbytes, seconds in ((100, 0.001), (100, 0.002), (400, 0.010)):
        s.record(nbytes, seconds)
        s.end_iteration()
    row = s.epoch_metrics()  # three iterations: a median and a mean tell apart
    assert row["comm_ms"] == pytest.approx(2.0)  # the median, not the mean (4.33)
    assert row["comm_bytes_per_iter"] == 200  # the mean, not the median (100)
    # collectives not timed (PDTBENCH_COMM_TIMING=0): no time, which is not 0 ms
    untimed = s.epoch_metrics(timed=False)
    assert "comm_ms" not in untimed and untimed["comm_bytes_per_iter"] == 200


def test_comm_state_masks_change_detection_and_checksum():
    m = small_model()
    state = comm.CommState(timing=False)
    assert not state.sparse
    assert state.bucket_index(list(m.parameters())) is None
    keep = torch.rand(m[0].weight.shape) < 0.5
    masks = {"0.weight": keep}
    assert state.set_masks(m, masks) is True
    assert state.set_masks(m, dict(masks)) is False  # same tensors: no change
    assert state.sparse
    idx = state.bucket_index(list(m.parameters()))
    assert idx is state.bucket_index(list(m.parameters()))  # cached
    digest = state.mask_digest()
    assert digest.dtype == torch.int64 and digest[:2].tolist() == [1, int(keep.sum())]
    other = comm.CommState(timing=False)  # another rank: other parameter ids, same masks
    other.set_masks(small_model(), {"0.weight": keep.clone()})
    assert torch.equal(other.mask_digest(), digest)
    assert state.set_masks(m, None) is True and not state.sparse
    with pytest.raises(ValueError, match="valid: auto, ref, cuda"):
        comm.CommState(impl="fast")


def test_bucket_tile_table_only_where_the_kernels_expand():
    """The unpack's tile table is built only for a GPU index: on the CPU (and without masks)
    there is none, and unpack zeroes and scatters. The bucket's index is strictly ascending,
    what the one-pass expand needs."""
    m = small_model()
    state = comm.CommState(timing=False)
    params = list(m.parameters())
    numel = sum(p.numel() for p in params)
    assert state.bucket_starts(params, numel) is None
    state.set_masks(m, {"0.weight": torch.rand(m[0].weight.shape) < 0.5})
    assert state.bucket_starts(params, numel) is None
    idx = state.bucket_index(params)
    assert bool((idx[1:] > idx[:-1]).all())


@pytest.mark.gpu
def test_bucket_tile_table_on_the_gpu_is_kept_and_unpack_expands_with_it():
    m = small_model().cuda()
    state = comm.CommState(timing=False)
    state.set_masks(m, {"0.weight": torch.rand(m[0].weight.shape, device="cuda") < 0.5})
    params = list(m.parameters())
    numel = sum(p.numel() for p in params)
    starts = state.bucket_starts(params, numel)
    assert starts is not None and starts is state.bucket_starts(params, numel)
    idx = state.bucket_index(params)
    packed = torch.randn(idx.numel(), device="cuda")
    poisoned = torch.full((numel,), float("nan"), device="cuda")
    got = comm.unpack(packed, idx, poisoned, starts=starts)
    want = comm.unpack(packed, idx, torch.empty(numel, device="cuda"), impl="ref")
    assert torch.equal(got, want)


def test_mask_digest_tells_apart_patterns_of_equal_count_and_position_sum():
    # Two ranks with 4-of-9 patterns (1,3,4,5) and (0,2,4,7) on every kernel passed the
    # check of (kept count, sum of kept positions), and their weights then diverged.
    def digest(pattern: tuple[int, ...]) -> torch.Tensor:
        m = nn.Conv2d(8, 16, 3)
        kernel = torch.zeros(9, dtype=torch.bool)
        kernel[list(pattern)] = True
        state = comm.CommState(timing=False)
        state.set_masks(m, {"weight": kernel.reshape(3, 3).expand(16, 8, 3, 3)})
        return state.mask_digest()

    a, b = digest((1, 3, 4, 5)), digest((0, 2, 4, 7))
    assert a[:2].tolist() == b[:2].tolist() == [1, 16 * 8 * 4]  # same masks and kept count
    assert not torch.equal(a, b)
    assert torch.equal(a, digest((1, 3, 4, 5)))


def test_masks_are_bound_again_after_the_parameters_change():
    # A parameter replaced under the same masks kept the masks bound to the old parameter's
    # id: the hook then sent the new parameter densely and left its pruned gradients.
    m = small_model()
    keep = torch.rand(m[0].weight.shape) < 0.5
    masks = {"0.weight": keep}
    state = comm.CommState(timing=False)
    state.set_masks(m, masks)
    m[0].weight = nn.Parameter(torch.randn_like(m[0].weight))
    state.forget_buckets()  # what the DDP wrapper's rebuild does
    assert state.set_masks(m, masks) is True
    idx = state.bucket_index([m[0].weight])
    assert idx is not None and idx.numel() == int(keep.sum())
    # masks no longer published after a rebuild: dense from then on, not the old masks kept
    # (they are keyed by parameter, and a parameter shrunk in place keeps its id)
    state.forget_buckets()
    assert state.set_masks(m, None) is True and not state.sparse
    assert state.bucket_index([m[0].weight]) is None


def test_a_mask_edited_in_place_is_taken_again():
    # The key was the masks' identities and storage alone: a method that kept its published
    # mask tensors and edited them left the hook sending the old positions, so gradients at
    # newly kept weights were never averaged.
    m = small_model()
    keep = torch.zeros(m[0].weight.shape, dtype=torch.bool)
    keep[0] = True
    masks = {"0.weight": keep}
    state = comm.CommState(timing=False)
    assert state.set_masks(m, masks) is True
    before = state.bucket_index([m[0].weight]).numel()
    keep[1] = True
    assert state.set_masks(m, masks) is True
    assert state.bucket_index([m[0].weight]).numel() == before + keep[1].numel()
    assert state.set_masks(m, masks) is False  # unchanged since: no new check
    with torch.inference_mode():  # such a tensor keeps no version counter: taken as it is
        frozen = torch.ones(m[0].weight.shape, dtype=torch.bool)
    assert state.set_masks(m, {"0.weight": frozen}) is True
    assert state.set_masks(m, {"0.weight": frozen}) is False


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank in this process (torn down after the test)."""
    assert not dist.is_initialized()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_timed_all_reduce_takes_the_seconds_between_its_two_clock_readings(
    one_rank_group, monkeypatch
):
    readings = iter([100.0, 100.25])
    monkeypatch.setattr(comm.time, "perf_counter", lambda: next(readings))
    payload = torch.arange(4.0)
    seconds = comm._all_reduce_timed(comm.CommState(timing=True), payload)
    assert seconds == 0.25
    assert torch.equal(payload, torch.arange(4.0))  # one rank: the sum is the tensor itself


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("timing", [True, False], ids=["timed", "async"])
def test_hook_on_one_rank_sends_kept_gradients_only(one_rank_group, timing, layout):
    m = small_model()
    ref = small_model()
    if layout == "channels_last":  # DDP's buckets hold these gradients in N, H, W, C order
        m = m.to(memory_format=torch.channels_last)
        assert not m[0].weight.is_contiguous()
    g = torch.Generator().manual_seed(1)
    masks = {
        "0.weight": torch.rand(m[0].weight.shape, generator=g) < 0.4,
        "3.weight": torch.rand(m[3].weight.shape, generator=g) < 0.6,
    }
    state = comm.CommState(timing=timing)
    ddp = nn.parallel.DistributedDataParallel(m)
    comm.register(ddp, state)
    state.set_masks(m, masks)
    x = torch.randn(5, 3, 5, 5, generator=g)
    ddp(x).square().sum().backward()
    state.stats.end_iteration()
    ref(x).square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        keep = masks.get(name, torch.ones_like(p, dtype=torch.bool))
        assert torch.allclose(p.grad, q.grad * keep, rtol=1e-6, atol=1e-7), name
        assert not p.grad[~keep].any(), name
    kept = sum(int(masks[n].sum()) if n in masks else p.numel() for n, p in m.named_parameters())
    assert state.stats.bytes == [kept * 4]
    assert state.stats.sparse == [True]
    assert (state.stats.seconds[0] > 0) is timing


def test_the_hook_sums_over_the_ranks_and_divides_by_nothing(one_rank_group, monkeypatch):
    """Each rank's backward already weighs its share by 1 / global batch
    (DataParallel.backward_loss), so the hook sums: with a world of 2 standing in, the one
    rank's gradients come back as they were, not halved as DDP's mean would, kept ones only."""
    monkeypatch.setattr(comm.CommState, "world_size", property(lambda self: 2))
    m, ref = small_model(), small_model()
    g = torch.Generator().manual_seed(2)
    masks = {"0.weight": torch.rand(m[0].weight.shape, generator=g) < 0.5}
    state = comm.CommState()
    ddp = nn.parallel.DistributedDataParallel(m)
    comm.register(ddp, state)
    state.set_masks(m, masks)
    x = torch.randn(4, 3, 5, 5, generator=g)
    ddp(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        keep = masks.get(name, torch.ones_like(p, dtype=torch.bool))
        assert torch.allclose(p.grad, q.grad * keep, rtol=1e-6, atol=1e-7), name


def test_an_iteration_is_sparse_if_any_of_its_buckets_was_packed():
    s = comm.CommStats()
    s.record(100, sparse=True)
    s.record(50, sparse=False)  # a dense bucket after a packed one
    s.end_iteration()
    s.record(50)
    s.end_iteration()
    assert s.sparse == [True, False] and s.epoch_metrics()["comm_sparse_iters"] == 1


def test_an_epoch_counts_each_sparse_iteration_and_sums_an_iterations_aux_bytes():
    """``comm_sparse_iters`` counts iterations (two of three here), not whether any was;
    two non-gradient collectives of one iteration add up (8 + 4 bytes)."""
    s = comm.CommStats()
    for sparse in (True, False, True):
        s.record(10, sparse=sparse)
        s.record_aux(8)
        s.record_aux(4)
        s.end_iteration()
    row = s.epoch_metrics()
    assert row["comm_sparse_iters"] == 2
    assert row["comm_aux_bytes_per_iter"] == 12
    assert s.aux_bytes == [12, 12, 12]


@pytest.mark.parametrize("timing", [True, False], ids=["timed", "async"])
def test_a_dense_iteration_is_not_sparse(one_rank_group, timing):
    """Without masks the hook sends whole buckets: every parameter's bytes, not packed."""
    m = small_model()
    state = comm.CommState(timing=timing)
    ddp = nn.parallel.DistributedDataParallel(m)
    comm.register(ddp, state)
    ddp(torch.randn(2, 3, 5, 5)).sum().backward()
    state.stats.end_iteration()
    assert state.stats.sparse == [False]
    assert state.stats.bytes == [sum(p.numel() for p in m.parameters()) * 4]
    assert state.stats.epoch_metrics(timed=timing)["comm_sparse_iters"] == 0
