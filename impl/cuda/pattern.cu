// Pattern-sparse kernels of ClickTrain (Sec. 5.1 and 5.2) and their training support.
//
// Conventions (every kernel):
//   * A layer's filter matrix is F x K with K = C*R*S in im2col order (column c*R*S + r*S + s),
//     row-major: element (f, k) at f * ld + k.
//   * Its kept positions are a CSR structure built once (impl.ops.pattern.pattern_positions):
//     row_ptr [F + 1] int64 and col_ind [nnz] int64, in GPU global memory; the columns of
//     each row are sorted ascending and unique (a mask's nonzeros, row-major).
//   * values [nnz] (global) hold the weights at those positions, in CSR order.
//   * Dense operands are row-major with a row stride (ld*) and, when batched, a batch
//     stride (s*), both in elements; the batch index is blockIdx.z.
//   * All sizes are in elements. No kernel allocates memory; outputs are written in full
//     unless stated (the host poisons outputs in the tests to check that).
#include "pdt_common.cuh"

// ---------------------------------------------------------------------------------------
// 1. Convert2CSR with predefined positions (Sec. 5.1): gather the values of a dense filter
//    matrix at the kept positions.
//    dense   [F x ld] global, read at (f, col_ind[j]) only
//    row_ptr [F + 1], col_ind [nnz] global
//    val     [nnz] global, written in full
//    grid: one block per row (grid-stride over rows), any block size. A thread moves
//    PDT_MOVE_LB elements of its row a round: their column loads, then their value loads,
//    then the stores.
// ---------------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void pdt_csr_gather_body(const T* __restrict__ dense, i64 ld,
                                                    const i64* __restrict__ row_ptr,
                                                    const i64* __restrict__ col_ind,
                                                    T* __restrict__ val, i64 n_rows) {
  for (i64 f = blockIdx.x; f < n_rows; f += gridDim.x) {
    const i64 b = row_ptr[f], e = row_ptr[f + 1];
    const T* __restrict__ row = dense + f * ld;
    for (i64 j0 = b + threadIdx.x; j0 < e; j0 += PDT_MOVE_LB * blockDim.x) {
      i64 c[PDT_MOVE_LB];
      T v[PDT_MOVE_LB];
#pragma unroll
      for (int i = 0; i < PDT_MOVE_LB; ++i)
        if (j0 + i * blockDim.x < e) c[i] = col_ind[j0 + i * blockDim.x];
#pragma unroll
      for (int i = 0; i < PDT_MOVE_LB; ++i)
        if (j0 + i * blockDim.x < e) v[i] = row[c[i]];
#pragma unroll
      for (int i = 0; i < PDT_MOVE_LB; ++i)
        if (j0 + i * blockDim.x < e) val[j0 + i * blockDim.x] = v[i];
    }
  }
}

