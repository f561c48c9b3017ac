// Shared device helpers of the pdtbench kernels: integer types, 16-bit float conversions,
// 16-byte vector types, and the Philox-4x32-10 counter-based random generator.
//
// Everything here compiles under NVRTC without any system or CUDA header (the loader
// pastes this file into each source before handing it to NVRTC), and under nvcc.
#pragma once

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// Tunables shared with the host (impl/cuda/loader.py passes the same -D values to NVRTC and
// to the nvcc compile check; the host computes its grids from the same numbers).
#ifndef PDT_SPMM_WARPS
#define PDT_SPMM_WARPS 8  // rows (warps) of one SpMM / implicit-conv thread block
#endif
#ifndef PDT_SPMM_TK
#define PDT_SPMM_TK 32  // rows of the dense operand staged in shared memory per step
#endif
#ifndef PDT_SPMM_TN_F32
#define PDT_SPMM_TN_F32 256  // output columns of one SpMM block, float32
#endif
#ifndef PDT_SPMM_TN_F64
#define PDT_SPMM_TN_F64 128  // output columns of one SpMM block, float64
#endif
#ifndef PDT_SPMM_RW_F32
#define PDT_SPMM_RW_F32 8  // rows per warp of the row-tiled SpMM, float32
#endif
#ifndef PDT_SPMM_RW_F64
#define PDT_SPMM_RW_F64 4  // rows per warp of the row-tiled SpMM, float64
#endif
#ifndef PDT_CONV_CPT
#define PDT_CONV_CPT 4  // output positions per thread of the implicit-im2col conv
#endif
#ifndef PDT_SDDMM_SEG
#define PDT_SDDMM_SEG 1024  // columns of the output gradient staged in shared memory
#endif
#ifndef PDT_SDDMM_EB
#define PDT_SDDMM_EB 1024  // nonzeros of one row accumulated in shared memory at a time
#endif
#ifndef PDT_SDDMM_KC
#define PDT_SDDMM_KC 128  // columns of the filter matrix per chunk of the row-tiled SDDMM
#endif
#ifndef PDT_SDDMM_RT_F32
#define PDT_SDDMM_RT_F32 8  // rows of the filter matrix per row-tiled SDDMM block, float32
#endif
#ifndef PDT_SDDMM_RT_F64
#define PDT_SDDMM_RT_F64 4  // rows of the filter matrix per row-tiled SDDMM block, float64
#endif
#ifndef PDT_NM_BLOCK
#define PDT_NM_BLOCK 256  // threads of the N:M statistics kernel (a power of two)
#endif
#ifndef PDT_EXPAND_TILE
#define PDT_EXPAND_TILE 2048  // positions per tile of the expand (unpack with zeros) kernel
#endif

#define PDT_FULL_MASK 0xffffffffu

// Elements one thread of the gather and scatter kernels (pattern.cu's CSR gather and scatter,
// pack.cu) moves a round: every load of the round is issued before its stores, so that many
// loads are in flight a thread (one load, one store, next load waits a memory latency each).
#define PDT_MOVE_LB 4

// A kernel's dynamic shared memory (the launch's shared_mem bytes) as a T*, 16-byte aligned.
// Every kernel that uses it declares the same extern array, as CUDA requires.
#ifdef PDT_HOST_EMULATION
#define PDT_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(pdt_emu::dynamic_shared())
#else
#define PDT_DYNAMIC_SHARED(T, name)                            \
  extern __shared__ __align__(16) unsigned char pdt_dynamic_smem[]; \
  T* name = reinterpret_cast<T*>(pdt_dynamic_smem)
#endif

