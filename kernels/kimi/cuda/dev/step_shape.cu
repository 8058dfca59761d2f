// How a step's shape bounds its time: the whole step's weight stages
// (~210 a block, the bytes of one full-size step at 2048 rows) streamed
// through the megakernel's own loader ring and consumer loop, cut into P
// phases with a grid barrier between each two. It answers, before any
// rewrite, how many grid-wide dependencies a step may have and still reach
// the issue's stage 2 (~120 us on the H200), and what the loader and the
// consumers reach with none (RESULTS, "Where the gap to the floor is, as
// of run 290": "a step of a different shape with far fewer boundaries").
//
// Each block's phase p: stage the input x (2304 bf16, read from global
// memory as a phase's staging reads its input after the barrier), eat
// n_p stages (items of at most 18 stages, a d-input tile's length, each
// item's 128 sums added into y by atomics), then the grid barrier. Every
// block eats the same number of stages in a phase: no imbalance, no
// k-split hand-off, no attention, KDA or routing work, so each shape's time
// is a lower bound for a step of that shape on these pieces. The loader
// issues every stage of the block in order as the ring frees, across the
// barriers (hold 0), or, as the megakernel's default does, at most 2 of a
// phase's stages before the block's consumers are past the barrier before
// it (hold 2).
//
// Shapes (stages a block in each phase; ~210 in all, 132 blocks):
//   B1 .. B26   the stages cut into B phases of equal length;
//   now26       the megakernel's phases, their bytes at 2048 rows: a K layer
//               q,k,v,g 18 | KDA state 3 | o_proj 4 | router and shared
//               gate/up 3 | routed gate/up 17 | down 10, three times; the M
//               layer q/kv_a 7 | q_abs 1 | attention 2 | w_uv 1 | o_proj 4 |
//               router 3 | gate/up 17 | down 10;
//   fused18     the same bytes with KDA + o_proj, w_uv + o_proj and the MoE's
//               gate/up + down merged (the levers RESULTS lists);
//   lean10      two phases a K layer (attention, MoE), four in the M layer.
// Two more ways to run a shape take its pieces apart (hold 2 only): `loads`,
// where the consumers wait for each stage and release it without computing
// (what the loader and DRAM reach alone), and `x once`, where the input is
// staged before the first phase only (what the staging after each barrier
// costs). Holds 1 and 4 bracket the default 2. `ahead h` bounds the loader
// differently: at most h stages of the phases the block's consumers have not
// begun, all of them together (a hold counts each phase's own stages, so
// behind a run of short phases the loader may be many stages ahead).
// Where the stages lie (whether DRAM serves 132 streams far apart slower):
// by default each block's ~210 stages are one run of its own (the blocks'
// streams 1.9 MB apart); `interleaved` lays the blocks' k-th stages side by
// side (the grid reads one run of ~1.1 MB at a time, as a plain read of the
// grid does); `phase runs` lays each phase's stages in one region, each
// block's n_p of them a run in it (the streams n_p stages apart, as the
// megakernel's repacked tiles lie: an item's stages are a run of its tile's).
// Phase runs stream as fast as interleaved, and each block's run is ~5%
// slower at 10-26 phases (RESULTS, runs 314-315): the figures of runs
// 307-311, in that layout, are ~5% above the megakernel's own.
// The stages are distinct (248 MB, more than L2; L2 is flushed before each
// launch too); their contents repeat 64 repacked stages of a random W4A16
// matrix, so each launch's y is checked against a CPU reference (the
// spec's bf16 dequant in double). A launch is timed by globaltimer from the
// first block's start to the last block past the final barrier.
//
// Measured in RESULTS, runs 307 (H200), 308-309 and 314-315 (H100). At 12
// consumer warps (the build step_shape_t384, KT_THREADS=384; run 324, H100)
// every shape was 0.6-3 us slower than at 8, though those warps eat resident
// stages 7% faster (consumer_rate): the loader bounds a step on the H100.
//
// Build (the megakernel's full-size defines, no GPU needed): CMake builds
// it as build/step_shape (and build/step_shape_t384), or
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. \
//     $(scripts/megakernel_defines.sh) -o /tmp/step_shape kernels/kimi/cuda/dev/step_shape.cu
// Run on the device machine: step_shape [launches] [case name prefixes...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "kernels/kimi/cuda/dev/cuda_check.h"
#include "kernels/kimi/cuda/megakernel.cu"
#include "kernels/kimi/cuda/dev/megakernel_study.cuh"

