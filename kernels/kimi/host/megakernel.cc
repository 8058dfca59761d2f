// Kimi-Linear decode step on the CPU as a "megakernel": ONE parallel region
// (rt->parallel) runs the whole step, its threads splitting each phase's
// work and meeting at a barrier between dependent phases, as the CUDA
// megakernel's blocks meet at grid barriers. It is the host backend's fast
// template; the baseline (baseline.cc) computes the same function with one
// region per operation. Shared numerics are in host_common.h.
//
// Phases of a step (| = barrier):
//   K layer: norm + q,k,v,g projections with conv/SiLU/decay epilogues, beta
//            | delta rule per (head, 32 value columns) | o_proj + residual |
//   M layer: norm + q, kv_a projections with RoPE and cache append
//            (exact form: + kv_b dequantized to floats)
//            | (absorbed form: q_abs = W_UK q_nope |)
//            attention over the cache in row chunks (softmax partials)
//            | combine partials (absorbed: + o = W_UV^T o_lat) | o_proj + residual |
//   MoE:     norm + router logits + shared experts' gate/up
//            | top-k (each thread alike) + routed experts' gate/up
//            | down projections, weighted sum, residual |
// Within a phase, threads claim work units (GEMV column tiles, KDA column
// blocks, row chunks) from an atomic counter, so a slow or descheduled
// thread does not hold the others back; each unit's result does not depend
// on which thread ran it, so the output is deterministic.
//
// Knobs (kernels/kimi/templates.cc host_mega_space):
//   KT_THREADS  threads in the region (capped by rt->max_threads)
//   KT_TILE     output columns per GEMV work unit
//   KT_BARRIER  0: atomic spin barrier (pause, then yield), 1: mutex + condvar
//   KT_DEQUANT  0: 16-entry table per (group, column), 1: arithmetic per weight
//   KT_MLA      0: exact (every cached row expanded through kv_b), 1: absorbed
//   KT_UNROLL   row pairs per inner GEMV step
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>

#include "kernels/kimi/host/host_common.h"
#include "kernels/kimi/host/runtime.h"
#include "kernels/kimi/topk.h"

namespace mk {

using namespace kth;

constexpr int kMaxThreads = 8;  // the largest KT_THREADS value
constexpr int TILE = KT_TILE, DEQUANT = KT_DEQUANT, UNROLL = KT_UNROLL;
constexpr bool kAbsorbed = KT_MLA == 1;
constexpr int VD = kAbsorbed ? R : VH;  // width of an attention partial's value sum
constexpr int PART = 2 + VD;            // floats per (chunk, head) softmax partial
constexpr int kMaxChunks = 4 * kMaxThreads;
constexpr int kMaxPhases = 8 * LAYERS;
constexpr int kRouterRows = 8;   // router experts per work unit
constexpr int kRowsPerUnit = 16;  // kv_b rows per dequant / q_abs work unit
static_assert(TILE % kBlock == 0 && KT_THREADS <= kMaxThreads, "knobs");
static_assert(R % kRowsPerUnit == 0, "kv_b row units");

// ---- barriers ------------------------------------------------------------------------
// Both count arrivals against the thread count given per call and release
// everyone when the last one arrives; a generation number tells waiters that
// their barrier (not a later one) has opened.

// An atomic counter; waiters spin with a pause hint, then yield, so that
// more threads than cores still make progress.
struct SpinBarrier {
  std::atomic<int> arrived{0};
  std::atomic<int> generation{0};

  void wait(int n) {
    int gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.store(gen + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins < 256) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }
};

// Sleeps in the kernel (futex) until the last thread arrives.
struct BlockingBarrier {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  long generation = 0;

  void wait(int n) {
    std::unique_lock<std::mutex> lock(mu);
    long gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen; });
  }
};

#if KT_BARRIER == 0
using Barrier = SpinBarrier;
#else
using Barrier = BlockingBarrier;
#endif

