// What it costs an SM to run code it has not run lately: the megakernel
// runs ~200 KB of its ~380 KB of code every step, most of it once a layer
// or once a step (phase boundaries: staging, hand-off, epilogue,
// numbering), so that code is not in the SM's instruction caches when a
// boundary needs it. Its profile build, with 27 KB more code that mostly
// does not run, is ~10 us slower a step (RESULTS.md, run 248). This probe
// prices that: nanoseconds a KB of straight-line code
//
//   warm      run again at once (the code fits the SM's instruction cache)
//   evicted   run after 256 KB of other code (so fetched again, from L2)
//   flushed   the launch's first run after the host swept 256 MB through L2
//   loaded    as evicted, while warp 4 streams from DRAM by bulk copies
//             (8 in flight) into a shared-memory ring, as the megakernel's
//             loader does during a phase boundary
//   dormant   as evicted, but each executed KB is followed by a KB that a
//             runtime-false branch skips (the profile build's stamps)
//   warm loaded, loaded at depth n: as warm, or as loaded with n copies in
//             flight (the megakernel's ring has 12)
//   loaded elsewhere, loaded half: as loaded at depth 12, but only the even
//             blocks stream; the figures are the odd blocks' (the GPU loaded,
//             not the SM) or the even ones' (the SM loaded, the GPU half)
//
// A region is R KB of FFMA (64 a KB: 8 independent chains, so a warm warp
// issues about one a cycle); each KB starts with a clock read into shared
// memory, and a compare that may end the region there (a runtime limit).
// The measured warps (1, or 4: one a scheduler) run the same region, as a
// block's consumer warps run the same boundary code. One block an SM, 132
// blocks; each figure is the median block's. The FFMA chains' results are
// checked against the host's, so the code the figures time is the code
// that ran.
//
// What it showed on the H200 (RESULTS.md, runs 249-251): ~40 ns a KB warm
// up to ~16 KB, ~85 up to ~96 KB (the SM's instruction cache), ~205 from
// L2, ~460-500 from DRAM; a skipped KB after each run one adds ~115. From
// L2 while every SM streams: ~240 ns a KB with 2 copies in flight a block,
// ~340 with 4, ~800 with 8, 1-2 us with 12; with only half the SMs
// streaming, the idle rate on both halves (a GPU-wide queue, not the SM's
// own). Code in the instruction cache runs at its warm rate under any load.
//
// Build and run (sm_90a; on the device machine): CMake builds it as
// build/icache_probe where it finds the CUDA toolkit, or by hand
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o /tmp/icache_probe kernels/kimi/cuda/dev/icache_probe.cu
// then run it with no arguments (scripts/device_pack.sh carries it).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/kimi/cuda/common.cuh"
#include "kernels/kimi/cuda/dev/cuda_check.h"

constexpr int THREADS = 256, KB_MAX = 192, EVICT_KB = 256, CHAINS = 8, FFMA_PER_KB = 64;
constexpr int PASSES = 3, MAX_DEPTH = 12, STAGE_BYTES = 8704;  // the megakernel's ring and stage
constexpr size_t kStreamBuffer = size_t(1) << 30;

// One KB of code: 64 FFMA over the chains (asm volatile: neither merged nor
// dropped; a and b are runtime values, so nothing folds).
template <int SALT>
__device__ __forceinline__ void one_kb(float (&x)[CHAINS], float a, float b) {
#pragma unroll
  for (int i = 0; i < FFMA_PER_KB / CHAINS; ++i)
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[j]) : "f"(a), "f"(b + SALT));
}

__device__ __forceinline__ unsigned clock32() {
  unsigned t;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
  return t;
}

