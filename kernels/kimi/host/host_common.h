// Shared pieces of the host (CPU) Kimi kernels: everything the baseline
// (kernels/kimi/host/baseline.cc) and the megakernel (megakernel.cc) compute
// alike lives here, so the two templates differ only in how they schedule
// the work (one parallel region per operation vs one for the whole step).
//
// The numerics follow the oracle (kernels/kimi/oracle.cc) rounding point for
// rounding point: activations are floats holding bf16 values, a W4A16 weight
// is bf16((q - zero) * scale), GEMVs accumulate in fp32, projections are
// rounded to bf16, conv+SiLU is rounded, S stays fp32, o is rounded before
// o_proj, and the MoE experts run in fp32 with only their sum rounded.
//
// Plain C++17 with no ktune library: a rendered variant is compiled on its
// own by g++. The size macros (KT_D, KT_KH, ...) are prepended by the
// renderer. Inner loops run over a fixed block of 16 columns with
// __restrict pointers so that g++ vectorizes them already at -O2.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/topk.h"

namespace kth {

// ---- sizes of the config the variant is rendered for ------------------------
constexpr int D = KT_D;                                      // hidden
constexpr int KH = KT_KH, KD = KT_KD, C = KH * KD;           // KDA heads x head dim
constexpr int MH = KT_MH, R = KT_R, NOPE = KT_NOPE, ROPE = KT_ROPE, VH = KT_VH;
constexpr int QH = NOPE + ROPE;                              // MLA query width per head
constexpr int HD = NOPE + VH;                                // kv_b output width per head
constexpr int QDIM = MH * QH, KVA = R + ROPE, KVB = MH * HD, MO = MH * VH;
constexpr int E = KT_E, TOPK = KT_TOPK, NSH = KT_NSH, I = KT_I, G = KT_G;
constexpr int SLOTS = TOPK + NSH;  // experts evaluated per layer (routed + shared)
constexpr int LAYERS = KT_LAYERS;
constexpr float kEps = float(KT_EPS);
constexpr double kRopeTheta = KT_ROPE_THETA, kScaling = KT_SCALING;

constexpr int kBlock = 16;  // the column block of every vectorized inner loop

// A loop whose speed scales with the vector width (the exact MLA expansion,
// a small dense GEMM: 5x faster with AVX-512 than with the SSE2 that a
// plain -O2 build targets) is compiled once per ISA level; the dynamic
// loader picks the clone the CPU supports. The wider clones may fuse
// multiply-adds, which moves the last bits of an fp32 sum, not a rounding
// point. (The int4 GEMV gains nothing from it: its byte-to-float
// conversions keep g++ at 128-bit vectors even with -march=native.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__AVX512F__)
#define KTH_WIDE_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KTH_WIDE_VECTORS
#endif
static_assert(D % kBlock == 0 && KD % kBlock == 0 && R % kBlock == 0 && NOPE % kBlock == 0 &&
                  ROPE % kBlock == 0 && VH % kBlock == 0 && I % kBlock == 0,
              "every vector length is a multiple of the 16-column block");
static_assert(G % 2 == 0 && D % G == 0 && C % G == 0 && R % G == 0 && MO % G == 0 && I % G == 0,
              "W4A16 inputs are whole groups of rows");
static_assert(LAYERS <= KT_MAX_LAYERS, "layers");

inline bool is_mla_layer(int layer) { return (KT_PATTERN_M >> layer) & 1; }

// The variant's exported description (kernels/kimi/host/runtime.h); the
// template passes the type of its scratch memory.
#define KTH_EXPORT_ABI(ScratchType)                                                               \
  extern "C" {                                                                                    \
  int ktune_abi_version = KT_ABI_VERSION;                                                         \
  int ktune_config[KT_CONFIG_FIELDS] = {KT_D, KT_KH,  KT_KD, KT_MH,  KT_R,  KT_NOPE,   KT_ROPE,    \
                                        KT_VH, KT_E, KT_TOPK, KT_NSH, KT_I, KT_G, KT_LAYERS, \
                                        KT_PATTERN_M};                                            \
  long long ktune_scratch_bytes = (long long)sizeof(ScratchType);                                 \
  }

// ---- scalars ------------------------------------------------------------------
inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, bit for bit base/bf16.h (NaN stays NaN). Written
// branch-free so that loops calling it vectorize.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// The same rounding for values known to be finite (dequantized weights):
// without the NaN test it is five integer ops per SIMD lane.
inline float round_bf16_finite(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

inline float silu(float v) { return v / (1.0f + expf(-v)); }
inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// [b, e) = the t-th of n nearly equal parts of [0, count), each a multiple of
// `align` except possibly the last.
inline void split_range(int count, int t, int n, int align, int* b, int* e) {
  int blocks = (count + align - 1) / align;
  int lo = int((long long)blocks * t / n), hi = int((long long)blocks * (t + 1) / n);
  *b = lo * align < count ? lo * align : count;
  *e = hi * align < count ? hi * align : count;
}

// ---- small vector kernels --------------------------------------------------------
// Dot products keep 16 independent partial sums: a float reduction does not
// vectorize without reassociation, 16 lanes do. n is a multiple of 16.
inline float dot_f32(const float* __restrict a, const float* __restrict b, int n) {
  float lanes[kBlock] = {};
  for (int i = 0; i < n; i += kBlock)
    for (int c = 0; c < kBlock; ++c) lanes[c] += a[i + c] * b[i + c];
  float s = 0;
  for (int c = 0; c < kBlock; ++c) s += lanes[c];
  return s;
}

inline float dot_bf16(const float* __restrict a, const uint16_t* __restrict b, int n) {
  float lanes[kBlock] = {};
  for (int i = 0; i < n; i += kBlock)
    for (int c = 0; c < kBlock; ++c) lanes[c] += a[i + c] * bf16_to_float(b[i + c]);
  float s = 0;
  for (int c = 0; c < kBlock; ++c) s += lanes[c];
  return s;
}

inline void bf16_to_floats(const uint16_t* __restrict in, int n, float* __restrict out) {
  for (int i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

// abi.h's attn_out: layer `layer`'s attention output o (floats holding bf16
// values, MO of them for an MLA layer, C for a KDA one), when the runner
// asks for it.
inline void report_attn_out(const KimiDeviceArgs& a, int layer, const float* o) {
  if (!a.attn_out) return;
  uint16_t* dst = a.attn_out + size_t(layer) * KT_ATTN_OUT_STRIDE(C, MO);
  const int n = is_mla_layer(layer) ? MO : C;
  for (int i = 0; i < n; ++i) dst[i] = float_to_bf16(o[i]);
}

// abi.h's logits_out: layer `layer`'s router logits (E floats holding bf16
// values), when the runner asks for them.
inline void report_logits(const KimiDeviceArgs& a, int layer, const float* logits) {
  if (!a.logits_out) return;
  for (int e = 0; e < E; ++e) a.logits_out[size_t(layer) * E + e] = float_to_bf16(logits[e]);
}

// RMSNorm in two parts so a caller can split the second over threads:
// the inverse RMS of x (bf16 values as floats), then
// out[i] = bf16(x[i] * inv * w[i]) for i in [i0, i1).
inline float rms_inverse(const float* x, int n) {
  return 1.0f / sqrtf(dot_f32(x, x, n) / float(n) + kEps);
}

inline void rms_apply(const float* __restrict x, const uint16_t* __restrict w, float inv, int i0, int i1,
                      float* __restrict out) {
  for (int i = i0; i < i1; ++i) out[i] = round_bf16(x[i] * inv * bf16_to_float(w[i]));
}

inline void rms_norm(const float* x, const uint16_t* w, int n, float* out) {
  rms_apply(x, w, rms_inverse(x, n), 0, n, out);
}

// ---- W4A16 weights -----------------------------------------------------------------
// One W4A16 matrix with its shape: q [K/2, N] bytes (low nibble = even row),
// scales / zeros bf16 [K/G, N].
struct W4 {
  const uint8_t* q;
  const uint16_t* scale;
  const uint16_t* zero;
  int K, N;
};

inline W4 w4(const KtW4& w, int K, int N) { return W4{w.w_q, w.scales, w.zeros, K, N}; }

// Matrix e of a stack of experts.
inline W4 w4_expert(const KtW4& w, int K, int N, int e) {
  size_t bytes = size_t(K / 2) * N, params = size_t(K / G) * N;
  return W4{w.w_q + e * bytes, w.scales + e * params, w.zeros + e * params, K, N};
}

// The exact dequantized weight: q - zero is a small integer (exact in
// float), the product is rounded once to bf16, as bf16 arithmetic does.
inline float w4_value(int q, float zero, float scale) { return round_bf16_finite((float(q) - zero) * scale); }

// Dequantizes rows [k0, k1) (even bounds) of w to bf16 into out[k][n]
// (row-major, N wide), as eager PyTorch materializes a weight.
inline void w4_dequant_rows(const W4& w, int k0, int k1, uint16_t* __restrict out) {
  for (int k = k0; k < k1; k += 2) {
    const uint8_t* __restrict q = w.q + size_t(k / 2) * w.N;
    const uint16_t* __restrict s = w.scale + size_t(k / G) * w.N;
    const uint16_t* __restrict z = w.zero + size_t(k / G) * w.N;
    uint16_t* __restrict even = out + size_t(k) * w.N;
    uint16_t* __restrict odd = even + w.N;
    for (int n = 0; n < w.N; ++n) {
      float sf = bf16_to_float(s[n]), zf = bf16_to_float(z[n]);
      even[n] = float_to_bf16(w4_value(q[n] & 15, zf, sf));
      odd[n] = float_to_bf16(w4_value(q[n] >> 4, zf, sf));
    }
  }
}

// y[n0, n1) = x[0, K) @ W[:, n0:n1) for a dense bf16 matrix W [K, N] (the
// baseline's dequantized weights); n0, n1 multiples of 16. Rows are read
// contiguously over a block of up to 256 columns.
inline void bf16_gemv_cols(const uint16_t* W, int K, int N, const float* x, int n0, int n1, float* y) {
  constexpr int kWidth = 256;
  for (int nb = n0; nb < n1; nb += kWidth) {
    const int width = n1 - nb < kWidth ? n1 - nb : kWidth;
    float acc[kWidth] = {};
    for (int k = 0; k < K; ++k) {
      const uint16_t* row = W + size_t(k) * N + nb;
      const float xk = x[k];
      for (int cb = 0; cb < width; cb += kBlock) {
        const uint16_t* __restrict w = row + cb;
        float* __restrict a = acc + cb;
        for (int c = 0; c < kBlock; ++c) a[c] += xk * bf16_to_float(w[c]);
      }
    }
    for (int c = 0; c < width; ++c) y[nb + c] = acc[c];
  }
}

// One step of the fused W4A16 GEMV: UNROLL row pairs (rows 2u, 2u + 1 of
// q, x) times WIDTH consecutive columns, summed per column into acc.
//   DEQUANT 0: `table` holds a 16-entry table of the exact weights per
//              column; the weights are looked up (a gather: scalar code).
//   DEQUANT 1: `scale`, `zero` hold the column parameters; each weight is
//              (q - zero) * scale rounded to bf16 with integer ops: pure SIMD.
// The UNROLL row pairs are summed per column before touching acc, so
// larger values cut accumulator traffic and give more independent work.
template <int WIDTH, int DEQUANT, int UNROLL>
inline void w4_rows_block(const uint8_t* __restrict q, size_t stride, const float* __restrict x,
                          const float* __restrict table, const float* __restrict scale,
                          const float* __restrict zero, float* __restrict acc) {
  for (int c = 0; c < WIDTH; ++c) {
    float sum = 0;
#pragma GCC unroll 4
    for (int u = 0; u < UNROLL; ++u) {
      unsigned b = q[u * stride + c];
      if (DEQUANT == 0)
        sum += x[2 * u] * table[c * 16 + (b & 15)] + x[2 * u + 1] * table[c * 16 + (b >> 4)];
      else
        sum += x[2 * u] * w4_value(b & 15, zero[c], scale[c]) + x[2 * u + 1] * w4_value(b >> 4, zero[c], scale[c]);
    }
    acc[c] += sum;
  }
}

constexpr int kPrefetchRows = 8;  // row pairs ahead of the GEMV's loads
constexpr int kWideBlock = 64;    // columns per GEMV step where the tile allows

// The fused W4A16 GEMV of the megakernel, for one tile of columns:
// acc[0, ncols) += x[0, K) @ W[:, n0 : n0 + ncols), ncols a multiple of 16
// and at most TILE. Per group of G rows the tile's dequant parameters are
// prepared in `work` (TILE * 16 floats), then the group's rows stream by in
// steps of UNROLL row pairs, each step sweeping the tile's contiguous bytes
// in blocks of 64 columns (16 for the rest): g++ sizes its vectors by the
// byte loads, so only 64 bytes at a time fill 256- or 512-bit registers
// with floats when the build targets AVX2 or AVX-512.
template <int TILE, int DEQUANT, int UNROLL>
inline void w4_gemv_tile(const W4& w, const float* __restrict x, int n0, int ncols, float* __restrict acc,
                         float* __restrict work) {
  static_assert((G / 2) % UNROLL == 0, "UNROLL row pairs divide a group");
  const size_t stride = size_t(w.N);
  float* __restrict scale = work;  // DEQUANT 1: [TILE] scales, then [TILE] zeros
  float* __restrict zero = work + TILE;
  const int wide = ncols / kWideBlock * kWideBlock;
  for (int g = 0; g < w.K / G; ++g) {
    const uint16_t* sc = w.scale + size_t(g) * w.N + n0;
    const uint16_t* zr = w.zero + size_t(g) * w.N + n0;
    if (DEQUANT == 0) {
      for (int c = 0; c < ncols; ++c) {
        float s = bf16_to_float(sc[c]), z = bf16_to_float(zr[c]);
        for (int v = 0; v < 16; ++v) work[c * 16 + v] = w4_value(v, z, s);
      }
    } else {
      for (int c = 0; c < ncols; ++c) {
        scale[c] = bf16_to_float(sc[c]);
        zero[c] = bf16_to_float(zr[c]);
      }
    }
    for (int rp = g * G / 2; rp < (g + 1) * G / 2; rp += UNROLL) {
      const uint8_t* row = w.q + size_t(rp) * stride + n0;
      const float* xr = x + 2 * rp;
      // A tile's rows are N bytes apart, and weights are rarely aligned to
      // cache lines (tensors packed in a file), so a tile row often ends in
      // a line it shares with the next tile. The hardware prefetchers
      // serve such sparse rows badly; fetch every line of the rows
      // kPrefetchRows ahead, the last one included.
      if (rp + UNROLL + kPrefetchRows <= w.K / 2)
        for (int u = 0; u < UNROLL; ++u) {
          const uint8_t* ahead = row + (kPrefetchRows + u) * stride;
          for (int cb = 0; cb < ncols; cb += 64) __builtin_prefetch(ahead + cb);
          __builtin_prefetch(ahead + ncols - 1);
        }
      int cb = 0;
      for (; cb < wide; cb += kWideBlock)
        w4_rows_block<kWideBlock, DEQUANT, UNROLL>(row + cb, stride, xr, work + cb * 16, scale + cb, zero + cb,
                                                   acc + cb);
      for (; cb < ncols; cb += kBlock)
        w4_rows_block<kBlock, DEQUANT, UNROLL>(row + cb, stride, xr, work + cb * 16, scale + cb, zero + cb,
                                               acc + cb);
    }
  }
}

// ---- KDA ---------------------------------------------------------------------------
// The short causal conv of column j of one projection: three kept raw rows
// (oldest first) and the new raw value, SiLU, rounded to bf16. The window
// then drops its oldest row and keeps the new raw value. Columns are
// independent, so any tile of columns can do this in its GEMV epilogue.
// conv_w is this projection's [C, 4] slice.
inline float conv_silu_shift(uint16_t* win, const uint16_t* conv_w, int j, float raw) {
  const uint16_t* cw = conv_w + size_t(j) * 4;
  float sum = 0;
  for (int t = 0; t < 3; ++t) sum += bf16_to_float(win[size_t(t) * C + j]) * bf16_to_float(cw[t]);
  sum += raw * bf16_to_float(cw[3]);
  win[j] = win[size_t(C) + j];
  win[size_t(C) + j] = win[size_t(2) * C + j];
  win[size_t(2) * C + j] = float_to_bf16(raw);
  return round_bf16(silu(sum));
}

// The per-key decay exp(-softplus(g)) = 1 / (1 + e^g) of a bf16 g_proj output.
inline float kda_decay(float g) { return 1.0f / (1.0f + expf(g)); }

constexpr int kKdaCols = 32;  // value columns of one KDA work unit
static_assert(KD % kKdaCols == 0, "KDA column blocks");

// The gated delta rule of one head, on value columns [j0, j0 + 32) of its
// S [KD (key i), KD (value j)] (columns are independent):
//   S = S * dec[i];  pred[j] = sum_i S[i,j] k[i];  S += beta k[i] (v[j] - pred[j])
//   o[j] = bf16(sum_i S[i,j] q[i] / sqrt(KD))  from the updated S.
// q, k, v are the head's conv outputs (bf16 values), dec its decays.
inline void kda_update_columns(float* S, const float* q, const float* k, const float* v, const float* dec,
                               float beta, int j0, float* o) {
  const float qscale = 1.0f / sqrtf(float(KD));
  float pred[kKdaCols] = {}, delta[kKdaCols], out[kKdaCols] = {};
  for (int i = 0; i < KD; ++i) {
    const float* __restrict row = S + size_t(i) * KD + j0;
    float dk = dec[i] * k[i];
    for (int j = 0; j < kKdaCols; ++j) pred[j] += row[j] * dk;
  }
  for (int j = 0; j < kKdaCols; ++j) delta[j] = beta * (v[j0 + j] - pred[j]);
  for (int i = 0; i < KD; ++i) {
    float* __restrict row = S + size_t(i) * KD + j0;
    float di = dec[i], ki = k[i], qi = q[i] * qscale;
    for (int j = 0; j < kKdaCols; ++j) {
      float s = row[j] * di + ki * delta[j];
      row[j] = s;
      out[j] += s * qi;
    }
  }
  for (int j = 0; j < kKdaCols; ++j) o[j0 + j] = round_bf16(out[j]);
}

// ---- MLA ---------------------------------------------------------------------------
// Rotates pair i of a rope section of width ROPE at position `pos`, result
// rounded to bf16. The angle is computed in double, as the oracle does:
// at long contexts an fp32 angle would drift by 1e-3 rad.
inline void rope_pair(float* x0, float* x1, int pos, int i) {
  double a = double(pos) * pow(kRopeTheta, -2.0 * i / ROPE);
  float c = float(cos(a)), s = float(sin(a));
  float a0 = *x0, a1 = *x1;
  *x0 = round_bf16(a0 * c - a1 * s);
  *x1 = round_bf16(a1 * c + a0 * s);
}

// Attention scores are scaled by 1 / sqrt(qk_nope + qk_rope).
inline float qk_scale() { return 1.0f / sqrtf(float(QH)); }

// A running softmax over a range of cached rows for one head: the largest
// score m, the sum l of exp(score - m) and acc = sum exp(score - m) * value.
// Stored per (chunk of rows, head) as [m, l, acc...].
inline void softmax_init(float* part, int vd) {
  part[0] = -INFINITY;
  part[1] = 0;
  for (int d = 0; d < vd; ++d) part[2 + d] = 0;
}

// Folds nb scores and their value rows (vals + b * vstride) into a partial.
inline void softmax_fold(float* part, int vd, const float* scores, int nb, const float* vals, size_t vstride) {
  float m = part[0];
  for (int b = 0; b < nb; ++b) m = scores[b] > m ? scores[b] : m;
  float corr = expf(part[0] - m);  // 0 while the partial is empty (m was -inf)
  float* __restrict acc = part + 2;
  float l = part[1] * corr;
  for (int d = 0; d < vd; ++d) acc[d] *= corr;
  for (int b = 0; b < nb; ++b) {
    float p = expf(scores[b] - m);
    const float* __restrict v = vals + b * vstride;
    l += p;
    for (int d = 0; d < vd; ++d) acc[d] += p * v[d];
  }
  part[0] = m;
  part[1] = l;
}

// Merges one head's partials of `chunks` chunks (consecutive chunks
// `stride` floats apart) into out[vd] = acc / l.
inline void softmax_combine(const float* part, int chunks, size_t stride, int vd, float* out) {
  float m = -INFINITY;
  for (int c = 0; c < chunks; ++c) m = part[c * stride] > m ? part[c * stride] : m;
  float l = 0;
  for (int d = 0; d < vd; ++d) out[d] = 0;
  for (int c = 0; c < chunks; ++c) {
    const float* p = part + c * stride;
    if (p[1] == 0) continue;
    float corr = expf(p[0] - m);
    l += p[1] * corr;
    for (int d = 0; d < vd; ++d) out[d] += p[2 + d] * corr;
  }
  for (int d = 0; d < vd; ++d) out[d] /= l;
}

constexpr int kRowBlock = 8;  // cached rows expanded through kv_b together (weight reuse)

// kv_b rows [k0, k1) (even bounds) dequantized to floats in panels of 16
// columns: out[(n / 16) * R * 16 + k * 16 + n % 16]. The expansion walks a
// panel's rows contiguously; walking kv_b's own rows down a column block
// would stride by KVB floats (heads x 1 KB), which maps the rows onto a
// few L1 sets that then evict each other.
inline void w4_dequant_panels(const W4& w, int k0, int k1, float* __restrict out) {
  for (int k = k0; k < k1; k += 2) {
    const uint8_t* __restrict q = w.q + size_t(k / 2) * w.N;
    const uint16_t* __restrict s = w.scale + size_t(k / G) * w.N;
    const uint16_t* __restrict z = w.zero + size_t(k / G) * w.N;
    for (int nb = 0; nb < w.N; nb += kBlock) {
      float* __restrict even = out + size_t(nb) * w.K + size_t(k) * kBlock;
      float* __restrict odd = even + kBlock;
      for (int c = 0; c < kBlock; ++c) {
        float sf = bf16_to_float(s[nb + c]), zf = bf16_to_float(z[nb + c]);
        even[c] = w4_value(q[nb + c] & 15, zf, sf);
        odd[c] = w4_value(q[nb + c] >> 4, zf, sf);
      }
    }
  }
}

// Latent rows [t0, t0 + nb) as floats, transposed: cT[r * kRowBlock + b];
// rows past nb are zero.
inline void load_latent_rows_t(const uint16_t* c_kv, int t0, int nb, float* __restrict cT) {
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < kRowBlock; ++b)
      cT[r * kRowBlock + b] = b < nb ? bf16_to_float(c_kv[size_t(t0 + b) * R + r]) : 0.0f;
}

// out[b][n] = bf16(sum_r cT[r][b] * W[r][n]) for the kRowBlock latent rows
// of cT and W = kv_b in panels (w4_dequant_panels). One weight load feeds
// all rows of the block; a panel's kRowBlock x 16 accumulators stay in
// registers over the whole r loop.
KTH_WIDE_VECTORS inline void mla_expand_rows(const float* panels, const float* __restrict cT, float* out) {
  for (int nb = 0; nb < KVB; nb += kBlock) {
    const float* panel = panels + size_t(nb) * R;
    float acc[kRowBlock][kBlock] = {};
    for (int r = 0; r < R; ++r) {
      const float* __restrict w = panel + r * kBlock;
#pragma GCC unroll 8
      for (int b = 0; b < kRowBlock; ++b) {
        float cr = cT[r * kRowBlock + b];
        for (int c = 0; c < kBlock; ++c) acc[b][c] += cr * w[c];
      }
    }
    for (int b = 0; b < kRowBlock; ++b)
      for (int c = 0; c < kBlock; ++c) out[size_t(b) * KVB + nb + c] = round_bf16(acc[b][c]);
  }
}

// Loads latent rows [t0, t0 + nb) into cbuf as floats, [b][R].
inline void load_latent_rows(const uint16_t* c_kv, int t0, int nb, float* cbuf) {
  for (int b = 0; b < nb; ++b) bf16_to_floats(c_kv + size_t(t0 + b) * R, R, cbuf + b * R);
}

// Attention of every head over cached rows [t0, t1), the spec's literal
// form: each row is expanded through kv_b (k_nope and v rounded to bf16),
// scored against q (per head [nope | roped rope], bf16 values) and folded
// into part ([MH][2 + VH] softmax partials). kvb_panels is kv_b from
// w4_dequant_panels; rows holds kRowBlock * KVB floats, cbuf kRowBlock * R,
// scores MH * kRowBlock.
inline void mla_exact_chunk(const float* kvb_panels, const uint16_t* c_kv, const uint16_t* k_rope, const float* q,
                            int t0, int t1, float* rows, float* cbuf, float* scores, float* part) {
  for (int h = 0; h < MH; ++h) softmax_init(part + h * (2 + VH), VH);
  for (int tb = t0; tb < t1; tb += kRowBlock) {
    int nb = t1 - tb < kRowBlock ? t1 - tb : kRowBlock;
    load_latent_rows_t(c_kv, tb, nb, cbuf);
    mla_expand_rows(kvb_panels, cbuf, rows);
    for (int h = 0; h < MH; ++h) {
      const float* qh = q + h * QH;
      for (int b = 0; b < nb; ++b) {
        float s = dot_f32(qh, rows + size_t(b) * KVB + h * HD, NOPE) +
                  dot_bf16(qh + NOPE, k_rope + size_t(tb + b) * ROPE, ROPE);
        scores[h * kRowBlock + b] = s * qk_scale();
      }
      softmax_fold(part + h * (2 + VH), VH, scores + h * kRowBlock, nb, rows + h * HD + NOPE, KVB);
    }
  }
}

// ---- MoE ---------------------------------------------------------------------------
// Routing from the bf16 router logits: the TOPK best experts in PyTorch's
// order (ties included, see topk.h) and their weights, softmax over all
// experts renormalized over the chosen ones, times the routed scaling. In
// double, as the oracle: it is E values.
inline void moe_route(const float* logits, int* idx, float* weight, ktune::kimi::topk_detail::Item* items) {
  ktune::kimi::torch_topk(logits, E, TOPK, idx, items);
  double top = logits[idx[0]], total = 0, chosen = 0;
  for (int e = 0; e < E; ++e) total += exp(double(logits[e]) - top);
  for (int j = 0; j < TOPK; ++j) chosen += exp(double(logits[idx[j]]) - top) / total;
  for (int j = 0; j < TOPK; ++j)
    weight[j] = float(exp(double(logits[idx[j]]) - top) / total / (chosen + 1e-9) * kScaling);
}

}  // namespace kth
