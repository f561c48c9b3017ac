// N:M pruning of SDGP (McDanel et al. 2022, Sec. III-A/B): of every m consecutive elements
// along one dimension keep n, by magnitude (ties to the lowest index), at random, or by
// magnitude followed by an L1-preserving rescale.
//
// The host views the tensor as x[O, C, I] with element strides (so, sc, si): C is the
// grouping dimension, O the product of the dimensions before it, I of those after it (NCHW
// with dim=1: O=N, I=H*W, sc=H*W, si=1; channels-last: sc=1, si=C). The output y has the same
// strides. Groups are g = 0 .. G-1, G = ceil(C / m); group g holds channels [g*m, g*m + r),
// r = min(m, C - g*m): a partial last group keeps min(n, r) of its r elements, as the
// reference does (it pads with scores of -inf, which are never kept).
//
// Element types: float32, float64, and float16 / bfloat16 handled as raw 16-bit words.
// Scores and sums use A = float (float64 for float64 inputs), as the torch reference does.
// NaN magnitudes rank above every number (torch's sort puts NaN first when descending);
// equal scores keep the lowest index (torch's stable sort).
#include "pdt_common.cuh"

#define PDT_NM_MAGNITUDE 0
#define PDT_NM_RANDOM 1
#define PDT_NM_RESCALED 2

__device__ __forceinline__ float pdt_abs(float a) {
  return __uint_as_float(__float_as_uint(a) & 0x7fffffffu);
}
__device__ __forceinline__ double pdt_abs(double a) {
  return __longlong_as_double(__double_as_longlong(a) & 0x7fffffffffffffffLL);
}

// Ranking key of a magnitude: the bits of |a|. Non-negative IEEE numbers order like their
// bit patterns (denormals included, whatever -ftz says); every NaN maps to one key above
// +inf, so NaNs rank above every number and tie among themselves, as in torch's sort.
__device__ __forceinline__ u32 pdt_mag_key(float a) {
  const u32 b = __float_as_uint(a) & 0x7fffffffu;
  return b > 0x7f800000u ? 0x7f800001u : b;
}
__device__ __forceinline__ u64 pdt_mag_key(double a) {
  const u64 b = (u64)__double_as_longlong(a) & 0x7fffffffffffffffull;
  return b > 0x7ff0000000000000ull ? 0x7ff0000000000001ull : b;
}

// Rank of this lane's key among the valid lanes of its W-lane sub-warp: the number of lanes
// j that sort before it (greater key, or equal key and j < k). Every lane of the warp must
// call it (shuffles). The lanes outside the group (k >= r) must pass key 0: they then never
// count for a lane inside it (0 is no greater than any key, and they all have j >= r > k),
// so no bounds test is needed; their own rank is meaningless. A lane does not count itself
// (equal key, j == k).
template <int W, typename S>
__device__ __forceinline__ int pdt_nm_rank(S s, int k) {
  int rank = 0;
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const S sj = __shfl_sync(PDT_FULL_MASK, s, j, W);
    rank += (sj > s || (sj == s && j < k)) ? 1 : 0;
  }
  return rank;
}

// The random mode's Philox key and stream, from the host's two int64 seed words (zeros in the
// other modes, whose seed is null).
struct PdtNmSeed {
  u32 k0, k1, stream;
};
__device__ __forceinline__ PdtNmSeed pdt_nm_seed(int mode, const i64* __restrict__ seed) {
  PdtNmSeed s = {0u, 0u, 0u};
  if (mode == PDT_NM_RANDOM) {
    const u64 s0 = (u64)seed[0];
    s.k0 = (u32)s0;
    s.k1 = (u32)(s0 >> 32);
    s.stream = (u32)(u64)seed[1];
  }
  return s;
}

// The 4 random words of elements 4 * kq .. 4 * kq + 3 of logical group gid:
// Philox-4x32-10 at counter (gid, kq, stream).
__device__ __forceinline__ PdtU4 pdt_nm_draw(u64 gid, u32 kq, PdtNmSeed s) {
  PdtU4 ctr;
  ctr.x = (u32)gid;
  ctr.y = (u32)(gid >> 32);
  ctr.z = kq;
  ctr.w = s.stream;
  return pdt_philox(ctr, s.k0, s.k1);
}

// (o, g, i) of group t: g fastest when a group is contiguous (ch_contig), else i fastest.
__device__ __forceinline__ void pdt_nm_decode(u32 t, u32 G, u32 I, int ch_contig, u32& o,
                                              u32& g, u32& i) {
  if (ch_contig) {
    g = t % G;
    const u32 rem = t / G;
    i = rem % I;
    o = rem / I;
  } else {
    i = t % I;
    const u32 rem = t / I;
    g = rem % G;
    o = rem / G;
  }
}

