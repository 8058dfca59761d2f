// A K layer's o_proj (4096 -> 2304, 4.7 MB of stages), as the megakernel
// runs it and merged into the KDA phase, on the megakernel's loader ring
// and consumer code. It answers whether merging is worth porting
// (one grid barrier fewer in each K layer; RESULTS, runs 285-286 sized it
// at ~2 us a K layer).
//
//   v1  its own phase, as now: a grid barrier (the one after the KDA
//       phase), then every block stages the whole attention output o (4096
//       bf16, written by the KDA items) and computes one of 18 tiles x 7
//       k-splits (4-5 stages of 128 rows x 128 columns, mk::consume_stages),
//       adding its 128 sums into y by atomics; a grid barrier; every block
//       reads y (the MoE's input staging).
//   v2  merged: each of 128 blocks is a KDA item (head h, value columns
//       32 q .. 32 q + 31) that already holds its 32 values of o, and
//       multiplies them by their 32 rows of o_proj for all 2304 columns: 9
//       half stages (32 rows x 2 tiles, a whole group's scales for each
//       tile), a warp a chunk (16 rows of one tile); after each half stage
//       the warp group adds its two tiles' sums into y by 16-byte vector
//       reductions; a grid barrier; every block reads y. No barrier before:
//       the KDA update and o_proj are one phase.
//
// Both read the same weights (v2 reads each group's scales 4 times, once
// for each quarter of the head: 25% more bytes a stage); the loader issues
// a block's stages at its start, so in v1 they land during the first
// barrier and the staging (more than the megakernel's `hold` 2 allows: v1
// is the optimistic side). The KDA update itself is not here: v2's time
// would follow it, v1's barrier would wait for it. Each launch is checked
// against a CPU reference (the spec's bf16 dequant in double); L2 is
// flushed before each launch; a launch is timed by globaltimer from the
// first block's start to the last block holding y.
//
// What it showed on the H200 (RESULTS.md, 2026-12-03, run 290; us,
// medians of 59 launches): v1 7.49-7.52, v2 7.01. The merged o_proj saves
// only 0.5 us: its median block is done at 4.7 us, but the 128-way
// reductions, the barrier and the read then take 2.3 us against v1's 1.6
// after its atomics. So ~0.5-1 us a K layer: not worth the port yet.
//
// Build (the megakernel's full-size defines, no GPU needed): CMake builds
// it as build/oproj_merge, or
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. \
//     $(scripts/megakernel_defines.sh) -o /tmp/oproj_merge kernels/kimi/cuda/dev/oproj_merge.cu
// Run on the device machine: oproj_merge [launches] [version name prefixes...]
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

constexpr int D = mk::D, C = mk::C, G = mk::G, KD = mk::KD;
constexpr int DT = D / TILE;                  // o_proj's output tiles (18)
constexpr int CG = C / G;                     // its groups of 128 rows (32: a head each)
constexpr int SPLITS = 7;                     // v1: 18 x 7 = 126 items
constexpr int QUARTER = 32;                   // v2: rows of o an item holds (a KDA item's value columns)
constexpr int ITEMS = C / QUARTER;            // v2: 128 KDA items
constexpr int HALVES = DT / 2;                // v2: half stages an item (2 tiles each)
constexpr int HALF_CHUNKS = QUARTER / mk::CHUNK;  // 16-row chunks of a tile in a half stage (2)
static_assert(HALF_CHUNKS * 2 == FEED_WPG, "v2: a warp of the group a chunk");
static_assert(KD % QUARTER == 0 && G == KD, "v2: an item's rows lie in one group (its head)");

// v2's stage: 32 rows of two tiles, chunk c = (tile c / 2, rows 16 (c % 2)
// ..) in repack_stage's fragment order, and each tile's scales and
// (128 + zero)s for the rows' group.
struct alignas(16) HalfStage {
  uint8_t w[2 * HALF_CHUNKS][1024];
  uint16_t sc[2][TILE], ze[2][TILE];
};
static_assert(sizeof(HalfStage) <= sizeof(Stage), "a half stage fits a ring slot");

enum Version { kOwnPhase = 1, kMerged };

struct Args {
  const Stage* stages;     // v1: [tile][group], repacked
  const HalfStage* halves; // v2: [item][half]
  const uint16_t* o;       // [C] bf16, the KDA phase's output
  float* y;                // [D] (zeroed)
  unsigned* bar;           // grid barrier arrivals (zeroed)
  unsigned long long* times;  // [block][4]: start, first barrier passed (v1), its work done, y held
};