// ---- scratch ---------------------------------------------------------------------------
// One thread's private working memory (each thread computes its own copy
// of cheap shared inputs, such as the RMSNorm, instead of waiting for one).
struct ThreadArea {
  float token[D];        // layer 0's input, converted from x_in
  float xn[D];           // RMSNorm of the layer input, then of h
  float acc[2][TILE];    // GEMV tile accumulators (an expert's gate and up)
  float work[TILE * 16];  // the current group's dequant table / scales and zeros
  float rows[kRowBlock * (kAbsorbed ? 1 : KVB)];  // cached rows expanded through kv_b
  float cbuf[kRowBlock * R];                      // cached latent rows as floats
  float scores[MH * kRowBlock];
  float o_lat[R > VH ? R : VH];  // a head's combined attention output
  ktune::kimi::topk_detail::Item items[E];
  int route[TOPK];
  float route_w[TOPK];
  char pad[64];  // keeps neighbouring threads' areas off each other's cache lines
};

struct Scratch {
  alignas(Barrier) unsigned char barrier[sizeof(Barrier)];  // constructed per step
  std::atomic<int> next_unit[kMaxPhases];  // per phase: the next unclaimed work unit
  float x[D];  // the layer input (bf16 values), written by the previous layer's MoE
  float h[D];  // x + attention
  float act[3][C], decay[C], beta[KH], kda_o[C];  // KDA
  float mla_q[QDIM];                               // per head [nope | roped rope]
  float q_abs[kAbsorbed ? MH * R : 1];
  float wkvb[kAbsorbed ? 1 : R * KVB];  // kv_b dequantized in panels, for the exact form
  float mla_o[MO];
  float part[kMaxChunks * MH * PART];  // attention partials [chunk][head][PART]
  float logits[E];
  float moe_act[SLOTS * I];  // silu(gate) * up per expert slot (routed, then shared)
  ThreadArea thread[kMaxThreads];
};

struct Region {
  const KimiDeviceArgs* args;
  Scratch* scratch;
  Barrier* barrier;
};

struct Tile {
  int n0, ncols;
};

inline int tiles(int n) { return (n + TILE - 1) / TILE; }
inline Tile tile(int n, int u) { return Tile{u * TILE, n - u * TILE < TILE ? n - u * TILE : TILE}; }

// q_abs[h][r] = sum_d W_UK[r, h, d] q_nope[h][d] for kv_b rows [r0, r1):
// the query absorbed into the latent space, so scores need no expansion.
inline void absorb_query_rows(const W4& wb, const float* q, int r0, int r1, float* q_abs) {
  for (int r = r0; r < r1; r += 2) {
    const uint8_t* row = wb.q + size_t(r / 2) * KVB;
    const uint16_t* sc = wb.scale + size_t(r / G) * KVB;
    const uint16_t* zr = wb.zero + size_t(r / G) * KVB;
    for (int h = 0; h < MH; ++h) {
      const float* qn = q + h * QH;
      float even[kBlock] = {}, odd[kBlock] = {};
      for (int d = 0; d < NOPE; d += kBlock) {
        const int n = h * HD + d;
        for (int c = 0; c < kBlock; ++c) {
          float s = bf16_to_float(sc[n + c]), z = bf16_to_float(zr[n + c]);
          even[c] += w4_value(row[n + c] & 15, z, s) * qn[d + c];
          odd[c] += w4_value(row[n + c] >> 4, z, s) * qn[d + c];
        }
      }
      float se = 0, so = 0;
      for (int c = 0; c < kBlock; ++c) {
        se += even[c];
        so += odd[c];
      }
      q_abs[h * R + r] = se;
      q_abs[h * R + r + 1] = so;
    }
  }
}

// One thread's walk through the step.
class Worker {
 public:
  Worker(const Region& g, int t, int nt)
      : a_(*g.args), s_(*g.scratch), bar_(*g.barrier), me_(g.scratch->thread[t]), t_(t), nt_(nt) {}

  void run() {
    bf16_to_floats(a_.x_in, D, me_.token);
    for (int layer = 0; layer < LAYERS; ++layer) {
      const KtLayer& ly = a_.layers[layer];
      const float* x = layer == 0 ? me_.token : s_.x;
      if (is_mla_layer(layer)) mla_layer(ly, x);
      else kda_layer(ly, x);
      // o is complete (o_proj's barrier) and stays until the next layer's attention.
      if (t_ == 0) report_attn_out(a_, layer, is_mla_layer(layer) ? s_.mla_o : s_.kda_o);
      moe(ly, layer);
    }
  }

 private:
  // Runs fn(u) for the units of this phase that this thread claims.
  template <class Fn>
  void each_unit(int units, const Fn& fn) {
    std::atomic<int>& next = s_.next_unit[phase_];
    for (int u = next.fetch_add(1, std::memory_order_relaxed); u < units;
         u = next.fetch_add(1, std::memory_order_relaxed))
      fn(u);
  }