// The measured region: KB_MAX KB from KB K on, its first `limit` run;
// stamps[k] is the clock at KB k's start (stamps[limit] at the end).
// DORMANT: a skipped KB after each executed one (`never` is 0 at run
// time). A template recursion, not a loop: nvcc leaves a loop with an
// early exit rolled, and the point is KB_MAX KB of distinct code.
template <bool DORMANT, int K = 0>
__device__ __forceinline__ void region(float (&x)[CHAINS], float a, float b, int limit, int never, unsigned* stamps) {
  if constexpr (K < KB_MAX) {
    if (K == limit) {
      stamps[limit] = clock32();
      return;
    }
    stamps[K] = clock32();
    one_kb<0>(x, a, b);
    if (DORMANT && never) one_kb<1>(x, b, a);
    region<DORMANT, K + 1>(x, a, b, limit, never, stamps);
  } else {
    stamps[KB_MAX] = clock32();
  }
}

// Other code, to push the region out of the instruction caches.
__device__ __forceinline__ void evictor(float (&x)[CHAINS], float a, float b) {
#pragma unroll
  for (int k = 0; k < EVICT_KB; ++k) one_kb<2>(x, a, b);
}

struct Args {
  float* out;            // [blocks * 32][CHAINS]: the chains' results of warp 0
  unsigned* stamps;      // [blocks][PASSES][KB_MAX + 1]: warp 0's clocks
  unsigned long long* ns;  // [blocks][PASSES]: warp 0's globaltimer a pass
  const unsigned char* stream;  // the loader's buffer, or nullptr
  float a, b;
  int limit, warps, evict, never;
  int depth;        // the loader's copies in flight (ring stages)
  int odd_streams;  // 1: only the even blocks stream (the odd ones are measured)
};

// Warp 4's lane 0 (the loader): 8.5-KB bulk copies into a ring of g.depth
// stages,
// each block through its own part of a 1-GB buffer, until told to stop.
__device__ void stream_until(const Args& g, unsigned char* ring, uint64_t* full, volatile int* stop) {
  const size_t span = kStreamBuffer / gridDim.x / STAGE_BYTES * STAGE_BYTES;
  const unsigned char* base = g.stream + blockIdx.x * span;
  size_t off = 0;
  const unsigned depth = unsigned(g.depth);
  unsigned n = 0;
  for (; n < depth; ++n, off += STAGE_BYTES) {
    kt_mbar_arrive_expect_tx(&full[n], STAGE_BYTES);
    kt_bulk_copy_g2s(ring + n * STAGE_BYTES, base + off, STAGE_BYTES, &full[n]);
  }
  while (!*stop) {
    const unsigned s = n % depth;
    kt_mbar_wait(&full[s], (n / depth - 1) & 1);
    if (off + STAGE_BYTES > span) off = 0;
    kt_mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
    kt_bulk_copy_g2s(ring + s * STAGE_BYTES, base + off, STAGE_BYTES, &full[s]);
    off += STAGE_BYTES;
    ++n;
  }
  for (unsigned k = n - depth; k < n; ++k) kt_mbar_wait(&full[k % depth], (k / depth) & 1);
}

template <bool DORMANT>
__global__ void __launch_bounds__(THREADS, 1) probe(Args g) {
  extern __shared__ __align__(128) unsigned char ring[];  // MAX_DEPTH stages
  __shared__ uint64_t full[MAX_DEPTH];
  __shared__ unsigned stamps[4][PASSES][KB_MAX + 1];  // a measured warp's
  __shared__ int stop;
  const int warp = int(threadIdx.x) / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < MAX_DEPTH; ++s) kt_mbar_init(&full[s], 1);
    kt_mbar_fence_init();
    stop = 0;
  }
  __syncthreads();
  if (warp == 4) {
    if (g.stream && !(g.odd_streams && blockIdx.x % 2 == 1) && threadIdx.x % 32 == 0) stream_until(g, ring, full, &stop);
    return;
  }
  if (warp >= g.warps) return;
  float x[CHAINS];
#pragma unroll
  for (int j = 0; j < CHAINS; ++j) x[j] = float(j) * 0.001f;
  if (g.stream) __nanosleep(20000);  // the stream under way first