// The adjoint of the gather (the gradient of pattern_csr): dense[f, col_ind[j]] = val[j].
//    val     [nnz] global
//    dense   [F x ld] global; only the kept positions are written (the host zero-fills it)
template <typename T>
__device__ __forceinline__ void pdt_csr_scatter_body(const T* __restrict__ val, i64 ld,
                                                     const i64* __restrict__ row_ptr,
                                                     const i64* __restrict__ col_ind,
                                                     T* __restrict__ dense, i64 n_rows) {
  for (i64 f = blockIdx.x; f < n_rows; f += gridDim.x) {
    const i64 b = row_ptr[f], e = row_ptr[f + 1];
    T* __restrict__ row = dense + f * ld;
    for (i64 j0 = b + threadIdx.x; j0 < e; j0 += PDT_MOVE_LB * blockDim.x) {
      i64 c[PDT_MOVE_LB];
      T v[PDT_MOVE_LB];
#pragma unroll
      for (int i = 0; i < PDT_MOVE_LB; ++i) {
        if (j0 + i * blockDim.x < e) {
          c[i] = col_ind[j0 + i * blockDim.x];
          v[i] = val[j0 + i * blockDim.x];
        }
      }
#pragma unroll
      for (int i = 0; i < PDT_MOVE_LB; ++i)
        if (j0 + i * blockDim.x < e) row[c[i]] = v[i];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Staging for the SpMM kernels: rows k0 + kk of B (those with bit kk of `used` set), columns
// [n0, n0 + TN), into tile[kk * TN + ...] (coalesced VEC-wide loads; columns >= N read as 0).
// A thread's vectors are t = threadIdx.x + i * blockDim.x; it issues the loads of LB of them
// before it stores any, so that LB loads are in flight at once. (A loop that loads one
// vector and stores it before the next load waits a full memory latency per vector: eight in
// a row per K-step at the block size the host launches.) The order of the values is the
// same, so what lands in the tile is the same.
// ---------------------------------------------------------------------------------------
// Loads in flight per thread in the staging: 64 bytes of 16-byte vectors, 32 bytes of scalars
// (the scalar fallback's 64 would spill on sm_90 in float64).
#define PDT_STAGE_LB(T, VEC) (((VEC) > 1 ? 64 : 32) / (int)(sizeof(T) * (VEC)))

template <typename T, int VEC, int TN, int LB>
__device__ __forceinline__ void pdt_stage_b_rows(const T* __restrict__ Bz, i64 ldb, int k0,
                                                 int n0, int N, u32 used,
                                                 T* __restrict__ tile) {
  constexpr int NV = TN / VEC;  // vectors per tile row
  constexpr int ITEMS = PDT_SPMM_TK * NV;
  for (int t0 = threadIdx.x; t0 < ITEMS; t0 += LB * blockDim.x) {
    T r[LB][VEC];
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      const int t = t0 + i * blockDim.x;
      const int kk = t / NV;
      const int n = n0 + (t - kk * NV) * VEC;
      if (t < ITEMS && ((used >> kk) & 1u) && n < N) {
        pdt_load_vec<T, VEC>(Bz + (i64)(k0 + kk) * ldb + n, r[i]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) r[i][j] = T(0);
      }
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      const int t = t0 + i * blockDim.x;
      const int kk = t / NV;
      if (t < ITEMS && ((used >> kk) & 1u))
        pdt_store_vec<T, VEC>(tile + kk * TN + (t - kk * NV) * VEC, r[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// The SpMM kernels' per-step masks of used B rows, double-buffered: K-step s ORs into
// used[s & 1]. After the barrier that ends a step's OR phase every thread reads used[b], and
// thread 0 clears used[b ^ 1], which the last step's threads read before that same barrier and
// the next step's threads OR into only after the step's closing barrier. No location is
// written while another thread may read it (a single mask cleared at the top of each step was
// read and cleared with no barrier between, which compute-sanitizer's racecheck reported).
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ void pdt_clear_used_masks(u32 (&used)[2]) {
  if (threadIdx.x == 0) {
    used[0] = 0u;
    used[1] = 0u;
  }
  __syncthreads();
}

__device__ __forceinline__ u32 pdt_take_used_mask(u32 (&used)[2], int b) {
  __syncthreads();  // every OR into used[b] is done
  const u32 u = used[b];
  if (threadIdx.x == 0) used[b ^ 1] = 0u;
  return u;
}

// ---------------------------------------------------------------------------------------
// 2. Pattern SpMM (Sec. 5.2): C[z] = A * B[z], A sparse F x K (CSR), B[z] dense K x N.
//    values  [nnz], row_ptr [F + 1], col_ind [nnz]  global
//    B       [batch][K x N] global, row stride ldb, batch stride sb; read once per block
//    C       [batch][F x N] global, row stride ldc, batch stride sc; written in full
//    tile    [TK x TN] shared: the rows of B's current K-step that some row of the block uses
//    used    [2] shared: bit k set when row k0 + k of B is needed by the block (double-buffered)
//    grid:   (ceil(F / WARPS), ceil(N / TN), batch); block: 32 * WARPS threads.
//    One warp per output row, one block per 1-D tile of TN columns of WARPS rows. A K-step
//    of TK = 32 columns of A holds at most 32 nonzeros of a row (sorted, unique), so each
//    warp reads its row's next 32 (col, value) pairs with one coalesced load and keeps them
//    in registers (broadcast by shuffles). VEC = 16 / sizeof(T) uses 16-byte loads and
//    stores (the host picks it only when N, ldb, sb, ldc, sc are multiples of VEC and the
//    pointers are 16-byte aligned); VEC = 1 is the scalar fallback for any size.
// ---------------------------------------------------------------------------------------
template <typename T, int VEC, int CPT>
__device__ __forceinline__ void pdt_spmm_body(const T* __restrict__ values,
                                              const i64* __restrict__ row_ptr,
                                              const i64* __restrict__ col_ind,
                                              const T* __restrict__ B, T* __restrict__ C,
                                              int F, int K, int N, i64 ldb, i64 sb, i64 ldc,
                                              i64 sc) {
  constexpr int TK = PDT_SPMM_TK;
  static_assert(TK <= 32, "a K-step must fit one warp-wide load and the 32-bit 'used' mask");
  constexpr int TN = 32 * VEC * CPT;
  __shared__ __align__(16) T tile[TK * TN];
  __shared__ u32 used[2];
  const int lane = threadIdx.x & 31;
  const int f = blockIdx.x * PDT_SPMM_WARPS + (threadIdx.x >> 5);
  const int n0 = blockIdx.y * TN;
  const T* __restrict__ Bz = B + (i64)blockIdx.z * sb;
  i64 p = 0, pend = 0;
  if (f < F) {
    p = row_ptr[f];
    pend = row_ptr[f + 1];
  }
  T acc[CPT][VEC];
#pragma unroll
  for (int i = 0; i < CPT; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[i][j] = T(0);

  pdt_clear_used_masks(used);
  for (int k0 = 0, b = 0; k0 < K; k0 += TK, b ^= 1) {
    // Phase 1: the row's nonzeros in columns [k0, k0 + TK) are the first `cnt` of the next 32.
    int c = 0x7fffffff;
    T v = T(0);
    if (p + lane < pend) {
      c = (int)col_ind[p + lane];
      v = values[p + lane];
    }
    const bool in = c < k0 + TK;
    const int cnt = __popc(__ballot_sync(PDT_FULL_MASK, in));
    if (in) atomicOr(&used[b], 1u << (c - k0));
    const u32 u = pdt_take_used_mask(used, b);
    // Phase 2: stage the used rows of B's K-step tile in shared memory (coalesced).
    if (u != 0u) pdt_stage_b_rows<T, VEC, TN, PDT_STAGE_LB(T, VEC)>(Bz, ldb, k0, n0, N, u, tile);
    __syncthreads();  // the tile is staged; every read of used[b] is done
    if (u == 0u) continue;  // block-uniform: no row of this block has a nonzero here
    // Phase 3: multiply-accumulate from shared memory.
    for (int e = 0; e < cnt; ++e) {
      const int ce = __shfl_sync(PDT_FULL_MASK, c, e) - k0;
      const T ve = __shfl_sync(PDT_FULL_MASK, v, e);
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        T r[VEC];
        pdt_load_vec<T, VEC>(tile + ce * TN + (i * 32 + lane) * VEC, r);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[i][j] += ve * r[j];
      }
    }
    p += cnt;
  }
  if (f < F) {
    T* __restrict__ Cr = C + (i64)blockIdx.z * sc + (i64)f * ldc;
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      const int n = n0 + (i * 32 + lane) * VEC;
      if (n < N) pdt_store_vec<T, VEC>(Cr + n, acc[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Row groups of the row-tiled kernels (2b, 3c): a warp's RW CSR rows f0 .. f0 + RW - 1 (rows
// at or past F are empty), walked in K-steps of 32 columns. Offsets are 32-bit, from the
// group's first nonzero (the host launches these kernels only where RW * K < 2^31). TK <= 32:
// one warp-wide load holds a row's nonzeros of a step, and one 32-bit mask its columns.
// ---------------------------------------------------------------------------------------
template <typename T, int RW, int TK>
struct PdtRowGroup {
  static_assert(TK <= 32, "a K-step must fit one warp-wide load and a 32-bit column mask");
  const T* __restrict__ vw;    // values of the group, from its first nonzero
  const i64* __restrict__ cw;  // their columns
  int p[RW], pend[RW];         // row r's next nonzero and its end

  __device__ __forceinline__ PdtRowGroup(const T* __restrict__ values,
                                         const i64* __restrict__ row_ptr,
                                         const i64* __restrict__ col_ind, int f0, int F) {
    const i64 base = f0 < F ? row_ptr[f0] : 0;
    vw = values + base;
    cw = col_ind + base;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      p[r] = 0;
      pend[r] = 0;
      if (f0 + r < F) {
        p[r] = (int)(row_ptr[f0 + r] - base);
        pend[r] = (int)(row_ptr[f0 + r + 1] - base);
      }
    }
  }

  // The K-step [k0, k0 + TK): each row's nonzeros there are the first of its next 32 (sorted,
  // unique columns). Their values go to aw[(col - k0) * RW + r] (the warp's [TK][RW] tile,
  // zero elsewhere), their columns to rmask[r] (bit col - k0); returns the union of the masks.
  // The whole warp calls it; it synchronises the warp before writing aw and after. Every
  // row's column and value are loaded before any is used, so that the warp waits one memory
  // latency per step, not one per row.
  __device__ __forceinline__ u32 gather(int k0, int lane, T* __restrict__ aw,
                                        u32 (&rmask)[RW]) {
    int c[RW];
    T v[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const bool has = p[r] + lane < pend[r];
      c[r] = has ? (int)cw[p[r] + lane] : 0x7fffffff;
      v[r] = has ? vw[p[r] + lane] : T(0);
    }
    __syncwarp();  // every lane is done reading the last step's values
    for (int i = lane; i < TK * RW; i += 32) aw[i] = T(0);
    __syncwarp();
    u32 wmask = 0u;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const bool in = c[r] < k0 + TK;
      if (in) aw[(c[r] - k0) * RW + r] = v[r];
      rmask[r] = pdt_warp_or(in ? 1u << (c[r] - k0) : 0u);
      p[r] += __popc(rmask[r]);  // one bit per nonzero
      wmask |= rmask[r];
    }
    __syncwarp();
    return wmask;
  }
};

// The RW values of a row group at one column: broadcast 16-byte loads from its tile row.
template <typename T, int RW>
__device__ __forceinline__ void pdt_load_group(const T* __restrict__ ak, T (&a)[RW]) {
  constexpr int AV = 16 / sizeof(T);
  static_assert(RW % AV == 0, "a row group must fill whole 16-byte loads");
#pragma unroll
  for (int q = 0; q < RW; q += AV) {
    T aq[AV];
    pdt_load_vec<T, AV>(ak + q, aq);
#pragma unroll
    for (int j = 0; j < AV; ++j) a[q + j] = aq[j];
  }
}

// The accumulators of a warp's row group (kernels 2b and 2c), zeroed.
template <typename T, int VEC, int CPT, int RW>
__device__ __forceinline__ void pdt_row_group_zero(T (&acc)[RW][CPT][VEC]) {
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int i = 0; i < CPT; ++i)
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[r][i][j] = T(0);
}

// A warp's multiply-accumulate over one staged K-step (kernels 2b and 2c): for each column kk
// of the union `wmask` of its rows' columns, ascending, B's row kk of the tile (row stride
// TN = 32 * VEC * CPT; CPT 16-byte loads per lane) times the RW values at aw[kk * RW ..],
// into the accumulators of every row whose mask has kk (a warp-uniform branch).
template <typename T, int VEC, int CPT, int RW>
__device__ __forceinline__ void pdt_row_group_mac(const T* __restrict__ tile,
                                                  const T* __restrict__ aw, u32 wmask,
                                                  const u32 (&rmask)[RW], int lane,
                                                  T (&acc)[RW][CPT][VEC]) {
  constexpr int TN = 32 * VEC * CPT;
  for (u32 m = wmask; m != 0u; m &= m - 1u) {
    const int kk = __ffs((int)m) - 1;
    T b[CPT][VEC];
#pragma unroll
    for (int i = 0; i < CPT; ++i)
      pdt_load_vec<T, VEC>(tile + kk * TN + (i * 32 + lane) * VEC, b[i]);
    T a[RW];
    pdt_load_group<T, RW>(aw + kk * RW, a);
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      if ((rmask[r] >> kk) & 1u) {  // warp-uniform
#pragma unroll
        for (int i = 0; i < CPT; ++i)
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[r][i][j] += a[r] * b[i][j];
      }
    }
  }
}

// The warp's rows f0 .. f0 + RW - 1 (those below F) of C (row stride ldc), columns n0 + the
// lane's CPT vectors (those below N), from the accumulators.
template <typename T, int VEC, int CPT, int RW>
__device__ __forceinline__ void pdt_row_group_store(const T (&acc)[RW][CPT][VEC],
                                                    T* __restrict__ Cz, i64 ldc, int f0, int F,
                                                    int n0, int N, int lane) {
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    if (f0 + r >= F) continue;
    T* __restrict__ Cr = Cz + (i64)(f0 + r) * ldc;
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      const int n = n0 + (i * 32 + lane) * VEC;
      if (n < N) pdt_store_vec<T, VEC>(Cr + n, acc[r][i]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// 2b. Row-tiled pattern SpMM: the product of 2 with RW rows per warp, so that each element of
//    B read from shared memory serves every row of the warp that has a nonzero there.
//    Kernel 2 reads one B element from shared memory per multiply-add, which caps it at the
//    shared-memory bandwidth (128 bytes per clock per SM on sm_80/sm_90: a quarter of the
//    FP32 FMA rate). Here a warp walks the union of its RW rows' columns in a K-step, loads
//    B's row there once into registers, and multiplies it into every row that keeps that
//    column (a warp-uniform branch: rows without it do no work, so absent positions are
//    never multiplied, as in 2). Each row's sum runs over its nonzeros in ascending column
//    order, the order of 2, so both kernels give the same bits.
//    Same arguments, layout and vector rule as 2.
//    atile   [WARPS][TK x RW] shared: the warp's rows' values in the K-step, zero elsewhere
//    grid:   (ceil(F / (WARPS * RW)), ceil(N / TN), batch); block: 32 * WARPS threads.
// ---------------------------------------------------------------------------------------
template <typename T, int VEC, int CPT, int RW>
__device__ __forceinline__ void pdt_spmm_tiled_body(const T* __restrict__ values,
                                                    const i64* __restrict__ row_ptr,
                                                    const i64* __restrict__ col_ind,
                                                    const T* __restrict__ B, T* __restrict__ C,
                                                    int F, int K, int N, i64 ldb, i64 sb,
                                                    i64 ldc, i64 sc) {
  constexpr int TK = PDT_SPMM_TK;
  constexpr int TN = 32 * VEC * CPT;
  __shared__ __align__(16) T tile[TK * TN];
  __shared__ __align__(16) T atile[PDT_SPMM_WARPS * TK * RW];
  __shared__ u32 used[2];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int f0 = (blockIdx.x * PDT_SPMM_WARPS + warp) * RW;
  const int n0 = blockIdx.y * TN;
  const T* __restrict__ Bz = B + (i64)blockIdx.z * sb;
  T* __restrict__ aw = atile + warp * (TK * RW);  // [TK][RW]: this warp's values
  PdtRowGroup<T, RW, TK> rows(values, row_ptr, col_ind, f0, F);
  T acc[RW][CPT][VEC];
  pdt_row_group_zero<T, VEC, CPT, RW>(acc);

  pdt_clear_used_masks(used);
  for (int k0 = 0, b = 0; k0 < K; k0 += TK, b ^= 1) {
    // Phase 1: the rows' values and column masks in this K-step.
    u32 rmask[RW];
    const u32 wmask = rows.gather(k0, lane, aw, rmask);
    if (lane == 0 && wmask != 0u) atomicOr(&used[b], wmask);
    const u32 u = pdt_take_used_mask(used, b);
    // Phase 2: stage the used rows of B's K-step tile in shared memory (as kernel 2).
    if (u != 0u) pdt_stage_b_rows<T, VEC, TN, PDT_STAGE_LB(T, VEC)>(Bz, ldb, k0, n0, N, u, tile);
    __syncthreads();  // the tile is staged; every read of used[b] is done
    if (u == 0u) continue;  // block-uniform
    // Phase 3: one pass over the union of the warp's columns, ascending.
    pdt_row_group_mac<T, VEC, CPT, RW>(tile, aw, wmask, rmask, lane, acc);
  }
  pdt_row_group_store<T, VEC, CPT, RW>(acc, C + (i64)blockIdx.z * sc, ldc, f0, F, n0, N, lane);
}

// ---------------------------------------------------------------------------------------
// 2c. Pipelined row-tiled pattern SpMM: kernel 2b's rows and arithmetic (the same sums in the
//    same order: the same bits), with B's K-steps staged by asynchronous copies one step
//    ahead, into two shared tiles, so that the loads of step s + 1 are in flight while step
//    s multiplies. Every row of B's step is staged (no `used` mask: with WARPS * RW rows a
//    block, nearly every row of a step is used at the papers' sparsities), and a step meets
//    two barriers, not 2b's three. K-steps are of TKP = 16 columns, so that both tiles fit the
//    static 48 KiB (2 x 16 x TN elements: 32 KiB in float32 and float64).
//    Same arguments, layout, grid and vector rule as 2b.
//    tile    [2][TKP x TN] shared: B's rows k0 .. k0 + TKP - 1 (zero past K), columns n0 ..
//    atile   [WARPS][TKP x RW] shared: the warp's rows' values in the K-step, zero elsewhere
//    Before sm_80 (no cp.async) the copies are plain loads and stores (pdt_cp_async).
// ---------------------------------------------------------------------------------------
#define PDT_SPMM_TKP 16

// Stage B's rows [k0, k0 + TKP), columns [n0, n0 + TN) into tile (rows >= K and columns
// >= N as zeros) with asynchronous copies of VEC elements, and commit them as one group.
template <typename T, int VEC, int TN>
__device__ __forceinline__ void pdt_stage_b_async(const T* __restrict__ Bz, i64 ldb, int k0,
                                                  int K, int n0, int N, T* __restrict__ tile) {
  constexpr int NV = TN / VEC;
  for (int t = threadIdx.x; t < PDT_SPMM_TKP * NV; t += blockDim.x) {
    const int kk = t / NV;
    const int cv = t - kk * NV;
    const int n = n0 + cv * VEC;
    T* dst = tile + kk * TN + cv * VEC;
    if (k0 + kk < K && n < N) {
      pdt_cp_async<(int)(VEC * sizeof(T))>(dst, Bz + (i64)(k0 + kk) * ldb + n);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) dst[j] = T(0);
    }
  }
  pdt_cp_async_commit();
}

template <typename T, int VEC, int CPT, int RW>
__device__ __forceinline__ void pdt_spmm_piped_body(const T* __restrict__ values,
                                                    const i64* __restrict__ row_ptr,
                                                    const i64* __restrict__ col_ind,
                                                    const T* __restrict__ B, T* __restrict__ C,
                                                    int F, int K, int N, i64 ldb, i64 sb,
                                                    i64 ldc, i64 sc) {
  constexpr int TK = PDT_SPMM_TKP;
  constexpr int TN = 32 * VEC * CPT;
  __shared__ __align__(16) T tile[2][TK * TN];
  __shared__ __align__(16) T atile[PDT_SPMM_WARPS * TK * RW];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int f0 = (blockIdx.x * PDT_SPMM_WARPS + warp) * RW;
  const int n0 = blockIdx.y * TN;
  const T* __restrict__ Bz = B + (i64)blockIdx.z * sb;
  T* __restrict__ aw = atile + warp * (TK * RW);  // [TK][RW]: this warp's values
  PdtRowGroup<T, RW, TK> rows(values, row_ptr, col_ind, f0, F);
  T acc[RW][CPT][VEC];
  pdt_row_group_zero<T, VEC, CPT, RW>(acc);

  const int steps = (K + TK - 1) / TK;
  pdt_stage_b_async<T, VEC, TN>(Bz, ldb, 0, K, n0, N, tile[0]);
  for (int s = 0; s < steps; ++s) {
    const int k0 = s * TK;
    // Step s + 1's copies go to the tile that step s - 1 read: every thread passed the
    // barrier that ended step s - 1 before any thread gets here.
    if (s + 1 < steps) pdt_stage_b_async<T, VEC, TN>(Bz, ldb, k0 + TK, K, n0, N, tile[(s + 1) & 1]);
    // The rows' columns and values of step s load while the copies are in flight (the wait's
    // memory clobber would otherwise hold these loads behind it: two latencies a step).
    u32 rmask[RW];
    const u32 wmask = rows.gather(k0, lane, aw, rmask);  // synchronises the warp
    if (s + 1 < steps) {
      pdt_cp_async_wait<1>();  // this thread's copies of step s are done
    } else {
      pdt_cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of step s are done and visible
    pdt_row_group_mac<T, VEC, CPT, RW>(tile[s & 1], aw, wmask, rmask, lane, acc);
    __syncthreads();  // every read of tile[s & 1] is done before step s + 2's copies
  }
  pdt_row_group_store<T, VEC, CPT, RW>(acc, C + (i64)blockIdx.z * sc, ldc, f0, F, n0, N, lane);
}

// ---------------------------------------------------------------------------------------
// 3a. SDDMM for the weight gradient: partial[s, j] = sum over (z, n) in split s of
//     G[z][f, n] * Bm[z][col_ind[j], n] for every nonzero j of row f (only kept positions).
//    row_ptr [F + 1], col_ind [nnz]  global
//    G       [batch][F x N] global (the output gradient), row stride ldg, batch stride sg
//    Bm      [batch][K x N] global (the im2col matrix), row stride ldb, batch stride sb
//    partial [gridDim.z * gridDim.y][nnz] global; every entry of a block's row is written;
//            the host sums the splits in a fixed order (deterministic)
//    gseg    [SEG] shared: a segment of G's row f, reused by every nonzero of the row
//    accs    [EB] shared: running sums of up to EB nonzeros of the row
//    grid:   (F, ceil(N / n_chunk), ceil(batch / b_group)); block: any multiple of 32.
//    A warp per nonzero; its lanes stride the segment (VEC-wide when aligned) and reduce
//    with shuffles in a fixed order.
// ---------------------------------------------------------------------------------------
// The split of an SDDMM block (both kernels): columns [nlo, nhi) and batches [blo, bhi) of the
// reduction (blockIdx.y, blockIdx.z), and the split's row of partial sums.
template <typename T>
struct PdtSddmmSplit {
  int nlo, nhi, blo, bhi;
  T* out;

  __device__ __forceinline__ PdtSddmmSplit(T* partial, int N, int batch, int n_chunk,
                                           int b_group, i64 nnz) {
    nlo = blockIdx.y * n_chunk;
    nhi = min(N, nlo + n_chunk);
    blo = blockIdx.z * b_group;
    bhi = min(batch, blo + b_group);
    out = partial + ((i64)blockIdx.z * gridDim.y + blockIdx.y) * nnz;
  }
};

// Both SDDMM kernels read a kept column's row of Bm over a segment of len columns, a lane's
// part at t = ((i0 + i) * 32 + lane) * VEC: PDT_SDDMM_NB(T, VEC) loads (64 bytes) in flight a
// lane. This loads group i0 .. i0 + NB - 1 of them into b (entries at t >= len untouched).
#define PDT_SDDMM_NB(T, VEC) (64 / (int)(sizeof(T) * (VEC)))

template <typename T, int VEC, int NB>
__device__ __forceinline__ void pdt_sddmm_load_b(const T* __restrict__ Br, int i0, int lane,
                                                 int len, T (&b)[NB][VEC]) {
#pragma unroll
  for (int i = 0; i < NB; ++i) {
    const int t = ((i0 + i) * 32 + lane) * VEC;
    if (t < len) pdt_load_vec<T, VEC>(Br + t, b[i]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void pdt_sddmm_body(const i64* __restrict__ row_ptr,
                                               const i64* __restrict__ col_ind,
                                               const T* __restrict__ G, const T* __restrict__ Bm,
                                               T* __restrict__ partial, int N, int batch,
                                               i64 ldg, i64 sg, i64 ldb, i64 sb, int n_chunk,
                                               int b_group, i64 nnz) {
  constexpr int SEG = PDT_SDDMM_SEG;
  constexpr int EB = PDT_SDDMM_EB;
  __shared__ __align__(16) T gseg[SEG];
  __shared__ T accs[EB];
  const int f = blockIdx.x;
  const i64 rb = row_ptr[f], re = row_ptr[f + 1];
  const PdtSddmmSplit<T> sp(partial, N, batch, n_chunk, b_group, nnz);
  const int nlo = sp.nlo, nhi = sp.nhi, blo = sp.blo, bhi = sp.bhi;
  T* __restrict__ out = sp.out;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (i64 eb = rb; eb < re; eb += EB) {
    const int ne = (int)min((i64)EB, re - eb);
    for (int e = threadIdx.x; e < ne; e += blockDim.x) accs[e] = T(0);
    for (int z = blo; z < bhi; ++z) {
      for (int s0 = nlo; s0 < nhi; s0 += SEG) {
        const int len = min(SEG, nhi - s0);
        __syncthreads();  // earlier readers of gseg are done; accs reset is visible
        const T* __restrict__ Gr = G + (i64)z * sg + (i64)f * ldg + s0;
        for (int t = threadIdx.x * VEC; t < len; t += blockDim.x * VEC) {
          T r[VEC];
          pdt_load_vec<T, VEC>(Gr + t, r);
          pdt_store_vec<T, VEC>(gseg + t, r);
        }
        __syncthreads();
        for (int e = warp; e < ne; e += nwarps) {
          const i64 k = col_ind[eb + e];
          const T* __restrict__ Br = Bm + (i64)z * sb + k * ldb + s0;
          T sum = T(0);
          // NB loads of Bm's row in flight (as 3d), then the products in the lane's t order
          constexpr int NB = PDT_SDDMM_NB(T, VEC);
          for (int i0 = 0; i0 * 32 * VEC < len; i0 += NB) {  // warp-uniform
            T b[NB][VEC];
            pdt_sddmm_load_b<T, VEC, NB>(Br, i0, lane, len, b);
#pragma unroll
            for (int i = 0; i < NB; ++i) {
              const int t = ((i0 + i) * 32 + lane) * VEC;
              if (t < len) {
                T a[VEC];
                pdt_load_vec<T, VEC>(gseg + t, a);
#pragma unroll
                for (int j = 0; j < VEC; ++j) sum += a[j] * b[i][j];
              }
            }
          }
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(PDT_FULL_MASK, sum, o);
          if (lane == 0) accs[e] += sum;
        }
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ne; e += blockDim.x) out[eb + e] = accs[e];
    __syncthreads();  // before the next group of nonzeros resets accs
  }
}

// ---------------------------------------------------------------------------------------
// 3d. Row-tiled SDDMM: the weight gradient of 3a with RT rows of the filter matrix per block,
//    so that a segment of a row of Bm, read once from global memory (L2), serves every row of
//    the block that keeps that column. 3a reads Bm's row k once per nonzero (f, k): at the
//    paper's shape (256 x 1152 at 60% sparsity, N = 50176) that is about 24 GB through L2
//    per call; here once per block that keeps k, about RT * density times less.
//    The columns are walked in chunks of KC: for each chunk, the block's rows' nonzeros there
//    (a column's bit r in keep[] when row f0 + r keeps it), the union of their columns
//    (ucol, ascending), then for each batch z and segment of SEG columns of the split: the RT
//    rows of G's segment go to shared memory, a warp per union column loads Bm's segment
//    into registers, and every row keeping the column adds its dot product to accs. Each
//    nonzero's sum runs over (z, segment) in the order of 3a, with 3a's lane-strided partial
//    sums and shuffle tree, so with the same split (the host computes it from the number of
//    row blocks, for both kernels) both kernels write the same bits.
//    Same arguments as 3a, plus F (rows) and K (columns of the filter matrix; < 2^30).
//    gseg    [RT x SEG] shared: the block's rows of G's segment (row r at r * SEG)
//    accs    [KC x RT] shared: running sums of the chunk's nonzeros, by (column, row)
//    keep    [KC] shared: the rows (bits) that keep each column of the chunk
//    ucol    [KC] shared: the chunk's union columns, ascending; n_union of them
//    grid:   (ceil(F / RT), ceil(N / n_chunk), ceil(batch / b_group)); block: 32 * 8 threads.
// ---------------------------------------------------------------------------------------
template <typename T, int VEC, int RT>
__device__ __forceinline__ void pdt_sddmm_tiled_body(const i64* __restrict__ row_ptr,
                                                     const i64* __restrict__ col_ind,
                                                     const T* __restrict__ G,
                                                     const T* __restrict__ Bm,
                                                     T* __restrict__ partial, int F, int K,
                                                     int N, int batch, i64 ldg, i64 sg,
                                                     i64 ldb, i64 sb, int n_chunk, int b_group,
                                                     i64 nnz) {
  constexpr int SEG = PDT_SDDMM_SEG;
  constexpr int KC = PDT_SDDMM_KC;
  constexpr int NB = PDT_SDDMM_NB(T, VEC);  // a lane's loads of Bm in flight at once
  static_assert(SEG % (32 * VEC * NB) == 0, "a segment is whole groups of warp-wide loads");
  static_assert(KC % 32 == 0, "the union is compacted 32 columns per ballot");
  static_assert(RT >= 1 && RT <= 32, "a column's rows are the bits of one 32-bit word");
  __shared__ __align__(16) T gseg[RT * SEG];
  __shared__ T accs[KC * RT];
  __shared__ u32 keep[KC];
  __shared__ int ucol[KC];
  __shared__ int n_union;
  __shared__ i64 pbeg[RT], pnext[RT];  // row r's first nonzero in the chunk, and past its last
  const int f0 = blockIdx.x * RT;
  const int rows = min(RT, F - f0);
  const PdtSddmmSplit<T> sp(partial, N, batch, n_chunk, b_group, nnz);
  const int nlo = sp.nlo, nhi = sp.nhi, blo = sp.blo, bhi = sp.bhi;
  T* __restrict__ out = sp.out;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (row_ptr[f0] == row_ptr[f0 + rows]) return;  // block-uniform: no nonzero, nothing to write
  for (int r = threadIdx.x; r < rows; r += blockDim.x) pbeg[r] = row_ptr[f0 + r];
  for (int kc0 = 0; kc0 < K; kc0 += KC) {
    __syncthreads();  // the last chunk's readers of keep, accs and pbeg are done
    for (int c = threadIdx.x; c < KC; c += blockDim.x) keep[c] = 0u;
    for (int i = threadIdx.x; i < KC * RT; i += blockDim.x) accs[i] = T(0);
    __syncthreads();
    // The rows' nonzeros in [kc0, kc0 + KC): the first of each row's remaining ones (sorted).
    for (int r = warp; r < rows; r += nwarps) {
      const i64 re = row_ptr[f0 + r + 1];
      i64 q = pbeg[r];
      for (;;) {
        const i64 i = q + lane;
        const int c = i < re ? (int)col_ind[i] : 0x7fffffff;
        const bool in = c < kc0 + KC;
        // (a guard, not a rule: columns are sorted and < K, so every counted one is in range)
        if (in && c >= kc0) atomicOr(&keep[c - kc0], 1u << r);
        const int cnt = __popc(__ballot_sync(PDT_FULL_MASK, in));
        q += cnt;
        if (cnt < 32) break;  // warp-uniform
      }
      if (lane == 0) pnext[r] = q;
    }
    __syncthreads();
    if (warp == 0) {  // compact the union columns, ascending
      int base = 0;
      for (int c0 = 0; c0 < KC; c0 += 32) {
        const bool any = keep[c0 + lane] != 0u;
        const u32 bal = __ballot_sync(PDT_FULL_MASK, any);
        if (any) ucol[base + __popc(bal & ((1u << lane) - 1u))] = c0 + lane;
        base += __popc(bal);
      }
      if (lane == 0) n_union = base;
    }
    __syncthreads();
    const int nu = n_union;
    if (nu > 0) {  // block-uniform
      for (int z = blo; z < bhi; ++z) {
        for (int s0 = nlo; s0 < nhi; s0 += SEG) {
          const int len = min(SEG, nhi - s0);
          __syncthreads();  // earlier readers of gseg are done
          const T* __restrict__ Gz = G + (i64)z * sg + (i64)f0 * ldg + s0;
          // LB loads in flight a thread before its stores (as pdt_stage_b_rows)
          constexpr int LB = PDT_STAGE_LB(T, VEC);
          const int items = rows * SEG;
          for (int t0 = threadIdx.x * VEC; t0 < items; t0 += LB * blockDim.x * VEC) {
            T v[LB][VEC];
#pragma unroll
            for (int i = 0; i < LB; ++i) {
              const int t = t0 + i * blockDim.x * VEC;
              const int r = t / SEG, o = t - (t / SEG) * SEG;
              if (t < items && o < len) pdt_load_vec<T, VEC>(Gz + (i64)r * ldg + o, v[i]);
            }
#pragma unroll
            for (int i = 0; i < LB; ++i) {
              const int t = t0 + i * blockDim.x * VEC;
              if (t < items && t - (t / SEG) * SEG < len) pdt_store_vec<T, VEC>(gseg + t, v[i]);
            }
          }
          __syncthreads();
          for (int u = warp; u < nu; u += nwarps) {
            const int c = ucol[u];
            const u32 m = keep[c];
            const T* __restrict__ Br = Bm + (i64)z * sb + (i64)(kc0 + c) * ldb + s0;
            // The lane's part of Bm's segment (t = lane * VEC + i * 32 * VEC, 3a's order),
            // NB loads in flight at a time, then each kept row's products in that order.
            T sum[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) sum[r] = T(0);
            for (int i0 = 0; i0 * 32 * VEC < len; i0 += NB) {  // warp-uniform
              T b[NB][VEC];
              pdt_sddmm_load_b<T, VEC, NB>(Br, i0, lane, len, b);
#pragma unroll
              for (int i = 0; i < NB; ++i) {
                const int t = ((i0 + i) * 32 + lane) * VEC;
                if (t < len) {
#pragma unroll
                  for (int r = 0; r < RT; ++r) {
                    if ((m >> r) & 1u) {  // warp-uniform
                      T a[VEC];
                      pdt_load_vec<T, VEC>(gseg + r * SEG + t, a);
#pragma unroll
                      for (int j = 0; j < VEC; ++j) sum[r] += a[j] * b[i][j];
                    }
                  }
                }
              }
            }
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              if ((m >> r) & 1u) {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                  sum[r] += __shfl_xor_sync(PDT_FULL_MASK, sum[r], o);
                if (lane == 0) accs[c * RT + r] += sum[r];
              }
            }
          }
        }
      }
    }
    __syncthreads();
    for (int r = 0; r < rows; ++r)
      for (i64 j = pbeg[r] + threadIdx.x; j < pnext[r]; j += blockDim.x)
        out[j] = (unsigned)((int)col_ind[j] - kc0) < (unsigned)KC  // the same guard
                     ? accs[((int)col_ind[j] - kc0) * RT + r]
                     : T(0);
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) pbeg[r] = pnext[r];
  }
}

// ---------------------------------------------------------------------------------------
// The implicit convs' output positions: lane `lane` owns positions n0 + lane + 32 t (t < CPT)
// of the Bt x Ho x Wo outputs; for each, whether it exists (ok), the top-left input pixel of
// its window (ih0, iw0) and that pixel's offset in x (xb, before the channel offset).
// ---------------------------------------------------------------------------------------
template <int CPT>
struct PdtConvPositions {
  i64 xb[CPT];
  int ih0[CPT], iw0[CPT];
  bool ok[CPT];

  __device__ __forceinline__ PdtConvPositions(i64 n0, int lane, i64 total, i64 L, int Wo,
                                              int sh, int sw, int ph, int pw, i64 chw,
                                              int W) {
#pragma unroll
    for (int t = 0; t < CPT; ++t) {
      const i64 n = n0 + t * 32 + lane;
      ok[t] = n < total;
      const i64 z = ok[t] ? n / L : 0;
      const int l = ok[t] ? (int)(n - z * L) : 0;
      const int pp = l / Wo, qq = l - (l / Wo) * Wo;
      ih0[t] = pp * sh - ph;
      iw0[t] = qq * sw - pw;
      xb[t] = z * chw + (i64)ih0[t] * W + iw0[t];
    }
  }

  // out[z, f, position] = acc[t] + bias[f] (when has_bias) for each existing position.
  template <typename T>
  __device__ __forceinline__ void store(T* __restrict__ out, const T (&acc)[CPT],
                                        const T* __restrict__ bias, int has_bias, int f, int F,
                                        i64 n0, int lane, i64 L) const {
    const T bf = has_bias ? bias[f] : T(0);
#pragma unroll
    for (int t = 0; t < CPT; ++t) {
      if (!ok[t]) continue;
      const i64 n = n0 + t * 32 + lane;
      const i64 z = n / L;
      out[(z * F + f) * L + (n - z * L)] = acc[t] + bf;
    }
  }
};

// ---------------------------------------------------------------------------------------
// 3b. Implicit-im2col pattern convolution (forward): never materialises the im2col matrix.
//     out[z, f, p, q] = bias[f] + sum_j values[j] * x[z, c_j, p*sh - ph + r_j*dh,
//                                                    q*sw - pw + s_j*dw]
//     over the nonzeros j of row f, col_ind[j] = c_j*R*S + r_j*S + s_j; out-of-image reads
//     are zero (zero padding).
//    x       [Bt, C, H, W] global, contiguous NCHW
//    values  [nnz], row_ptr [F + 1], col_ind [nnz] global
//    bias    [F] global, read only when has_bias
//    out     [Bt, F, Ho, Wo] global, contiguous, written in full
//    grid:   (ceil(F / WARPS), tiles, 1), block: 32 * WARPS threads; block (bx, by) computes
//            position tile tile0 + by (the host launches chunks of at most 65535 tiles).
//    One warp per filter; lane i of the warp owns output positions n0 + i + 32*t (t < CPT),
//    so neighbouring lanes read neighbouring input pixels (coalesced when sw == 1).
// ---------------------------------------------------------------------------------------
#define PDT_CONV_U 4  // nonzeros of a row whose input pixels are loaded together (3b)

template <typename T>
__device__ __forceinline__ void pdt_conv_implicit_body(
    const T* __restrict__ x, const T* __restrict__ values, const i64* __restrict__ row_ptr,
    const i64* __restrict__ col_ind, const T* __restrict__ bias, T* __restrict__ out, int Bt,
    int C, int H, int W, int F, int R, int S, int Ho, int Wo, int sh, int sw, int ph, int pw,
    int dh, int dw, int has_bias, i64 tile0) {
  constexpr int CPT = PDT_CONV_CPT;
  const int lane = threadIdx.x & 31;
  const int f = blockIdx.x * PDT_SPMM_WARPS + (threadIdx.x >> 5);
  if (f >= F) return;  // warp-uniform; no block-wide barrier below
  const i64 L = (i64)Ho * Wo;
  const i64 total = (i64)Bt * L;
  const i64 n0 = (tile0 + blockIdx.y) * (32 * CPT);
  const PdtConvPositions<CPT> pos(n0, lane, total, L, Wo, sh, sw, ph, pw, (i64)C * H * W, W);
  T acc[CPT];
#pragma unroll
  for (int t = 0; t < CPT; ++t) acc[t] = T(0);
  const int RS = R * S;
  const i64 pend = row_ptr[f + 1];
  for (i64 p = row_ptr[f]; p < pend; p += 32) {
    const int cnt = (int)min((i64)32, pend - p);
    int off = 0, dr = 0, ds = 0;
    T v = T(0);
    if (lane < cnt) {
      const int col = (int)col_ind[p + lane];
      const int c = col / RS;
      const int rs = col - c * RS;
      const int r = rs / S;
      const int s = rs - r * S;
      dr = r * dh;
      ds = s * dw;
      off = c * H * W + dr * W + ds;
      v = values[p + lane];
    }
    // PDT_CONV_U nonzeros a round: all their pixels loaded, then multiplied in order
    for (int e0 = 0; e0 < cnt; e0 += PDT_CONV_U) {
      T xv[PDT_CONV_U][CPT], ve[PDT_CONV_U];
      bool inb[PDT_CONV_U][CPT];
#pragma unroll
      for (int u = 0; u < PDT_CONV_U; ++u) {
        const int e = min(e0 + u, 31);  // lanes past cnt hold no nonzero: skipped below
        const int oe = __shfl_sync(PDT_FULL_MASK, off, e);
        const int dre = __shfl_sync(PDT_FULL_MASK, dr, e);
        const int dse = __shfl_sync(PDT_FULL_MASK, ds, e);
        ve[u] = __shfl_sync(PDT_FULL_MASK, v, e);
#pragma unroll
        for (int t = 0; t < CPT; ++t) {
          const int ih = pos.ih0[t] + dre, iw = pos.iw0[t] + dse;
          inb[u][t] = e0 + u < cnt && pos.ok[t] && (unsigned)ih < (unsigned)H &&
                      (unsigned)iw < (unsigned)W;
          xv[u][t] = inb[u][t] ? x[pos.xb[t] + oe] : T(0);
        }
      }
#pragma unroll
      for (int u = 0; u < PDT_CONV_U; ++u)
#pragma unroll
        for (int t = 0; t < CPT; ++t)
          if (inb[u][t]) acc[t] += ve[u] * xv[u][t];
    }
  }
  pos.store<T>(out, acc, bias, has_bias, f, F, n0, lane, L);
}

// ---------------------------------------------------------------------------------------
// 3c. Row-tiled implicit-im2col pattern convolution: the output of 3b with RW filters per
//     warp. Per K-step of 32 columns each warp gathers its filters' values into `atile` and
//     one column mask per filter, lane i decodes column k0 + i once, and the warp walks the
//     union of its filters' columns in ascending order: each lane reads its CPT input pixels
//     for the column once (with the bounds test once) and multiplies them into every filter
//     that keeps the column. Each filter's sum runs over its nonzeros in ascending column
//     order and skips out-of-image pixels, as in 3b: the same bits.
//    atile   [WARPS][TK x RW] shared, per warp (no block-wide barrier in this kernel)
//    grid:   (ceil(F / (WARPS * RW)), tiles, 1); block: 32 * WARPS threads.
// ---------------------------------------------------------------------------------------
template <typename T, int RW>
__device__ __forceinline__ void pdt_conv_implicit_tiled_body(
    const T* __restrict__ x, const T* __restrict__ values, const i64* __restrict__ row_ptr,
    const i64* __restrict__ col_ind, const T* __restrict__ bias, T* __restrict__ out, int Bt,
    int C, int H, int W, int F, int R, int S, int Ho, int Wo, int sh, int sw, int ph, int pw,
    int dh, int dw, int has_bias, i64 tile0) {
  constexpr int CPT = PDT_CONV_CPT;
  constexpr int TK = 32;
  __shared__ __align__(16) T atile[PDT_SPMM_WARPS * TK * RW];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int f0 = (blockIdx.x * PDT_SPMM_WARPS + warp) * RW;
  if (f0 >= F) return;  // warp-uniform; only warp-level collectives below
  T* __restrict__ aw = atile + warp * (TK * RW);
  const i64 L = (i64)Ho * Wo;
  const i64 total = (i64)Bt * L;
  const i64 n0 = (tile0 + blockIdx.y) * (32 * CPT);
  const PdtConvPositions<CPT> pos(n0, lane, total, L, Wo, sh, sw, ph, pw, (i64)C * H * W, W);
  PdtRowGroup<T, RW, TK> rows(values, row_ptr, col_ind, f0, F);
  T acc[RW][CPT];
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int t = 0; t < CPT; ++t) acc[r][t] = T(0);
  const int RS = R * S;
  const int K = C * RS;
  for (int k0 = 0; k0 < K; k0 += TK) {
    u32 rmask[RW];
    const u32 wmask = rows.gather(k0, lane, aw, rmask);
    if (wmask == 0u) continue;  // warp-uniform
    int off = 0, dr = 0, ds = 0;  // lane i: column k0 + i decoded once
    if (k0 + lane < K) {
      const int col = k0 + lane;
      const int c = col / RS;
      const int rs = col - c * RS;
      const int r = rs / S;
      dr = r * dh;
      ds = (rs - r * S) * dw;
      off = c * H * W + dr * W + ds;
    }
    for (u32 m = wmask; m != 0u; m &= m - 1u) {
      const int kk = __ffs((int)m) - 1;
      const int oe = __shfl_sync(PDT_FULL_MASK, off, kk);
      const int dre = __shfl_sync(PDT_FULL_MASK, dr, kk);
      const int dse = __shfl_sync(PDT_FULL_MASK, ds, kk);
      T xv[CPT];
      bool inb[CPT];
#pragma unroll
      for (int t = 0; t < CPT; ++t) {
        const int ih = pos.ih0[t] + dre, iw = pos.iw0[t] + dse;
        inb[t] = pos.ok[t] && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
        xv[t] = inb[t] ? x[pos.xb[t] + oe] : T(0);
      }
      T a[RW];
      pdt_load_group<T, RW>(aw + kk * RW, a);
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        if ((rmask[r] >> kk) & 1u) {  // warp-uniform
#pragma unroll
          for (int t = 0; t < CPT; ++t)
            if (inb[t]) acc[r][t] += a[r] * xv[t];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RW; ++r)
    if (f0 + r < F) pos.store<T>(out, acc[r], bias, has_bias, f0 + r, F, n0, lane, L);
}

// ---------------------------------------------------------------------------------------
// extern "C" entry points, one per dtype (and per vector width where it applies)
// ---------------------------------------------------------------------------------------
#define PDT_PATTERN_KERNELS(SUF, T, VEC, TN, RW, RT)                                          \
  extern "C" __global__ void pdt_csr_gather_##SUF(const T* dense, i64 ld, const i64* row_ptr, \
                                                  const i64* col_ind, T* val, i64 n_rows) {   \
    pdt_csr_gather_body<T>(dense, ld, row_ptr, col_ind, val, n_rows);                         \
  }                                                                                           \
  extern "C" __global__ void pdt_csr_scatter_##SUF(const T* val, i64 ld, const i64* row_ptr,  \
                                                   const i64* col_ind, T* dense,              \
                                                   i64 n_rows) {                              \
    pdt_csr_scatter_body<T>(val, ld, row_ptr, col_ind, dense, n_rows);                        \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS, 4)                         \
      pdt_spmm_##SUF##_vec(const T* values, const i64* row_ptr, const i64* col_ind,           \
                           const T* B, T* C, int F, int K, int N, i64 ldb, i64 sb, i64 ldc,   \
                           i64 sc) {                                                          \
    pdt_spmm_body<T, VEC, (TN) / (32 * VEC)>(values, row_ptr, col_ind, B, C, F, K, N, ldb,    \
                                             sb, ldc, sc);                                    \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS, 4)                         \
      pdt_spmm_##SUF##_scalar(const T* values, const i64* row_ptr, const i64* col_ind,        \
                              const T* B, T* C, int F, int K, int N, i64 ldb, i64 sb,         \
                              i64 ldc, i64 sc) {                                              \
    pdt_spmm_body<T, 1, (TN) / 32>(values, row_ptr, col_ind, B, C, F, K, N, ldb, sb, ldc,     \
                                   sc);                                                       \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS, 2)                        \
      pdt_spmm_tiled_##SUF##_vec(const T* values, const i64* row_ptr, const i64* col_ind,     \
                                 const T* B, T* C, int F, int K, int N, i64 ldb, i64 sb,      \
                                 i64 ldc, i64 sc) {                                           \
    pdt_spmm_tiled_body<T, VEC, (TN) / (32 * VEC), RW>(values, row_ptr, col_ind, B, C, F, K,  \
                                                       N, ldb, sb, ldc, sc);                  \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS, 2)                        \
      pdt_spmm_tiled_##SUF##_scalar(const T* values, const i64* row_ptr, const i64* col_ind,  \
                                    const T* B, T* C, int F, int K, int N, i64 ldb, i64 sb,   \
                                    i64 ldc, i64 sc) {                                        \
    pdt_spmm_tiled_body<T, 1, (TN) / 32, RW>(values, row_ptr, col_ind, B, C, F, K, N, ldb,    \
                                             sb, ldc, sc);                                    \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS, 2)                        \
      pdt_spmm_piped_##SUF##_vec(const T* values, const i64* row_ptr, const i64* col_ind,     \
                                 const T* B, T* C, int F, int K, int N, i64 ldb, i64 sb,      \
                                 i64 ldc, i64 sc) {                                           \
    pdt_spmm_piped_body<T, VEC, (TN) / (32 * VEC), RW>(values, row_ptr, col_ind, B, C, F, K,  \
                                                       N, ldb, sb, ldc, sc);                  \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS, 2)                        \
      pdt_spmm_piped_##SUF##_scalar(const T* values, const i64* row_ptr, const i64* col_ind,  \
                                    const T* B, T* C, int F, int K, int N, i64 ldb, i64 sb,   \
                                    i64 ldc, i64 sc) {                                        \
    pdt_spmm_piped_body<T, 1, (TN) / 32, RW>(values, row_ptr, col_ind, B, C, F, K, N, ldb,    \
                                             sb, ldc, sc);                                    \
  }                                                                                           \
  extern "C" __global__ void pdt_sddmm_##SUF##_vec(                                           \
      const i64* row_ptr, const i64* col_ind, const T* G, const T* Bm, T* partial, int N,     \
      int batch, i64 ldg, i64 sg, i64 ldb, i64 sb, int n_chunk, int b_group, i64 nnz) {       \
    pdt_sddmm_body<T, VEC>(row_ptr, col_ind, G, Bm, partial, N, batch, ldg, sg, ldb, sb,      \
                           n_chunk, b_group, nnz);                                            \
  }                                                                                           \
  extern "C" __global__ void pdt_sddmm_##SUF##_scalar(                                        \
      const i64* row_ptr, const i64* col_ind, const T* G, const T* Bm, T* partial, int N,     \
      int batch, i64 ldg, i64 sg, i64 ldb, i64 sb, int n_chunk, int b_group, i64 nnz) {       \
    pdt_sddmm_body<T, 1>(row_ptr, col_ind, G, Bm, partial, N, batch, ldg, sg, ldb, sb,        \
                         n_chunk, b_group, nnz);                                              \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) pdt_sddmm_tiled_##SUF##_vec(              \
      const i64* row_ptr, const i64* col_ind, const T* G, const T* Bm, T* partial, int F,     \
      int K, int N, int batch, i64 ldg, i64 sg, i64 ldb, i64 sb, int n_chunk, int b_group,    \
      i64 nnz) {                                                                              \
    pdt_sddmm_tiled_body<T, VEC, RT>(row_ptr, col_ind, G, Bm, partial, F, K, N, batch, ldg,   \
                                     sg, ldb, sb, n_chunk, b_group, nnz);                     \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256, 2) pdt_sddmm_tiled_##SUF##_scalar(        \
      const i64* row_ptr, const i64* col_ind, const T* G, const T* Bm, T* partial, int F,     \
      int K, int N, int batch, i64 ldg, i64 sg, i64 ldb, i64 sb, int n_chunk, int b_group,    \
      i64 nnz) {                                                                              \
    pdt_sddmm_tiled_body<T, 1, RT>(row_ptr, col_ind, G, Bm, partial, F, K, N, batch, ldg, sg, \
                                   ldb, sb, n_chunk, b_group, nnz);                           \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS) pdt_conv_implicit_##SUF(  \
      const T* x, const T* values, const i64* row_ptr, const i64* col_ind, const T* bias,     \
      T* out, int Bt, int C, int H, int W, int F, int R, int S, int Ho, int Wo, int sh,       \
      int sw, int ph, int pw, int dh, int dw, int has_bias, i64 tile0) {                      \
    pdt_conv_implicit_body<T>(x, values, row_ptr, col_ind, bias, out, Bt, C, H, W, F, R, S,   \
                              Ho, Wo, sh, sw, ph, pw, dh, dw, has_bias, tile0);               \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * PDT_SPMM_WARPS, 2)                        \
      pdt_conv_implicit_tiled_##SUF(const T* x, const T* values, const i64* row_ptr,          \
                                    const i64* col_ind, const T* bias, T* out, int Bt, int C, \
                                    int H, int W, int F, int R, int S, int Ho, int Wo, int sh, \
                                    int sw, int ph, int pw, int dh, int dw, int has_bias,     \
                                    i64 tile0) {                                              \
    pdt_conv_implicit_tiled_body<T, RW>(x, values, row_ptr, col_ind, bias, out, Bt, C, H, W,  \
                                        F, R, S, Ho, Wo, sh, sw, ph, pw, dh, dw, has_bias,    \
                                        tile0);                                               \
  }

PDT_PATTERN_KERNELS(f32, float, 4, PDT_SPMM_TN_F32, PDT_SPMM_RW_F32, PDT_SDDMM_RT_F32)
PDT_PATTERN_KERNELS(f64, double, 2, PDT_SPMM_TN_F64, PDT_SPMM_RW_F64, PDT_SDDMM_RT_F64)