  void barrier() {
    bar_.wait(nt_);
    ++phase_;
  }

  // acc[0, ncols) = x @ w[:, tile].
  void gemv(const W4& w, const float* x, Tile tl, float* acc) {
    memset(acc, 0, sizeof(float) * tl.ncols);
    w4_gemv_tile<TILE, DEQUANT, UNROLL>(w, x, tl.n0, tl.ncols, acc, me_.work);
  }

  // h = bf16(x + bf16(in @ w)), by column tiles of the output.
  void out_proj_residual(const W4& w, const float* in, const float* x) {
    each_unit(tiles(D), [&](int u) {
      Tile tl = tile(D, u);
      gemv(w, in, tl, me_.acc[0]);
      for (int c = 0; c < tl.ncols; ++c) s_.h[tl.n0 + c] = round_bf16(x[tl.n0 + c] + round_bf16(me_.acc[0][c]));
    });
    barrier();
  }

  void kda_layer(const KtLayer& ly, const float* x) {
    const KtKdaLayer& k = ly.kda;
    rms_norm(x, ly.attn_norm, D, me_.xn);
    // Projections; the epilogue of a q/k/v tile runs the conv (its columns'
    // windows only), of a g tile the decay. The last unit is beta.
    const W4 proj[4] = {w4(k.q, D, C), w4(k.k, D, C), w4(k.v, D, C), w4(k.g, D, C)};
    const int per = tiles(C);
    each_unit(4 * per + 1, [&](int u) {
      if (u == 4 * per) {
        for (int h = 0; h < KH; ++h) s_.beta[h] = sigmoid(round_bf16(dot_bf16(me_.xn, k.beta + size_t(h) * D, D)));
        return;
      }
      const int m = u / per;
      Tile tl = tile(C, u % per);
      gemv(proj[m], me_.xn, tl, me_.acc[0]);
      for (int c = 0; c < tl.ncols; ++c) {
        const int j = tl.n0 + c;
        float raw = round_bf16(me_.acc[0][c]);
        if (m < 3) s_.act[m][j] = conv_silu_shift(k.win[m], k.conv_w + size_t(m) * C * 4, j, raw);
        else s_.decay[j] = kda_decay(raw);
      }
    });
    barrier();
    constexpr int blocks = KD / kKdaCols;
    each_unit(KH * blocks, [&](int u) {
      const int h = u / blocks, off = h * KD;
      kda_update_columns(k.S + size_t(h) * KD * KD, s_.act[0] + off, s_.act[1] + off, s_.act[2] + off,
                         s_.decay + off, s_.beta[h], (u % blocks) * kKdaCols, s_.kda_o + off);
    });
    barrier();
    out_proj_residual(w4(k.o, C, D), s_.kda_o, x);
  }