#pragma unroll 1
  for (int p = 0; p < PASSES; ++p) {
    if (g.evict) evictor(x, g.a, g.b);
    const unsigned long long t0 = kt_globaltimer();
    region<DORMANT>(x, g.a, g.b, g.limit, g.never, stamps[warp][p]);
    const unsigned long long t1 = kt_globaltimer();
    if (warp == 0 && threadIdx.x == 0) g.ns[blockIdx.x * PASSES + p] = t1 - t0;
  }
  if (warp == 0) {
    for (int j = 0; j < CHAINS; ++j) g.out[(blockIdx.x * 32 + threadIdx.x) * CHAINS + j] = x[j];
    __syncwarp();
    for (int i = int(threadIdx.x); i < PASSES * (KB_MAX + 1); i += 32)
      g.stamps[size_t(blockIdx.x) * PASSES * (KB_MAX + 1) + i] = stamps[0][i / (KB_MAX + 1)][i % (KB_MAX + 1)];
    if (threadIdx.x == 0) stop = 1;
  }
}

struct Config {
  const char* name;
  bool dormant = false, evict = false, flush = false, load = false;
  int warps = 1, depth = 8;
  std::vector<int> sizes_kb = {4, 16, 32, 64, 96, 128, 192};
  // 0: every block streams; 1: the even blocks stream, the figures are the
  // odd blocks'; 2: the same run, the even blocks' figures.
  int half = 0;
};

struct Figures {
  double ns_per_kb[PASSES] = {0, 0, 0};  // median block, globaltimer
  double cyc_first_kb = 0, cyc_steady_kb = 0;  // pass 0, median block: KB 0, and KBs 1.. on average
  int wrong = 0;
};

// Replays the FFMA sequence one chain sees (evictions with b + 2, the
// region with b), to check the results the kernel wrote.
float replay(int j, const Config& c, float a, float b, int kb) {
  float x = float(j) * 0.001f;
  auto run = [&](int kbs, float bb) {
    for (long i = 0; i < long(kbs) * (FFMA_PER_KB / CHAINS); ++i) x = std::fmaf(x, a, bb);
  };
  for (int p = 0; p < PASSES; ++p) {
    if (c.evict) run(EVICT_KB, b + 2);
    run(kb, b);
  }
  return x;
}

