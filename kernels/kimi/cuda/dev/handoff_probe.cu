// The k-split hand-off, alone: how long from the moment every k-split item
// of a tile has its 128 partial sums until one block holds the tile's
// total, with every tile of a phase handing off at once (as o_proj's 18
// tiles x 7 splits do). It answers whether thread-block clusters, their
// splits reduced through distributed shared memory, would cut the ~1 us
// hand-off of the megakernel's o_proj, down, q,kv_a and w_uv phases, and
// how many SMs a persistent cluster launch can hold.
//
//   v0 global   as the megakernel's gemv_item: each split stores its
//               partials, one acquire-release atomic on the tile's counter,
//               the split that arrives last reads the S partials
//   v1 atomic   every split adds its partials into the tile's sums by
//               fire-and-forget atomics, a grid barrier, then a block reads
//               the sums (the megakernel's KT_REDUCE 1, whose next staging
//               pays for the atomics: RESULTS, run 200)
//   v2 cluster  the S splits of a tile are one cluster: each stores its
//               partials into the first block's shared memory (DSMEM), one
//               cluster barrier, the first block sums them
//   v3 read all v1, then every block reads every tile's sums (as the
//               megakernel's next staging, stage_carried, reads a whole
//               vector); v4 the same with the sums written by plain stores
//               (one split a tile), to tell the atomics' cost from the reads'
//   v5 wide     every block adds a whole hidden-sized vector (18 tiles of
//               128 sums, 16-byte vector reductions, a warp a tile at a
//               time), a grid barrier, then every block reads the vector:
//               o_proj's k-split if each of the KDA phase's 128 items
//               (head, 32 value columns) multiplied its own 32 values of o
//               by their 32 rows of o_proj, so that no barrier stood
//               between the KDA update and o_proj (S 128 a column instead
//               of 7); with C copies of the vector, block b adds into copy
//               b % C and every block reads all C (fewer reductions wait on
//               each 32-byte sector, more to read)
//   ref         the grid barrier alone (v1 includes one); "ref n poll", the
//               same with lane 0 of n warps polling its counter, their first
//               polls spread (a megakernel knob, barrier_pollers, tried
//               and dropped in run 332)
// and whether a cooperative launch (the megakernel's) takes clusters of 2.
//
// Each round starts at a grid barrier (a counter, as the megakernel's
// KT_BARRIER 2); a round's time is the finishing block's, from its barrier
// exit to holding the sums (globaltimer). Every total is checked against
// the sum the host expects. Warps 0-3 hand off; with "under load", warps
// 4-7 meanwhile stream 64 KB a block from a 1-GB buffer (~8 MB a round
// over the grid, ~2 us of DRAM time), as the megakernel's loader streams
// the next phase's weights while a phase hands off. Then, for a persistent
// kernel that needs every block resident (one block an SM, as the
// megakernel runs), how many clusters of 2, 4 and 8 blocks fit at once
// (cudaOccupancyMaxActiveClusters).
//
// What it showed on the H200 (RESULTS.md, 2026-12-02, run 201): the grid
// barrier alone 0.99 us, v0 1.0-1.5, v1 1.1, v2 0.6 us; clusters of 2 hold
// all 132 SMs, of 4 or 8 only 120; reading atomically added sums costs
// 0.1 us more than plainly stored ones; under load every variant, the
// barrier alone included, takes ~1.7 us longer (the barrier 2.7 us).
// Runs 285-286 (2026-12-03): v5 wide 3.46-3.78 us against v3's 1.41-1.54
// (2 copies 3.14, 4 3.49, 8 4.96; under load 4.45-4.80 against 3.10-3.17):
// a 128-way k-split by reductions costs ~2 us more than a 7-way one.
// Run 287: a cooperative launch with clusters of 2 is accepted (132
// blocks, the cluster hand-off 0.58 us as without the cooperative launch).
//
// Build and run (sm_90a; on the device machine): CMake builds it as
// build/handoff_probe where it finds the CUDA toolkit, or by hand
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o /tmp/handoff_probe kernels/kimi/cuda/dev/handoff_probe.cu
// then run it with no arguments (scripts/device_pack.sh carries it).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/kimi/cuda/common.cuh"
#include "kernels/kimi/cuda/dev/cuda_check.h"

