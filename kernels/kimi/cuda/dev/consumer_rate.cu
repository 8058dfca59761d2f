// The megakernel's consumer warps alone, on stages already in shared memory:
// how long a block takes per 8.5-KB stage (one quantization group of a
// 128-column tile) when no stage waits for DRAM. It answers whether a GEMV
// phase's stage rate in the megakernel (~0.33 us a stage a block, RESULTS
// run 214) is the consumers' or the DRAM's: with all 132 blocks streaming,
// DRAM gives a block a stage every ~0.28 us (132 x 8.5 KB at ~4 TB/s), and
// the stages the loader copied ahead, during the previous phase's barrier
// and hand-off, are eaten at the consumers' own rate.
//
// Each block holds the ring's STAGES stages (a tile's first STAGES groups,
// repacked by the megakernel's repack_stage) and eats them `rounds` times
// over as consecutive items. A loader warp only arrives on each stage's
// `full` mbarrier once its `empty` one says the slot's last eating is over,
// so the ring's handshake is the megakernel's without the copies. Every
// version is checked against a CPU reference (the spec's bf16 dequant, x
// as the hi + lo parts the megakernel stages) unless it says otherwise, and
// timed the same way (clock64 and globaltimer around the rounds, the
// median block's).
//
//   v1  mk::consume_stages, the megakernel's own code (Q = FEED_Q chunks a
//       warp a stage, FEED_WPG warps a stage, the groups in turn)
//   v2  the same loop written here (checks that the copy is faithful)
//   v3  Q 4: two warps a stage, so twice as many stages in progress
//   v4  Q 8: a warp a stage
//   v5  v2 without the mbarriers (no waits, no arrivals): the handshake's cost
//   v6  v2 without the dequant arithmetic (the nibble pairs straight into
//       the mma; not checked): what the bf16 subtract and multiply cost
//   v7  Q 1: every warp a chunk of every stage (one group)
//   v8  v2 with one of the three nibble shifts an mma's registers need as
//       the high word of a product (IMAD.HI, off the ALU pipe)
//   v9  v2 with all three as such products
//   v10 v2 with the warp's next stage's weights and scales read from
//       shared memory before its current stage is computed
//   v11 the dequant folded out of the weights: a column's sum over a
//       group is s (sum_k x_k (128 + q_k) - (128 + z) sum_k x_k), so the
//       mma takes the nibbles' bf16 128 + q as they are (no subtract, no
//       multiply a weight), one more mma with all-ones weights gives the
//       warp's sum of x, and each stage ends with two FMAs a sum. w is not
//       rounded to bf16 as the spec's dequant rounds it, so it is checked
//       against the unrounded dequant, (q - z) s in double
//
// What it showed on the H200 (RESULTS.md, 2026-12-02, runs 216 and 220): v1
// eats a stage in 276 ns a block at 8 warps (4.16 TB/s over 132 blocks, as
// fast as DRAM feeds every block at once), so the consumers are not what
// makes a GEMV phase slow; v3 257, v4 269, v7 316 ns; v5 as v2 (the
// handshake is free); v6 210 ns (the exact dequant is ~25%). 12 warps: v4
// 235 ns, but the megakernel spills heavily at 384 threads. In the
// megakernel 4 or 1 chunks a warp (knob feed_chunks) made the step 5-7 us
// slower: its items are a few stages long, and there a stage's latency
// from landing to released counts more than the rate. Run 241: v8 303, v9
// 370, v10 334 ns against v2's 268 (IMAD.HI costs more than a shift; the
// read-ahead only adds register moves). Run 321 (H100, same clock): v11
// 290 ns against v2's 270 and v1's 276: likely (not profiled) the fold's
// extra mma and its FMAs, which wait on each block's mma result, cost more
// than the bf16 subtract and multiply they replace. Ported to the
// megakernel as a knob for the same run, it was no faster (within 1.5 us)
// and 5x farther from the oracle (relative L2 error of the output 1.1e-2
// against 1.8e-3), so the knob was removed. Here v11 matches the unrounded dequant to 3e-8, so the fold
// itself is exact; the likely cause is the oracle's w rounded to bf16, as
// the spec says and the fold does not (not isolated).
//
// Build (the megakernel's full-size defines, no GPU needed; KT_THREADS=384
// or 512 for 12 or 16 consumer warps):
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. \
//     $(scripts/megakernel_defines.sh) -o .devcarry/consumer_rate kernels/kimi/cuda/dev/consumer_rate.cu
// Run on the device machine: .devcarry/consumer_rate [rounds] [version names...]
#include "kernels/kimi/cuda/megakernel.cu"
// The studies' shared pieces, which build on megakernel.cu (so after it).
#include "kernels/kimi/cuda/dev/megakernel_study.cuh"

