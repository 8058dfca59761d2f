// Kimi-Linear decode step on the CPU, the way eager PyTorch runs it: one
// parallel region (rt->parallel, the host's "kernel launch") per operation,
// on all of the runner's threads, and every W4A16 weight matrix dequantized
// to bf16 in scratch (materialized) before its GEMV reads it. It is the
// host backend's baseline: the megakernel (megakernel.cc) must beat it, and
// the runner counts its hundreds of regions per step. No knobs. Shared
// numerics are in host_common.h.
#include <stdint.h>

#include "kernels/kimi/host/host_common.h"
#include "kernels/kimi/host/runtime.h"
#include "kernels/kimi/topk.h"

namespace base {

using namespace kth;

constexpr int kMaxThreads = 64;  // threads used at most (scratch holds one area per thread)

constexpr size_t cmax(size_t a, size_t b) { return a > b ? a : b; }
// The largest W4A16 matrix dequantized at once (kv_b goes to its own float
// buffer: the attention reads it for every cached row).
constexpr size_t kMaxMatrix = cmax(cmax(size_t(D) * C, size_t(C) * D),
                                   cmax(cmax(size_t(D) * QDIM, size_t(D) * KVA), cmax(size_t(MO) * D, size_t(D) * I)));

struct ThreadArea {
  float rows[kRowBlock * KVB];
  float cbuf[kRowBlock * R];
  float scores[MH * kRowBlock];
  char pad[64];
};

struct Scratch {
  uint16_t weight[kMaxMatrix];  // the current matrix, dequantized to bf16
  float wkvb[R * KVB];          // kv_b dequantized to floats, in panels of 16 columns
  float x[D], xn[D], h[D], y[D];
  float raw[3][C], act[3][C], graw[C], decay[C], beta[KH], o[C > MO ? C : MO];
  float mla_q[QDIM], kv[KVA];
  float part[kMaxThreads * MH * (2 + VH)];
  float logits[E];
  int route[TOPK];
  float route_w[TOPK];
  ktune::kimi::topk_detail::Item items[E];
  float gate[I], up[I], ffn[I], moe[D];
  ThreadArea thread[kMaxThreads];
};

class Eager {
 public:
  Eager(const KimiDeviceArgs& a, const KtHostRuntime* rt, Scratch& s)
      : a_(a), rt_(rt), s_(s), nt_(rt->max_threads < kMaxThreads ? rt->max_threads : kMaxThreads) {
    if (nt_ < 1) nt_ = 1;
  }

  void step() {
    launch([&](int t, int n) {
      int b, e;
      split_range(D, t, n, kBlock, &b, &e);
      bf16_to_floats(a_.x_in + b, e - b, s_.x + b);
    });
    for (int layer = 0; layer < LAYERS; ++layer) {
      const KtLayer& ly = a_.layers[layer];
      rms_norm_op(s_.x, ly.attn_norm);
      if (is_mla_layer(layer)) mla(ly.mla);
      else kda(ly.kda);
      report_attn_out(a_, layer, s_.o);
      residual_op(s_.x, s_.y, s_.h, nullptr);
      rms_norm_op(s_.h, ly.moe_norm);
      moe(ly.moe, layer);
      residual_op(s_.h, s_.moe, s_.x, layer == LAYERS - 1 ? a_.x_out : nullptr);
    }
  }

 private:
  // One parallel region: fn(thread, threads) on every thread.
  template <class Fn>
  void launch(const Fn& fn) {
    rt_->parallel(
        rt_, [](void* ctx, int t, int n) { (*static_cast<const Fn*>(ctx))(t, n); }, const_cast<Fn*>(&fn), nt_);
  }

