// One MoE layer's routed experts (8: gate/up, then down), as the megakernel
// runs them and fused, on the megakernel's own loader ring and consumer
// loop. It answers whether fusing the gate/up and down phases, so that a
// layer's MoE has no grid barrier inside it, is worth porting into the
// megakernel (RESULTS, "Where the gap to the floor is, as of run 274",
// lever 1: fewer boundaries).
//
//   v1  two phases: each of the first 128 blocks computes one gate/up tile
//       (128 columns of one expert's gate or up projection over all of K,
//       18 stages) and adds its sums into the layer's gate/up buffer; a
//       grid barrier; the down projection over the 8 experts' concatenated
//       activations silu(g) * u * w, 18 column tiles x 7 k-splits (9-10
//       stages an item), each item adding its sums into y by atomics; a
//       grid barrier (the next layer's). The loader issues every stage as
//       soon as the ring has room, across the barrier.
//   v2  v1 with the megakernel's default hold (knob `hold` 2): the loader
//       issues a block's first 2 down stages, then waits until the block's
//       consumers are past the barrier.
//   v3  fused, by pairs of blocks: block 2p computes gate tile j of expert
//       e and block 2p + 1 its up tile j (p = 8 e + j; the same 18 stages
//       as in v1); each publishes its 128 sums with a flag and waits for
//       its partner's; both make h = silu(g) * u * w for those 128
//       intermediate columns, and each multiplies h by expert e's down rows
//       128 j .. 128 j + 127 for 9 of the 18 output tiles (9 stages, one
//       each), adding every tile's sums into y by atomics; then the grid
//       barrier. The down weights do not depend on h, so the loader streams
//       them behind the gate/up stages without waiting: the only boundary
//       left inside the layer's MoE is the pair's swap.
//   v4  v3 without the swap (each block makes h from its own sums alone;
//       not checked): what the swap costs.
//   v5  v1 with the gate/up phase dealt at run time: its 128 tiles cut
//       into units of U stages (U 2, 3 or 6), which every block's loader
//       takes from a global counter when its ring has room (the first
//       ones dealt statically, so that the ring fills without waiting),
//       tagging each unit in shared memory for its consumers; a warp
//       group eats whole units and adds its warps' sums into the gate/up
//       buffer (16-byte vector reductions) after each. All 132 blocks take
//       part, and a block whose stages come late takes fewer units, so
//       the phase's blocks should finish together (the spread v1 shows is
//       1.5-1.8 us). `look` L: the loader takes a unit only once its
//       consumers are within L stages of what it has issued (12: the
//       ring's room alone), so that fewer units are committed before the
//       phase's end. The down phase is v1's.
//
// Every version reads the same bytes (the 8 experts' gate, up and down:
// 3456 stages, 30.1 MB) with one loader warp and the megakernel's
// consumers (mk::consume_stages; v3's down is that loop with a flush after
// each stage, since each of its stages is another output tile). The shared
// expert is left out: in the megakernel it is computed while the routing
// is found. Each launch is checked against a CPU reference (the spec's
// bf16 dequant in double; h staged as the megakernel stages fp32 inputs,
// bf16 hi + lo parts); L2 is flushed before each launch, and a launch is
// timed by globaltimer from the first block's start to the last block past
// the final barrier. Each version also prints how the gate/up blocks'
// finishing times spread (the same 18 stages each) and whether the late
// blocks are the same from launch to launch, with their SMs: a systematic
// part would be work the megakernel could take from those SMs.
//
// What it showed on the H200 (RESULTS.md, 2026-12-03, runs 277-283; us,
// medians of 40-60 launches): v1 17.1, v2 17.5-17.6, v3 16.8-16.9, v4
// 15.7-15.8. Fusing by pairs saves ~0.3 us a layer: the median block
// waits 2.0 us from its own gate/up tile to its partner's sums, as long as
// v1's waits for the grid barrier (2.1), because what both wait for is a
// late block, and one partner in two is as likely late as the slowest of
// 132 is. Even with no swap at all (v4) the layer is only 1.3-1.4 us
// shorter. 9 resident down stages, each another output tile, take 4.1 us
// (v3, v4): the consumers' rate, not DRAM. The gate/up blocks finish 1.5-1.8
// us apart in a launch for the same 18 stages. A block's mean lateness
// against its launch's median spans -0.4 .. +0.4 us over the blocks, and
// the even and the odd launches' means correlate 0.77-0.86: that much of
// the spread (~0.7 of 1.5-1.8 us) belongs to the block, launch after launch
// (the latest ones sit in pairs of neighbouring SMs, e.g. 22-25, 66-71,
// 106-113), the rest to the launch. By SM (runs 280-281): blocks start
// within 0.14 us of each other, so it is not the dispatch; an SM's
// lateness (-0.4 .. +0.4 us) is the same in v1 and v4 within a process,
// but not from one machine to the next. With the stages in L2 (runs
// 282-283, `warm`): v1 13.2-13.3, v3 13.3, v4 12.5-12.6 us; the gate/up
// blocks finish 0.5-0.9 us apart, against 1.7-1.8 from DRAM, yet the swap
// still costs what the barrier does (1.34 against 1.28 us); the SMs'
// lateness repeats every 16 SM numbers (where the SM sits).
// v5 (runs 284-285): slower than v1 at every U and look, by 0.9-3.7 us
// flushed and 1.25-2.9 warm, with no smaller spread. A take from the
// counter is an L2 round trip (`ahead` overlaps it with the unit's copies:
// still +0.9 us), the units' many reductions slow the consumers (warm, the
// median block's gate/up +1.1 us), and a loader commits its ring's depth
// plus a take's round trip (~4 us of a ~5 us share) before the spread
// arises, while a shallower `look` starves DRAM. So run-time dealing cannot
// pay for the spread with this pipeline.
//
// Build (the megakernel's full-size defines, no GPU needed): CMake builds
// it as build/moe_fused, or
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. \
//     $(scripts/megakernel_defines.sh) -o /tmp/moe_fused kernels/kimi/cuda/dev/moe_fused.cu
// Run on the device machine: moe_fused [launches] [warm] [version name prefixes...]
// (e.g. moe_fused 60 v1 "v5 dynamic, U 3")
// ("warm": L2 not flushed, so the stages, 30 MB, come from L2 after the
// first launch: the spread of the blocks' finishing without DRAM's order)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "kernels/kimi/cuda/dev/cuda_check.h"
#include "kernels/kimi/cuda/megakernel.cu"
#include "kernels/kimi/cuda/dev/megakernel_study.cuh"