// float32 -> bfloat16 from the bits, as cvt.rn.bf16.f32 rounds: nearest even (denormals
// kept), NaN -> 0x7fff. The host emulation's conversion, and the device's before sm_80,
// which has no bfloat16 instruction.
__device__ __forceinline__ u16 pdt_float_to_bf16_bits(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

#ifdef PDT_HOST_EMULATION
// Host builds for the CPU emulation tests (pdt_host_emulation.cuh): the same semantics in C++.
inline float pdt_half_to_float(u16 h) {
  _Float16 f;
  memcpy(&f, &h, 2);
  return (float)f;
}
inline u16 pdt_float_to_half(float f) {
  const _Float16 h = (_Float16)f;
  u16 u;
  memcpy(&u, &h, 2);
  return u;
}
inline float pdt_bf16_to_float(u16 b) { return __uint_as_float(((u32)b) << 16); }
inline u16 pdt_float_to_bf16(float f) { return pdt_float_to_bf16_bits(f); }
inline float pdt_add_rn(float a, float b) { return a + b; }
inline float pdt_mul_rn(float a, float b) { return a * b; }
inline float pdt_div_rn(float a, float b) { return a / b; }
inline double pdt_add_rn(double a, double b) { return a + b; }
inline double pdt_mul_rn(double a, double b) { return a * b; }
inline double pdt_div_rn(double a, double b) { return a / b; }
inline float pdt_double_to_float_rn(double a) { return (float)a; }
#else
// -- 16-bit floats, handled as raw bits so that no cuda_fp16.h / cuda_bf16.h is needed -----
__device__ __forceinline__ float pdt_half_to_float(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 pdt_float_to_half(float f) {  // round to nearest even
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float pdt_bf16_to_float(u16 b) {
  return __uint_as_float(((u32)b) << 16);
}
__device__ __forceinline__ u16 pdt_float_to_bf16(float f) {
  // round to nearest even, NaN -> canonical NaN: the instruction torch's CUDA kernels use
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return pdt_float_to_bf16_bits(f);  // cvt.*.bf16.f32 needs sm_80
#else
  u16 b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
#endif
}

// -- float32 arithmetic that ignores -ftz=true ------------------------------------------------
// CuPy compiles with -ftz=true (denormals flushed to zero), torch's kernels without it. Where
// a result must equal torch's bit for bit, float32 arithmetic goes through these explicit
// round-to-nearest PTX instructions, which never flush (and are never fused into an FMA).
__device__ __forceinline__ float pdt_add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float pdt_mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float pdt_div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ double pdt_add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double pdt_mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double pdt_div_rn(double a, double b) { return __ddiv_rn(a, b); }
// double -> float, nearest even, a denormal result kept: a C++ cast compiles to
// cvt.rn.ftz.f32.f64 under -ftz=true and would flush it to zero.
__device__ __forceinline__ float pdt_double_to_float_rn(double a) {
  float r;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(a));
  return r;
}

#endif  // PDT_HOST_EMULATION

// -- element traits: storage type T, score/accumulation type A, conversions ------------------
// A is float for float32/float16/bfloat16 and double for float64, as in the torch reference.
struct TraitF32 {
  typedef float T;
  typedef float A;
  static __device__ __forceinline__ float to_a(float x) { return x; }
  static __device__ __forceinline__ float from_a(float x) { return x; }
};
struct TraitF64 {
  typedef double T;
  typedef double A;
  static __device__ __forceinline__ double to_a(double x) { return x; }
  static __device__ __forceinline__ double from_a(double x) { return x; }
};
struct TraitF16 {
  typedef u16 T;
  typedef float A;
  static __device__ __forceinline__ float to_a(u16 x) { return pdt_half_to_float(x); }
  static __device__ __forceinline__ u16 from_a(float x) { return pdt_float_to_half(x); }
};
struct TraitBF16 {
  typedef u16 T;
  typedef float A;
  static __device__ __forceinline__ float to_a(u16 x) { return pdt_bf16_to_float(x); }
  static __device__ __forceinline__ u16 from_a(float x) { return pdt_float_to_bf16(x); }
};

// -- 16-byte vectors -----------------------------------------------------------------------
template <typename T, int VEC>
struct VecT;
template <typename T>
struct VecT<T, 1> {
  typedef T type;
};
template <>
struct VecT<float, 4> {
  typedef float4 type;
};
template <>
struct VecT<double, 2> {
  typedef double2 type;
};

template <typename T, int VEC>
__device__ __forceinline__ void pdt_load_vec(const T* __restrict__ p, T (&r)[VEC]) {
  typedef typename VecT<T, VEC>::type V;
  V v = *reinterpret_cast<const V*>(p);
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < VEC; ++i) r[i] = e[i];
}

template <typename T, int VEC>
__device__ __forceinline__ void pdt_store_vec(T* __restrict__ p, const T (&r)[VEC]) {
  typedef typename VecT<T, VEC>::type V;
  V v;
  T* e = reinterpret_cast<T*>(&v);
#pragma unroll
  for (int i = 0; i < VEC; ++i) e[i] = r[i];
  *reinterpret_cast<V*>(p) = v;
}

// The OR of v over the 32 lanes of the warp (every lane must call it): one __reduce_or_sync
// on sm_80 and newer, a shuffle butterfly on older GPUs (which lack it).
__device__ __forceinline__ u32 pdt_warp_or(u32 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(PDT_FULL_MASK, v, o);
  return v;
#else
  return __reduce_or_sync(PDT_FULL_MASK, v);
#endif
}

// -- asynchronous copies from global to shared memory (cp.async, sm_80 and newer) ----------
// pdt_cp_async<BYTES>(dst, src) starts a copy of BYTES (4, 8 or 16; both addresses aligned to
// it; dst in shared memory) that completes in the background; pdt_cp_async_commit() closes
// the issuing thread's current group of copies, and pdt_cp_async_wait<N>() waits until at
// most N of its committed groups are still in flight. A thread sees only its own copies done:
// a barrier must follow before other threads read them. Before sm_80 and in the host
// emulation a copy is an ordinary load and store, done at once, and waiting does nothing.
template <int BYTES>
struct PdtBytesT;
template <>
struct PdtBytesT<2> {
  typedef u16 type;
};
template <>
struct PdtBytesT<4> {
  typedef u32 type;
};
template <>
struct PdtBytesT<8> {
  typedef u64 type;
};
template <>
struct PdtBytesT<16> {
  typedef struct __align__(16) {
    u64 a, b;
  } type;
};

template <int BYTES>
__device__ __forceinline__ void pdt_cp_async(void* dst, const void* src) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(PDT_HOST_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
  typedef typename PdtBytesT<BYTES>::type W;
  *reinterpret_cast<W*>(dst) = *reinterpret_cast<const W*>(src);
#else
  u32 d;
  asm volatile("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }"
               : "=r"(d)
               : "l"(dst));
  if (BYTES == 16) {  // .cg: through L2 only (the staged rows are read from shared memory)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(BYTES)
                 : "memory");
  }
#endif
}

__device__ __forceinline__ void pdt_cp_async_commit() {
#if !defined(PDT_HOST_EMULATION) && !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void pdt_cp_async_wait() {
#if !defined(PDT_HOST_EMULATION) && !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// -- Philox-4x32-10 (Salmon et al., SC'11), the generator of cuRAND and torch --------------
struct PdtU4 {
  u32 x, y, z, w;
};

__device__ __forceinline__ PdtU4 pdt_philox(PdtU4 c, u32 k0, u32 k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    PdtU4 n;
    n.x = hi1 ^ c.y ^ k0;
    n.y = lo1;
    n.z = hi0 ^ c.w ^ k1;
    n.w = lo0;
    c = n;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}