  // y = x @ w: the matrix dequantized to bf16 (one region), then the GEMV
  // (another), rounded to bf16 when the spec rounds there.
  void linear(const W4& w, const float* x, float* y, bool round) {
    launch([&](int t, int n) {
      int b, e;
      split_range(w.K, t, n, 2, &b, &e);
      w4_dequant_rows(w, b, e, s_.weight);
    });
    launch([&](int t, int n) {
      int b, e;
      split_range(w.N, t, n, kBlock, &b, &e);
      bf16_gemv_cols(s_.weight, w.K, w.N, x, b, e, y);
      if (round)
        for (int i = b; i < e; ++i) y[i] = round_bf16(y[i]);
    });
  }

  // s_.xn = RMSNorm(x, w); each thread computes the (cheap) inverse RMS.
  void rms_norm_op(const float* x, const uint16_t* w) {
    launch([&](int t, int n) {
      int b, e;
      split_range(D, t, n, kBlock, &b, &e);
      rms_apply(x, w, rms_inverse(x, D), b, e, s_.xn);
    });
  }

  // out = bf16(x + bf16(y)) (y is already bf16 for attention), also as bf16 to `bf`.
  void residual_op(const float* x, const float* y, float* out, uint16_t* bf) {
    launch([&](int t, int n) {
      int b, e;
      split_range(D, t, n, kBlock, &b, &e);
      for (int i = b; i < e; ++i) {
        out[i] = round_bf16(x[i] + round_bf16(y[i]));
        if (bf) bf[i] = float_to_bf16(out[i]);
      }
    });
  }

  void kda(const KtKdaLayer& k) {
    const KtW4* proj[3] = {&k.q, &k.k, &k.v};
    for (int m = 0; m < 3; ++m) {
      linear(w4(*proj[m], D, C), s_.xn, s_.raw[m], true);
      launch([&](int t, int n) {  // short conv + SiLU, window shift
        int b, e;
        split_range(C, t, n, kBlock, &b, &e);
        for (int j = b; j < e; ++j)
          s_.act[m][j] = conv_silu_shift(k.win[m], k.conv_w + size_t(m) * C * 4, j, s_.raw[m][j]);
      });
    }
    linear(w4(k.g, D, C), s_.xn, s_.graw, true);
    launch([&](int t, int n) {
      int b, e;
      split_range(C, t, n, kBlock, &b, &e);
      for (int j = b; j < e; ++j) s_.decay[j] = kda_decay(s_.graw[j]);
    });
    launch([&](int t, int n) {
      int b, e;
      split_range(KH, t, n, 1, &b, &e);
      for (int h = b; h < e; ++h) s_.beta[h] = sigmoid(round_bf16(dot_bf16(s_.xn, k.beta + size_t(h) * D, D)));
    });
    constexpr int blocks = KD / kKdaCols;
    launch([&](int t, int n) {
      int b, e;
      split_range(KH * blocks, t, n, 1, &b, &e);
      for (int u = b; u < e; ++u) {
        const int h = u / blocks, off = h * KD;
        kda_update_columns(k.S + size_t(h) * KD * KD, s_.act[0] + off, s_.act[1] + off, s_.act[2] + off,
                           s_.decay + off, s_.beta[h], (u % blocks) * kKdaCols, s_.o + off);
      }
    });
    linear(w4(k.o, C, D), s_.o, s_.y, true);
  }