namespace study {
using mk::WARPS;

constexpr int D = mk::D, I = mk::I, G = mk::G;
constexpr int EXPERTS = mk::TOPK;      // the routed experts of a layer
constexpr int IT = I / TILE;           // gate (or up) tiles of an expert
constexpr int DG = D / G;              // groups of a gate/up tile: its stages
constexpr int DT = D / TILE;           // down's output tiles
constexpr int IG = I / G;              // down groups of an expert
constexpr int KG = EXPERTS * IG;       // down groups over the concatenated experts
constexpr int GU_TILES = EXPERTS * 2 * IT;  // 128: one a block
constexpr int SPLITS = 7;                   // v1's down k-splits: 18 x 7 = 126 items
constexpr int HOLD = 2;                     // v2's held stages
static_assert(FEED_WPG * 32 == TILE, "v3's flush: a warp group's thread a column");

enum Version { kTwoPhases = 1, kTwoPhasesHold, kFusedPairs, kFusedNoSwap };  // v5: moe_dynamic_kernel
constexpr int TAGS = 16;  // v5: units tagged ahead in shared memory (the ring holds at most STAGES / U + 1)
__host__ __device__ constexpr bool fused(int v) { return v == kFusedPairs || v == kFusedNoSwap; }

struct Args {
  const Stage* gu_stages;  // [expert][gate 0, up 1][tile j][group]: tile-major, as the megakernel repacks
  const Stage* dn_stages;  // [output tile][expert][group]: down over the concatenated experts
  const uint16_t* x;       // [D] bf16
  const float* w;          // [EXPERTS] routing weights
  float* gu;               // [EXPERTS][2][I] gate/up sums (zeroed)
  float* swap;             // v3: [pair][gate 0, up 1][TILE]
  unsigned* flags;         // v3: [pair][2] (zeroed)
  float* y;                // [D] (zeroed)
  unsigned* bar;           // grid barrier arrivals (zeroed)
  unsigned long long* times;  // [block][5]: start, its gate/up done, the middle point, its down work done, end
  unsigned* sm_of;            // [block]: the SM it ran on
  unsigned* taken;            // v5: units taken from the counter (zeroed)
  int look;                   // v5: the loader takes a unit once its consumers are within `look` stages
  int ahead;                  // v5, 1: the next unit is asked for as soon as the last one is known
};

// v5's shared memory beyond the megakernel's Smem: each unit's number (tile
// * parts + part, or -1: no more units) by the block's unit count, and how
// many units the block ate.
struct DynamicTags {
  int unit[TAGS];
  int units;
};
__device__ DynamicTags* dynamic_tags(Smem* sm) { return reinterpret_cast<DynamicTags*>(sm + 1); }

__device__ void grid_barrier(const Args& a, unsigned round) { grid_barrier(a.bar, round); }

// v1, v2: block b's down item (b < DT * SPLITS): tile n, groups [g0, g1).
__device__ void down_item(int b, int* n, int* g0, int* g1) {
  const int sp = b % SPLITS;
  *n = b / SPLITS;
  *g0 = sp * KG / SPLITS;
  *g1 = (sp + 1) * KG / SPLITS;
}

// v3: block b's pair p, its part m (gate 0, up 1), expert e and tile j.
struct PairItem {
  int p, m, e, j;
};
__device__ PairItem pair_item(int b) {
  const int p = b / 2;
  return {p, b % 2, p / IT, p % IT};
}

template <class Issue>
__device__ void issue_down(const Args& a, Smem* sm, bool hold, Issue& issue);

// The loader warp's lane 0: every stage of the block's items, in the order
// the consumers eat them, one bulk copy each into the ring.
template <int V>
__device__ void loader(const Args& a, Smem* sm) {
  Stage* ring = reinterpret_cast<Stage*>(sm->pipe);
  unsigned k = 0;
  auto issue = [&](const Stage* src) {
    const unsigned slot = k % STAGES;
    if (k >= STAGES) kt_mbar_wait(&sm->empty[slot], ((k / STAGES) - 1) & 1);
    kt_mbar_arrive_expect_tx(&sm->full[slot], unsigned(sizeof(Stage)));
    kt_bulk_copy_g2s(&ring[slot], src, unsigned(sizeof(Stage)), &sm->full[slot]);
    ++k;
  };
  const int b = int(blockIdx.x);
  if (fused(V)) {
    if (b >= GU_TILES) return;
    const PairItem it = pair_item(b);
    const int tile = (it.e * 2 + it.m) * IT + it.j;  // as the gate/up stages are laid out
    for (int grp = 0; grp < DG; ++grp) issue(a.gu_stages + size_t(tile) * DG + grp);
    for (int t = 0; t < DT / 2; ++t) issue(a.dn_stages + (size_t(it.m * (DT / 2) + t) * KG + it.e * IG + it.j));
    return;
  }
  if (b < GU_TILES)
    for (int grp = 0; grp < DG; ++grp) issue(a.gu_stages + size_t(b) * DG + grp);  // tile b: (e * 2 + m) * IT + j
  issue_down(a, sm, V == kTwoPhasesHold, issue);
}

// v1, v2, v5: the block's down item's stages, after its gate/up ones
// (v2: the first HOLD, then the rest once the consumers are past the barrier).
template <class Issue>
__device__ void issue_down(const Args& a, Smem* sm, bool hold, Issue& issue) {
  const int b = int(blockIdx.x);
  if (b >= DT * SPLITS) return;
  int n, g0, g1;
  down_item(b, &n, &g0, &g1);
  for (int g = g0; g < g1; ++g) {
    if (hold && g == g0 + HOLD)
      while (*reinterpret_cast<volatile int*>(&sm->flag) == 0) __nanosleep(32);
    issue(a.dn_stages + size_t(n) * KG + g);
  }
}

// v5's loader: gate/up units of U stages, the block's first ones dealt
// statically (block b takes units b, b + blocks, ...: as many as fill the
// `look` stages), the rest from the counter `taken`; then FEED_GROUPS
// units tagged -1 (their U slots completed without a copy), one for each
// warp group to stop at; then the down item as v1's.
template <int U>
__device__ void loader_dynamic(const Args& a, Smem* sm) {
  constexpr int PARTS = DG / U, UNITS = GU_TILES * PARTS;
  Stage* ring = reinterpret_cast<Stage*>(sm->pipe);
  DynamicTags* tags = dynamic_tags(sm);
  unsigned k = 0;
  const unsigned look = unsigned(a.look);
  auto room = [&]() {  // the slot free, and the consumers within `look` stages
    if (k >= STAGES) kt_mbar_wait(&sm->empty[k % STAGES], ((k / STAGES) - 1) & 1);
    if (look < STAGES && k >= look) kt_mbar_wait(&sm->empty[(k - look) % STAGES], ((k - look) / STAGES) & 1);
  };
  auto issue = [&](const Stage* src) {
    room();
    const unsigned slot = k % STAGES;
    kt_mbar_arrive_expect_tx(&sm->full[slot], unsigned(sizeof(Stage)));
    kt_bulk_copy_g2s(&ring[slot], src, unsigned(sizeof(Stage)), &sm->full[slot]);
    ++k;
  };
  const int blocks = int(gridDim.x), b = int(blockIdx.x);
  const int first = (int(look) + U - 1) / U;  // static units a block
  int units = 0;
  auto unit = [&](int u) {
    tags->unit[units % TAGS] = u;  // published by the first stage's arrival
    const int tile = u / PARTS, g0 = (u % PARTS) * U;
    for (int s = 0; s < U; ++s) issue(a.gu_stages + size_t(tile) * DG + g0 + s);
    ++units;
  };
  for (int i = 0; i < first && b + blocks * i < UNITS; ++i) unit(b + blocks * i);
  if (a.ahead) {
    // One take always in flight: its round trip overlaps the unit's copies.
    unsigned next = atomicAdd(a.taken, 1u);
    for (;;) {
      const int u = blocks * first + int(next);
      if (u >= UNITS) break;
      next = atomicAdd(a.taken, 1u);
      unit(u);
    }
  } else {
    for (;;) {
      room();  // take a unit only when its first stage could be issued at once
      const int u = blocks * first + int(atomicAdd(a.taken, 1u));
      if (u >= UNITS) break;
      unit(u);
    }
  }
  tags->units = units;
  for (int m = 0; m < FEED_GROUPS; ++m) {
    tags->unit[units % TAGS] = -1;
    ++units;
    for (int s = 0; s < U; ++s) {
      room();
      kt_mbar_arrive(&sm->full[k % STAGES]);
      ++k;
    }
  }
  issue_down(a, sm, false, issue);
}

// The block's sums of a tile (its warps' rows of red), for thread tid < TILE.
__device__ float tile_sum(const Smem* sm, int tid) {
  float y = 0;
  for (int w = 0; w < WARPS; ++w) y += sm->red[w][tid];
  return y;
}

// Stages an fp32 value at input position k as the megakernel does: bf16 hi
// and lo parts.
__device__ void stage_f32(Smem* sm, int k, float v) {
  const float hi = kt_round_bf16(v);
  reinterpret_cast<uint16_t*>(sm->xs_hi)[k] = kt_f2bf(hi);
  reinterpret_cast<uint16_t*>(sm->xs_lo)[k] = kt_f2bf(v - hi);
}

// v3's and v4's down: n stages (from the block's stage `eaten`), each another output
// tile on the same 128 staged inputs; the warp groups take them in turn, as
// consume_stages does, and each group adds a stage's sums into y_tiles
// (tile t at y_tiles + t * TILE) as soon as its warps have them.
__device__ __noinline__ void consume_tiles(Smem* sm, unsigned eaten, int n, uint32_t bias, float* y_tiles) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int group = warp / FEED_WPG, first_chunk = (warp % FEED_WPG) * mk::FEED_Q;
  const Stage* ring = reinterpret_cast<const Stage*>(sm->pipe);
  for (int s = group; s < n; s += FEED_GROUPS) {
    const unsigned k = eaten + unsigned(s), slot = k % STAGES;
    float acc[16], mma_acc[8][4], out[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
    kt_mbar_wait(&sm->full[slot], (k / STAGES) & 1);
    mk::compute_feed_stage(ring[slot], lane, first_chunk, bias, sm->xs_hi, sm->xs_lo, 0, mma_acc);
    __syncwarp();
    if (lane == 0) kt_mbar_arrive(&sm->empty[slot]);
    mk::gemv_finish(acc, mma_acc, out);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int b = 0; b < 16; ++b) sm->red[warp][16 * g + b] = out[b];
    }
    group_sync(group);
    const int col = threadIdx.x % TILE;
    float y = 0;
    for (int w = 0; w < FEED_WPG; ++w) y += sm->red[group * FEED_WPG + w][col];
    atomicAdd(y_tiles + s * TILE + col, y);
    group_sync(group);  // the group's rows of red are free again
  }
}