// v1's item for block b < DT * SPLITS: tile n, groups [g0, g1).
__device__ void split_item(int b, int* n, int* g0, int* g1) {
  const int sp = b % SPLITS;
  *n = b / SPLITS;
  *g0 = sp * CG / SPLITS;
  *g1 = (sp + 1) * CG / SPLITS;
}

// The loader warp's first thread: the block's stages, one bulk copy each.
template <int V>
__device__ void loader(const Args& a, Smem* sm) {
  Stage* ring = reinterpret_cast<Stage*>(sm->pipe);
  unsigned k = 0;
  auto issue = [&](const void* src, unsigned bytes) {
    const unsigned slot = k % STAGES;
    if (k >= STAGES) kt_mbar_wait(&sm->empty[slot], ((k / STAGES) - 1) & 1);
    kt_mbar_arrive_expect_tx(&sm->full[slot], bytes);
    kt_bulk_copy_g2s(&ring[slot], src, bytes, &sm->full[slot]);
    ++k;
  };
  const int b = int(blockIdx.x);
  if (V == kOwnPhase) {
    if (b >= DT * SPLITS) return;
    int n, g0, g1;
    split_item(b, &n, &g0, &g1);
    for (int g = g0; g < g1; ++g) issue(a.stages + size_t(n) * CG + g, unsigned(sizeof(Stage)));
  } else {
    if (b >= ITEMS) return;
    for (int h = 0; h < HALVES; ++h) issue(a.halves + size_t(b) * HALVES + h, unsigned(sizeof(HalfStage)));
  }
}

// A consumer thread's share of y, read as the MoE's staging reads it.
__device__ float read_y(const Args& a) {
  float any = 0;
  for (int n = int(threadIdx.x); n < D; n += THREADS) any += kt_ld_cg(a.y + n);
  return any;
}

// v2's consumers: warp group `group` eats half stages group, group +
// FEED_GROUPS, ...; warp w of the group computes chunk w (one 16-row chunk
// of one of the two tiles), then the group adds the two tiles' sums (each
// the sum of its two warps') into y by vector reductions.
__device__ __noinline__ void consume_halves(Smem* sm, uint32_t bias, float* y) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int group = warp / FEED_WPG, c = warp % FEED_WPG, tile = c / HALF_CHUNKS;
  const Stage* ring = reinterpret_cast<const Stage*>(sm->pipe);  // a half stage a slot
  for (int s = group; s < HALVES; s += FEED_GROUPS) {
    const unsigned slot = unsigned(s) % STAGES;
    kt_mbar_wait(&sm->full[slot], (unsigned(s) / STAGES) & 1);
    const HalfStage& st = *reinterpret_cast<const HalfStage*>(ring + slot);
    const uint4* sv = reinterpret_cast<const uint4*>(st.sc[tile] + 16 * g);
    const uint4* zv = reinterpret_cast<const uint4*>(st.ze[tile] + 16 * g);
    const uint4 s_lo = sv[0], s_hi = sv[1], z_lo = zv[0], z_hi = zv[1];
    const uint32_t ss[8] = {s_lo.x, s_lo.y, s_lo.z, s_lo.w, s_hi.x, s_hi.y, s_hi.z, s_hi.w};
    const uint32_t zz[8] = {z_lo.x, z_lo.y, z_lo.z, z_lo.w, z_hi.x, z_hi.y, z_hi.z, z_hi.w};
    float acc[16], mma_acc[8][4], out[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
    const uint8_t* w = st.w[c] + lane * 16;
    mk::chunk_compute_frag(*reinterpret_cast<const uint4*>(w), *reinterpret_cast<const uint4*>(w + 512), ss, zz, bias,
                           sm->xs_hi, sm->xs_lo, c % HALF_CHUNKS, mma_acc);
    __syncwarp();
    if (lane == 0) kt_mbar_arrive(&sm->empty[slot]);
    mk::gemv_finish(acc, mma_acc, out);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int b = 0; b < 16; ++b) sm->red[warp][16 * g + b] = out[b];
    }
    group_sync(group);
    const int i = int(threadIdx.x) % (FEED_WPG * 32);  // 64 threads: a tile's 4 columns each
    if (i < 2 * TILE / 4) {
      const int t = i / (TILE / 4), col = 4 * (i % (TILE / 4));
      const float* r0 = sm->red[group * FEED_WPG + t * HALF_CHUNKS];
      const float* r1 = sm->red[group * FEED_WPG + t * HALF_CHUNKS + 1];
      float* dst = y + (2 * s + t) * TILE + col;
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(r0[col] + r1[col]),
                   "f"(r0[col + 1] + r1[col + 1]), "f"(r0[col + 2] + r1[col + 2]), "f"(r0[col + 3] + r1[col + 3])
                   : "memory");
    }
    group_sync(group);  // the group's rows of red are free again
  }
}

