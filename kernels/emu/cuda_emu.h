// A CPU emulator for ktune's CUDA kernels, so their logic runs (and is
// tested in CI) on a machine without a GPU. A variant's .cu source compiled
// by g++ with this header prepended becomes a shared library whose kernels
// run as fibers: one fiber per GPU thread, all blocks of a cooperative
// launch alive at once, switched cooperatively at __syncthreads, warp
// collectives (shuffles, ballots, mma), spin-wait sleeps and grid barriers.
//
// What it models: thread/block indexing, dynamic shared memory per block,
// block barriers, warp shuffles/ballots, the m16n8k16 bf16 mma fragment
// layout (per the PTX ISA), atomics, and the bf16 conversions and packed
// bf16 arithmetic the kernels use (bit-exact round-to-nearest-even).
// What it does not: timing, caches, memory-model races (fibers interleave
// only at the points above), or faults (a wild write is a host segfault).
// Fibers take turns in thread order, block by block; KTUNE_EMU_ORDER=reverse
// turns them in the opposite order (the last block's last thread first), so
// a wait that thread order happens to satisfy early is tested the other
// way round too.
//
// Kernels must use the kt_* wrappers in kernels/kimi/cuda/common.cuh for
// anything architectural (PTX, intrinsics); that file picks the emulated
// versions from here when KT_EMULATION is defined.
#pragma once
#define KT_EMULATION 1

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <chrono>
#include <cmath>
#include <vector>

// ---- CUDA qualifiers and vector types -----------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
#define __grid_constant__

struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace kt_emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// ---- fibers: a minimal x86-64 context switch --------------------------
// kt_emu_switch(save, load): pushes the callee-saved registers, stores the
// stack pointer in *save, loads `load` and pops the other context's ones.
extern "C" void kt_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl kt_emu_switch
  .type kt_emu_switch, @function
kt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kt_emu_switch, .-kt_emu_switch
)");

using KernelFn = void (*)(const void* args, const void* launch_args);

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;  // a slice of the launch's stack pool
  unsigned block = 0, thread = 0;
  bool done = false;
};

struct WarpState {
  unsigned arrived = 0, generation = 0;
  alignas(16) unsigned char slot[32][64];  // each lane's contribution to a collective
};

struct BlockState {
  unsigned arrived = 0, generation = 0;
  unsigned named_arrived = 0, named_generation = 0;  // named barrier 1 (bar.sync 1, n)
  std::vector<unsigned char> smem;
  std::vector<WarpState> warps;
};

struct Launch {
  KernelFn fn = nullptr;
  const void* args = nullptr;
  const void* launch_args = nullptr;
  Dim3 grid, block;
  std::vector<Fiber> fibers;
  std::vector<BlockState> blocks;
  size_t current = 0;
  void* scheduler_sp = nullptr;
};

inline Launch* g_launch = nullptr;
inline Dim3 g_threadIdx, g_blockIdx, g_blockDim, g_gridDim;
inline const size_t kStackBytes = 128 * 1024;

inline Fiber& self() { return g_launch->fibers[g_launch->current]; }
inline void yield() { kt_emu_switch(&self().sp, g_launch->scheduler_sp); }

inline void fiber_entry() {
  Launch& L = *g_launch;
  L.fn(L.args, L.launch_args);
  self().done = true;
  yield();  // never resumed
}

// Sets up a fresh stack so that the first switch into it "returns" into
// fiber_entry with the ABI's stack alignment.
inline void prepare(Fiber& f) {
  f.done = false;
  uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + kStackBytes) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                     // fake return address slot: keeps rsp % 16 == 8 at entry
  *--sp = reinterpret_cast<void*>(&fiber_entry);       // popped by `ret`
  for (int i = 0; i < 6; ++i) *--sp = nullptr;         // rbp rbx r12 r13 r14 r15
  f.sp = sp;
}

// A barrier's state is an arrival count and a generation: the count-th
// arrival starts the next generation, which releases the others.
inline void meet(unsigned& arrived, unsigned& generation, unsigned count) {
  unsigned gen = generation;
  if (++arrived == count) {
    arrived = 0;
    ++generation;
    return;
  }
  while (generation == gen) yield();
}

// Block-wide barrier (__syncthreads).
inline void block_barrier() {
  BlockState& b = g_launch->blocks[self().block];
  meet(b.arrived, b.generation, g_launch->block.x);
}

// Named barrier 1 among `count` of the block's threads (bar.sync 1, count):
// the others (a loader warpgroup) never join it.
inline void named_barrier(unsigned count) {
  BlockState& b = g_launch->blocks[self().block];
  meet(b.named_arrived, b.named_generation, count);
}