// Every version's start: the block's start and SM noted, x staged (the
// gate/up input, bf16: no lo part), the ring's mbarriers made.
__device__ void kernel_start(const Args& a, Smem* sm) {
  const int tid = int(threadIdx.x), b = int(blockIdx.x);
  if (tid == 0) {
    a.times[5 * b] = kt_globaltimer();
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    a.sm_of[b] = smid;
  }
  for (int i = tid; i < D / 2; i += blockDim.x) {
    sm->xs_hi[i] = reinterpret_cast<const uint32_t*>(a.x)[i];
    sm->xs_lo[i] = 0;
  }
  if (tid == 0) sm->flag = 0;  // v2: the consumers are past the barrier
  init_ring(sm);
  __syncthreads();
}

// kernel_start, then the roles (consumer_role). True for a consumer.
template <class Load>
__device__ bool start_as_consumer(const Args& a, Smem* sm, Load load) {
  kernel_start(a, sm);
  return consumer_role(load);
}

// v1, v2, v5 after their gate/up sums are added: the grid barrier, the
// block's down item (its inputs silu(g) * u * w staged from the summed
// gate/up buffer), its sums added into y, the final barrier. `eaten`: the
// block's stages eaten before.
__device__ void down_phase(const Args& a, Smem* sm, unsigned eaten) {
  const int tid = int(threadIdx.x), b = int(blockIdx.x), warp = tid >> 5;
  grid_barrier(a, 1);
  if (tid == 0) a.times[5 * b + 2] = kt_globaltimer();
  if (b < DT * SPLITS) {
    int n, g0, g1;
    down_item(b, &n, &g0, &g1);
    // The item's inputs silu(g) * u * w, k = g0 * G .. g1 * G of the concatenated experts.
    for (int k = g0 * G + tid; k < g1 * G; k += THREADS) {
      const int e = k / I, i = k % I;
      const float g = kt_ld_cg(a.gu + (e * 2) * I + i), u = kt_ld_cg(a.gu + (e * 2 + 1) * I + i);
      stage_f32(sm, k, kt_silu(g) * u * a.w[e]);
    }
    consumers_sync();
    if (tid == 0) *reinterpret_cast<volatile int*>(&sm->flag) = 1;  // v2: the held stages may go
    mk::consume_stages(sm, eaten, g0, g1 - g0, mk::g_bias_pair, sm->red[warp]);
    consumers_sync();
    if (tid < TILE) atomicAdd(a.y + n * TILE + tid, tile_sum(sm, tid));
  }
  consumers_sync();
  if (tid == 0) a.times[5 * b + 3] = kt_globaltimer();
  grid_barrier(a, 2);
}