namespace cg = cooperative_groups;

constexpr int TILE = 128, THREADS = 256, ROUNDS = 200;
constexpr int HANDOFF_THREADS = 128;                      // warps 0-3; 4-7 make the background load
constexpr size_t kBgBytes = 64 * 1024, kBgBuffer = size_t(1) << 30;
constexpr int kSmemBytes = 200 * 1024;  // one block an SM, as the megakernel

enum Mode { kGlobal = 0, kAtomic = 1, kCluster = 2, kBarrier = 3, kAtomicAll = 4, kStoreAll = 5, kWide = 6 };
constexpr int kWideTiles = 18;  // v5: 2304 columns

struct Args {
  float* partials;              // [tiles][S][TILE]
  int* counters;                // [tiles]
  float* sums;                  // [2][tiles][TILE] (v1, v3, v4; by round parity)
  unsigned* bar;                // the grid barrier's counter
  unsigned long long* ns;       // [ROUNDS][tiles]: the finishing block's time
  int* wrong;                   // totals that differ from the expected
  const uint4* bg;              // the background load's buffer (kBgBuffer bytes), or nullptr
  int S, tiles;
  int copies;  // v5: copies of the summed vector
};

// A barrier of the hand-off's warps only (named barrier 1), or of the block.
template <bool handoff_only>
__device__ void block_sync() {
  if (handoff_only)
    asm volatile("bar.sync 1, %0;" ::"n"(HANDOFF_THREADS) : "memory");
  else
    __syncthreads();
}

// The counter grid barrier (kt_grid_arrive / kt_grid_wait's protocol),
// among the hand-off's warps or whole blocks. With pollers > 1 ("ref n
// poll"), lane 0 of that many warps polls the counter, warp w's first poll
// w x 400 / n ns after warp 0's, and the first to see it reached writes the
// target into *seen (shared memory, zeroed before the first round), where
// the others look between their polls: the counter sampled n times as
// often, to see whether one poller's round trips are what a barrier waits
// for (RESULTS, run 332: they are not; the extra polls slow it).
template <bool handoff_only = false, int pollers = 1>
__device__ void grid_sync(unsigned* bar, unsigned* target, volatile unsigned* seen = nullptr) {
  constexpr unsigned kWindowNs = 400;
  block_sync<handoff_only>();
  *target += gridDim.x;  // every thread's copy: a poller may be any warp's lane 0
  if (threadIdx.x == 0) kt_red_release_add(bar, 1u);
  const unsigned warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0 && warp < unsigned(pollers)) {
    if (pollers > 1) {
      const unsigned long long t0 = kt_globaltimer();
      while (*seen < *target && kt_globaltimer() - t0 < warp * (kWindowNs / pollers)) __nanosleep(8);
    }
    while (!(pollers > 1 && *seen >= *target) && kt_ld_acquire(bar) < *target) __nanosleep(8);
    if (pollers > 1) *seen = *target;
  }
  block_sync<handoff_only>();
}

// Warps 4-7's share of a round's background load: all loads issued, then
// summed (the sum is never negative, so nothing is written).
__device__ void background_load(const Args& a, int r) {
  constexpr int kLoaders = THREADS - HANDOFF_THREADS, kPerThread = int(kBgBytes / 16) / kLoaders, kBatch = 8;
  const size_t base = ((size_t(r) * gridDim.x + blockIdx.x) * kBgBytes) % kBgBuffer / 16;
  unsigned x = 0;
  for (int b = 0; b < kPerThread; b += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) v[i] = kt_ld_cg(a.bg + base + size_t(b + i) * kLoaders + (threadIdx.x - HANDOFF_THREADS));
#pragma unroll
    for (int i = 0; i < kBatch; ++i) x += v[i].x;
  }
  if (x == 0xffffffffu) atomicAdd(a.wrong, 1000000);
}