namespace study {
using mk::WARPS;

constexpr int D = mk::D, G = mk::G;
constexpr int ITEM = D / G;         // stages of an item at most (18: a d-input tile)
constexpr int KINDS = 64;           // distinct stage contents
constexpr int PER_BLOCK_MAX = 216;  // stages a block, the most any shape streams
constexpr int MAX_PHASES = 32;
constexpr int TIMES = 2 * MAX_PHASES + 1;  // a block's time points
constexpr int KK = KINDS / 2 * G;   // the matrix whose stages repeat: [KK, 2 tiles]

struct Args {
  const Stage* stages;        // [block][PER_BLOCK_MAX] stages' room, repacked, laid out as `layout` says
  const uint16_t* x;          // [D] bf16
  float* y;                   // [TILE] (zeroed)
  unsigned* bar;              // grid barrier arrivals (zeroed)
  unsigned long long* times;  // [block][TIMES]: start, then (arrival, passed) at each barrier; the end
  int phases, hold;
  int ahead;    // > 0: at most that many stages of the phases the consumers have not begun, all such phases together
  int compute;  // 0: the consumers release each stage unread (loads only)
  int restage;  // 0: the input is staged before the first phase only
  int layout;   // Layout
  int n[MAX_PHASES];          // stages a block in each phase
};

enum Layout { kBlockRuns, kInterleaved, kPhaseRuns };
// Where block b's k-th stage lies in the big buffer (k in the phase that
// starts at the block's stage `start` and has n of them).
__host__ __device__ inline size_t stage_index(int layout, unsigned b, unsigned blocks, unsigned k, unsigned start,
                                              unsigned n) {
  if (layout == kInterleaved) return size_t(k) * blocks + b;
  if (layout == kPhaseRuns) return size_t(start) * blocks + size_t(b) * n + (k - start);
  return size_t(b) * PER_BLOCK_MAX + k;
}

// The loader warp's first thread: the block's stages in order, one bulk
// copy each; with hold h, at most h of a phase's before the consumers say
// they are past the barrier before it (sm->flag: the phases begun).
__device__ void loader(const Args& a, Smem* sm) {
  Stage* ring = reinterpret_cast<Stage*>(sm->pipe);
  const volatile int* begun = reinterpret_cast<volatile int*>(&sm->flag);
  unsigned k = 0;
  int start[MAX_PHASES + 1] = {0};  // the first stage of each phase, in the block's order
  for (int p = 0; p < a.phases; ++p) start[p + 1] = start[p] + a.n[p];
  for (int p = 0; p < a.phases; ++p)
    for (int i = 0; i < a.n[p]; ++i) {
      if (a.hold > 0 && p > 0 && i == a.hold)
        while (*begun < p + 1) __nanosleep(32);
      if (a.ahead > 0)  // stages of phases not begun (from phase *begun on), counted across short phases
        for (int b = *begun; p >= b && int(k) - start[b] >= a.ahead; b = *begun) __nanosleep(32);
      const unsigned slot = k % STAGES;
      if (k >= STAGES) kt_mbar_wait(&sm->empty[slot], ((k / STAGES) - 1) & 1);
      kt_mbar_arrive_expect_tx(&sm->full[slot], unsigned(sizeof(Stage)));
      const size_t at = stage_index(a.layout, blockIdx.x, gridDim.x, k, unsigned(start[p]), unsigned(a.n[p]));
      kt_bulk_copy_g2s(&ring[slot], a.stages + at, unsigned(sizeof(Stage)), &sm->full[slot]);
      ++k;
    }
}

__global__ void __launch_bounds__(KT_BLOCK_THREADS, 1) shape_kernel(const __grid_constant__ Args a) {
  Smem* sm = reinterpret_cast<Smem*>(kt_smem());
  const int tid = int(threadIdx.x), b = int(blockIdx.x), warp = tid >> 5;
  unsigned long long* t = a.times + size_t(b) * TIMES;
  if (tid == 0) {
    t[0] = kt_globaltimer();
    sm->flag = 0;
  }
  init_ring(sm);
  __syncthreads();
  if (!consumer_role([&] { loader(a, sm); })) return;
  const uint32_t bias = mk::g_bias_pair;
  unsigned eaten = 0;
  for (int p = 0; p < a.phases; ++p) {
    if (p > 0) {
      consumers_sync();
      if (tid == 0) t[2 * p - 1] = kt_globaltimer();
      grid_barrier(a.bar, unsigned(p));
      if (tid == 0) t[2 * p] = kt_globaltimer();
    }
    if (tid == 0) *reinterpret_cast<volatile int*>(&sm->flag) = p + 1;  // hold: the phase's other stages may go
    if (p == 0 || a.restage) {
      for (int i = tid; i < D / 2; i += THREADS) {  // the phase's input, as a staging reads it after the barrier
        sm->xs_hi[i] = kt_ld_cg(reinterpret_cast<const unsigned*>(a.x) + i);
        sm->xs_lo[i] = 0;
      }
      consumers_sync();
    }
    if (!a.compute) {  // the ring's handshake alone, in consume_stages' order of warp groups
      for (int s = warp / mk::FEED_WPG; s < a.n[p]; s += mk::FEED_GROUPS) {
        const unsigned k = eaten + unsigned(s);
        kt_mbar_wait(&sm->full[k % STAGES], (k / STAGES) & 1);
        __syncwarp();
        if ((tid & 31) == 0) kt_mbar_arrive(&sm->empty[k % STAGES]);
      }
      eaten += unsigned(a.n[p]);
      continue;
    }
    for (int done = 0; done < a.n[p]; done += ITEM) {
      const int m = min(ITEM, a.n[p] - done);
      mk::consume_stages(sm, eaten, 0, m, bias, sm->red[warp]);
      eaten += unsigned(m);
      consumers_sync();
      if (tid < TILE) {
        float y = 0;
        for (int w = 0; w < WARPS; ++w) y += sm->red[w][tid];
        atomicAdd(a.y + tid, y);
      }
      consumers_sync();  // red is free again
    }
  }
  if (tid == 0) t[2 * a.phases - 1] = kt_globaltimer();
  grid_barrier(a.bar, unsigned(a.phases));
  if (tid == 0) t[2 * a.phases] = kt_globaltimer();
}

// The KINDS distinct stages: stage v is (tile v / (KINDS / 2), group v % (KINDS / 2)).
__global__ void repack_kernel(const uint8_t* wq, const uint16_t* sc, const uint16_t* ze, Stage* kinds) {
  const int v = int(blockIdx.x);
  mk::repack_stage(wq, sc, ze, 2 * TILE, v / (KINDS / 2), v % (KINDS / 2), reinterpret_cast<uint8_t*>(kinds + v));
}
// Stage f of the big buffer is kind f % KINDS.
__global__ void spread_kernel(const Stage* kinds, Stage* stages, size_t count) {
  const size_t words = sizeof(Stage) / 16;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count * words; i += size_t(gridDim.x) * blockDim.x)
    reinterpret_cast<uint4*>(stages)[i] = reinterpret_cast<const uint4*>(kinds + (i / words) % KINDS)[i % words];
}