namespace study {
using mk::STAGE_CHUNKS;
using mk::WARPS;

constexpr int K = STAGES * mk::G;  // a round: the ring's stages, one item of STAGES groups
static_assert(K <= mk::KMAX, "the staged input holds K");

enum Version { kMegakernel = 1, kCopy, kQ4, kQ8, kNoMbar, kNoDequant, kQ1, kMulHi1, kMulHi3, kAhead, kFolded };

// v8, v9: a chunk whose nibble shifts (registers 1..SHIFTS of an mma, of
// the 3 that need one) are high words of products (IMAD.HI, on the FMA
// pipe) instead of SHF (on the ALU pipe, with every LOP3). mul[r] = 2^(32 -
// 4r), read from memory so that ptxas cannot turn the product back into a
// shift.
template <int SHIFTS>
__device__ __forceinline__ void chunk_mulhi(const uint4& wa, const uint4& wb, const uint32_t (&ss)[8],
                                            const uint32_t (&zz)[8], uint32_t bias, const uint32_t (&mul)[4],
                                            const uint32_t* xh, const uint32_t* xl, int lc, float (&mma_acc)[8][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t* xsrc = g == 0 ? xh : xl;
  uint32_t b[2] = {g < 2 ? xsrc[lc * 8 + t] : 0u, g < 2 ? xsrc[lc * 8 + t + 4] : 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t w = mk::word_of(j < 4 ? wa : wb, j & 3);
    uint32_t a[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint32_t v = r == 0 ? w : r <= SHIFTS ? __umulhi(w, mul[r]) : w >> (4 * r);
      a[r] = mk::dequant_col((v & 0x000f000fu) | bias, ss, zz, 2 * j + (r & 1));
    }
    kt_mma_bf16(mma_acc[j], a, b);
  }
}
__device__ uint32_t g_shift_mul[4] = {1u, 1u << 28, 1u << 24, 1u << 20};

// v11: a warp's Q chunks of one stage (one quantization group, so one
// scale and zero a column) with the dequant folded out. The A fragment's
// rows g and g + 8 of block j are the lane's columns 2j and 2j + 1, whose
// scale and 128 + zero are the low and high halves of ss[j] and zz[j]; the
// C fragment's c0, c1 are row g (x's hi and lo parts in lanes t == 0, zero
// elsewhere), c2, c3 row g + 8.
template <int Q>
__device__ __forceinline__ void compute_folded_stage(const Stage& st, int lane, int first_chunk, uint32_t bias,
                                                     const uint32_t* xh, const uint32_t* xl, int lc0,
                                                     float (&mma_acc)[8][4]) {
  const int g = lane >> 2, t = lane & 3;
  const uint4* sv = reinterpret_cast<const uint4*>(st.sc + 16 * g);
  const uint4* zv = reinterpret_cast<const uint4*>(st.ze + 16 * g);
  const uint4 s_lo = sv[0], s_hi = sv[1], z_lo = zv[0], z_hi = zv[1];
  const uint32_t ss[8] = {s_lo.x, s_lo.y, s_lo.z, s_lo.w, s_hi.x, s_hi.y, s_hi.z, s_hi.w};
  const uint32_t zz[8] = {z_lo.x, z_lo.y, z_lo.z, z_lo.w, z_hi.x, z_hi.y, z_hi.z, z_hi.w};
  const uint32_t* xsrc = g == 0 ? xh : xl;
  uint4 wa[Q], wb[Q];
  uint32_t b[Q][2];
  float sum_x[4] = {0, 0, 0, 0};
  constexpr uint32_t kOnes[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};  // bf16 1.0 pairs
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const int j = first_chunk + q, lc = lc0 + j;
    const uint8_t* w = st.w + j * 1024 + lane * 16;
    wa[q] = *reinterpret_cast<const uint4*>(w);
    wb[q] = *reinterpret_cast<const uint4*>(w + 512);
    b[q][0] = g < 2 ? xsrc[lc * 8 + t] : 0u;
    b[q][1] = g < 2 ? xsrc[lc * 8 + t + 4] : 0u;
    kt_mma_bf16(sum_x, kOnes, b[q]);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float part[4] = {0, 0, 0, 0};
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const uint32_t w = mk::word_of(j < 4 ? wa[q] : wb[q], j & 3);
      uint32_t a[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = ((r == 0 ? w : w >> (4 * r)) & 0x000f000fu) | bias;
      kt_mma_bf16(part, a, b[q]);
    }
    const float s0 = kt_lo(ss[j]), s1 = kt_hi(ss[j]), z0 = kt_lo(zz[j]), z1 = kt_hi(zz[j]);
    mma_acc[j][0] = fmaf(s0, fmaf(-z0, sum_x[0], part[0]), mma_acc[j][0]);
    mma_acc[j][1] = fmaf(s0, fmaf(-z0, sum_x[1], part[1]), mma_acc[j][1]);
    mma_acc[j][2] = fmaf(s1, fmaf(-z1, sum_x[2], part[2]), mma_acc[j][2]);
    mma_acc[j][3] = fmaf(s1, fmaf(-z1, sum_x[3], part[3]), mma_acc[j][3]);
  }
}

// The study's copy of the consumers' loop (mk::consume_stages), with the
// chunks a warp takes per stage (Q) and the probes as parameters.
template <int Q, bool MBAR, bool DEQUANT, bool FOLDED = false>
__device__ __noinline__ void consume(Smem* sm, unsigned eaten, int g0, int n, uint32_t bias, float* red_row) {
  constexpr int WPG = STAGE_CHUNKS / Q, GROUPS = WARPS / WPG;
  static_assert(WARPS % WPG == 0, "whole warp groups");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int group = warp / WPG, first_chunk = (warp % WPG) * Q;
  const Stage* stages = reinterpret_cast<const Stage*>(sm->pipe);
  float acc[16], mma_acc[8][4], out[16];
#pragma unroll
  for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
  for (int s = group; s < n; s += GROUPS) {
    const unsigned k = eaten + unsigned(s), slot = k % STAGES, parity = (k / STAGES) & 1;
    if (MBAR) kt_mbar_wait(&sm->full[slot], parity);
    const Stage& st = stages[slot];
    const int lc0 = (g0 + s) * STAGE_CHUNKS;
    if (FOLDED) {
      compute_folded_stage<Q>(st, lane, first_chunk, bias, sm->xs_hi, sm->xs_lo, lc0, mma_acc);
    } else if (DEQUANT) {
      mk::compute_feed_stage<Q>(st, lane, first_chunk, bias, sm->xs_hi, sm->xs_lo, lc0, mma_acc);
    } else {
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        const int j = first_chunk + q, lc = lc0 + j;
        const uint8_t* wp = st.w + j * 1024 + lane * 16;
        const uint4 wa = *reinterpret_cast<const uint4*>(wp), wb = *reinterpret_cast<const uint4*>(wp + 512);
        const uint32_t* xsrc = g == 0 ? sm->xs_hi : sm->xs_lo;
        uint32_t b[2] = {g < 2 ? xsrc[lc * 8 + t] : 0u, g < 2 ? xsrc[lc * 8 + t + 4] : 0u};
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const uint32_t w = mk::word_of(jj < 4 ? wa : wb, jj & 3);
          uint32_t a[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) a[r] = ((r == 0 ? w : w >> (4 * r)) & 0x000f000fu) | bias;
          kt_mma_bf16(mma_acc[jj], a, b);
        }
      }
    }
    __syncwarp();
    if (MBAR && lane == 0) kt_mbar_arrive(&sm->empty[slot]);
  }
  mk::gemv_finish(acc, mma_acc, out);
  if (t == 0) {
#pragma unroll
    for (int b = 0; b < 16; ++b) red_row[16 * g + b] = out[b];
  }
}