// Split `split`'s partial for column n in round r, and the tile's total.
__device__ __host__ float partial_of(int split, int n, int r) { return float(split + 1) * float(n + 1) + float(r); }
__device__ __host__ float total_of(int S, int n, int r) { return float(S * (S + 1) / 2) * float(n + 1) + float(S * r); }

template <int MODE, int POLLERS = 1>
__global__ void __launch_bounds__(THREADS, 1) handoff(Args a) {
  extern __shared__ float dsm[];  // v2: the first block's [S][TILE] partials
  __shared__ int last;
  __shared__ unsigned seen;  // ref: the pollers' last target seen reached
  if (threadIdx.x == 0) seen = 0;  // read only after the first round's block barriers
  const int tid = threadIdx.x, S = a.S;
  // v5: every block adds into every tile; block t < tiles zeroes and checks tile t.
  const int tile = MODE == kWide ? int(blockIdx.x) : int(blockIdx.x) / S;
  const int split = MODE == kWide ? (tile < a.tiles ? 0 : 1) : int(blockIdx.x) % S;
  const bool active = tile < a.tiles;
  unsigned target = 0;
  constexpr bool kSplitWarps = MODE != kCluster;  // the cluster barrier takes every thread
  for (int r = 0; r < ROUNDS; ++r) {
    grid_sync(a.bar, &target);
    if (kSplitWarps && tid >= HANDOFF_THREADS) {
      if (a.bg) background_load(a, r);
      continue;  // to the next round's grid barrier
    }
    const unsigned long long t0 = kt_globaltimer();
    const float y = partial_of(split, tid, r);
    bool finisher = false;
    float total = 0;
    if (MODE == kGlobal && active) {
      if (tid < TILE) a.partials[(size_t(tile) * S + split) * TILE + tid] = y;
      block_sync<true>();
      if (tid == 0) last = kt_atom_add_acq_rel(&a.counters[tile], 1) == S - 1;
      block_sync<true>();
      if (last) {
        if (tid < TILE)
          for (int sp = 0; sp < S; ++sp) total += kt_ld_cg(&a.partials[(size_t(tile) * S + sp) * TILE + tid]);
        if (tid == 0) a.counters[tile] = 0;
        finisher = true;
      }
    } else if (MODE == kAtomic || MODE == kAtomicAll || MODE == kStoreAll || MODE == kWide) {
      const int copies = MODE == kWide ? a.copies : 1, stride = a.tiles * TILE;  // a copy's floats
      float* sums = a.sums + size_t(r % 2) * copies * stride;
      float* spent = a.sums + size_t((r + 1) % 2) * copies * stride;  // read in round r - 1, before this barrier
      if (MODE != kStoreAll && active && split == 0 && tid < TILE)
        for (int c = 0; c < copies; ++c) spent[c * stride + tile * TILE + tid] = 0.0f;
      if (MODE == kStoreAll) {
        if (active && split == 0 && tid < TILE) sums[tile * TILE + tid] = total_of(S, tid, r);
      } else if (MODE == kWide) {
        // Warp w adds tiles w, w + 4, ...: lane l columns 4l .. 4l + 3.
        const int warp = tid / 32, lane = tid % 32;
        const float4 v = {partial_of(blockIdx.x, 4 * lane, r), partial_of(blockIdx.x, 4 * lane + 1, r),
                          partial_of(blockIdx.x, 4 * lane + 2, r), partial_of(blockIdx.x, 4 * lane + 3, r)};
        float* mine = sums + (blockIdx.x % copies) * stride;
        for (int t = warp; t < a.tiles; t += HANDOFF_THREADS / 32)
          asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(mine + t * TILE + 4 * lane), "f"(v.x),
                       "f"(v.y), "f"(v.z), "f"(v.w)
                       : "memory");
      } else if (active && tid < TILE) {
        atomicAdd(&sums[tile * TILE + tid], y);
      }
      grid_sync<true>(a.bar, &target);
      if (MODE != kAtomic) {
        // Every block reads a hidden-sized vector (the first 2304 sums), a
        // column a thread at a time, all loads issued before the first is
        // used (stage_carried's way).
        constexpr int kCols = 2304, kMaxCols = kCols / HANDOFF_THREADS;
        float any = 0;
        for (int c = 0; c < copies; ++c) {  // v5: each copy's loads all issued, then summed
          float v[kMaxCols];
#pragma unroll
          for (int e = 0; e < kMaxCols; ++e) {
            const int n = tid + e * HANDOFF_THREADS;
            v[e] = n < stride ? kt_ld_cg(&sums[c * stride + n]) : 0.0f;
          }
#pragma unroll
          for (int e = 0; e < kMaxCols; ++e) any += v[e];
        }
        if (any == -1.0f) atomicAdd(a.wrong, 1000000);  // keeps the loads (never true: sums are positive)
      }
      if (active && split == 0) {
        if (tid < TILE)
          for (int c = 0; c < copies; ++c) total += kt_ld_cg(&sums[c * stride + tile * TILE + tid]);
        finisher = true;
      }
    } else if (MODE == kCluster && active) {
      cg::cluster_group cluster = cg::this_cluster();
      float* first = cluster.map_shared_rank(dsm, 0);
      if (tid < TILE) first[split * TILE + tid] = y;
      cluster.sync();  // barrier.cluster arrive (release) and wait (acquire)
      if (cluster.block_rank() == 0) {
        if (tid < TILE)
          for (int sp = 0; sp < S; ++sp) total += dsm[sp * TILE + tid];
        finisher = true;
      }
    } else if (MODE == kBarrier) {
      grid_sync<true, POLLERS>(a.bar, &target, &seen);
      finisher = active && split == 0;
      if (tid < TILE) total = total_of(S, tid, r);
    }
    block_sync<kSplitWarps>();
    const unsigned long long t1 = kt_globaltimer();
    if (finisher) {
      if (tid < TILE && total != total_of(S, tid, r)) atomicAdd(a.wrong, 1);
      if (tid == 0) a.ns[size_t(r) * a.tiles + tile] = t1 - t0;
    }
  }
  // v2: no block leaves while another may still write its shared memory.
  if (MODE == kCluster) cg::this_cluster().sync();
}