template <int V>
__global__ void __launch_bounds__(KT_BLOCK_THREADS, 1) moe_kernel(const __grid_constant__ Args a) {
  Smem* sm = reinterpret_cast<Smem*>(kt_smem());
  const int tid = int(threadIdx.x), b = int(blockIdx.x);
  if (!start_as_consumer(a, sm, [&] { loader<V>(a, sm); })) return;
  const uint32_t bias = mk::g_bias_pair;
  const int warp = tid >> 5;
  unsigned eaten = 0;
  if (b < GU_TILES) {
    mk::consume_stages(sm, 0, 0, DG, bias, sm->red[warp]);
    consumers_sync();
    if (tid == 0) a.times[5 * b + 1] = kt_globaltimer();
    eaten = DG;
  }
  if (fused(V)) {
    if (b < GU_TILES) {
      const PairItem it = pair_item(b);
      float own = 0;
      if (tid < TILE) {
        own = tile_sum(sm, tid);
        kt_st_relaxed(reinterpret_cast<unsigned*>(a.swap) + (it.p * 2 + it.m) * TILE + tid, __float_as_uint(own));
      }
      consumers_sync();
      if (tid == 0 && V == kFusedPairs) {
        kt_red_release_add(&a.flags[it.p * 2 + it.m], 1u);  // after the block barrier: publishes every thread's store
        while (kt_ld_acquire(&a.flags[it.p * 2 + 1 - it.m]) == 0) {
        }
      }
      consumers_sync();
      if (tid < TILE) {
        const float other =
            V == kFusedNoSwap
                ? own
                : __uint_as_float(kt_ld_relaxed(reinterpret_cast<const unsigned*>(a.swap) + (it.p * 2 + 1 - it.m) * TILE + tid));
        const float g = it.m == 0 ? own : other, u = it.m == 0 ? other : own;
        stage_f32(sm, tid, kt_silu(g) * u * a.w[it.e]);
      }
      if (tid == 0) a.times[5 * b + 2] = kt_globaltimer();
      consumers_sync();
      consume_tiles(sm, eaten, DT / 2, bias, a.y + it.m * (DT / 2) * TILE);
    }
    consumers_sync();
    if (tid == 0) a.times[5 * b + 3] = kt_globaltimer();
    grid_barrier(a, 1);
  } else {
    if (b < GU_TILES && tid < TILE) atomicAdd(a.gu + b * TILE + tid, tile_sum(sm, tid));  // b's columns: (e * 2 + m) * I + j * TILE
    down_phase(a, sm, eaten);
  }
  if (tid == 0) a.times[5 * b + 4] = kt_globaltimer();
}