// v8-v10: the study's loop with each chunk computed by chunk_mulhi<MODE>
// (MODE 1 or 3: v8, v9) or by the megakernel's chunk_compute_frag (MODE 0);
// with AHEAD (v10) the warp's next stage's weights and scales are read from
// shared memory before the current one is computed (its full mbarrier
// waited for first: resident here, so this shows what hiding the loads'
// latency is worth).
template <int MODE, bool AHEAD>
__device__ __noinline__ void consume_alt(Smem* sm, unsigned eaten, int g0, int n, uint32_t bias, float* red_row) {
  constexpr int Q = mk::FEED_Q, WPG = mk::FEED_WPG, GROUPS = mk::FEED_GROUPS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int group = warp / WPG, first_chunk = (warp % WPG) * Q;
  const Stage* stages = reinterpret_cast<const Stage*>(sm->pipe);
  uint32_t mul[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) mul[r] = g_shift_mul[r];
  float acc[16], mma_acc[8][4], out[16];
#pragma unroll
  for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
  struct Frag {
    uint4 w[Q][2], s[2], z[2];
  };
  auto fetch = [&](int s, Frag& f) {
    const unsigned k = eaten + unsigned(s), slot = k % STAGES;
    kt_mbar_wait(&sm->full[slot], (k / STAGES) & 1);
    const Stage& st = stages[slot];
    const uint4* sv = reinterpret_cast<const uint4*>(st.sc + 16 * g);
    const uint4* zv = reinterpret_cast<const uint4*>(st.ze + 16 * g);
    f.s[0] = sv[0], f.s[1] = sv[1], f.z[0] = zv[0], f.z[1] = zv[1];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const uint8_t* w = st.w + (first_chunk + q) * 1024 + lane * 16;
      f.w[q][0] = *reinterpret_cast<const uint4*>(w);
      f.w[q][1] = *reinterpret_cast<const uint4*>(w + 512);
    }
  };
  auto compute = [&](int s, const Frag& f) {
    const uint32_t ss[8] = {f.s[0].x, f.s[0].y, f.s[0].z, f.s[0].w, f.s[1].x, f.s[1].y, f.s[1].z, f.s[1].w};
    const uint32_t zz[8] = {f.z[0].x, f.z[0].y, f.z[0].z, f.z[0].w, f.z[1].x, f.z[1].y, f.z[1].z, f.z[1].w};
    const int lc0 = (g0 + s) * STAGE_CHUNKS;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      if (MODE == 0)
        mk::chunk_compute_frag(f.w[q][0], f.w[q][1], ss, zz, bias, sm->xs_hi, sm->xs_lo, lc0 + first_chunk + q,
                               mma_acc);
      else
        chunk_mulhi<MODE>(f.w[q][0], f.w[q][1], ss, zz, bias, mul, sm->xs_hi, sm->xs_lo, lc0 + first_chunk + q,
                          mma_acc);
    }
  };
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) kt_mbar_arrive(&sm->empty[(eaten + unsigned(s)) % STAGES]);
  };
  if (AHEAD) {
    Frag cur, next;
    if (group < n) fetch(group, cur);
    for (int s = group; s < n; s += GROUPS) {
      if (s + GROUPS < n) fetch(s + GROUPS, next);
      compute(s, cur);
      release(s);
      cur = next;
    }
  } else {
    for (int s = group; s < n; s += GROUPS) {
      Frag f;
      fetch(s, f);
      compute(s, f);
      release(s);
    }
  }
  mk::gemv_finish(acc, mma_acc, out);
  if ((lane & 3) == 0) {
#pragma unroll
    for (int b = 0; b < 16; ++b) red_row[16 * g + b] = out[b];
  }
}