  void mla(const KtMlaLayer& m) {
    const int pos = a_.context, rows = pos + 1;
    linear(w4(m.q, D, QDIM), s_.xn, s_.mla_q, true);
    linear(w4(m.kv_a, D, KVA), s_.xn, s_.kv, true);
    launch([&](int t, int n) {  // RoPE of each head's q, and of k_rope with the cache append
      int b, e;
      split_range(MH + 1, t, n, 1, &b, &e);
      for (int h = b; h < e; ++h) {
        float* v = h < MH ? s_.mla_q + h * QH + NOPE : s_.kv + R;
        for (int i = 0; i < ROPE / 2; ++i) rope_pair(&v[2 * i], &v[2 * i + 1], pos, i);
        if (h < MH) continue;
        for (int i = 0; i < R; ++i) m.c_kv[size_t(pos) * R + i] = float_to_bf16(s_.kv[i]);
        for (int i = 0; i < ROPE; ++i) m.k_rope[size_t(pos) * ROPE + i] = float_to_bf16(s_.kv[R + i]);
      }
    });
    const W4 wb = w4(m.kv_b, R, KVB);
    launch([&](int t, int n) {
      int b, e;
      split_range(R, t, n, 2, &b, &e);
      w4_dequant_panels(wb, b, e, s_.wkvb);
    });
    const int chunks = nt_;  // of cached rows, one per thread, each into its own softmax partials
    launch([&](int t, int n) {  // every cached row expanded through kv_b
      ThreadArea& me = s_.thread[t];
      for (int c = t; c < chunks; c += n) {
        int b, e;
        split_range(rows, c, chunks, kRowBlock, &b, &e);
        mla_exact_chunk(s_.wkvb, m.c_kv, m.k_rope, s_.mla_q, b, e, me.rows, me.cbuf, me.scores,
                        s_.part + size_t(c) * MH * (2 + VH));
      }
    });
    launch([&](int t, int n) {
      int b, e;
      split_range(MH, t, n, 1, &b, &e);
      for (int h = b; h < e; ++h) {
        float* o = s_.o + h * VH;
        softmax_combine(s_.part + h * (2 + VH), chunks, size_t(MH) * (2 + VH), VH, o);
        for (int d = 0; d < VH; ++d) o[d] = round_bf16(o[d]);
      }
    });
    linear(w4(m.o, MO, D), s_.o, s_.y, true);
  }

  void moe(const KtMoeLayer& w, int layer) {
    launch([&](int t, int n) {
      int b, e;
      split_range(E, t, n, 1, &b, &e);
      for (int x = b; x < e; ++x) s_.logits[x] = round_bf16(dot_bf16(s_.xn, w.router + size_t(x) * D, D));
    });
    launch([&](int t, int) {
      if (t != 0) return;
      moe_route(s_.logits, s_.route, s_.route_w, s_.items);
      report_logits(a_, layer, s_.logits);
      if (a_.topk_out)
        for (int j = 0; j < TOPK; ++j) a_.topk_out[layer * TOPK + j] = s_.route[j];
    });
    launch([&](int t, int n) {
      int b, e;
      split_range(D, t, n, kBlock, &b, &e);
      for (int i = b; i < e; ++i) s_.moe[i] = 0;
    });
    for (int slot = 0; slot < SLOTS; ++slot) {
      const bool routed = slot < TOPK;
      const int e = routed ? s_.route[slot] : slot - TOPK;
      const float weight = routed ? s_.route_w[slot] : 1.0f;
      // The expert in fp32: no rounding between gate/up, silu * up and down.
      linear(w4_expert(routed ? w.gate : w.s_gate, D, I, e), s_.xn, s_.gate, false);
      linear(w4_expert(routed ? w.up : w.s_up, D, I, e), s_.xn, s_.up, false);
      launch([&](int t, int n) {
        int b, end;
        split_range(I, t, n, kBlock, &b, &end);
        for (int i = b; i < end; ++i) s_.ffn[i] = silu(s_.gate[i]) * s_.up[i];
      });
      linear(w4_expert(routed ? w.down : w.s_down, I, D, e), s_.ffn, s_.y, false);
      launch([&](int t, int n) {
        int b, end;
        split_range(D, t, n, kBlock, &b, &end);
        for (int i = b; i < end; ++i) s_.moe[i] += weight * s_.y[i];
      });
    }
  }

  const KimiDeviceArgs& a_;
  const KtHostRuntime* rt_;
  Scratch& s_;
  int nt_;
};

}  // namespace base

KTH_EXPORT_ABI(base::Scratch)

extern "C" int ktune_host_step(const KimiDeviceArgs* a, const KtHostRuntime* rt) {
  if (!a || !rt || !a->scratch || reinterpret_cast<uintptr_t>(a->scratch) % alignof(base::Scratch) != 0) return 1;
  base::Eager(*a, rt, *reinterpret_cast<base::Scratch*>(a->scratch)).step();
  return 0;
}