inline WarpState& my_warp() { return g_launch->blocks[self().block].warps[self().thread / 32]; }
inline unsigned lane_id() { return self().thread % 32; }

// All 32 lanes of the warp meet here (the two halves of a collective).
inline void warp_barrier() {
  WarpState& w = my_warp();
  meet(w.arrived, w.generation, 32);
}

// Deposits `bytes` of this lane's data and returns, after every lane did
// the same, a pointer to the warp's slots; call warp_release() after reading.
inline unsigned char (*warp_gather(const void* data, size_t bytes))[64] {
  WarpState& w = my_warp();
  memcpy(w.slot[lane_id()], data, bytes);
  warp_barrier();
  return w.slot;
}
inline void warp_release() { warp_barrier(); }

// Fiber stacks, kept from launch to launch (untouched pages cost nothing;
// reallocating them for every launch would fault them in again).
inline char* stack_pool(size_t bytes) {
  static char* pool = nullptr;
  static size_t size = 0;
  if (bytes > size) {
    free(pool);
    pool = static_cast<char*>(aligned_alloc(4096, bytes));
    size = bytes;
  }
  return pool;
}

// Runs a kernel to completion. A cooperative launch runs every block at
// once (its blocks may wait for each other at grid barriers); otherwise
// blocks run a few at a time, as an SM would, which keeps large grids cheap.
// Returns false with a message for a launch the hardware would refuse.
inline bool launch(KernelFn fn, unsigned grid, unsigned block, size_t smem, bool cooperative, const void* args,
                   const void* launch_args, char* err, size_t errlen) {
  if (block == 0 || block > 1024 || block % 32) {
    snprintf(err, errlen, "emulator: block size %u is not a multiple of 32 in 32..1024", block);
    return false;
  }
  if (smem > 227 * 1024) {
    snprintf(err, errlen, "emulator: %zu bytes of shared memory exceed the 227 KB a block may have", smem);
    return false;
  }
  const unsigned wave = cooperative ? grid : (grid < 4 ? grid : 4);
  char* stacks = stack_pool(size_t(wave) * block * kStackBytes);
  Launch* outer = g_launch;
  for (unsigned first = 0; first < grid; first += wave) {
    const unsigned count = grid - first < wave ? grid - first : wave;
    Launch L;
    L.fn = fn;
    L.args = args;
    L.launch_args = launch_args;
    L.grid.x = grid;
    L.block.x = block;
    L.blocks.resize(count);
    for (auto& b : L.blocks) {
      b.smem.assign(smem + 16, 0xA5);  // poisoned, as uninitialized shared memory would be
      b.warps.resize(block / 32);
    }
    L.fibers.resize(size_t(count) * block);
    for (unsigned b = 0; b < count; ++b)
      for (unsigned t = 0; t < block; ++t) {
        Fiber& f = L.fibers[size_t(b) * block + t];
        f.block = b;
        f.thread = t;
        f.stack = stacks + (size_t(b) * block + t) * kStackBytes;
        prepare(f);
      }
    g_launch = &L;
    g_gridDim.x = grid;
    g_blockDim.x = block;
    const char* order = getenv("KTUNE_EMU_ORDER");
    const bool reverse = order && strcmp(order, "reverse") == 0;
    size_t remaining = L.fibers.size();
    while (remaining) {
      for (size_t k = 0; k < L.fibers.size(); ++k) {
        const size_t i = reverse ? L.fibers.size() - 1 - k : k;
        Fiber& f = L.fibers[i];
        if (f.done) continue;
        L.current = i;
        g_threadIdx.x = f.thread;
        g_blockIdx.x = first + f.block;
        kt_emu_switch(&L.scheduler_sp, f.sp);
        if (f.done) --remaining;
      }
    }
  }
  g_launch = outer;
  return true;
}

// ---- mbarriers and bulk copies (cp.async.bulk) ----------------------------
// An emulated mbarrier is its 8 bytes of shared memory read as: the
// arrivals each phase expects, the arrivals still pending, the phase's
// parity, and the transaction bytes still pending. A bulk copy happens at
// once (memcpy) and completes its bytes on the barrier right away, so a
// waiter only ever waits for other threads' arrivals.
struct Mbar {
  uint32_t expected : 12, pending : 12, parity : 1;
  int32_t tx;
};
inline Mbar& mbar(void* p) {
  static_assert(sizeof(Mbar) == 8, "an mbarrier is 8 bytes");
  return *static_cast<Mbar*>(p);
}
inline void mbar_complete_if_done(Mbar& b) {
  if (b.pending == 0 && b.tx == 0) {
    b.parity ^= 1;
    b.pending = b.expected;
  }
}
inline void mbar_init(void* p, unsigned count) {
  Mbar& b = mbar(p);
  b.expected = b.pending = count;
  b.parity = 0;
  b.tx = 0;
}
inline void mbar_arrive(void* p, int tx_bytes) {
  Mbar& b = mbar(p);
  b.tx += tx_bytes;
  --b.pending;
  mbar_complete_if_done(b);
}
inline void mbar_complete_tx(void* p, int bytes) {
  Mbar& b = mbar(p);
  b.tx -= bytes;
  mbar_complete_if_done(b);
}
// Phase `parity` has completed once the barrier's parity moved past it.
inline void mbar_wait(void* p, unsigned parity) {
  while (mbar(p).parity == parity) yield();
}

}  // namespace kt_emu

