// A CPU emulation of the CUDA execution model, for tests only: it lets the kernels of
// impl/cuda/*.cu be compiled by a host C++ compiler (g++ -include pdt_host_emulation.cuh)
// and run on machines without a GPU, so that their results can be checked against the torch
// references there too. Never used on a GPU (NVRTC and nvcc do not see this file).
//
// Each block runs as cooperative fibers, one per thread, on one OS thread (started with
// makecontext/setcontext, switched with _setjmp/_longjmp: no system call per switch), blocks
// one after another; __syncthreads and the warp collectives (__shfl*_sync, __ballot_sync)
// are barriers over every thread of the block or warp (strict: a thread that has exited
// never arrives, as the full-mask collectives and __syncthreads of the kernels require). A
// barrier that can never complete (divergent __syncthreads or shuffles, or an exit before
// one) is reported as a deadlock instead of hanging.
// Shared memory is a function-local static (blocks do not run concurrently). What it does
// not model: the memory model (data races run in one fixed interleaving, and are found by the
// race checker below), warp divergence costs, timing.
//
// Built with -fsanitize=thread (g++ defines __SANITIZE_THREAD__), it is a race checker, the
// CPU counterpart of compute-sanitizer racecheck: each emulated thread is a ThreadSanitizer
// fiber, switched to without synchronisation, and the only happens-before edges between the
// threads of a block are the ones the GPU guarantees: __syncthreads (over the block), and
// __syncwarp and the warp collectives (over the warp). Two threads of a block that touch the
// same byte of shared or global memory, one of them writing, with no such barrier between
// them, are reported as a data race, whatever order the fibers happen to run in. Atomics are
// real atomics there. Blocks are ordered one after another (the launcher acquires each
// finished block), so races between blocks are not reported, as racecheck reports none.
#pragma once
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define PDT_HOST_EMULATION 1

#if defined(__SANITIZE_THREAD__)
#define PDT_EMU_RACECHECK 1
#include <sanitizer/tsan_interface.h>
// The emulation's own bookkeeping (barrier counters, the scheduler) is not what is checked.
#define PDT_EMU_UNCHECKED __attribute__((no_sanitize_thread, noinline))
#else
#define PDT_EMU_UNCHECKED
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct pdt_uint3 {
  unsigned x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) double2 {
  double x, y;
};

static pdt_uint3 threadIdx, blockIdx, blockDim, gridDim;

inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline long long __double_as_longlong(double d) {
  long long u;
  memcpy(&u, &d, 8);
  return u;
}
inline double __longlong_as_double(long long u) {
  double d;
  memcpy(&d, &u, 8);
  return d;
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
template <class A, class B>
inline auto min(A a, B b) -> decltype(a + b) {
  return a < b ? a : b;
}
template <class A, class B>
inline auto max(A a, B b) -> decltype(a + b) {
  return a < b ? b : a;
}
inline unsigned atomicOr(unsigned* p, unsigned v) {  // an atomic, as the race checker must see
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}

namespace pdt_emu {

constexpr int kMaxThreads = 1024;
constexpr size_t kStack = 256 * 1024;

struct Fiber {
  ucontext_t ctx;
  jmp_buf jb;
  std::vector<char> stack;
  bool started = false;
  bool done = false;
  pdt_uint3 tid{0, 0, 0};
  unsigned lin = 0;
#ifdef PDT_EMU_RACECHECK
  void* race_fiber = nullptr;  // the fiber's ThreadSanitizer context
#endif
};

struct State {
  std::vector<Fiber> fibers;
  jmp_buf sched;
  int cur = -1;
  std::function<void()>* body = nullptr;
  unsigned long long events = 0;
  unsigned nthreads = 0, arrived = 0, gen = 0;
  unsigned w_size[kMaxThreads / 32], w_arrived[kMaxThreads / 32], w_gen[kMaxThreads / 32];
  unsigned char slot[kMaxThreads][8];
  char error[256] = {0};
  std::vector<unsigned char> dynamic_smem;  // the launch's dynamic shared memory, per block
  // Addresses that stand for the happens-before edges of the race checker.
  char block_sync = 0, block_done = 0, w_sync[kMaxThreads / 32] = {0};
#ifdef PDT_EMU_RACECHECK
  ucontext_t sched_ctx;
  void* sched_fiber = nullptr;  // the launching thread's ThreadSanitizer context
#endif
};

inline State& st() {
  static State s;
  return s;
}

// PDT_EMU_ORDER=reverse (read at the first launch) runs a launch's blocks last first, and
// the threads of a block, between two barriers, last first too. A result that changes with it
// depends on an order the GPU does not promise: between blocks (which the race checker does
// not see) as well as within one.
inline bool reverse_order() {
  static const bool reverse = [] {
    const char* order = getenv("PDT_EMU_ORDER");
    return order != nullptr && strcmp(order, "reverse") == 0;
  }();
  return reverse;
}

// Under the race checker a barrier is a release by every arriving thread and an acquire by
// every leaving one: all that each did before it happens before all that any does after it.
PDT_EMU_UNCHECKED inline void sync_release(char* edge) {
#ifdef PDT_EMU_RACECHECK
  __tsan_release(edge);
#else
  (void)edge;
#endif
}

PDT_EMU_UNCHECKED inline void sync_acquire(char* edge) {
#ifdef PDT_EMU_RACECHECK
  __tsan_acquire(edge);
#else
  (void)edge;
#endif
}

#ifdef PDT_EMU_RACECHECK
// Fibers switch by swapcontext (ThreadSanitizer follows no _longjmp between stacks), and
// without synchronisation: a fiber's accesses are ordered before another's only by barriers.
PDT_EMU_UNCHECKED inline void yield_() {
  State& s = st();
  __tsan_switch_to_fiber(s.sched_fiber, __tsan_switch_to_fiber_no_sync);
  swapcontext(&s.fibers[s.cur].ctx, &s.sched_ctx);
}
#else
inline void yield_() {
  State& s = st();
  if (!_setjmp(s.fibers[s.cur].jb)) _longjmp(s.sched, 1);
}
#endif

PDT_EMU_UNCHECKED inline void entry() {
  State& s = st();
  (*s.body)();
  Fiber& f = s.fibers[s.cur];
  f.done = true;
  s.events++;
  sync_release(&s.block_done);  // the launcher acquires the finished block
#ifdef PDT_EMU_RACECHECK
  __tsan_switch_to_fiber(s.sched_fiber, __tsan_switch_to_fiber_no_sync);
  setcontext(&s.sched_ctx);
#else
  _longjmp(s.sched, 1);  // never returns: the fiber's stack is reused by the next block
#endif
}

PDT_EMU_UNCHECKED inline void block_barrier() {
  State& s = st();
  const unsigned g = s.gen;
  s.arrived++;
  s.events++;
  sync_release(&s.block_sync);
  for (;;) {
    if (s.gen != g) break;
    if (s.arrived >= s.nthreads) {
      s.arrived = 0;
      s.gen++;
      s.events++;
      break;
    }
    yield_();
  }
  sync_acquire(&s.block_sync);
}

PDT_EMU_UNCHECKED inline void warp_barrier() {
  State& s = st();
  const unsigned w = s.fibers[s.cur].lin / 32;
  const unsigned g = s.w_gen[w];
  s.w_arrived[w]++;
  s.events++;
  sync_release(&s.w_sync[w]);
  for (;;) {
    if (s.w_gen[w] != g) break;
    if (s.w_arrived[w] >= s.w_size[w]) {
      s.w_arrived[w] = 0;
      s.w_gen[w]++;
      s.events++;
      break;
    }
    yield_();
  }
  sync_acquire(&s.w_sync[w]);
}

template <class T>
inline T exchange(T v, unsigned src_lane) {
  State& s = st();
  const unsigned lin = s.fibers[s.cur].lin;
  const unsigned base = lin & ~31u;
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  memcpy(s.slot[lin], &v, sizeof(T));
  warp_barrier();
  T r;
  memcpy(&r, s.slot[base + src_lane], sizeof(T));
  warp_barrier();
  return r;
}

PDT_EMU_UNCHECKED inline int run_block(unsigned nthreads) {
  State& s = st();
  if (nthreads > (unsigned)kMaxThreads) {
    snprintf(s.error, sizeof s.error, "block of %u threads > %d", nthreads, kMaxThreads);
    return 1;
  }
  if (s.fibers.size() < nthreads) s.fibers.resize(nthreads);
  s.nthreads = nthreads;
  s.arrived = 0;
  for (unsigned w = 0; w < (unsigned)kMaxThreads / 32; ++w) {
    const unsigned lo = w * 32;
    s.w_size[w] = lo >= nthreads ? 0 : (nthreads - lo < 32 ? nthreads - lo : 32);
    s.w_arrived[w] = 0;
  }
  for (unsigned i = 0; i < nthreads; ++i) {
    Fiber& f = s.fibers[i];
    if (f.stack.empty()) f.stack.resize(kStack);
    f.done = false;
    f.started = false;
    f.lin = i;
    f.tid = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, (void (*)())entry, 0);
#ifdef PDT_EMU_RACECHECK
    if (!f.race_fiber) f.race_fiber = __tsan_create_fiber(0);
#endif
  }
#ifdef PDT_EMU_RACECHECK
  s.sched_fiber = __tsan_get_current_fiber();
#endif
  const bool reverse = reverse_order();
  for (;;) {
    const unsigned long long before = s.events;
    bool any = false;
    for (unsigned j = 0; j < nthreads; ++j) {
      const unsigned i = reverse ? nthreads - 1 - j : j;
      if (s.fibers[i].done) continue;
      any = true;
      s.cur = (int)i;
      threadIdx = s.fibers[i].tid;
      Fiber& f = s.fibers[i];
#ifdef PDT_EMU_RACECHECK
      // With synchronisation: what the launcher did (the last block included) happens before.
      // (swapcontext starts a fiber from makecontext's context and resumes one from yield_'s.)
      __tsan_switch_to_fiber(f.race_fiber, 0);
      swapcontext(&s.sched_ctx, &f.ctx);
#else
      if (!_setjmp(s.sched)) {
        if (!f.started) {
          f.started = true;
          setcontext(&f.ctx);
        }
        _longjmp(f.jb, 1);
      }
#endif
    }
    if (!any) {
      sync_acquire(&s.block_done);  // the block's threads happen before what follows it
      return 0;
    }
    if (s.events == before) {
      snprintf(s.error, sizeof s.error,
               "deadlock in block (%u,%u,%u): a barrier or warp collective is never completed",
               blockIdx.x, blockIdx.y, blockIdx.z);
      return 1;
    }
  }
}

// Dynamic shared memory (PDT_DYNAMIC_SHARED): `smem_bytes` of it, refilled with 0xA5 before
// each block so that a read before any write sees garbage, as on a GPU.
template <class F>
PDT_EMU_UNCHECKED inline int launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, F body, size_t smem_bytes = 0) {
  std::function<void()> fn = body;
  st().body = &fn;
  st().error[0] = 0;
  st().dynamic_smem.assign(smem_bytes + 16, 0xA5);
  gridDim = {gx, gy, gz};
  blockDim = {bx, by, bz};
  const unsigned long long blocks = (unsigned long long)gx * gy * gz;
  for (unsigned long long j = 0; j < blocks; ++j) {
    const unsigned long long b = reverse_order() ? blocks - 1 - j : j;
    blockIdx = {(unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / gx / gy)};
    std::fill(st().dynamic_smem.begin(), st().dynamic_smem.end(), 0xA5);
    if (run_block(bx * by * bz)) return 1;
  }
  return 0;
}