// ---------------------------------------------------------------------------------------
// Selection: y = x where kept, 0 elsewhere; with mode RESCALED the kept values are
// multiplied by ratio[(o / o2) * C + c] (from pdt_nm_ratio_*).
//    x       [O, C, I] global, strides (so, sc, si); read once
//    y       [O, C, I] global, same strides; written in full
//    seed    [2] int64 global (mode RANDOM only): Philox key and stream, drawn by the host
//            from the caller's torch.Generator so that the draw is reproducible
//    ratio   [(O / o2) * C] A global (mode RESCALED only)
//    grid:   1-D, grid-stride over the O * G * I groups (the host checks < 2^31), 32 / W
//            groups per warp, one W-lane sub-warp per group (W = the power of two >= m),
//            lane k holding element k of its group; when ch_contig, g varies fastest (a
//            group is contiguous), otherwise i does (coalesced along the spatial dims of
//            NCHW tensors).
//    RANDOM draws one 32-bit Philox uniform per element, counter = (logical group index
//    (o * I + i) * G + g, k / 4, stream), word k % 4: the draw does not depend on the layout.
// ---------------------------------------------------------------------------------------
template <class Tr, int W>
__device__ __forceinline__ void pdt_nm_select_body(const typename Tr::T* __restrict__ x,
                                                   typename Tr::T* __restrict__ y, int O, int C,
                                                   int I, i64 so, i64 sc, i64 si, int n, int m,
                                                   int mode, const i64* __restrict__ seed,
                                                   const typename Tr::A* __restrict__ ratio,
                                                   int o2, int ch_contig) {
  typedef typename Tr::T T;
  typedef typename Tr::A A;
  constexpr int GPW = 32 / W;  // groups per warp
  const u32 G = (u32)((C + m - 1) / m);
  const u32 total = (u32)O * G * (u32)I;
  const int lane = threadIdx.x & 31;
  const int k = lane & (W - 1);
  const u32 sub = (u32)(lane / W);
  const PdtNmSeed rng = pdt_nm_seed(mode, seed);
  const u32 warp_id = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const u32 nwarps = (gridDim.x * blockDim.x) >> 5;
  for (u32 t0 = warp_id * GPW; t0 < total; t0 += nwarps * GPW) {  // warp-uniform loop
    const u32 t = t0 + sub;
    u32 o = 0u, g = 0u, i = 0u;
    int r = 0;
    if (t < total) {
      pdt_nm_decode(t, G, (u32)I, ch_contig, o, g, i);
      r = min(m, C - (int)g * m);
    }
    const bool mine = k < r;
    const int c = (int)g * m + k;
    const i64 at = (i64)o * so + (i64)c * sc + (i64)i * si;
    const T v = mine ? x[at] : T(0);
    int rank;
    if (mode == PDT_NM_RANDOM) {
      const u64 gid = ((u64)o * (u64)I + i) * (u64)G + g;
      const PdtU4 q = pdt_nm_draw(gid, (u32)(k >> 2), rng);
      const int w = k & 3;
      const u32 s = w == 0 ? q.x : (w == 1 ? q.y : (w == 2 ? q.z : q.w));
      rank = pdt_nm_rank<W>(mine ? s : 0u, k);
    } else {
      rank = pdt_nm_rank<W>(pdt_mag_key(Tr::to_a(v)), k);  // v = 0 outside the group
    }
    const bool keep = rank < n;
    if (mine) {
      if (mode == PDT_NM_RESCALED) {
        const A rt = ratio[(i64)(o / (u32)o2) * C + c];
        y[at] = Tr::from_a(pdt_mul_rn(keep ? Tr::to_a(v) : A(0), rt));
      } else {
        y[at] = keep ? v : T(0);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Selection, one thread per group (the "thread" path; the kernel above is the "subwarp"
// path): the same output, bit for bit, from the same keys, tie rule, Philox draws and
// rescale arithmetic. A thread holds a whole group at V consecutive positions i (V = 16 bytes
// of elements, fewer for wide groups: pdt_nm_positions) in registers and ranks each
// position's r elements among themselves: no shuffles, W loads of V elements in flight per
// thread, and one Philox draw per 4 elements instead of one per element.
//    x, y, seed, ratio, o2, ch_contig: as the subwarp kernel
//    vec     1 when the host has checked that V positions are one aligned vector load (a
//            strided group, si = 1; I, sc and so multiples of 16 bytes of elements; x and y
//            16-byte aligned); 0: scalar loads, any strides
//    grid:   1-D, grid-stride over the O * G * ceil(I / V) units (o, g, iq), positions
//            i = iq * V .. iq * V + V - 1; iq varies fastest for strided groups (consecutive
//            threads read consecutive positions of each channel), g when a group is
//            contiguous (consecutive threads read consecutive groups).
// ---------------------------------------------------------------------------------------
// Positions per thread of the thread path: 16 bytes of elements (one vector load), halved
// while a group's elements there would exceed 32 values or 128 bytes of registers.
template <typename T, int W>
__device__ constexpr int pdt_nm_positions() {
  int v = (int)(16 / sizeof(T));
  while (v > 1 && (W * v > 32 || W * v * (int)sizeof(T) > 128)) v /= 2;
  return v;
}

template <typename T, int V>
__device__ __forceinline__ void pdt_load_raw(const T* __restrict__ p, T (&r)[V]) {
  typedef typename PdtBytesT<(int)(V * sizeof(T))>::type Raw;
  const Raw w = *reinterpret_cast<const Raw*>(p);
  const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
  for (int q = 0; q < V; ++q) r[q] = e[q];
}

template <typename T, int V>
__device__ __forceinline__ void pdt_store_raw(T* __restrict__ p, const T (&r)[V]) {
  typedef typename PdtBytesT<(int)(V * sizeof(T))>::type Raw;
  Raw w;
  T* e = reinterpret_cast<T*>(&w);
#pragma unroll
  for (int q = 0; q < V; ++q) e[q] = r[q];
  *reinterpret_cast<Raw*>(p) = w;
}

// A unit of the thread path: group g of row o at positions i0 .. i0 + V - 1; lane k of
// position q at v[k][q], zero past the group (k >= r) or past the row (i >= I), so that its
// key is 0 and never outranks an element. `vec` (the host's vector_loads): 1, each
// channel's V positions are one aligned vector load (strided groups); 2, each position's
// group is one (contiguous whole groups of W elements, W * sizeof(T) <= 16 bytes); 0, none.
template <typename T, int W, int V>
__device__ __forceinline__ void pdt_nm_unit_load(const T* __restrict__ x, i64 base, i64 sc,
                                                 i64 si, int r, int i0, int I, int vec,
                                                 T (&v)[W][V]) {
  if constexpr (W * sizeof(T) <= 16) {
    if (vec == 2) {
#pragma unroll
      for (int q = 0; q < V; ++q) {
        T grp[W];
        if (i0 + q < I) {
          pdt_load_raw<T, W>(x + base + (i64)q * si, grp);
        } else {
#pragma unroll
          for (int k = 0; k < W; ++k) grp[k] = T(0);
        }
#pragma unroll
        for (int k = 0; k < W; ++k) v[k][q] = grp[k];
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if (vec == 1 && k < r) {
      pdt_load_raw<T, V>(x + base + (i64)k * sc, v[k]);
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q)
        v[k][q] = (k < r && i0 + q < I) ? x[base + (i64)k * sc + (i64)q * si] : T(0);
    }
  }
}

// The unit's elements back (k < r, i < I only).
template <typename T, int W, int V>
__device__ __forceinline__ void pdt_nm_unit_store(T* __restrict__ y, i64 base, i64 sc, i64 si,
                                                  int r, int i0, int I, int vec,
                                                  const T (&v)[W][V]) {
  if constexpr (W * sizeof(T) <= 16) {
    if (vec == 2) {
#pragma unroll
      for (int q = 0; q < V; ++q) {
        if (i0 + q >= I) continue;
        T grp[W];
#pragma unroll
        for (int k = 0; k < W; ++k) grp[k] = v[k][q];
        pdt_store_raw<T, W>(y + base + (i64)q * si, grp);
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if (k >= r) continue;
    if (vec == 1) {
      pdt_store_raw<T, V>(y + base + (i64)k * sc, v[k]);
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q)
        if (i0 + q < I) y[base + (i64)k * sc + (i64)q * si] = v[k][q];
    }
  }
}

// Bit k set when key[k] ranks below n among the W keys (greater key, or equal key and lower
// index, ranks first): the sub-warp kernel's rank, by unrolled compares.
template <typename Key, int W>
__device__ __forceinline__ u32 pdt_nm_keep_mask(const Key (&key)[W], int n) {
  u32 keep = 0u;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    int rank = 0;
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (j != k) rank += (key[j] > key[k] || (key[j] == key[k] && j < k)) ? 1 : 0;
    keep |= (rank < n ? 1u : 0u) << k;
  }
  return keep;
}

// The magnitude keep mask of position q of a unit.
template <class Tr, int W, int V>
__device__ __forceinline__ u32 pdt_nm_magnitude_mask(const typename Tr::T (&v)[W][V], int q,
                                                     int n) {
  typedef decltype(pdt_mag_key(typename Tr::A(0))) Key;
  Key key[W];
#pragma unroll
  for (int k = 0; k < W; ++k) key[k] = pdt_mag_key(Tr::to_a(v[k][q]));  // 0 where v = 0
  return pdt_nm_keep_mask<Key, W>(key, n);
}

template <class Tr, int W>
__device__ __forceinline__ void pdt_nm_gselect_body(const typename Tr::T* __restrict__ x,
                                                    typename Tr::T* __restrict__ y, int O,
                                                    int C, int I, i64 so, i64 sc, i64 si,
                                                    int n, int m, int mode,
                                                    const i64* __restrict__ seed,
                                                    const typename Tr::A* __restrict__ ratio,
                                                    int o2, int ch_contig, int vec) {
  typedef typename Tr::T T;
  typedef typename Tr::A A;
  constexpr int V = pdt_nm_positions<T, W>();
  const u32 G = (u32)((C + m - 1) / m);
  const u32 IQ = (u32)((I + V - 1) / V);
  const u32 total = (u32)O * G * IQ;  // <= O * G * I: the host checks it is < 2^31
  const PdtNmSeed rng = pdt_nm_seed(mode, seed);
  for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
    u32 o, g, iq;
    pdt_nm_decode(t, G, IQ, ch_contig, o, g, iq);
    const int r = min(m, C - (int)g * m);
    const int i0 = (int)iq * V;
    const i64 base = (i64)o * so + (i64)g * m * sc + (i64)i0 * si;
    T v[W][V];
    pdt_nm_unit_load<T, W, V>(x, base, sc, si, r, i0, I, vec, v);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      u32 keep;
      if (mode == PDT_NM_RANDOM) {
        const u64 gid = ((u64)o * (u64)I + (u64)(i0 + q)) * (u64)G + g;
        u32 key[W];
#pragma unroll
        for (int kq = 0; kq < (W + 3) / 4; ++kq) {
          const PdtU4 d = pdt_nm_draw(gid, (u32)kq, rng);
          const u32 words[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
          for (int w = 0; w < 4; ++w)
            if (kq * 4 + w < W) key[kq * 4 + w] = (kq * 4 + w < r) ? words[w] : 0u;
        }
        keep = pdt_nm_keep_mask<u32, W>(key, n);
      } else {
        keep = pdt_nm_magnitude_mask<Tr, W, V>(v, q, n);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const bool kept = (keep >> k) & 1u;
        if (mode == PDT_NM_RESCALED) {
          const A rt = k < r ? ratio[(i64)(o / (u32)o2) * C + (i64)g * m + k] : A(0);
          v[k][q] = Tr::from_a(pdt_mul_rn(kept ? Tr::to_a(v[k][q]) : A(0), rt));
        } else if (!kept) {
          v[k][q] = T(0);
        }
      }
    }
    pdt_nm_unit_store<T, W, V>(y, base, sc, si, r, i0, I, vec, v);
  }
}

// ---------------------------------------------------------------------------------------
// The rescale sums of a block (the sub-warp statistics kernel): thread (ii, k) sums |x| and
// |kept x| of channel k over positions i = ii, ii + ith, ... in that order (load(i) reads
// element (k, i)); then a fixed-order tree over ii (threads tid and tid + s * row) leaves the
// sums of channel k in red_x / red_y at the threads with ii = 0. Every thread of the block
// calls it (it synchronises the block).
// ---------------------------------------------------------------------------------------
template <class Tr, int W, class Load>
__device__ __forceinline__ void pdt_nm_block_sums(Load load, int I, int ith, int ii, int k,
                                                  int r, int n, int row,
                                                  typename Tr::A* __restrict__ red_x,
                                                  typename Tr::A* __restrict__ red_y) {
  typedef typename Tr::T T;
  typedef typename Tr::A A;
  const int tid = threadIdx.x;
  A ax = A(0), ay = A(0);
  // 64-bit: with I near 2^31, i0 + ith would wrap a 32-bit counter negative (never ending)
  for (i64 i0 = 0; i0 < I; i0 += ith) {  // warp-uniform loop
    const i64 i = i0 + ii;
    const int ri = i < I ? r : 0;
    const bool act = k < ri;
    const T v = act ? load(i) : T(0);
    const A va = Tr::to_a(v);
    const A a = pdt_abs(va);
    const int rank = pdt_nm_rank<W>(pdt_mag_key(va), k);  // v = 0 where not act
    if (act) {
      ax = pdt_add_rn(ax, a);
      if (rank < n) ay = pdt_add_rn(ay, a);
    }
  }
  red_x[tid] = ax;
  red_y[tid] = ay;
  __syncthreads();
  for (int s = ith >> 1; s > 0; s >>= 1) {
    if (ii < s) {
      red_x[tid] = pdt_add_rn(red_x[tid], red_x[tid + s * row]);
      red_y[tid] = pdt_add_rn(red_y[tid], red_y[tid + s * row]);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------
// Statistics of the rescale: sx[o, c] = sum_i |x[o, c, i]|, sy[o, c] = the same over the
// elements kept by magnitude, accumulated in A.
//    x       [O, C, I] global, strides (so, sc, si)
//    sx, sy  [O, C] A global, written in full
//    red_x, red_y [PDT_NM_BLOCK] A shared: the fixed-order tree reduction
//    grid:   (O, ceil(G / GT)); block: PDT_NM_BLOCK threads. Thread tid is lane
//            k = tid % W of group blockIdx.y * GT + (tid / W) % GT and handles positions
//            i = tid / (W * GT) + q * (BLOCK / (W * GT)). GT = 2^gt_log2: 1 for NCHW, up to
//            32 / W when a group is contiguous (a warp then reads 32 neighbouring channels).
// The sums are deterministic (fixed order) but not in torch's order: they may differ from
// the reference's sums in the last bits (see docs/kernels.md).
// ---------------------------------------------------------------------------------------
template <class Tr, int W>
__device__ __forceinline__ void pdt_nm_stats_body(const typename Tr::T* __restrict__ x, int O,
                                                  int C, int I, i64 so, i64 sc, i64 si, int n,
                                                  int m, int gt_log2,
                                                  typename Tr::A* __restrict__ sx,
                                                  typename Tr::A* __restrict__ sy) {
  typedef typename Tr::T T;
  typedef typename Tr::A A;
  __shared__ A red_x[PDT_NM_BLOCK];
  __shared__ A red_y[PDT_NM_BLOCK];
  const int tid = threadIdx.x;
  const int GT = 1 << gt_log2;
  const int row = W * GT;  // threads per position i
  const int ith = PDT_NM_BLOCK / row;
  const int k = tid & (W - 1);
  const int gl = (tid / W) & (GT - 1);
  const int ii = tid / row;
  const int G = (C + m - 1) / m;
  const int o = blockIdx.x;
  const int g = blockIdx.y * GT + gl;
  const int c = g * m + k;
  const int r = g < G ? min(m, C - g * m) : 0;
  const bool mine = k < r;
  const i64 base = (i64)o * so + (i64)c * sc;
  pdt_nm_block_sums<Tr, W>([&](i64 i) { return x[base + i * si]; }, I, ith, ii, k, r, n,
                           row, red_x, red_y);
  if (ii == 0 && mine) {
    sx[(i64)o * C + c] = red_x[tid];
    sy[(i64)o * C + c] = red_y[tid];
  }
}

// a > 0 as IEEE compares it, a positive denormal included: under -ftz=true a float32
// comparison compiles to setp.*.ftz, which takes a denormal for zero (with eps = 0 a plane
// whose kept sum is denormal would then get the ratio 0 where the reference gives sx / sy).
// From the bits: positive, not +0, at most +inf (so no NaN).
__device__ __forceinline__ bool pdt_positive(float a) {
  const u32 b = __float_as_uint(a);
  return b != 0u && b <= 0x7f800000u;
}
__device__ __forceinline__ bool pdt_positive(double a) { return a > 0.0; }  // -ftz: f32 only

// The rescale factor of sums sx = sum |x|, sy = sum |kept x|: sx / (sy + eps), and 0 where
// sy > 0 fails (nothing nonzero kept, or a NaN in the plane), as the reference's
// torch.where(sy > 0, sx / (sy + eps), 0).
// eps in the accumulation type, rounded as torch rounds a Python float added to a float32
// tensor (to nearest; a denormal kept, where (float)eps under -ftz=true would give 0).
__device__ __forceinline__ float pdt_nm_eps(float, double eps) { return pdt_double_to_float_rn(eps); }
__device__ __forceinline__ double pdt_nm_eps(double, double eps) { return eps; }

template <typename A>
__device__ __forceinline__ A pdt_nm_ratio_of(A sx, A sy, double eps) {
  return pdt_positive(sy) ? pdt_div_rn(sx, pdt_add_rn(sy, pdt_nm_eps(A(0), eps))) : A(0);
}

// ---------------------------------------------------------------------------------------
// Rescale ratios: ratio[b, c] = (sum_{q < o2} sx[b*o2 + q, c]) / ((sum_q sy[...]) + eps),
// summed in increasing q (pdt_nm_ratio_of: 0 where the sy sum is not > 0). Plane rule
// (authors' code): o2 = the dims between the batch and the grouping dim (1 for NCHW); channel
// rule (paper text): one b, o2 = O.
//    sx, sy  [O, C] A global; ratio [(O / o2) * C] A global, written in full
//    grid:   1-D over (O / o2) * C threads.
// ---------------------------------------------------------------------------------------
template <typename A>
__device__ __forceinline__ void pdt_nm_ratio_body(const A* __restrict__ sx,
                                                  const A* __restrict__ sy, A* __restrict__ ratio,
                                                  int nb, int o2, int C, double eps) {
  const i64 total = (i64)nb * C;
  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < total;
       t += (i64)gridDim.x * blockDim.x) {
    const i64 b = t / C, c = t - (t / C) * C;
    A ax = A(0), ay = A(0);
    for (int q = 0; q < o2; ++q) {
      ax = pdt_add_rn(ax, sx[(b * o2 + q) * C + c]);
      ay = pdt_add_rn(ay, sy[(b * o2 + q) * C + c]);
    }
    ratio[t] = pdt_nm_ratio_of(ax, ay, eps);
  }
}

// ---------------------------------------------------------------------------------------
// Rescale statistics of strided groups (GT = 1: NCHW and every layout whose groups are not
// contiguous), in the thread path's units: one block per group (o, g), grid (O, G); thread
// tid takes the units iq = tid, tid + BLOCK, ... of its group, in that order, and for each
// position q adds |x| of channel k to its ax[k] and, where k is kept by magnitude, to its
// ay[k] (in A); then pdt_nm_block_reduce sums the threads in a fixed order.
//    x       [O, C, I] global, strides (so, sc, si); vec as the thread selection
//    sx, sy  [O, C] A global: written for the group's r channels
// The fused kernel below sums in exactly this order, so the two paths give the same bits.
// ---------------------------------------------------------------------------------------
template <class Tr, int W, int V>
__device__ __forceinline__ void pdt_nm_unit_sums(const typename Tr::T (&v)[W][V], int r,
                                                 int i0, int I, int n,
                                                 typename Tr::A (&ax)[W],
                                                 typename Tr::A (&ay)[W]) {
#pragma unroll
  for (int q = 0; q < V; ++q) {
    if (i0 + q >= I) continue;
    const u32 keep = pdt_nm_magnitude_mask<Tr, W, V>(v, q, n);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (k >= r) continue;
      const typename Tr::A a = pdt_abs(Tr::to_a(v[k][q]));
      ax[k] = pdt_add_rn(ax[k], a);
      if ((keep >> k) & 1u) ay[k] = pdt_add_rn(ay[k], a);
    }
  }
}

// The block's sums of ax[k] and ay[k] into tot[k] and tot[W + k] (shared, [2 W]): a shuffle
// butterfly per warp (both partners add the same two numbers, so every lane holds the same
// sum), then the warps' sums in warp order by thread k. Every thread of the block calls it.
//    wsum    [BLOCK / 32][2 W] A shared
template <typename A, int W>
__device__ __forceinline__ void pdt_nm_block_reduce(A (&ax)[W], A (&ay)[W], A* __restrict__ wsum,
                                                    A* __restrict__ tot) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < W; ++k) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      ax[k] = pdt_add_rn(ax[k], __shfl_xor_sync(PDT_FULL_MASK, ax[k], off));
      ay[k] = pdt_add_rn(ay[k], __shfl_xor_sync(PDT_FULL_MASK, ay[k], off));
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      wsum[warp * 2 * W + k] = ax[k];
      wsum[warp * 2 * W + W + k] = ay[k];
    }
  }
  __syncthreads();
  if (threadIdx.x < 2 * W) {
    A sum = A(0);
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) sum = pdt_add_rn(sum, wsum[w * 2 * W + threadIdx.x]);
    tot[threadIdx.x] = sum;
  }
  __syncthreads();
}

// The sums of group (o, g) = (blockIdx.x, blockIdx.y) in the thread path's units into tot
// (shared, [2 W]: tot[k] = sum |x|, tot[W + k] = sum |kept x| of channel k), in the order
// described above; with a tile (the fused kernel) each thread also keeps its units there,
// tile[(k * ceil(I / V) + iq) * V + q]. Every thread of the block calls it.
template <class Tr, int W>
__device__ __forceinline__ void pdt_nm_group_sums(const typename Tr::T* __restrict__ x, int C,
                                                  int I, i64 so, i64 sc, i64 si, int n, int m,
                                                  int vec, typename Tr::T* __restrict__ tile,
                                                  typename Tr::A* __restrict__ wsum,
                                                  typename Tr::A* __restrict__ tot) {
  typedef typename Tr::T T;
  typedef typename Tr::A A;
  constexpr int V = pdt_nm_positions<T, W>();
  const int g = blockIdx.y;
  const int r = min(m, C - g * m);
  const int IQ = (I + V - 1) / V;
  const i64 base0 = (i64)blockIdx.x * so + (i64)g * m * sc;
  A ax[W], ay[W];
#pragma unroll
  for (int k = 0; k < W; ++k) ax[k] = ay[k] = A(0);
  for (int iq = threadIdx.x; iq < IQ; iq += blockDim.x) {
    const int i0 = iq * V;
    T v[W][V];
    pdt_nm_unit_load<T, W, V>(x, base0 + (i64)i0 * si, sc, si, r, i0, I, vec, v);
    pdt_nm_unit_sums<Tr, W, V>(v, r, i0, I, n, ax, ay);
    if (tile != nullptr) {
#pragma unroll
      for (int k = 0; k < W; ++k) pdt_store_raw<T, V>(tile + ((i64)k * IQ + iq) * V, v[k]);
    }
  }
  pdt_nm_block_reduce<A, W>(ax, ay, wsum, tot);
}

template <class Tr, int W>
__device__ __forceinline__ void pdt_nm_gstats_body(const typename Tr::T* __restrict__ x, int O,
                                                   int C, int I, i64 so, i64 sc, i64 si, int n,
                                                   int m, int vec,
                                                   typename Tr::A* __restrict__ sx,
                                                   typename Tr::A* __restrict__ sy) {
  typedef typename Tr::A A;
  __shared__ A wsum[(PDT_NM_BLOCK / 32) * 2 * W];
  __shared__ A tot[2 * W];
  pdt_nm_group_sums<Tr, W>(x, C, I, so, sc, si, n, m, vec, nullptr, wsum, tot);
  const i64 c = (i64)blockIdx.y * m + threadIdx.x;
  if ((int)threadIdx.x < min(m, C - (int)blockIdx.y * m)) {
    sx[(i64)blockIdx.x * C + c] = tot[threadIdx.x];
    sy[(i64)blockIdx.x * C + c] = tot[W + threadIdx.x];
  }
}

// ---------------------------------------------------------------------------------------
// Rescale statistics of contiguous groups (channels-last, the SDGP authors' layout; W <= 8):
// grid (O, ceil(G / 32)), block PDT_NM_BLOCK. Lane l of warp w takes group
// g = blockIdx.y * 32 + l at positions i = w, w + NW, ... (NW = BLOCK / 32 warps) in that
// order, each position's group one vector load where `vec` = 2 allows (a warp then reads 32
// neighbouring groups at once), adding |x| and |kept x| per channel as the other statistics
// kernels do; then thread (l, j) sums the warps' partial sums j of group l in warp order.
//    x       [O, C, I] global, strides (so, 1, si)
//    sx, sy  [O, C] A global: written for the block's groups
//    part    [NW][32][2 W] A shared
// ---------------------------------------------------------------------------------------
template <class Tr, int W>
__device__ __forceinline__ void pdt_nm_cstats_body(const typename Tr::T* __restrict__ x, int O,
                                                   int C, int I, i64 so, i64 sc, i64 si, int n,
                                                   int m, int vec,
                                                   typename Tr::A* __restrict__ sx,
                                                   typename Tr::A* __restrict__ sy) {
  typedef typename Tr::T T;
  typedef typename Tr::A A;
  constexpr int NW = PDT_NM_BLOCK / 32;
  __shared__ A part[NW * 32 * 2 * W];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int G = (C + m - 1) / m;
  const int o = blockIdx.x;
  const int g = blockIdx.y * 32 + lane;
  const int r = g < G ? min(m, C - g * m) : 0;
  const i64 base0 = (i64)o * so + (i64)g * m * sc;
  const int lvec = r == W ? vec : 0;  // a whole group, or element by element
  A ax[W], ay[W];
#pragma unroll
  for (int k = 0; k < W; ++k) ax[k] = ay[k] = A(0);
#pragma unroll 4
  for (int i = warp; i < I; i += NW) {
    T v[W][1];
    pdt_nm_unit_load<T, W, 1>(x, base0 + (i64)i * si, sc, si, r, i, I, lvec, v);
    pdt_nm_unit_sums<Tr, W, 1>(v, r, i, I, n, ax, ay);
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    part[(warp * 32 + lane) * 2 * W + k] = ax[k];
    part[(warp * 32 + lane) * 2 * W + W + k] = ay[k];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < 32 * 2 * W; t += blockDim.x) {
    const int l = t / (2 * W);
    const int j = t - l * 2 * W;
    const int k = j < W ? j : j - W;
    const int gl = blockIdx.y * 32 + l;
    A sum = A(0);
    for (int w = 0; w < NW; ++w) sum = pdt_add_rn(sum, part[(w * 32 + l) * 2 * W + j]);
    if (gl < G && k < min(m, C - gl * m)) (j < W ? sx : sy)[(i64)o * C + (i64)gl * m + k] = sum;
  }
}

// ---------------------------------------------------------------------------------------
// Fused rescaled N:M (plane rule, one plane per (o, c): o2 == 1; strided groups): the
// statistics above, the ratio kernel's arithmetic and the selection in one kernel that
// reads x once. One block per group (o, g), grid (O, G): each thread loads its units as the
// statistics kernel does (the same sums, in the same order), keeps them in the shared tile,
// and after the block's ratios are known rescales and writes its own units: the same bits
// as statistics + ratio + selection, with one read and one write of x instead of two reads
// and one write.
//    x, y    [O, C, I] global, strides (so, sc, si); y written in full for the group
//    tile    [W][ceil(I / V)][V] T dynamic shared (the host passes its size:
//            fused_shared_bytes); channel-major, so a warp's V-wide accesses are consecutive
//    wsum, tot as pdt_nm_block_reduce; ratio_s [W] A shared
// ---------------------------------------------------------------------------------------
template <class Tr, int W>
__device__ __forceinline__ void pdt_nm_fused_body(const typename Tr::T* __restrict__ x,
                                                  typename Tr::T* __restrict__ y, int O, int C,
                                                  int I, i64 so, i64 sc, i64 si, int n, int m,
                                                  int vec, double eps) {
  typedef typename Tr::T T;
  typedef typename Tr::A A;
  constexpr int V = pdt_nm_positions<T, W>();
  PDT_DYNAMIC_SHARED(T, tile);
  __shared__ A wsum[(PDT_NM_BLOCK / 32) * 2 * W];
  __shared__ A tot[2 * W];
  __shared__ A ratio_s[W];
  pdt_nm_group_sums<Tr, W>(x, C, I, so, sc, si, n, m, vec, tile, wsum, tot);
  const int r = min(m, C - (int)blockIdx.y * m);
  if ((int)threadIdx.x < r)  // the ratio kernel's arithmetic with o2 = 1
    ratio_s[threadIdx.x] = pdt_nm_ratio_of(pdt_add_rn(A(0), tot[threadIdx.x]),
                                           pdt_add_rn(A(0), tot[W + threadIdx.x]), eps);
  __syncthreads();
  A rt[W];
#pragma unroll
  for (int k = 0; k < W; ++k) rt[k] = k < r ? ratio_s[k] : A(0);
  const int IQ = (I + V - 1) / V;
  const i64 base0 = (i64)blockIdx.x * so + (i64)blockIdx.y * m * sc;
  for (int iq = threadIdx.x; iq < IQ; iq += blockDim.x) {  // its own units, from the tile
    const int i0 = iq * V;
    T v[W][V];
#pragma unroll
    for (int k = 0; k < W; ++k) pdt_load_raw<T, V>(tile + ((i64)k * IQ + iq) * V, v[k]);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const u32 keep = pdt_nm_magnitude_mask<Tr, W, V>(v, q, n);
#pragma unroll
      for (int k = 0; k < W; ++k)
        v[k][q] = Tr::from_a(pdt_mul_rn(((keep >> k) & 1u) ? Tr::to_a(v[k][q]) : A(0), rt[k]));
    }
    pdt_nm_unit_store<T, W, V>(y, base0 + (i64)i0 * si, sc, si, r, i0, I, vec, v);
  }
}