struct Shape {
  std::string name;
  std::vector<int> n;
};

std::vector<Shape> shapes() {
  const std::vector<int> k_layer = {18, 3, 4, 3, 17, 10}, m_layer = {7, 1, 2, 1, 4, 3, 17, 10};
  const std::vector<int> k_fused = {18, 7, 3, 27}, m_fused = {7, 1, 2, 5, 3, 27};
  const std::vector<int> k_lean = {25, 30}, m_lean = {8, 2, 5, 30};
  auto step = [](const std::vector<int>& k, const std::vector<int>& m) {
    std::vector<int> n;
    for (int l = 0; l < 3; ++l) n.insert(n.end(), k.begin(), k.end());
    n.insert(n.end(), m.begin(), m.end());
    return n;
  };
  std::vector<Shape> out;
  const std::vector<int> now = step(k_layer, m_layer);
  int total = 0;
  for (int v : now) total += v;
  for (int phases : {1, 2, 4, 8, 13, 18, 26}) {
    Shape s{"B" + std::to_string(phases), {}};
    for (int p = 0; p < phases; ++p) s.n.push_back((p + 1) * total / phases - p * total / phases);
    out.push_back(s);
  }
  out.push_back({"now26", now});
  out.push_back({"fused18", step(k_fused, m_fused)});
  out.push_back({"lean10", step(k_lean, m_lean)});
  return out;
}

