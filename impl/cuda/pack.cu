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

template <typename T, typename IDX>
__device__ __forceinline__ void pdt_pack_body(const T* __restrict__ src,
                                              const IDX* __restrict__ index, T* __restrict__ dst,
                                              i64 nnz) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
#pragma unroll 4
  for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < nnz; j += stride)
    dst[j] = src[index[j]];
}

template <typename T, typename IDX>
__device__ __forceinline__ void pdt_unpack_body(const T* __restrict__ src,
                                                const IDX* __restrict__ index,
                                                T* __restrict__ dst, i64 nnz) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
#pragma unroll 4
  for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < nnz; j += stride)
    dst[index[j]] = src[j];
}

#define PDT_PACK_KERNELS(SUF, T, IDX, ISUF)                                                 \
  extern "C" __global__ void pdt_pack_##SUF##_##ISUF(const T* src, const IDX* index, T* dst, \
                                                     i64 nnz) {                             \
    pdt_pack_body<T, IDX>(src, index, dst, nnz);                                            \
  }                                                                                         \
  extern "C" __global__ void pdt_unpack_##SUF##_##ISUF(const T* src, const IDX* index,       \
                                                       T* dst, i64 nnz) {                   \
    pdt_unpack_body<T, IDX>(src, index, dst, nnz);                                          \
  }

PDT_PACK_KERNELS(b1, unsigned char, int, i32)
PDT_PACK_KERNELS(b1, unsigned char, i64, i64)
PDT_PACK_KERNELS(b2, u16, int, i32)
PDT_PACK_KERNELS(b2, u16, i64, i64)
PDT_PACK_KERNELS(b4, u32, int, i32)
PDT_PACK_KERNELS(b4, u32, i64, i64)
PDT_PACK_KERNELS(b8, u64, int, i32)
PDT_PACK_KERNELS(b8, u64, i64, i64)