// v5's consumers: warp group `group` eats the block's units group, group +
// FEED_GROUPS, ... (U stages each, in ring order), until a unit tagged -1;
// after each unit every warp adds its sums for the unit's tile into gu.
template <int U>
__device__ __noinline__ void consume_units(Smem* sm, uint32_t bias, float* gu) {
  constexpr int PARTS = DG / U;
  static_assert(DG % U == 0 && STAGES % U == 0 && (STAGES / U) % FEED_GROUPS == 0,
                "v5: a slot's fill before is the same group's (consume_stages' rule), units whole");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int group = warp / FEED_WPG, first_chunk = (warp % FEED_WPG) * mk::FEED_Q;
  const Stage* ring = reinterpret_cast<const Stage*>(sm->pipe);
  const DynamicTags* tags = dynamic_tags(sm);
  for (int ku = group;; ku += FEED_GROUPS) {
    const unsigned k0 = unsigned(ku) * U;
    kt_mbar_wait(&sm->full[k0 % STAGES], (k0 / STAGES) & 1);
    const int u = tags->unit[ku % TAGS];
    float acc[16], mma_acc[8][4], out[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
    for (int s = 0; s < U; ++s) {
      const unsigned k = k0 + unsigned(s), slot = k % STAGES;
      if (s > 0) kt_mbar_wait(&sm->full[slot], (k / STAGES) & 1);
      if (u >= 0)
        mk::compute_feed_stage(ring[slot], lane, first_chunk, bias, sm->xs_hi, sm->xs_lo,
                               ((u % PARTS) * U + s) * mk::STAGE_CHUNKS, mma_acc);
      __syncwarp();
      if (lane == 0) kt_mbar_arrive(&sm->empty[slot]);
    }
    if (u < 0) return;
    mk::gemv_finish(acc, mma_acc, out);
    if ((lane & 3) == 0) {
      float* dst = gu + (u / PARTS) * TILE + 16 * g;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst + 4 * q), "f"(out[4 * q]),
                     "f"(out[4 * q + 1]), "f"(out[4 * q + 2]), "f"(out[4 * q + 3])
                     : "memory");
    }
  }
}