template <int V>
__global__ void __launch_bounds__(KT_BLOCK_THREADS, 1) oproj_kernel(const __grid_constant__ Args a) {
  Smem* sm = reinterpret_cast<Smem*>(kt_smem());
  const int tid = int(threadIdx.x), b = int(blockIdx.x), warp = tid >> 5;
  if (tid == 0) a.times[4 * b] = kt_globaltimer();
  if (V == kMerged && b < ITEMS)  // the item's own 32 values of o, as its KDA update leaves them
    for (int i = tid; i < QUARTER / 2; i += blockDim.x) {
      sm->xs_hi[i] = reinterpret_cast<const uint32_t*>(a.o + b * QUARTER)[i];
      sm->xs_lo[i] = 0;
    }
  init_ring(sm);
  __syncthreads();
  if (!consumer_role([&] { loader<V>(a, sm); })) return;
  const uint32_t bias = mk::g_bias_pair;
  if (V == kOwnPhase) {
    grid_barrier(a.bar, 1);  // after the KDA phase
    if (tid == 0) a.times[4 * b + 1] = kt_globaltimer();
    if (b < DT * SPLITS) {
      int n, g0, g1;
      split_item(b, &n, &g0, &g1);
      for (int i = tid; i < C / 2; i += THREADS) {  // o, as o_proj's staging reads it
        sm->xs_hi[i] = kt_ld_cg(reinterpret_cast<const unsigned*>(a.o) + i);
        sm->xs_lo[i] = 0;
      }
      consumers_sync();
      mk::consume_stages(sm, 0, g0, g1 - g0, bias, sm->red[warp]);
      consumers_sync();
      if (tid < TILE) {
        float sum = 0;
        for (int w = 0; w < mk::WARPS; ++w) sum += sm->red[w][tid];
        atomicAdd(a.y + n * TILE + tid, sum);
      }
    }
  } else if (b < ITEMS) {
    consume_halves(sm, bias, a.y);
  }
  consumers_sync();
  if (tid == 0) a.times[4 * b + 2] = kt_globaltimer();
  grid_barrier(a.bar, V == kOwnPhase ? 2 : 1);
  const float any = read_y(a);
  consumers_sync();
  if (tid == 0) a.times[4 * b + 3] = kt_globaltimer();
  if (any == -12345.0f) a.y[0] = any;  // keeps the reads
}

// One stage a block: v1's [tile][group], then v2's [item][half] assembled
// from the same repacked layout.
__global__ void repack_kernel(const uint8_t* wq, const uint16_t* sc, const uint16_t* ze, Stage* stages) {
  const int i = int(blockIdx.x);
  mk::repack_stage(wq, sc, ze, D, i / CG, i % CG, reinterpret_cast<uint8_t*>(stages + i));
}
__global__ void halves_kernel(const Stage* stages, HalfStage* halves) {
  const int i = int(blockIdx.x), item = i / HALVES, half = i % HALVES;
  const int grp = item / (KD / QUARTER), q = item % (KD / QUARTER);  // rows 32 q .. of head (group) grp
  HalfStage& out = halves[i];
  for (int t = 0; t < 2; ++t) {
    const Stage& st = stages[size_t(2 * half + t) * CG + grp];
    for (int j = threadIdx.x; j < HALF_CHUNKS * 1024; j += blockDim.x)
      out.w[t * HALF_CHUNKS + j / 1024][j % 1024] = st.w[(q * HALF_CHUNKS + j / 1024) * 1024 + j % 1024];
    for (int j = threadIdx.x; j < TILE; j += blockDim.x) {
      out.sc[t][j] = st.sc[j];
      out.ze[t][j] = st.ze[j];
    }
  }
}

struct Case {
  const char* name;
  void (*kernel)(Args);
};

}  // namespace study