// A launch of `blocks` blocks, one an SM (the shared memory asks for it),
// in clusters of `cluster` blocks when cluster > 1.
// With `cooperative`, also as a cooperative launch (as the megakernel is
// launched), which guarantees every block resident at once.
struct Launch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  Launch(int blocks, int cluster, bool cooperative = false) {
    cfg.gridDim = dim3(unsigned(blocks));
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.attrs = attr;
    if (cluster > 1) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attr[cfg.numAttrs].val.clusterDim.x = unsigned(cluster);
      attr[cfg.numAttrs].val.clusterDim.y = 1;
      attr[cfg.numAttrs].val.clusterDim.z = 1;
      ++cfg.numAttrs;
    }
    if (cooperative) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeCooperative;
      attr[cfg.numAttrs].val.cooperative = 1;
      ++cfg.numAttrs;
    }
  }
};

struct Result {
  double median_us = 0, p90_us = 0;
  int wrong = 0, blocks = 0;
  bool launched = true;  // false: the (cooperative) launch was refused
};

template <int MODE, int POLLERS = 1>
Result run(int S, int blocks, const uint4* bg = nullptr, int copies = 1, bool cooperative = false) {
  const int tiles = MODE == kWide ? kWideTiles : blocks / S;  // v5: S is the grid, every block a split
  Args a{};
  a.bg = bg;
  a.S = S;
  a.tiles = tiles;
  a.copies = copies;
  CHECK(cudaMalloc(&a.partials, size_t(tiles) * S * TILE * sizeof(float)));
  CHECK(cudaMalloc(&a.counters, size_t(tiles) * sizeof(int)));
  CHECK(cudaMalloc(&a.sums, 2 * size_t(copies) * tiles * TILE * sizeof(float)));
  CHECK(cudaMalloc(&a.bar, sizeof(unsigned)));
  CHECK(cudaMalloc(&a.ns, size_t(ROUNDS) * tiles * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&a.wrong, sizeof(int)));
  CHECK(cudaMemset(a.counters, 0, size_t(tiles) * sizeof(int)));
  CHECK(cudaMemset(a.sums, 0, 2 * size_t(copies) * tiles * TILE * sizeof(float)));
  CHECK(cudaMemset(a.bar, 0, sizeof(unsigned)));
  CHECK(cudaMemset(a.ns, 0, size_t(ROUNDS) * tiles * sizeof(unsigned long long)));
  CHECK(cudaMemset(a.wrong, 0, sizeof(int)));
  auto free_args = [&] {
    for (void* p : {static_cast<void*>(a.partials), static_cast<void*>(a.counters), static_cast<void*>(a.sums),
                    static_cast<void*>(a.bar), static_cast<void*>(a.ns), static_cast<void*>(a.wrong)})
      CHECK(cudaFree(p));
  };
  CHECK(cudaFuncSetAttribute(handoff<MODE, POLLERS>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  Launch l(MODE == kWide ? blocks : tiles * S, MODE == kCluster ? S : 1, cooperative);
  const cudaError_t launched = cudaLaunchKernelEx(&l.cfg, handoff<MODE, POLLERS>, a);
  if (launched != cudaSuccess && cooperative) {  // the question the caller asks: not fatal
    std::printf("  a cooperative launch of %d blocks in clusters of %d: refused (%s)\n", tiles * S, S,
                cudaGetErrorString(launched));
    (void)cudaGetLastError();
    free_args();
    Result refused;
    refused.launched = false;
    return refused;
  }
  CHECK(launched);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned long long> ns(size_t(ROUNDS) * tiles);
  Result res;
  CHECK(cudaMemcpy(ns.data(), a.ns, ns.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&res.wrong, a.wrong, sizeof(int), cudaMemcpyDeviceToHost));
  // The first rounds warm up; each round's slowest tile is the phase's.
  std::vector<double> worst;
  for (int r = 10; r < ROUNDS; ++r) {
    unsigned long long m = 0;
    for (int t = 0; t < tiles; ++t) m = std::max(m, ns[size_t(r) * tiles + t]);
    worst.push_back(double(m) / 1000.0);
  }
  std::sort(worst.begin(), worst.end());
  res.median_us = worst[worst.size() / 2];
  res.p90_us = worst[worst.size() * 9 / 10];
  res.blocks = MODE == kWide ? blocks : tiles * S;
  free_args();
  return res;
}

// Clusters of S blocks that fit at once, one block an SM.
int max_clusters(int S) {
  CHECK(cudaFuncSetAttribute(handoff<kCluster>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  Launch l(S, S);
  int n = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&n, handoff<kCluster>, &l.cfg));
  return n;
}

void print(const char* what, int S, const Result& r) {
  std::printf("%-11s S %d  blocks %3d  median %6.2f us  p90 %6.2f us  %s\n", what, S, r.blocks, r.median_us, r.p90_us,
              r.wrong ? "WRONG TOTALS" : "totals ok");
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("SMs: %d; a round's time is its slowest tile's (median and 90th percentile over %d rounds)\n", sms,
              ROUNDS - 10);
  int wrong = 0;
  std::printf("\nclusters that fit at once, one block an SM:\n");
  for (int S : {2, 4, 8}) {
    const int n = max_clusters(S);
    std::printf("  size %d: %3d clusters, %3d of %d SMs\n", S, n, n * S, sms);
  }
  std::printf("\nthe hand-off of every tile at once:\n");
  {
    const Result r = run<kBarrier>(1, sms), r2 = run<kBarrier, 2>(1, sms), r4 = run<kBarrier, 4>(1, sms);
    print("ref", 1, r);
    print("ref 2 poll", 1, r2);
    print("ref 4 poll", 1, r4);
    wrong += r.wrong + r2.wrong + r4.wrong;
  }
  for (int S : {2, 4, 7, 8}) {
    Result g = run<kGlobal>(S, sms), at = run<kAtomic>(S, sms), aa = run<kAtomicAll>(S, sms),
           sa = run<kStoreAll>(S, sms);
    print("v0 global", S, g);
    print("v1 atomic", S, at);
    print("v3 read all", S, aa);
    print("v4 stored", S, sa);
    wrong += g.wrong + at.wrong + aa.wrong + sa.wrong;
    if (S == 7) continue;  // not a cluster size
    const Result cl = run<kCluster>(S, max_clusters(S) * S);
    print("v2 cluster", S, cl);
    wrong += cl.wrong;
  }
  {
    // v5: o_proj's k-split by the KDA items (128 of them, one a block).
    for (int copies : {1, 2, 4, 8}) {
      const Result w = run<kWide>(128, 128, nullptr, copies);
      std::printf("(%d cop%s) ", copies, copies == 1 ? "y" : "ies");
      print("v5 wide", 128, w);
      wrong += w.wrong;
    }
  }
  {
    // Whether the megakernel could keep its cooperative launch with
    // clusters of 2 (all 132 SMs), for a cluster hand-off.
    const Result cc = run<kCluster>(2, sms, nullptr, 1, true);
    if (cc.launched) {
      std::printf("(cooperative) ");
      print("v2 cluster", 2, cc);
      wrong += cc.wrong;
    }
  }
  // o_proj's shape while warps 4-7 stream from DRAM (the megakernel's
  // loader does so while a phase hands off).
  uint4* bg = nullptr;
  CHECK(cudaMalloc(&bg, kBgBuffer));
  CHECK(cudaMemset(bg, 1, kBgBuffer));
  std::printf("\nunder load (warps 4-7 of every block stream %zu KB a round from DRAM):\n", kBgBytes / 1024);
  {
    const Result r = run<kBarrier>(1, sms, bg), g = run<kGlobal>(7, sms, bg), at = run<kAtomic>(7, sms, bg),
                 aa = run<kAtomicAll>(7, sms, bg), sa = run<kStoreAll>(7, sms, bg);
    const Result r2 = run<kBarrier, 2>(1, sms, bg), r4 = run<kBarrier, 4>(1, sms, bg);
    print("ref", 1, r);
    print("ref 2 poll", 1, r2);
    print("ref 4 poll", 1, r4);
    wrong += r2.wrong + r4.wrong;
    print("v0 global", 7, g);
    print("v1 atomic", 7, at);
    print("v3 read all", 7, aa);
    print("v4 stored", 7, sa);
    const Result w = run<kWide>(128, 128, bg), w4 = run<kWide>(128, 128, bg, 4);
    print("v5 wide", 128, w);
    std::printf("(4 copies) ");
    print("v5 wide", 128, w4);
    wrong += r.wrong + g.wrong + at.wrong + aa.wrong + sa.wrong + w.wrong + w4.wrong;
  }
  CHECK(cudaFree(bg));
  if (wrong) std::printf("\nFAILED: %d wrong totals\n", wrong);
  return wrong ? 1 : 0;
}