#define PDT_NM_KERNELS(SUF, TR, W)                                                          \
  extern "C" __global__ void pdt_nm_select_##SUF##_w##W(                                    \
      const TR::T* x, TR::T* y, int O, int C, int I, i64 so, i64 sc, i64 si, int n, int m,     \
      int mode, const i64* seed, const TR::A* ratio, int o2, int ch_contig) {                  \
    pdt_nm_select_body<TR, W>(x, y, O, C, I, so, sc, si, n, m, mode, seed, ratio, o2,       \
                                 ch_contig);                                                   \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(PDT_NM_BLOCK) pdt_nm_stats_##SUF##_w##W(     \
      const TR::T* x, int O, int C, int I, i64 so, i64 sc, i64 si, int n, int m, int gt_log2,  \
      TR::A* sx, TR::A* sy) {                                                                  \
    pdt_nm_stats_body<TR, W>(x, O, C, I, so, sc, si, n, m, gt_log2, sx, sy);                \
  }

// The thread path (selection, statistics, the fused kernel), for groups of at most 8
// (W <= 8): its statistics keep 2 W sums and a group's W x V elements in registers per
// thread, which for W = 16 and 32 spills (ptxas), and its selection's W x W unrolled compares
// at W = 32 more than doubled the compile time of this file; wider groups take the sub-warp
// kernels, unfused.
#define PDT_NM_THREAD_KERNELS(SUF, TR, W)                                                   \
  extern "C" __global__ void pdt_nm_gselect_##SUF##_w##W(                                   \
      const TR::T* x, TR::T* y, int O, int C, int I, i64 so, i64 sc, i64 si, int n, int m,     \
      int mode, const i64* seed, const TR::A* ratio, int o2, int ch_contig, int vec) {         \
    pdt_nm_gselect_body<TR, W>(x, y, O, C, I, so, sc, si, n, m, mode, seed, ratio, o2,      \
                                  ch_contig, vec);                                             \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(PDT_NM_BLOCK) pdt_nm_gstats_##SUF##_w##W(    \
      const TR::T* x, int O, int C, int I, i64 so, i64 sc, i64 si, int n, int m, int vec,      \
      TR::A* sx, TR::A* sy) {                                                                  \
    pdt_nm_gstats_body<TR, W>(x, O, C, I, so, sc, si, n, m, vec, sx, sy);                   \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(PDT_NM_BLOCK) pdt_nm_cstats_##SUF##_w##W(    \
      const TR::T* x, int O, int C, int I, i64 so, i64 sc, i64 si, int n, int m, int vec,      \
      TR::A* sx, TR::A* sy) {                                                                  \
    pdt_nm_cstats_body<TR, W>(x, O, C, I, so, sc, si, n, m, vec, sx, sy);                   \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(PDT_NM_BLOCK, 2) pdt_nm_fused_##SUF##_w##W(  \
      const TR::T* x, TR::T* y, int O, int C, int I, i64 so, i64 sc, i64 si, int n, int m,     \
      int vec, double eps) {                                                                   \
    pdt_nm_fused_body<TR, W>(x, y, O, C, I, so, sc, si, n, m, vec, eps);                     \
  }