int main(int argc, char** argv) {
  using namespace study;
  using namespace ktune;
  const int launches = argc > 1 ? std::max(2, std::atoi(argv[1])) : 20;
  std::mt19937 rng(20261203);
  const Stack wo(1, C, D, rng);
  std::vector<uint16_t> o(C);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : o) v = float_to_bf16(normal(rng));
  Reference ref(D);
  for (int k = 0; k < C; ++k)
    for (int n = 0; n < D; ++n) ref.add(n, double(bf16_to_float(o[k])) * wo.w(0, C, D, k, n));

  const int sms = sms_at_least(ITEMS, "oproj_merge", "one KDA item a block");
  Args a{};
  Stage* stages;
  HalfStage* halves;
  CHECK(cudaMalloc(&stages, size_t(DT) * CG * sizeof(Stage)));
  CHECK(cudaMalloc(&halves, size_t(ITEMS) * HALVES * sizeof(HalfStage)));
  {
    uint8_t* q = to_device(wo.q);
    uint16_t *s = to_device(wo.s), *z = to_device(wo.z);
    repack_kernel<<<DT * CG, 256>>>(q, s, z, stages);
    CHECK(cudaGetLastError());
    halves_kernel<<<ITEMS * HALVES, 256>>>(stages, halves);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    for (void* p : {(void*)q, (void*)s, (void*)z}) CHECK(cudaFree(p));
  }
  a.stages = stages;
  a.halves = halves;
  a.o = to_device(o);
  CHECK(cudaMalloc(&a.y, size_t(D) * 4));
  CHECK(cudaMalloc(&a.bar, 4));
  CHECK(cudaMalloc(&a.times, size_t(sms) * 4 * 8));
  const size_t flush_bytes = 256u << 20;  // written before each launch: no launch finds its weights in L2
  void* flush;
  CHECK(cudaMalloc(&flush, flush_bytes));

  const Case cases[] = {{"v1 its own phase", oproj_kernel<kOwnPhase>}, {"v2 merged into KDA", oproj_kernel<kMerged>}};
  const size_t smem = sizeof(Smem);
  std::printf("oproj_merge: o_proj %d -> %d (%.1f MB of stages; v2's half stages %.1f MB), %d blocks of %d threads, "
              "%d launches each\n",
              C, D, double(DT * CG) * sizeof(Stage) / 1e6, double(ITEMS * HALVES) * sizeof(HalfStage) / 1e6, sms,
              KT_BLOCK_THREADS, launches);
  std::printf("%-22s %9s %9s %9s %12s %9s %9s %9s\n", "version", "min us", "median", "max", "barrier 1", "work",
              "y held", "check");
  int failed = 0;
  for (const Case& cs : cases) {
    if (!asked_for(cs.name, argc, argv, 2)) continue;
    CHECK(cudaFuncSetAttribute(cs.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    std::vector<double> spans, firsts, works, helds;
    double worst = 0;
    for (int l = 0; l < launches; ++l) {
      CHECK(cudaMemset(flush, l, flush_bytes));
      CHECK(cudaMemset(a.y, 0, size_t(D) * 4));
      CHECK(cudaMemset(a.bar, 0, 4));
      launch_study(cs.kernel, a, sms, smem);
      worst = std::max(worst, ref.worst_error(a.y));
      std::vector<unsigned long long> t(size_t(sms) * 4);
      CHECK(cudaMemcpy(t.data(), a.times, t.size() * 8, cudaMemcpyDeviceToHost));
      if (l == 0) continue;  // the first launch warms the code and the clocks
      unsigned long long t0 = ~0ull, t1 = 0;
      for (int b = 0; b < sms; ++b) {
        t0 = std::min(t0, t[4 * b]);
        t1 = std::max(t1, t[4 * b + 3]);
      }
      auto median_at = [&](int i) {  // the median block's point i, us from the first start
        std::vector<double> at;
        for (int b = 0; b < sms; ++b) at.push_back(double(t[4 * b + i] - t0) / 1e3);
        std::sort(at.begin(), at.end());
        return at[at.size() / 2];
      };
      spans.push_back(double(t1 - t0) / 1e3);
      firsts.push_back(median_at(1));
      works.push_back(median_at(2));
      helds.push_back(median_at(3));
    }
    for (auto* v : {&spans, &firsts, &works, &helds}) std::sort(v->begin(), v->end());
    const bool ok = worst < 1e-4;
    char check[32];
    std::snprintf(check, sizeof check, "%s %.1e", ok ? "ok" : "FAIL", worst);
    char first[16] = "-";
    if (std::strncmp(cs.name, "v1", 2) == 0) std::snprintf(first, sizeof first, "%.2f", firsts[firsts.size() / 2]);
    std::printf("%-22s %9.2f %9.2f %9.2f %12s %9.2f %9.2f %9s\n", cs.name, spans.front(), spans[spans.size() / 2],
                spans.back(), first, works[works.size() / 2], helds[helds.size() / 2], check);
    if (!ok) ++failed;
  }
  std::printf("(us from the launch's first block start, medians over the launches; the points are the median block's:\n"
              " barrier 1, v1's barrier before o_proj passed; work, its o_proj work done; y held, it has read y)\n");
  return failed ? 1 : 0;
}