  void mla_layer(const KtLayer& ly, const float* x) {
    const KtMlaLayer& m = ly.mla;
    const int pos = a_.context, rows = pos + 1;
    const W4 wq = w4(m.q, D, QDIM), wa = w4(m.kv_a, D, KVA), wb = w4(m.kv_b, R, KVB);
    rms_norm(x, ly.attn_norm, D, me_.xn);
    // q and kv_a with RoPE in the epilogue (tiles are multiples of 16
    // columns, so rope pairs never straddle two), the new cache row
    // appended; in the exact form also kv_b dequantized for the expansion.
    const int qt = tiles(QDIM), at = tiles(KVA), bt = kAbsorbed ? 0 : R / kRowsPerUnit;
    each_unit(qt + at + bt, [&](int u) {
      if (u < qt) {
        Tile tl = tile(QDIM, u);
        gemv(wq, me_.xn, tl, me_.acc[0]);
        float* q = s_.mla_q;
        for (int c = 0; c < tl.ncols; ++c) q[tl.n0 + c] = round_bf16(me_.acc[0][c]);
        for (int n = tl.n0; n < tl.n0 + tl.ncols; n += 2)
          if (n % QH >= NOPE) rope_pair(&q[n], &q[n + 1], pos, (n % QH - NOPE) / 2);
      } else if (u < qt + at) {
        Tile tl = tile(KVA, u - qt);
        float* kv = me_.acc[0];
        gemv(wa, me_.xn, tl, kv);
        for (int c = 0; c < tl.ncols; ++c) kv[c] = round_bf16(kv[c]);
        for (int c = 0; c < tl.ncols; c += 2) {
          const int n = tl.n0 + c;
          if (n >= R) {
            rope_pair(&kv[c], &kv[c + 1], pos, (n - R) / 2);
            m.k_rope[size_t(pos) * ROPE + n - R] = float_to_bf16(kv[c]);
            m.k_rope[size_t(pos) * ROPE + n - R + 1] = float_to_bf16(kv[c + 1]);
          } else {
            m.c_kv[size_t(pos) * R + n] = float_to_bf16(kv[c]);
            m.c_kv[size_t(pos) * R + n + 1] = float_to_bf16(kv[c + 1]);
          }
        }
      } else {
        const int r0 = (u - qt - at) * kRowsPerUnit;
        w4_dequant_panels(wb, r0, r0 + kRowsPerUnit, s_.wkvb);
      }
    });
    barrier();
    if (kAbsorbed) {
      each_unit(R / kRowsPerUnit, [&](int u) {
        absorb_query_rows(wb, s_.mla_q, u * kRowsPerUnit, (u + 1) * kRowsPerUnit, s_.q_abs);
      });
      barrier();
    }
    // Attention in chunks of whole row blocks, each into its own partials.
    int chunks = (rows + kRowBlock - 1) / kRowBlock;
    if (chunks > 4 * nt_) chunks = 4 * nt_;
    each_unit(chunks, [&](int c) {
      int t0, t1;
      split_range(rows, c, chunks, kRowBlock, &t0, &t1);
      float* part = s_.part + size_t(c) * MH * PART;
      if (kAbsorbed) absorbed_chunk(m, t0, t1, part);
      else mla_exact_chunk(s_.wkvb, m.c_kv, m.k_rope, s_.mla_q, t0, t1, me_.rows, me_.cbuf, me_.scores, part);
    });
    barrier();
    if (kAbsorbed) {
      // Each unit merges its head's partials into o_lat (cheap, so every
      // unit does it) and applies its tile of W_UV^T.
      const int vt = tiles(VH);
      each_unit(MH * vt, [&](int u) {
        const int h = u / vt;
        Tile tl = tile(VH, u % vt);
        softmax_combine(s_.part + h * PART, chunks, size_t(MH) * PART, R, me_.o_lat);
        gemv(wb, me_.o_lat, Tile{h * HD + NOPE + tl.n0, tl.ncols}, me_.acc[0]);
        for (int c = 0; c < tl.ncols; ++c) s_.mla_o[h * VH + tl.n0 + c] = round_bf16(me_.acc[0][c]);
      });
    } else {
      each_unit(MH, [&](int h) {
        softmax_combine(s_.part + h * PART, chunks, size_t(MH) * PART, VH, me_.o_lat);
        for (int d = 0; d < VH; ++d) s_.mla_o[h * VH + d] = round_bf16(me_.o_lat[d]);
      });
    }
    barrier();
    out_proj_residual(w4(m.o, MO, D), s_.mla_o, x);
  }

  // Absorbed attention over cached rows [t0, t1): scores against the
  // latent rows directly, values are the latent rows (W_UV comes after).
  void absorbed_chunk(const KtMlaLayer& m, int t0, int t1, float* part) {
    for (int h = 0; h < MH; ++h) softmax_init(part + h * PART, R);
    for (int tb = t0; tb < t1; tb += kRowBlock) {
      const int nb = t1 - tb < kRowBlock ? t1 - tb : kRowBlock;
      load_latent_rows(m.c_kv, tb, nb, me_.cbuf);
      for (int h = 0; h < MH; ++h) {
        const float* qr = s_.mla_q + h * QH + NOPE;
        for (int b = 0; b < nb; ++b) {
          float sc = dot_f32(s_.q_abs + h * R, me_.cbuf + b * R, R) +
                     dot_bf16(qr, m.k_rope + size_t(tb + b) * ROPE, ROPE);
          me_.scores[h * kRowBlock + b] = sc * qk_scale();
        }
        softmax_fold(part + h * PART, R, me_.scores + h * kRowBlock, nb, me_.cbuf, R);
      }
    }
  }