template <int U>
__global__ void __launch_bounds__(KT_BLOCK_THREADS, 1) moe_dynamic_kernel(const __grid_constant__ Args a) {
  Smem* sm = reinterpret_cast<Smem*>(kt_smem());
  const int tid = int(threadIdx.x), b = int(blockIdx.x);
  if (!start_as_consumer(a, sm, [&] { loader_dynamic<U>(a, sm); })) return;
  consume_units<U>(sm, mk::g_bias_pair, a.gu);
  consumers_sync();
  if (tid == 0) a.times[5 * b + 1] = kt_globaltimer();
  down_phase(a, sm, unsigned(dynamic_tags(sm)->units + FEED_GROUPS) * U);
  if (tid == 0) a.times[5 * b + 4] = kt_globaltimer();
}

// One stage a block: gate/up stages first (GU_TILES x DG), then down's.
__global__ void repack_kernel(const uint8_t* gate_q, const uint16_t* gate_s, const uint16_t* gate_z,
                              const uint8_t* up_q, const uint16_t* up_s, const uint16_t* up_z, const uint8_t* down_q,
                              const uint16_t* down_s, const uint16_t* down_z, Stage* gu_stages, Stage* dn_stages) {
  const int i = int(blockIdx.x);
  if (i < GU_TILES * DG) {
    const int grp = i % DG, tile = i / DG, j = tile % IT, m = (tile / IT) % 2, e = tile / (2 * IT);
    const size_t wo = size_t(e) * (D / 2) * I, so = size_t(e) * DG * I;
    if (m == 0) mk::repack_stage(gate_q + wo, gate_s + so, gate_z + so, I, j, grp, reinterpret_cast<uint8_t*>(gu_stages + i));
    else mk::repack_stage(up_q + wo, up_s + so, up_z + so, I, j, grp, reinterpret_cast<uint8_t*>(gu_stages + i));
    return;
  }
  const int d = i - GU_TILES * DG, n = d / KG, e = (d % KG) / IG, grp = d % IG;
  const size_t wo = size_t(e) * (I / 2) * D, so = size_t(e) * IG * D;
  mk::repack_stage(down_q + wo, down_s + so, down_z + so, D, n, grp, reinterpret_cast<uint8_t*>(dn_stages + d));
}

struct Case {
  const char* name;
  void (*kernel)(Args);
  bool checked;
  int look;         // v5: Args::look
  bool all_blocks;  // every block computes gate/up (v5), not the first GU_TILES
  int ahead = 0;    // v5: Args::ahead
};

}  // namespace study