#define PDT_NM_ALL_M(SUF, TR)      \
  PDT_NM_KERNELS(SUF, TR, 1)       \
  PDT_NM_KERNELS(SUF, TR, 2)       \
  PDT_NM_KERNELS(SUF, TR, 4)       \
  PDT_NM_KERNELS(SUF, TR, 8)       \
  PDT_NM_KERNELS(SUF, TR, 16)      \
  PDT_NM_KERNELS(SUF, TR, 32)      \
  PDT_NM_THREAD_KERNELS(SUF, TR, 1) \
  PDT_NM_THREAD_KERNELS(SUF, TR, 2) \
  PDT_NM_THREAD_KERNELS(SUF, TR, 4) \
  PDT_NM_THREAD_KERNELS(SUF, TR, 8)

PDT_NM_ALL_M(f32, TraitF32)
PDT_NM_ALL_M(f64, TraitF64)
PDT_NM_ALL_M(f16, TraitF16)
PDT_NM_ALL_M(bf16, TraitBF16)

extern "C" __global__ void pdt_nm_ratio_f32(const float* sx, const float* sy, float* ratio,
                                            int nb, int o2, int C, double eps) {
  pdt_nm_ratio_body<float>(sx, sy, ratio, nb, o2, C, eps);
}
extern "C" __global__ void pdt_nm_ratio_f64(const double* sx, const double* sy, double* ratio,
                                            int nb, int o2, int C, double eps) {
  pdt_nm_ratio_body<double>(sx, sy, ratio, nb, o2, C, eps);
}