// The reference: contribution[v][i][c] of a stage of kind v eaten as an
// item's i-th (inputs x[128 i ..]) to y[c], and the sum of its terms' magnitudes.
struct Contributions {
  std::vector<double> sum, mag;  // [KINDS][ITEM][TILE]
  Contributions(const Stack& w, const std::vector<uint16_t>& x)
      : sum(size_t(KINDS) * ITEM * TILE, 0.0), mag(sum.size(), 0.0) {
    for (int v = 0; v < KINDS; ++v)
      for (int i = 0; i < ITEM; ++i)
        for (int r = 0; r < G; ++r) {
          const double xr = ktune::bf16_to_float(x[size_t(i) * G + r]);
          for (int c = 0; c < TILE; ++c) {
            const double term = xr * w.w(0, KK, 2 * TILE, (v % (KINDS / 2)) * G + r, (v / (KINDS / 2)) * TILE + c);
            sum[(size_t(v) * ITEM + i) * TILE + c] += term;
            mag[(size_t(v) * ITEM + i) * TILE + c] += std::fabs(term);
          }
        }
  }
  // y's reference for a shape on `blocks` blocks: the stages each block eats, in its items' order.
  Reference of(const Shape& s, int blocks, int layout) const {
    Reference ref(TILE);
    for (int b = 0; b < blocks; ++b) {
      int j = 0;
      for (int np : s.n) {
        const int start = j;
        for (int done = 0; done < np; done += ITEM)
          for (int i = 0; i < std::min(ITEM, np - done); ++i, ++j) {
            const int v = int(stage_index(layout, unsigned(b), unsigned(blocks), unsigned(j), unsigned(start),
                                          unsigned(np)) %
                              KINDS);
            for (int c = 0; c < TILE; ++c) {
              ref.want[c] += sum[(size_t(v) * ITEM + i) * TILE + c];
              ref.scale_of[c] += mag[(size_t(v) * ITEM + i) * TILE + c];
            }
          }
      }
    }
    return ref;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace study

int main(int argc, char** argv) {
  using namespace study;
  using namespace ktune;
  const int launches = argc > 1 ? std::max(2, std::atoi(argv[1])) : 20;
  std::mt19937 rng(20261205);
  const Stack w(1, KK, 2 * TILE, rng);
  std::vector<uint16_t> x(D);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = float_to_bf16(normal(rng));
  const Contributions contrib(w, x);

  const int sms = sms_at_least(1, "step_shape", "a block an SM");
  Stage* kinds;
  Stage* stages;
  const size_t count = size_t(sms) * PER_BLOCK_MAX;
  CHECK(cudaMalloc(&kinds, size_t(KINDS) * sizeof(Stage)));
  CHECK(cudaMalloc(&stages, count * sizeof(Stage)));
  {
    uint8_t* q = to_device(w.q);
    uint16_t *s = to_device(w.s), *z = to_device(w.z);
    repack_kernel<<<KINDS, 256>>>(q, s, z, kinds);
    CHECK(cudaGetLastError());
    spread_kernel<<<1024, 256>>>(kinds, stages, count);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    for (void* p : {(void*)q, (void*)s, (void*)z}) CHECK(cudaFree(p));
  }
  Args a{};
  a.stages = stages;
  a.x = to_device(x);
  CHECK(cudaMalloc(&a.y, size_t(TILE) * 4));
  CHECK(cudaMalloc(&a.bar, 4));
  CHECK(cudaMalloc(&a.times, size_t(sms) * TIMES * 8));
  const size_t flush_bytes = 256u << 20;  // written before each launch: no launch finds its stages in L2
  void* flush;
  CHECK(cudaMalloc(&flush, flush_bytes));
  const size_t smem = sizeof(Smem);
  CHECK(cudaFuncSetAttribute(shape_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));

  std::printf("step_shape: %d blocks of %d threads, ring %d stages of %zu B, %d launches a case\n", sms,
              KT_BLOCK_THREADS, STAGES, sizeof(Stage), launches);
  std::printf("%-16s %6s %7s %8s %8s %8s %8s %8s %9s %9s\n", "case", "phases", "stages", "min us", "median", "max",
              "work", "waits", "TB/s", "check");
  int failed = 0;
  struct Way {
    std::string name;
    int hold, ahead, compute, restage, layout = kBlockRuns;
  };
  const std::vector<Way> ways = {{"hold 0", 0, 0, 1, 1},  {"hold 1", 1, 0, 1, 1},  {"hold 2", 2, 0, 1, 1},
                                 {"hold 4", 4, 0, 1, 1},  {"ahead 2", 0, 2, 1, 1}, {"ahead 4", 0, 4, 1, 1},
                                 {"ahead 6", 0, 6, 1, 1}, {"ahead 8", 0, 8, 1, 1}, {"loads hold 2", 2, 0, 0, 1},
                                 {"x once hold 2", 2, 0, 1, 0}, {"interleaved hold 2", 2, 0, 1, 1, kInterleaved},
                                 {"loads interleaved hold 2", 2, 0, 0, 1, kInterleaved},
                                 {"phase runs hold 2", 2, 0, 1, 1, kPhaseRuns},
                                 {"loads phase runs hold 2", 2, 0, 0, 1, kPhaseRuns}};
  struct Point {
    std::string way;
    int phases;
    double us;
  };
  std::vector<Point> sweep;
  for (const Shape& shape : shapes())
    for (const Way& way : ways) {
      const std::string name = shape.name + " " + way.name;
      if (!asked_for(name.c_str(), argc, argv, 2)) continue;
      a.phases = int(shape.n.size());
      a.hold = way.hold;
      a.ahead = way.ahead;
      a.compute = way.compute;
      a.restage = way.restage;
      a.layout = way.layout;
      int total = 0;
      for (int p = 0; p < a.phases; ++p) total += (a.n[p] = shape.n[p]);
      const Reference ref = contrib.of(shape, sms, way.layout);
      std::vector<double> spans, works, waits;
      double worst = 0;
      for (int l = 0; l < launches; ++l) {
        CHECK(cudaMemset(flush, l, flush_bytes));
        CHECK(cudaMemset(a.y, 0, size_t(TILE) * 4));
        CHECK(cudaMemset(a.bar, 0, 4));
        launch_study(shape_kernel, a, sms, smem);
        if (a.compute) worst = std::max(worst, ref.worst_error(a.y));
        if (l == 0) continue;  // the first launch warms the code and the clocks
        std::vector<unsigned long long> t(size_t(sms) * TIMES);
        CHECK(cudaMemcpy(t.data(), a.times, t.size() * 8, cudaMemcpyDeviceToHost));
        unsigned long long t0 = ~0ull, t1 = 0;
        std::vector<double> work(sms, 0.0), wait(sms, 0.0);
        for (int b = 0; b < sms; ++b) {
          const unsigned long long* tb = t.data() + size_t(b) * TIMES;
          t0 = std::min(t0, tb[0]);
          t1 = std::max(t1, tb[2 * a.phases]);
          for (int p = 0; p < a.phases; ++p) {  // phase p: from its start (or the barrier passed) to the next arrival
            work[b] += double(tb[2 * p + 1] - tb[2 * p]) / 1e3;
            wait[b] += double(tb[2 * p + 2] - tb[2 * p + 1]) / 1e3;
          }
        }
        spans.push_back(double(t1 - t0) / 1e3);
        works.push_back(median(work));
        waits.push_back(median(wait));
      }
      const bool ok = worst < 1e-4;
      char check[32];
      std::snprintf(check, sizeof check, "%s %.1e", ok ? "ok" : "FAIL", worst);
      if (!a.compute) std::snprintf(check, sizeof check, "no sums");
      const double us = median(spans), bytes = double(total) * sms * sizeof(Stage);
      std::printf("%-16s %6d %7d %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9s\n", name.c_str(), a.phases, total,
                  *std::min_element(spans.begin(), spans.end()), us, *std::max_element(spans.begin(), spans.end()),
                  median(works), median(waits), bytes / us / 1e6, check);
      if (!ok) ++failed;
      if (shape.name[0] == 'B') sweep.push_back({way.name, a.phases, us});
    }
  // The equal-length phases: span = base + per_boundary x (phases - 1), least squares.
  for (const Way& way : ways) {
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const Point& p : sweep)
      if (p.way == way.name) {
        const double bx = p.phases - 1;
        n += 1, sx += bx, sy += p.us, sxx += bx * bx, sxy += bx * p.us;
      }
    if (n < 2) continue;
    const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), base = (sy - slope * sx) / n;
    std::printf("%-14s equal phases: %.2f us + %.2f us a boundary (least squares over %d shapes)\n",
                way.name.c_str(), base, slope, int(n));
  }
  std::printf("(us from the launch's first block start to the last block past the final barrier; work and waits: the\n"
              " median block's sums of its phases' own time and of its waits at the barriers; TB/s: the stages' bytes\n"
              " over the median span)\n");
  return failed ? 1 : 0;
}