int main(int argc, char** argv) {
  using namespace study;
  using namespace ktune;
  const int launches = argc > 1 ? std::max(2, std::atoi(argv[1])) : 20;
  const bool warm = argc > 2 && std::strcmp(argv[2], "warm") == 0;
  const int first_name = warm ? 3 : 2;
  std::mt19937 rng(20261203);
  const Stack gate(EXPERTS, D, I, rng), up(EXPERTS, D, I, rng), down(EXPERTS, I, D, rng);
  std::vector<uint16_t> x(D);
  std::vector<float> w(EXPERTS);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> weight(0.05f, 0.5f);
  for (auto& v : x) v = float_to_bf16(normal(rng));
  for (auto& v : w) v = weight(rng);

  // The reference: g, u and h in double; y = sum over experts of h @ down.
  Reference ref(D);
  for (int e = 0; e < EXPERTS; ++e) {
    std::vector<double> g(I, 0.0), u(I, 0.0);
    for (int k = 0; k < D; ++k) {
      const double xk = bf16_to_float(x[k]);
      for (int i = 0; i < I; ++i) {
        g[i] += xk * gate.w(e, D, I, k, i);
        u[i] += xk * up.w(e, D, I, k, i);
      }
    }
    for (int i = 0; i < I; ++i) {
      const double h = g[i] / (1.0 + std::exp(-g[i])) * u[i] * w[e];
      for (int n = 0; n < D; ++n) ref.add(n, h * down.w(e, I, D, i, n));
    }
  }

  const int sms = sms_at_least(GU_TILES, "moe_fused", "one gate/up tile a block");
  Stage *gu_stages, *dn_stages;
  CHECK(cudaMalloc(&gu_stages, size_t(GU_TILES) * DG * sizeof(Stage)));
  CHECK(cudaMalloc(&dn_stages, size_t(DT) * KG * sizeof(Stage)));
  {
    uint8_t *gq = to_device(gate.q), *uq = to_device(up.q), *dq = to_device(down.q);
    uint16_t *gs = to_device(gate.s), *gz = to_device(gate.z), *us = to_device(up.s), *uz = to_device(up.z);
    uint16_t *ds = to_device(down.s), *dz = to_device(down.z);
    repack_kernel<<<GU_TILES * DG + DT * KG, 256>>>(gq, gs, gz, uq, us, uz, dq, ds, dz, gu_stages, dn_stages);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    for (void* p : {(void*)gq, (void*)uq, (void*)dq, (void*)gs, (void*)gz, (void*)us, (void*)uz, (void*)ds, (void*)dz})
      CHECK(cudaFree(p));
  }
  Args a{};
  a.gu_stages = gu_stages;
  a.dn_stages = dn_stages;
  a.x = to_device(x);
  a.w = to_device(w);
  CHECK(cudaMalloc(&a.gu, size_t(EXPERTS) * 2 * I * 4));
  CHECK(cudaMalloc(&a.swap, size_t(GU_TILES) * TILE * 4));
  CHECK(cudaMalloc(&a.flags, size_t(GU_TILES) * 4));
  CHECK(cudaMalloc(&a.y, size_t(D) * 4));
  CHECK(cudaMalloc(&a.bar, 4));
  CHECK(cudaMalloc(&a.times, size_t(sms) * 5 * 8));
  CHECK(cudaMalloc(&a.sm_of, size_t(sms) * 4));
  CHECK(cudaMalloc(&a.taken, 4));
  // Written before each launch so that no launch finds its weights in L2.
  const size_t flush_bytes = 256u << 20;
  void* flush;
  CHECK(cudaMalloc(&flush, flush_bytes));

  const Case cases[] = {{"v1 two phases", moe_kernel<kTwoPhases>, true, 0, false},
                        {"v2 two phases, hold 2", moe_kernel<kTwoPhasesHold>, true, 0, false},
                        {"v3 fused by pairs", moe_kernel<kFusedPairs>, true, 0, false},
                        {"v4 fused, no swap", moe_kernel<kFusedNoSwap>, false, 0, false},
                        {"v5 dynamic, U 3, look 12", moe_dynamic_kernel<3>, true, 12, true},
                        {"v5 dynamic, U 2, look 12", moe_dynamic_kernel<2>, true, 12, true},
                        {"v5 dynamic, U 6, look 12", moe_dynamic_kernel<6>, true, 12, true},
                        {"v5 dynamic, U 3, look 6", moe_dynamic_kernel<3>, true, 6, true},
                        {"v5 dynamic, U 2, look 4", moe_dynamic_kernel<2>, true, 4, true},
                        {"v5 dynamic, U 3, look 12, ahead", moe_dynamic_kernel<3>, true, 12, true, 1},
                        {"v5 dynamic, U 3, look 6, ahead", moe_dynamic_kernel<3>, true, 6, true, 1},
                        {"v5 dynamic, U 2, look 4, ahead", moe_dynamic_kernel<2>, true, 4, true, 1}};
  const size_t smem = sizeof(Smem) + sizeof(DynamicTags);
  std::printf("moe_fused: %d experts' gate/up and down (%.1f MB of stages), %d blocks of %d threads, ring %d stages, "
              "%d launches each%s\n",
              EXPERTS, double(GU_TILES * DG + DT * KG) * sizeof(Stage) / 1e6, sms, KT_BLOCK_THREADS, STAGES, launches,
              warm ? ", L2 not flushed (warm)" : "");
  std::printf("%-34s %9s %9s %9s %9s %9s %9s %9s\n", "version", "min us", "median", "max", "gate/up", "middle", "done",
              "check");
  int failed = 0;
  for (const Case& cs : cases) {
    if (!asked_for(cs.name, argc, argv, first_name)) continue;
    CHECK(cudaFuncSetAttribute(cs.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    std::vector<double> spans, gus, middles, dones;
    const int gu_blocks = cs.all_blocks ? sms : GU_TILES;  // the blocks that compute gate/up
    a.look = cs.look;
    a.ahead = cs.ahead;
    std::vector<double> ranges;                             // each launch's last - first gate/up block done (us)
    std::vector<double> late_sum[2];                        // per block: gate/up done - the launch's median, summed over even / odd launches
    for (auto& v : late_sum) v.assign(gu_blocks, 0.0);
    std::vector<unsigned> sm_of(sms);
    std::vector<double> late_by_sm(1024, 0.0);  // the same lateness, summed by the SM the block ran on
    std::vector<double> start_by_sm(1024, 0.0);  // the block's start after the launch's first, likewise
    std::vector<int> count_by_sm(1024, 0);
    double worst = 0;
    for (int l = 0; l < launches; ++l) {
      if (!warm) CHECK(cudaMemset(flush, l, flush_bytes));
      CHECK(cudaMemset(a.gu, 0, size_t(EXPERTS) * 2 * I * 4));
      CHECK(cudaMemset(a.swap, 0xff, size_t(GU_TILES) * TILE * 4));  // poisoned: NaN until written
      CHECK(cudaMemset(a.flags, 0, size_t(GU_TILES) * 4));
      CHECK(cudaMemset(a.y, 0, size_t(D) * 4));
      CHECK(cudaMemset(a.bar, 0, 4));
      CHECK(cudaMemset(a.taken, 0, 4));
      launch_study(cs.kernel, a, sms, smem);
      worst = std::max(worst, ref.worst_error(a.y));
      std::vector<unsigned long long> t(size_t(sms) * 5);
      CHECK(cudaMemcpy(t.data(), a.times, t.size() * 8, cudaMemcpyDeviceToHost));
      unsigned long long t0 = ~0ull, t1 = 0;
      for (int b = 0; b < sms; ++b) {
        t0 = std::min(t0, t[5 * b]);
        t1 = std::max(t1, t[5 * b + 4]);
      }
      // The median gate/up block's point `i`, in us from the first start.
      auto median_at = [&](int i) {
        std::vector<double> at;
        for (int b = 0; b < gu_blocks; ++b) at.push_back(double(t[5 * b + i] - t0) / 1e3);
        std::sort(at.begin(), at.end());
        return at[at.size() / 2];
      };
      if (l == 0) continue;  // the first launch warms the code and the clocks
      {
        std::vector<double> at;
        for (int b = 0; b < gu_blocks; ++b) at.push_back(double(t[5 * b + 1] - t0) / 1e3);
        std::vector<double> sorted = at;
        std::sort(sorted.begin(), sorted.end());
        ranges.push_back(sorted.back() - sorted.front());
        for (int b = 0; b < gu_blocks; ++b) late_sum[l % 2][b] += at[b] - sorted[sorted.size() / 2];
        CHECK(cudaMemcpy(sm_of.data(), a.sm_of, size_t(sms) * 4, cudaMemcpyDeviceToHost));
        for (int b = 0; b < gu_blocks; ++b) {
          late_by_sm[sm_of[b] % 1024] += at[b] - sorted[sorted.size() / 2];
          start_by_sm[sm_of[b] % 1024] += double(t[5 * b] - t0) / 1e3;
          ++count_by_sm[sm_of[b] % 1024];
        }
      }
      spans.push_back(double(t1 - t0) / 1e3);
      gus.push_back(median_at(1));
      middles.push_back(median_at(2));
      dones.push_back(median_at(3));
    }
    for (auto* v : {&spans, &gus, &middles, &dones, &ranges}) std::sort(v->begin(), v->end());
    const bool ok = !cs.checked || worst < 1e-4;
    char check[32];
    if (cs.checked) std::snprintf(check, sizeof check, "%s %.1e", ok ? "ok" : "FAIL", worst);
    else std::snprintf(check, sizeof check, "-");
    std::printf("%-34s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9s\n", cs.name, spans.front(), spans[spans.size() / 2],
                spans.back(), gus[gus.size() / 2], middles[middles.size() / 2], dones[dones.size() / 2], check);
    if (!ok) ++failed;
    // How late each gate/up block is against its launch's median, in the
    // even and the odd launches: if the two halves agree (correlation near
    // 1), the lateness belongs to the block's SM, not to the launch.
    const int halves[2] = {launches / 2, (launches - 1) / 2};  // launches 1.. split by parity
    std::vector<double> late(gu_blocks);
    double m0 = 0, m1 = 0;
    for (int b = 0; b < gu_blocks; ++b) {
      late[b] = (late_sum[0][b] + late_sum[1][b]) / (halves[0] + halves[1]);
      m0 += late_sum[0][b] / halves[0] / gu_blocks;
      m1 += late_sum[1][b] / halves[1] / gu_blocks;
    }
    double c01 = 0, c00 = 0, c11 = 0;
    for (int b = 0; b < gu_blocks; ++b) {
      const double d0 = late_sum[0][b] / halves[0] - m0, d1 = late_sum[1][b] / halves[1] - m1;
      c01 += d0 * d1;
      c00 += d0 * d0;
      c11 += d1 * d1;
    }
    std::vector<int> order(gu_blocks);
    for (int b = 0; b < gu_blocks; ++b) order[b] = b;
    std::sort(order.begin(), order.end(), [&](int x, int y) { return late[x] > late[y]; });
    std::printf("    gate/up blocks' spread: last - first %.2f us (median launch); each block against its launch's median,\n"
                "    over the launches: %.2f .. %.2f us; even vs odd launches correlate %.2f; latest blocks (SM, us):",
                ranges[ranges.size() / 2], late[order.back()], late[order.front()], c01 / std::sqrt(c00 * c11 + 1e-30));
    for (int i = 0; i < 6; ++i) std::printf(" %d (%u, %+.2f)", order[i], sm_of[order[i]], late[order[i]]);
    // By SM: the block's mean lateness, and how much of it its start after
    // the launch's first block explains (the launch's dispatch, which a
    // megakernel pays once a step, not at every barrier).
    for (int what = 0; what < 2; ++what) {
      std::printf(what == 0 ? "\n    by SM, mean lateness (us; - where no gate/up block ran):"
                            : "\n    by SM, mean start after the launch's first block (us):");
      for (int sm = 0; sm < sms; ++sm) {
        if (sm % 16 == 0) std::printf("\n    %3d:", sm);
        if (count_by_sm[sm]) std::printf(" %+5.2f", (what == 0 ? late_by_sm[sm] : start_by_sm[sm]) / count_by_sm[sm]);
        else std::printf("     -");
      }
    }
    std::printf("\n");
  }
  std::printf("(us from the launch's first block start, medians over the launches of the median gate/up block's:\n"
              " gate/up, its gate/up tile computed; middle, v1/v2's barrier passed or v3/v4's swap done; done, its down\n"
              " work done, before the final barrier)\n");
  return failed ? 1 : 0;
}