// The block's dynamic shared memory, 16-byte aligned.
inline unsigned char* dynamic_shared() {
  unsigned char* p = st().dynamic_smem.data();
  return p + ((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15);
}

}  // namespace pdt_emu

inline void __syncthreads() { pdt_emu::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { pdt_emu::warp_barrier(); }

template <class T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const unsigned lane = pdt_emu::st().fibers[pdt_emu::st().cur].lin & 31u;
  const unsigned src_lane = (lane & ~(unsigned)(width - 1)) + ((unsigned)src & (width - 1));
  return pdt_emu::exchange(v, src_lane);
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const unsigned lane = pdt_emu::st().fibers[pdt_emu::st().cur].lin & 31u;
  (void)width;
  return pdt_emu::exchange(v, lane ^ (unsigned)lane_mask);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  pdt_emu::State& s = pdt_emu::st();
  const unsigned lin = s.fibers[s.cur].lin;
  const unsigned base = lin & ~31u;
  s.slot[lin][0] = pred ? 1 : 0;
  pdt_emu::warp_barrier();
  unsigned bits = 0;
  for (unsigned l = 0; l < 32 && base + l < s.nthreads; ++l)
    if (!s.fibers[base + l].done && s.slot[base + l][0]) bits |= 1u << l;
  pdt_emu::warp_barrier();
  return bits;
}
inline unsigned __reduce_or_sync(unsigned, unsigned value) {
  pdt_emu::State& s = pdt_emu::st();
  const unsigned lin = s.fibers[s.cur].lin;
  const unsigned base = lin & ~31u;
  memcpy(s.slot[lin], &value, sizeof value);
  pdt_emu::warp_barrier();
  unsigned bits = 0, v;
  for (unsigned l = 0; l < 32 && base + l < s.nthreads; ++l)
    if (!s.fibers[base + l].done) {
      memcpy(&v, s.slot[base + l], sizeof v);
      bits |= v;
    }
  pdt_emu::warp_barrier();
  return bits;
}
inline int __ffs(int x) { return __builtin_ffs(x); }