#define threadIdx kt_emu::g_threadIdx
#define blockIdx kt_emu::g_blockIdx
#define blockDim kt_emu::g_blockDim
#define gridDim kt_emu::g_gridDim

inline void __syncthreads() { kt_emu::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { kt_emu::warp_barrier(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __nanosleep(unsigned) { kt_emu::yield(); }
// A kernel's trap ends the context on the GPU; here it ends the process
// that runs the emulated launch (the runner reports a crashed variant).
[[noreturn]] inline void __trap() {
  fprintf(stderr, "kt_emu: a kernel thread trapped\n");
  abort();
}

template <class T>
inline T kt_emu_shfl(T v, int (*src)(int lane, int arg), int arg) {
  static_assert(sizeof(T) <= 64, "shuffle of a type larger than a slot");
  auto slots = kt_emu::warp_gather(&v, sizeof(T));
  int s = src(int(kt_emu::lane_id()), arg) & 31;
  T out;
  memcpy(&out, slots[s], sizeof(T));
  kt_emu::warp_release();
  return out;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) {
  return kt_emu_shfl<T>(v, [](int lane, int a) { return lane ^ a; }, m);
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) {
  return kt_emu_shfl<T>(v, [](int, int a) { return a; }, src);
}
template <class T> inline T __shfl_down_sync(unsigned, T v, int d) {
  return kt_emu_shfl<T>(v, [](int lane, int a) { return lane + a < 32 ? lane + a : lane; }, d);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  int p = pred != 0;
  auto slots = kt_emu::warp_gather(&p, sizeof p);
  unsigned bits = 0;
  for (int i = 0; i < 32; ++i) {
    int v;
    memcpy(&v, slots[i], sizeof v);
    if (v) bits |= 1u << i;
  }
  kt_emu::warp_release();
  return bits;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  auto slots = kt_emu::warp_gather(&v, sizeof v);
  unsigned most = 0;
  for (int i = 0; i < 32; ++i) {
    unsigned x;
    memcpy(&x, slots[i], sizeof x);
    most = x > most ? x : most;
  }
  kt_emu::warp_release();
  return most;
}
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, pred) == 0xffffffffu; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  uint64_t src = uint64_t(x) | (uint64_t(y) << 32);
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((src >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

inline int atomicAdd(int* p, int v) { int o = *p; *p = o + v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
inline float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
inline unsigned atomicExch(unsigned* p, unsigned v) { unsigned o = *p; *p = v; return o; }
inline int atomicExch(int* p, int v) { int o = *p; *p = v; return o; }
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { unsigned o = *p; if (o == c) *p = v; return o; }

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }

// The kernel table a variant exports, turned into something the runner can
// call. A variant source ends with
//   KT_KERNEL_TABLE_BEGIN KT_KERNEL(ktune_k0) KT_KERNEL(ktune_k1) KT_KERNEL_TABLE_END
// which is empty on the GPU and defines ktune_emu_launch here.
#define KT_KERNEL_TABLE_BEGIN static const kt_emu::KernelFn kt_emu_kernel_table[] = {
#define KT_KERNEL(k)                                                                   \
  +[](const void* a, const void* l) {                                                  \
    k(*static_cast<const KimiDeviceArgs*>(a), *static_cast<const KtLaunchArgs*>(l));   \
  },
#define KT_KERNEL_TABLE_END                                                                       \
  };                                                                                              \
  extern "C" int ktune_emu_launch(int kernel, int grid, int block, int smem, int cooperative,     \
                                  const void* args, const void* launch_args, char* err, int errlen) { \
    if (kernel < 0 || kernel >= int(sizeof kt_emu_kernel_table / sizeof kt_emu_kernel_table[0])) { \
      snprintf(err, size_t(errlen), "emulator: no kernel %d", kernel);                            \
      return 0;                                                                                   \
    }                                                                                             \
    return kt_emu::launch(kt_emu_kernel_table[kernel], unsigned(grid), unsigned(block),           \
                          size_t(smem), cooperative != 0, args, launch_args, err, size_t(errlen)); \
  }