Figures run(const Config& c, int kb, int blocks, unsigned char* stream, unsigned char* sweep, size_t sweep_bytes) {
  Args g{};
  g.a = 0.999f;
  g.b = 0.001f;
  g.limit = kb;
  g.warps = c.warps;
  g.evict = c.evict;
  g.never = 0;
  g.depth = c.depth;
  g.stream = c.load ? stream : nullptr;
  g.odd_streams = c.half > 0;
  CHECK(cudaMalloc(&g.out, size_t(blocks) * 32 * CHAINS * sizeof(float)));
  CHECK(cudaMalloc(&g.stamps, size_t(blocks) * PASSES * (KB_MAX + 1) * sizeof(unsigned)));
  CHECK(cudaMalloc(&g.ns, size_t(blocks) * PASSES * sizeof(unsigned long long)));
  const int smem = MAX_DEPTH * STAGE_BYTES;
  auto kernel = c.dormant ? probe<true> : probe<false>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // A first launch puts the code in L2 (and in any cache a launch keeps).
  kernel<<<blocks, THREADS, smem>>>(g);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  if (c.flush) CHECK(cudaMemset(sweep, int(kb), sweep_bytes));
  kernel<<<blocks, THREADS, smem>>>(g);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> out(size_t(blocks) * 32 * CHAINS);
  std::vector<unsigned> st(size_t(blocks) * PASSES * (KB_MAX + 1));
  std::vector<unsigned long long> ns(size_t(blocks) * PASSES);
  CHECK(cudaMemcpy(out.data(), g.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(st.data(), g.stamps, st.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(ns.data(), g.ns, ns.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(g.out));
  CHECK(cudaFree(g.stamps));
  CHECK(cudaFree(g.ns));
  Figures f;
  for (int j = 0; j < CHAINS; ++j) {
    const float want = replay(j, c, g.a, g.b, kb);
    for (int t = 0; t < blocks * 32; ++t)
      if (out[size_t(t) * CHAINS + j] != want) ++f.wrong;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (int p = 0; p < PASSES; ++p) {
    std::vector<double> v;
    for (int b = c.half == 1; b < blocks; b += c.half ? 2 : 1) v.push_back(double(ns[size_t(b) * PASSES + p]) / kb);
    f.ns_per_kb[p] = median(v);
  }
  std::vector<double> first, steady;
  for (int b = c.half == 1; b < blocks; b += c.half ? 2 : 1) {
    const unsigned* s = &st[size_t(b) * PASSES * (KB_MAX + 1)];
    first.push_back(double(s[1] - s[0]));
    if (kb > 1) steady.push_back(double(s[kb] - s[1]) / (kb - 1));
  }
  f.cyc_first_kb = median(first);
  f.cyc_steady_kb = kb > 1 ? median(steady) : 0;
  return f;
}

int main() {
  int sms = 0, clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("SMs %d, max SM clock %.0f MHz; one block an SM; figures are the median block's\n", sms,
              clock_khz / 1000.0);
  std::printf("ns/KB by pass (globaltimer; pass 1 is the launch's first run of the region), and pass 1's clocks:\n");
  std::printf("first KB's cycles, then cycles a KB over the rest (a warm KB is ~64 FFMA, ~70 cycles)\n\n");
  unsigned char *stream = nullptr, *sweep = nullptr;
  const size_t sweep_bytes = size_t(256) << 20;
  CHECK(cudaMalloc(&stream, kStreamBuffer));
  CHECK(cudaMemset(stream, 1, kStreamBuffer));
  CHECK(cudaMalloc(&sweep, sweep_bytes));
  const std::vector<int> few = {16, 64, 96};
  const Config configs[] = {
      {"warm, 1 warp", false, false, false, false, 1},
      {"warm, 4 warps", false, false, false, false, 4},
      {"evicted, 1 warp", false, true, false, false, 1},
      {"evicted, 4 warps", false, true, false, false, 4},
      {"flushed, 4 warps", false, false, true, false, 4},
      {"loaded, 4 warps", false, true, false, true, 4},
      {"dormant, 4 warps", true, true, false, false, 4},
      {"dormant loaded", true, true, false, true, 4},
      // Code the SM ran a moment ago (pass 2 onwards) while the loader streams,
      // and the loaded fetch by the loader's copies in flight.
      {"warm loaded", false, false, false, true, 4, 8, few},
      {"loaded, depth 2", false, true, false, true, 4, 2, few},
      {"loaded, depth 4", false, true, false, true, 4, 4, few},
      {"loaded, depth 12", false, true, false, true, 4, 12, few},
      // Half the SMs stream (half the GPU's copies in flight): whether the
      // fetch waits behind the SM's own copies or the GPU's.
      {"loaded elsewhere", false, true, false, true, 4, 12, few, 1},
      {"loaded half", false, true, false, true, 4, 12, few, 2},
  };
  int wrong = 0;
  std::printf("%-18s %5s %9s %9s %9s %10s %10s\n", "config", "KB", "pass 1", "pass 2", "pass 3", "KB0 cyc", "KB cyc");
  for (const Config& c : configs) {
    for (int kb : c.sizes_kb) {
      const Figures f = run(c, kb, sms, stream, sweep, sweep_bytes);
      std::printf("%-18s %5d %9.1f %9.1f %9.1f %10.0f %10.1f%s\n", c.name, kb, f.ns_per_kb[0], f.ns_per_kb[1],
                  f.ns_per_kb[2], f.cyc_first_kb, f.cyc_steady_kb, f.wrong ? "  WRONG RESULTS" : "");
      wrong += f.wrong;
    }
  }
  CHECK(cudaFree(stream));
  CHECK(cudaFree(sweep));
  if (wrong) std::printf("\nFAILED: %d wrong chain results\n", wrong);
  return wrong ? 1 : 0;
}