  // silu(x @ gate) * (x @ up) for one tile of an expert, in fp32.
  void expert_gate_up(const W4& gate, const W4& up, Tile tl, int slot) {
    gemv(gate, me_.xn, tl, me_.acc[0]);
    gemv(up, me_.xn, tl, me_.acc[1]);
    float* out = s_.moe_act + size_t(slot) * I + tl.n0;
    for (int c = 0; c < tl.ncols; ++c) out[c] = silu(me_.acc[0][c]) * me_.acc[1][c];
  }

  void moe(const KtLayer& ly, int layer) {
    const KtMoeLayer& w = ly.moe;
    rms_norm(s_.h, ly.moe_norm, D, me_.xn);
    // Router logits (need every expert before top-k) next to the shared
    // experts' gate/up, which do not depend on the routing.
    const int rt = (E + kRouterRows - 1) / kRouterRows, it = tiles(I);
    each_unit(rt + NSH * it, [&](int u) {
      if (u < rt) {
        for (int e = u * kRouterRows; e < E && e < (u + 1) * kRouterRows; ++e)
          s_.logits[e] = round_bf16(dot_bf16(me_.xn, w.router + size_t(e) * D, D));
        return;
      }
      const int sh = (u - rt) / it;
      expert_gate_up(w4_expert(w.s_gate, D, I, sh), w4_expert(w.s_up, D, I, sh), tile(I, (u - rt) % it), TOPK + sh);
    });
    barrier();
    // Every thread routes for itself (E values): no barrier needed.
    moe_route(s_.logits, me_.route, me_.route_w, me_.items);
    if (t_ == 0 && a_.topk_out)
      for (int j = 0; j < TOPK; ++j) a_.topk_out[layer * TOPK + j] = me_.route[j];
    if (t_ == 0) report_logits(a_, layer, s_.logits);
    each_unit(TOPK * it, [&](int u) {
      const int j = u / it, e = me_.route[j];
      expert_gate_up(w4_expert(w.gate, D, I, e), w4_expert(w.up, D, I, e), tile(I, u % it), j);
    });
    barrier();
    // Per output tile: every expert's down projection, weighted, summed in
    // fp32, rounded once; then the residual.
    const bool last = layer == LAYERS - 1;
    each_unit(tiles(D), [&](int u) {
      Tile tl = tile(D, u);
      float* sum = me_.acc[1];
      memset(sum, 0, sizeof(float) * tl.ncols);
      for (int slot = 0; slot < SLOTS; ++slot) {
        const bool routed = slot < TOPK;
        W4 down = routed ? w4_expert(w.down, I, D, me_.route[slot]) : w4_expert(w.s_down, I, D, slot - TOPK);
        const float weight = routed ? me_.route_w[slot] : 1.0f;
        gemv(down, s_.moe_act + size_t(slot) * I, tl, me_.acc[0]);
        for (int c = 0; c < tl.ncols; ++c) sum[c] += weight * me_.acc[0][c];
      }
      for (int c = 0; c < tl.ncols; ++c) {
        const int n = tl.n0 + c;
        float x = round_bf16(s_.h[n] + round_bf16(sum[c]));
        s_.x[n] = x;
        if (last) a_.x_out[n] = float_to_bf16(x);
      }
    });
    if (!last) barrier();  // the region's end joins the threads after the last layer
  }

  const KimiDeviceArgs& a_;
  Scratch& s_;
  Barrier& bar_;
  ThreadArea& me_;
  const int t_, nt_;
  int phase_ = 0;
};

void run_region(void* ctx, int t, int nt) { Worker(*static_cast<const Region*>(ctx), t, nt).run(); }

}  // namespace mk

KTH_EXPORT_ABI(mk::Scratch)

extern "C" int ktune_host_step(const KimiDeviceArgs* a, const KtHostRuntime* rt) {
  using namespace mk;
  if (!a || !rt || !a->scratch || reinterpret_cast<uintptr_t>(a->scratch) % alignof(Scratch) != 0) return 1;
  Scratch* s = reinterpret_cast<Scratch*>(a->scratch);
  int nt = KT_THREADS < rt->max_threads ? KT_THREADS : rt->max_threads;
  if (nt < 1) nt = 1;
  Barrier* bar = new (s->barrier) Barrier();
  for (std::atomic<int>& n : s->next_unit) n.store(0, std::memory_order_relaxed);
  Region region{a, s, bar};
  rt->parallel(rt, &run_region, &region, nt);
  bar->~Barrier();
  return 0;
}
