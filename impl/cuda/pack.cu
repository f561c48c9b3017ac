// Gradient pack and unpack for sparse communication (ClickTrain Sec. 5.3): the gradients of
// pruned weights stay zero, so only those at a mask's nonzero positions are sent.
//
// Both kernels move raw elements of 1, 2, 4 or 8 bytes (the dtype does not matter), with
// int32 or int64 flat indices (a mask's nonzero positions, built once).
//    pack:   dst[j] = src[index[j]]      src [numel] global (flat, contiguous), read at the
//            indices only; index [nnz] global; dst [nnz] global, written in full
//    unpack: dst[index[j]] = src[j]      src [nnz] global; dst [numel] global, written at the
//            indices only (the host zero-fills it first); indices must be unique
//    grid:   1-D, grid-stride over nnz; any block size.
#include "pdt_common.cuh"

// Both take PDT_MOVE_LB elements a thread a round (pdt_common.cuh), every load of the round
// issued before its stores (the pack's value loads after all its index loads), whatever the
// compiler would reorder across a store.

template <typename T, typename IDX>
__device__ __forceinline__ void pdt_pack_body(const T* __restrict__ src,
                                              const IDX* __restrict__ index, T* __restrict__ dst,
                                              i64 nnz) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 j0 = (i64)blockIdx.x * blockDim.x + threadIdx.x; j0 < nnz;
       j0 += PDT_MOVE_LB * stride) {
    IDX ix[PDT_MOVE_LB];
    T v[PDT_MOVE_LB];
#pragma unroll
    for (int i = 0; i < PDT_MOVE_LB; ++i)
      if (j0 + i * stride < nnz) ix[i] = index[j0 + i * stride];
#pragma unroll
    for (int i = 0; i < PDT_MOVE_LB; ++i)
      if (j0 + i * stride < nnz) v[i] = src[ix[i]];
#pragma unroll
    for (int i = 0; i < PDT_MOVE_LB; ++i)
      if (j0 + i * stride < nnz) dst[j0 + i * stride] = v[i];
  }
}

template <typename T, typename IDX>
__device__ __forceinline__ void pdt_unpack_body(const T* __restrict__ src,
                                                const IDX* __restrict__ index,
                                                T* __restrict__ dst, i64 nnz) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 j0 = (i64)blockIdx.x * blockDim.x + threadIdx.x; j0 < nnz;
       j0 += PDT_MOVE_LB * stride) {
    IDX ix[PDT_MOVE_LB];
    T v[PDT_MOVE_LB];
#pragma unroll
    for (int i = 0; i < PDT_MOVE_LB; ++i) {
      if (j0 + i * stride < nnz) {
        ix[i] = index[j0 + i * stride];
        v[i] = src[j0 + i * stride];
      }
    }
#pragma unroll
    for (int i = 0; i < PDT_MOVE_LB; ++i)
      if (j0 + i * stride < nnz) dst[ix[i]] = v[i];
  }
}

// Expand (unpack with zeros elsewhere, in one pass): dst[p] = src[j] where index[j] == p, 0
// at every other position, for a strictly ascending index. Zeroing dst and then scattering
// into it writes every position once and the kept ones again, scattered (partial sectors);
// here each block builds tiles of PDT_EXPAND_TILE consecutive positions in shared memory and
// writes each tile once, coalesced.
//    src     [nnz] global; index [nnz] global, strictly ascending (a mask's nonzeros in order)
//    starts  [tiles + 1] i64 global: starts[t] = the number of entries of index below
//            t * PDT_EXPAND_TILE (built once per index, pack_cuda.expand_starts)
//    dst     [numel] global, written in full
//    tile    [PDT_EXPAND_TILE] T shared
//    grid:   1-D, grid-stride over the tiles; any block size.
template <typename T, typename IDX>
__device__ __forceinline__ void pdt_expand_body(const T* __restrict__ src,
                                                const IDX* __restrict__ index,
                                                const i64* __restrict__ starts,
                                                T* __restrict__ dst, i64 numel) {
  __shared__ T tile[PDT_EXPAND_TILE];
  const i64 tiles = (numel + PDT_EXPAND_TILE - 1) / PDT_EXPAND_TILE;
  for (i64 t = blockIdx.x; t < tiles; t += gridDim.x) {  // block-uniform loop
    const i64 p0 = t * PDT_EXPAND_TILE;
    const int len = (int)min((i64)PDT_EXPAND_TILE, numel - p0);
    const i64 j0 = starts[t], j1 = starts[t + 1];  // in flight while the tile is zeroed
    for (int q = threadIdx.x; q < len; q += blockDim.x) tile[q] = T(0);
    __syncthreads();  // zeroed before any value lands
    // LB entries a thread loaded before any is stored (PDT_MOVE_LB)
    constexpr int LB = PDT_MOVE_LB;
    for (i64 jb = j0 + threadIdx.x; jb < j1; jb += LB * (i64)blockDim.x) {
      IDX ix[LB];
      T v[LB];
#pragma unroll
      for (int i = 0; i < LB; ++i) {
        const i64 j = jb + i * (i64)blockDim.x;
        if (j < j1) {
          ix[i] = index[j];
          v[i] = src[j];
        }
      }
#pragma unroll
      for (int i = 0; i < LB; ++i)
        if (jb + i * (i64)blockDim.x < j1) tile[(i64)ix[i] - p0] = v[i];
    }
    __syncthreads();  // every value is in
    for (int q = threadIdx.x; q < len; q += blockDim.x) dst[p0 + q] = tile[q];
    __syncthreads();  // every read of the tile is done before the next tile zeroes it
  }
}

#define PDT_PACK_KERNELS(SUF, T, IDX, ISUF)                                                 \
  extern "C" __global__ void pdt_pack_##SUF##_##ISUF(const T* src, const IDX* index, T* dst, \
                                                     i64 nnz) {                             \
    pdt_pack_body<T, IDX>(src, index, dst, nnz);                                            \
  }                                                                                         \
  extern "C" __global__ void pdt_unpack_##SUF##_##ISUF(const T* src, const IDX* index,       \
                                                       T* dst, i64 nnz) {                   \
    pdt_unpack_body<T, IDX>(src, index, dst, nnz);                                          \
  }                                                                                         \
  extern "C" __global__ void pdt_expand_##SUF##_##ISUF(const T* src, const IDX* index,       \
                                                       const i64* starts, T* dst,           \
                                                       i64 numel) {                         \
    pdt_expand_body<T, IDX>(src, index, starts, dst, numel);                                \
  }

PDT_PACK_KERNELS(b1, unsigned char, int, i32)
PDT_PACK_KERNELS(b1, unsigned char, i64, i64)
PDT_PACK_KERNELS(b2, u16, int, i32)
PDT_PACK_KERNELS(b2, u16, i64, i64)
PDT_PACK_KERNELS(b4, u32, int, i32)
PDT_PACK_KERNELS(b4, u32, i64, i64)
PDT_PACK_KERNELS(b8, u64, int, i32)
PDT_PACK_KERNELS(b8, u64, i64, i64)