template <int V>
__device__ void consume_version(Smem* sm, unsigned eaten, uint32_t bias, float* red_row) {
  if constexpr (V == kMegakernel) mk::consume_stages(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kCopy) consume<mk::FEED_Q, true, true>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kQ4) consume<4, true, true>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kQ8) consume<8, true, true>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kNoMbar) consume<mk::FEED_Q, false, true>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kNoDequant) consume<mk::FEED_Q, true, false>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kQ1) consume<1, true, true>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kMulHi1) consume_alt<1, false>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kMulHi3) consume_alt<3, false>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kAhead) consume_alt<0, true>(sm, eaten, 0, STAGES, bias, red_row);
  if constexpr (V == kFolded) consume<mk::FEED_Q, true, true, true>(sm, eaten, 0, STAGES, bias, red_row);
}
__host__ __device__ constexpr int warps_per_stage(int v) {
  return v == kQ1 ? 8 : v == kQ4 ? 2 : v == kQ8 ? 1 : mk::FEED_WPG;
}

// One block a tile copy: stages (STAGES x sizeof(Stage), repacked) and x
// (K floats) into shared memory, then `rounds` items of STAGES stages.
// times[2 b], [2 b + 1]: the block's clock64 and globaltimer spans.
template <int V>
__global__ void __launch_bounds__(KT_BLOCK_THREADS, 1)
    rate_kernel(const uint8_t* stages, const float* x, int rounds, float* y, unsigned long long* times) {
  Smem* sm = reinterpret_cast<Smem*>(kt_smem());
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr bool kMbar = V != kNoMbar;
  for (int i = tid; i < STAGES * int(sizeof(Stage)) / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(sm->pipe)[i] = reinterpret_cast<const uint4*>(stages)[i];
  for (int i = tid; i < K / 2; i += blockDim.x) {
    // As the megakernel stages an fp32 input: hi = bf16(x), lo = bf16(x - hi).
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    const float h0 = kt_round_bf16(x0), h1 = kt_round_bf16(x1);
    sm->xs_hi[i] = kt_pack(h0, h1);
    sm->xs_lo[i] = kt_pack(x0 - h0, x1 - h1);
  }
  if (tid == 0) {
    for (int i = 0; i < STAGES; ++i) {
      kt_mbar_init(&sm->full[i], 1);
      kt_mbar_init(&sm->empty[i], warps_per_stage(V));
    }
    kt_mbar_fence_init();
  }
  __syncthreads();
#if KT_FEED == 4
  if (tid >= THREADS) {
    kt_setmaxnreg_dec<mk::kLoaderRegs>();
    // The loader without copies: slot k % STAGES is eaten again once its
    // previous eating is over (the megakernel's loader waits the same way).
    if (kMbar && warp == WARPS && lane == 0)
      for (unsigned k = 0; k < unsigned(rounds) * STAGES; ++k) {
        const unsigned slot = k % STAGES;
        if (k >= STAGES) kt_mbar_wait(&sm->empty[slot], ((k / STAGES) - 1) & 1);
        kt_mbar_arrive(&sm->full[slot]);
      }
    return;
  }
  kt_setmaxnreg_inc<mk::kConsumerRegs>();
#endif
  const uint32_t bias = mk::g_bias_pair;
  consumers_sync();
  const unsigned long long c0 = clock64(), t0 = kt_globaltimer();
  for (int r = 0; r < rounds; ++r) {
    // A version whose warp groups do not divide the consumer warps is not
    // built (main skips it: Case::warps_a_stage).
    if constexpr (WARPS % warps_per_stage(V) == 0) consume_version<V>(sm, unsigned(r) * STAGES, bias, sm->red[warp]);
    consumers_sync();  // as the megakernel's item end: the warps' sums are read
  }
  const unsigned long long c1 = clock64(), t1 = kt_globaltimer();
  if (tid == 0) {
    times[2 * blockIdx.x] = c1 - c0;
    times[2 * blockIdx.x + 1] = t1 - t0;
  }
  for (int i = tid; i < TILE; i += THREADS) {
    float sum = 0;
    for (int w = 0; w < WARPS; ++w) sum += sm->red[w][i];
    y[size_t(blockIdx.x) * TILE + i] = sum;
  }
}

__global__ void repack_kernel(const uint8_t* wq, const uint16_t* sc, const uint16_t* ze, uint8_t* out) {
  mk::repack_stage(wq, sc, ze, TILE, 0, blockIdx.x, out + size_t(blockIdx.x) * sizeof(Stage));
}

// What a version's sums are checked against: nothing (a probe whose sums
// are not the GEMV's), the spec's dequant (w rounded to bf16 as bf16
// arithmetic rounds it), or the unrounded dequant (q - z) s.
enum Check { kUnchecked, kSpecDequant, kUnroundedDequant };
struct Case {
  const char* name;
  void (*kernel)(const uint8_t*, const float*, int, float*, unsigned long long*);
  Check check;
  int warps_a_stage;  // the version runs where the consumer warps are whole groups of these
};
template <int V>
Case version_case(const char* name, Check check) {
  return {name, rate_kernel<V>, check, warps_per_stage(V)};
}

}  // namespace study

int main(int argc, char** argv) {
  using namespace study;
  using namespace ktune;
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
  std::mt19937 rng(20261202);
  // A tile's K x 128 weights in the spec's layout, its scales and zeros, x.
  const Stack tile(1, K, TILE, rng);
  std::vector<float> x(K);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  // The references: w = bf16(bf16(q - z) * s) (Stack::w), and (v11) w = (q - z) s; x as its hi + lo parts.
  std::vector<double> want(TILE, 0.0), want_unrounded(TILE, 0.0), scale_of(TILE, 0.0);
  for (int k = 0; k < K; ++k) {
    const double hi = round_bf16f(x[k]), xk = hi + round_bf16f(x[k] - float(hi));
    for (int n = 0; n < TILE; ++n) {
      const uint8_t b = tile.q[size_t(k / 2) * TILE + n];
      const int q = k % 2 ? b >> 4 : b & 15;
      const size_t gi = size_t(k / mk::G) * TILE + n;
      const double w = tile.w(0, K, TILE, k, n);
      want[n] += w * xk;
      want_unrounded[n] += (q - double(bf16_to_float(tile.z[gi]))) * double(bf16_to_float(tile.s[gi])) * xk;
      scale_of[n] += std::fabs(w * xk);
    }
  }
  const int sms = sms_at_least(1, "consumer_rate", "a block an SM");
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  uint8_t* d_wq = to_device(tile.q);
  uint16_t *d_sc = to_device(tile.s), *d_ze = to_device(tile.z);
  float* d_x = to_device(x);
  uint8_t* d_stages;
  float* d_y;
  unsigned long long* d_times;
  CHECK(cudaMalloc(&d_stages, size_t(STAGES) * sizeof(Stage)));
  CHECK(cudaMalloc(&d_y, size_t(sms) * TILE * 4));
  CHECK(cudaMalloc(&d_times, size_t(sms) * 2 * 8));
  repack_kernel<<<STAGES, 256>>>(d_wq, d_sc, d_ze, d_stages);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  const Case cases[] = {version_case<kMegakernel>("v1 megakernel consume_stages", kSpecDequant),
                        version_case<kCopy>("v2 copy", kSpecDequant),
                        version_case<kQ4>("v3 Q4", kSpecDequant),
                        version_case<kQ8>("v4 Q8", kSpecDequant),
                        version_case<kNoMbar>("v5 no mbarriers", kSpecDequant),
                        version_case<kNoDequant>("v6 no dequant arithmetic", kUnchecked),
                        version_case<kQ1>("v7 Q1", kSpecDequant),
                        version_case<kMulHi1>("v8 mulhi 1 shift", kSpecDequant),
                        version_case<kMulHi3>("v9 mulhi 3 shifts", kSpecDequant),
                        version_case<kAhead>("v10 next stage read ahead", kSpecDequant),
                        version_case<kFolded>("v11 dequant folded", kUnroundedDequant)};
  const size_t smem = sizeof(Smem);
  std::printf("consumer_rate: %d consumer warps (KT_THREADS %d), ring %d stages of %zu bytes, %d rounds, %d blocks, "
              "SM clock %.0f MHz (nominal)\n",
              WARPS, THREADS, STAGES, sizeof(Stage), rounds, sms, clock_khz / 1e3);
  std::printf("%-32s %10s %10s %10s %12s %8s\n", "version", "cyc/stage", "ns/stage", "GB/s/blk", "TB/s (grid)",
              "check");
  int failed = 0;
  for (const Case& cs : cases) {
    if (!asked_for(cs.name, argc, argv, 2)) continue;
    if (WARPS % cs.warps_a_stage != 0) {
      std::printf("%-32s skipped: %d warps a stage do not divide %d consumer warps\n", cs.name, cs.warps_a_stage, WARPS);
      continue;
    }
    CHECK(cudaFuncSetAttribute(cs.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaMemset(d_y, 0xff, size_t(sms) * TILE * 4));  // poisoned: NaN until written
    cs.kernel<<<sms, KT_BLOCK_THREADS, smem>>>(d_stages, d_x, 1, d_y, d_times);  // warm-up, and the checked run
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> y(size_t(sms) * TILE);
    CHECK(cudaMemcpy(y.data(), d_y, y.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int b = 0; b < sms; ++b)
      for (int n = 0; n < TILE; ++n) {
        const double ref = cs.check == kUnroundedDequant ? want_unrounded[n] : want[n];
        const double d = std::fabs(double(y[size_t(b) * TILE + n]) - ref) / (scale_of[n] + 1e-30);
        worst = std::isfinite(d) ? std::max(worst, d) : 1e30;
      }
    const bool ok = worst < 1e-5;
    cs.kernel<<<sms, KT_BLOCK_THREADS, smem>>>(d_stages, d_x, rounds, d_y, d_times);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned long long> times(size_t(sms) * 2);
    CHECK(cudaMemcpy(times.data(), d_times, times.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<double> cyc, ns;
    for (int b = 0; b < sms; ++b) {
      cyc.push_back(double(times[2 * b]) / (double(rounds) * STAGES));
      ns.push_back(double(times[2 * b + 1]) / (double(rounds) * STAGES));
    }
    std::sort(cyc.begin(), cyc.end());
    std::sort(ns.begin(), ns.end());
    const double c_med = cyc[cyc.size() / 2], ns_med = ns[ns.size() / 2];
    const double gbs = sizeof(Stage) / ns_med;
    char check[32];
    if (cs.check != kUnchecked) std::snprintf(check, sizeof check, "%s %.1e", ok ? "ok" : "FAIL", worst);
    else std::snprintf(check, sizeof check, "-");
    std::printf("%-32s %10.1f %10.1f %10.1f %12.2f %8s  (blocks' ns/stage %.1f..%.1f)\n", cs.name, c_med, ns_med, gbs,
                gbs * sms / 1e3, check, ns.front(), ns.back());
    if (cs.check != kUnchecked && !ok) ++failed;
  }
  return failed ? 1 : 0;
}
