#include "kernels/kimi/oracle.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "base/bf16.h"
#include "base/parallel.h"
#include "kernels/kimi/topk.h"

namespace ktune::kimi {

namespace {
// The vector extensions this CPU has, asked once: the hot loops below are
// built for each and pick theirs at run time (same sums in every build).
struct CpuFeatures {
  bool avx2 = __builtin_cpu_supports("avx2"), fma = __builtin_cpu_supports("fma"),
       avx512f = __builtin_cpu_supports("avx512f");
};
const CpuFeatures& cpu() {
  static const CpuFeatures features;
  return features;
}

// One dequantized weight from its 4-bit value and its group's zero and
// scale: q - zero is a small integer (exact in bf16); the product is exact
// in float and rounded once to bf16, as bf16 arithmetic would.
inline float w4_dequant(int v, float zero, float scale) { return round_bf16f((float(v) - zero) * scale); }
}  // namespace

float w4_weight(const QLinear& q, int k, int n) {
  uint8_t byte = q.w_q[size_t(k / 2) * q.N + n];
  int v = (k & 1) ? byte >> 4 : byte & 15;
  size_t sz = size_t(k / q.group) * q.N + n;
  return w4_dequant(v, bf16_to_float(q.zeros[sz]), bf16_to_float(q.scales[sz]));
}

namespace {

// y[n] for the columns [n0, n1), kW4Tile at a time: per group, the tile's
// weights dequantized into floats (w4_dequant, as w4_weight does), then
// y[n] += x[k] w[k][n] + x[k+1] w[k+1][n] for each pair of rows, in the
// order of k. Both loops run along the columns, so a compiler
// can vectorize them; the sums are the same as one column at a time. Built
// with AVX2 but without FMA where the CPU has it: x is not always bf16 (the
// experts' down projection), so a fused multiply-add could round otherwise.
constexpr int kW4Tile = 256, kW4Ahead = 16;
[[gnu::always_inline]] inline void w4_columns_body(const QLinear& q, const double* x, size_t n0, size_t n1,
                                                    double* y) {
  const int K = q.K, G = q.group;
  const size_t N = q.N;
  // One buffer a thread, kept: 128 KB at full size, where a fresh one per
  // call is a fresh mapping (zeroed pages) for every small linear.
  thread_local std::vector<float> tile;
  tile.resize(std::max(tile.size(), size_t(G) * kW4Tile));
  for (size_t c0 = n0; c0 < n1; c0 += kW4Tile) {
    const int nc = int(std::min<size_t>(kW4Tile, n1 - c0));
    double acc[kW4Tile] = {};
    float s[kW4Tile], z[kW4Tile];
    for (int g = 0; g < K / G; ++g) {
      for (int j = 0; j < nc; ++j) {
        s[j] = bf16_to_float(q.scales[size_t(g) * N + c0 + j]);
        z[j] = bf16_to_float(q.zeros[size_t(g) * N + c0 + j]);
      }
      for (int kk = 0; kk < G / 2; ++kk) {
        const uint8_t* row = q.w_q + (size_t(g) * G / 2 + kk) * N + c0;
        // Rows are N bytes apart: too far for the hardware's prefetchers.
        __builtin_prefetch(row + kW4Ahead * N);
        for (int j = 64; j < nc; j += 64) __builtin_prefetch(row + kW4Ahead * N + j);
        float* lo = &tile[size_t(2 * kk) * kW4Tile];
        float* hi = lo + kW4Tile;
        for (int j = 0; j < nc; ++j) {
          lo[j] = w4_dequant(row[j] & 15, z[j], s[j]);
          hi[j] = w4_dequant(row[j] >> 4, z[j], s[j]);
        }
      }
      for (int kk = 0; kk < G / 2; ++kk) {
        const double x0 = x[g * G + 2 * kk], x1 = x[g * G + 2 * kk + 1];
        const float* lo = &tile[size_t(2 * kk) * kW4Tile];
        const float* hi = lo + kW4Tile;
        for (int j = 0; j < nc; ++j) acc[j] += x0 * double(lo[j]) + x1 * double(hi[j]);
      }
    }
    std::copy(acc, acc + nc, y + c0);
  }
}
__attribute__((target("avx2"))) void w4_columns_avx2(const QLinear& q, const double* x, size_t n0, size_t n1,
                                                      double* y) {
  w4_columns_body(q, x, n0, n1, y);
}
void w4_columns(const QLinear& q, const double* x, size_t n0, size_t n1, double* y) {
  if (cpu().avx2)
    w4_columns_avx2(q, x, n0, n1, y);
  else
    w4_columns_body(q, x, n0, n1, y);
}

}  // namespace

void w4_linear(const QLinear& q, const double* x, double* y) {
  const size_t N = q.N;
  if (size_t(q.K) * N < (1u << 20)) {
    w4_columns(q, x, 0, N, y);
  } else {
    // Chunks of whole tiles where N allows: a row's bytes are read a tile
    // at a time, each row on another page, so narrow chunks cost TLB misses.
    size_t chunks = std::clamp<size_t>(N / kW4Tile, 1, worker_count() * 4);
    size_t step = (N / 16 + chunks - 1) / chunks * 16;
    parallel_for(chunks, [&](size_t b, size_t e) {
      for (size_t c = b; c < e; ++c) {
        size_t n0 = c * step, n1 = std::min<size_t>(N, n0 + step);
        if (n0 < n1) w4_columns(q, x, n0, n1, y);
      }
    });
  }
}

namespace {

using Vec = std::vector<double>;

Vec from_bf16(const uint16_t* p, size_t n) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16_to_float(p[i]);
  return v;
}

// round_bf16 over n values: the bit rounding alone, vectorized, for the
// values whose rounding it is; where one is not, round_bf16 over them all
// (rounding a rounded value changes nothing).
[[gnu::always_inline]] inline void round_span_body(double* v, size_t n) {
  uint64_t not_normal = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t u = std::bit_cast<uint64_t>(v[i]), r = bf16_rounded_bits(u);
    const uint64_t keep = !bf16_rounds_normal(u, r);
    not_normal |= keep;
    v[i] = std::bit_cast<double>(keep ? u : r);  // not normal: left as it was, for round_bf16
  }
  if (not_normal)
    for (size_t i = 0; i < n; ++i) v[i] = round_bf16(v[i]);
}
__attribute__((target("avx2"))) void round_span_avx2(double* v, size_t n) { round_span_body(v, n); }
void round_span(double* v, size_t n) {
  if (cpu().avx2)
    round_span_avx2(v, n);
  else
    round_span_body(v, n);
}

void round_all(Vec& v) { round_span(v.data(), v.size()); }

std::vector<uint16_t> to_bf16(const Vec& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = double_to_bf16(v[i]);
  return out;
}

// A W4A16 linear as the spec defines it: output rounded to bf16.
Vec linear(const QLinear& q, const Vec& x) {
  Vec y(q.N);
  w4_linear(q, x.data(), y.data());
  round_all(y);
  return y;
}

// x @ W^T for a bf16 weight [rows, cols]; output rounded to bf16.
Vec bf16_linear_t(const uint16_t* w, int rows, int cols, const Vec& x) {
  Vec y(rows);
  for (int r = 0; r < rows; ++r) {
    double acc = 0;
    for (int c = 0; c < cols; ++c) acc += x[c] * bf16_to_float(w[size_t(r) * cols + c]);
    y[r] = round_bf16(acc);
  }
  return y;
}

Vec rms_norm(const Vec& x, const uint16_t* w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = round_bf16(x[i] * inv * bf16_to_float(w[i]));
  return y;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

Vec add_round(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = round_bf16(a[i] + b[i]);
  return y;
}

struct Tracer {
  OracleTrace* t;
  std::string prefix;
  void put(const std::string& name, const Vec& v) const {
    if (t) (*t)[prefix + name] = std::vector<float>(v.begin(), v.end());
  }
};

// Each attention returns its output projection's result and sets *o_out to
// the projection's input (o, bf16-rounded), which validation also checks.
Vec kda_layer(const KimiConfig& c, const KdaWeights& W, LayerState& st, const Vec& xn, const Tracer& tr,
              std::vector<uint16_t>* o_out) {
  const int H = c.kda_heads, D = c.kda_head_dim, C = c.kda_dim();
  Vec act[3];
  const QLinear* proj[3] = {&W.q, &W.k, &W.v};
  std::vector<uint16_t>* windows[3] = {&st.cq, &st.ck, &st.cv};
  const char* names[3] = {"q", "k", "v"};
  for (int idx = 0; idx < 3; ++idx) {
    Vec raw = linear(*proj[idx], xn);
    tr.put(std::string(names[idx]) + "_raw", raw);
    std::vector<uint16_t>& win = *windows[idx];
    act[idx].resize(C);
    for (int j = 0; j < C; ++j) {
      double sum = 0;
      for (int t = 0; t < 3; ++t)
        sum += bf16_to_float(win[size_t(t) * C + j]) * bf16_to_float(W.conv_w[(size_t(idx) * C + j) * 4 + t]);
      sum += raw[j] * bf16_to_float(W.conv_w[(size_t(idx) * C + j) * 4 + 3]);
      act[idx][j] = round_bf16(silu(sum));
    }
    // keep the last three raw rows
    std::copy(win.begin() + C, win.end(), win.begin());
    for (int j = 0; j < C; ++j) win[size_t(2) * C + j] = double_to_bf16(raw[j]);
    tr.put(names[idx], act[idx]);
  }
  Vec graw = linear(W.g, xn);
  tr.put("g_raw", graw);
  Vec braw = bf16_linear_t(W.beta, H, c.hidden, xn);
  tr.put("beta_raw", braw);
  const double qscale = 1.0 / std::sqrt(double(D));
  Vec o(C);
  for (int h = 0; h < H; ++h) {
    double beta = sigmoid(braw[h]);
    float* S = st.S.data() + size_t(h) * D * D;
    std::vector<double> Sd(size_t(D) * D);
    for (int i = 0; i < D; ++i) {
      double decay = std::exp(-softplus(graw[size_t(h) * D + i]));
      for (int j = 0; j < D; ++j) Sd[size_t(i) * D + j] = double(S[size_t(i) * D + j]) * decay;
    }
    const double* k = &act[1][size_t(h) * D];
    const double* v = &act[2][size_t(h) * D];
    const double* q = &act[0][size_t(h) * D];
    for (int j = 0; j < D; ++j) {
      double pred = 0;
      for (int i = 0; i < D; ++i) pred += Sd[size_t(i) * D + j] * k[i];
      double delta = beta * (v[j] - pred);
      double oj = 0;
      for (int i = 0; i < D; ++i) {
        double s = Sd[size_t(i) * D + j] + k[i] * delta;
        S[size_t(i) * D + j] = float(s);
        oj += s * q[i] * qscale;
      }
      o[size_t(h) * D + j] = round_bf16(oj);
    }
  }
  tr.put("o", o);
  *o_out = to_bf16(o);
  return linear(W.o, o);
}

void rope(double* x, int n, int pos, double theta) {
  for (int i = 0; i < n / 2; ++i) {
    double inv = std::pow(theta, -2.0 * i / n);
    double a = pos * inv;
    double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = round_bf16(x0 * std::cos(a) - x1 * std::sin(a));
    x[2 * i + 1] = round_bf16(x1 * std::cos(a) + x0 * std::sin(a));
  }
}

// kvb[i][n] = sum over r = 0..R-1, in that order, of c[i][r] * w[r][n], for
// up to kExpandRows rows i of c and the n_panels * 8 columns of w, stored in
// panels of 8 columns: panel p holds w[r][8p..8p+7] for r = 0..R-1, one
// after another (so each panel is read straight through, 16 KB at full
// size, where rows of w 32 KB apart thrashed the caches' sets). Each product
// of two bf16 values is exact in double, so a fused multiply-add rounds as
// a multiply and an add would: every build of the tile below gives the same
// sums, bit for bit, whatever its vector width.
//
// A tile keeps kRows x kVecs vectors of sums in registers over r (GCC's
// vector extension); a vector never straddles two panels. With AVX-512, 8
// rows x 16 columns (two panels; 16 of the 32 registers), twice the
// multiply-adds per weight loaded of AVX2's 4 rows x 8 columns; SSE2 takes
// 4 columns a pass with its 16 registers.
constexpr int kExpandRows = 8, kPanel = 8;
typedef double Double4 __attribute__((vector_size(32)));
typedef double Double8 __attribute__((vector_size(64)));
template <typename V, int kRows, int kVecs>
[[gnu::always_inline]] inline void expand_tile(const double* c, int R, const float* w, int col0, double* kvb,
                                               size_t stride) {
  constexpr int L = sizeof(V) / sizeof(double);
  const float* wcol[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    const int col = col0 + v * L;
    wcol[v] = w + size_t(col / kPanel) * R * kPanel + col % kPanel;
  }
  V acc[kRows][kVecs] = {};
  for (int r = 0; r < R; ++r) {
    V wv[kVecs];
    for (int v = 0; v < kVecs; ++v)
      for (int j = 0; j < L; ++j) wv[v][j] = wcol[v][size_t(r) * kPanel + j];
    for (int i = 0; i < kRows; ++i) {
      const double ci = c[size_t(i) * R + r];
      for (int v = 0; v < kVecs; ++v) acc[i][v] += ci * wv[v];
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v)
      for (int j = 0; j < L; ++j) kvb[size_t(i) * stride + col0 + v * L + j] = acc[i][v][j];
}
// Rows in tiles of kRows (the last rows of a block, when fewer, in tiles of
// 4), columns in tiles of kVecs vectors (the last in single vectors).
template <typename V, int kRows, int kVecs>
[[gnu::always_inline]] inline void expand_rows_body(const double* c, int n_rows, int R, const float* w, int n_panels,
                                                    double* kvb) {
  constexpr int L = sizeof(V) / sizeof(double);
  const int cols = n_panels * kPanel;
  const size_t stride = size_t(cols);
  for (int i0 = 0; i0 < n_rows; i0 += kRows) {
    const double* ci = c + size_t(i0) * R;
    double* out = kvb + size_t(i0) * stride;
    const bool full = kRows == 4 || n_rows - i0 > 4;
    int col = 0;
    for (; col + kVecs * L <= cols; col += kVecs * L)
      full ? expand_tile<V, kRows, kVecs>(ci, R, w, col, out, stride) : expand_tile<V, 4, kVecs>(ci, R, w, col, out, stride);
    for (; col < cols; col += L)
      full ? expand_tile<V, kRows, 1>(ci, R, w, col, out, stride) : expand_tile<V, 4, 1>(ci, R, w, col, out, stride);
  }
}
__attribute__((target("avx512f"))) void expand_rows_avx512(const double* c, int n_rows, int R, const float* w,
                                                            int n_panels, double* kvb) {
  expand_rows_body<Double8, 8, 2>(c, n_rows, R, w, n_panels, kvb);
}
__attribute__((target("avx2,fma"))) void expand_rows_avx2(const double* c, int n_rows, int R, const float* w,
                                                           int n_panels, double* kvb) {
  expand_rows_body<Double4, 4, 2>(c, n_rows, R, w, n_panels, kvb);
}
// c holds kExpandRows rows (of R), of which the first n_rows are wanted;
// kvb gets n_panels * 8 sums for each of them.
void expand_rows(const double* c, int n_rows, int R, const float* w, int n_panels, double* kvb) {
  if (cpu().avx512f)
    expand_rows_avx512(c, n_rows, R, w, n_panels, kvb);
  else if (cpu().avx2 && cpu().fma)
    expand_rows_avx2(c, n_rows, R, w, n_panels, kvb);
  else
    expand_rows_body<Double4, 4, 1>(c, n_rows, R, w, n_panels, kvb);
}

Vec mla_layer(const KimiConfig& c, const MlaWeights& W, LayerState& st, int pos, const Vec& xn, const Tracer& tr,
              std::vector<uint16_t>* ckv_row, std::vector<uint16_t>* krope_row, std::vector<uint16_t>* o_out) {
  const int H = c.mla_heads, NOPE = c.qk_nope, ROPE = c.qk_rope, QH = NOPE + ROPE, R = c.kv_lora, V = c.v_head;
  Vec q = linear(W.q, xn);
  Vec kv = linear(W.kv_a, xn);
  tr.put("q_raw", q);
  tr.put("kv_raw", kv);
  for (int h = 0; h < H; ++h) rope(&q[size_t(h) * QH + NOPE], ROPE, pos, c.rope_theta);
  rope(&kv[R], ROPE, pos, c.rope_theta);
  size_t rows = size_t(pos) + 1;
  if (st.c_kv.size() < rows * R) st.c_kv.resize(rows * R);
  if (st.k_rope.size() < rows * ROPE) st.k_rope.resize(rows * ROPE);
  for (int i = 0; i < R; ++i) st.c_kv[size_t(pos) * R + i] = double_to_bf16(kv[i]);
  for (int i = 0; i < ROPE; ++i) st.k_rope[size_t(pos) * ROPE + i] = double_to_bf16(kv[R + i]);
  ckv_row->assign(st.c_kv.begin() + size_t(pos) * R, st.c_kv.begin() + rows * R);
  krope_row->assign(st.k_rope.begin() + size_t(pos) * ROPE, st.k_rope.begin() + rows * ROPE);
  tr.put("q_roped", q);
  tr.put("kv_roped", kv);

  // The spec's form, literally: every cached row is expanded through kv_b
  // (a W4A16 linear, so k_nope and v are rounded to bf16), then softmax
  // attention per head. Streamed over t with an online softmax, in parallel
  // chunks of rows, so long contexts need no [rows, H*(NOPE+V)] buffer.
  // Within a chunk, head by head: the head's slice of kv_b (R x HD floats,
  // 512 KB at full size) stays in cache for all the chunk's rows, where the
  // whole kv_b (16 MB) streamed from memory for each row before (most of a
  // session's validation time). Each head's softmax sees its rows in the
  // same order as before, and each k_nope and v value is the same sum in
  // the same order, so the result is the same, bit for bit.
  const QLinear& B = W.kv_b;  // [R, H*(NOPE+V)]
  const int HD = NOPE + V, panels = (HD + kPanel - 1) / kPanel, HDP = panels * kPanel;
  // kv_b dequantized, head by head in panels (expand_rows), zeros past HD.
  std::vector<float> wkvb(size_t(H) * HDP * R, 0.0f);
  parallel_for(size_t(H) * panels, [&](size_t b, size_t e) {
    for (size_t hp = b; hp < e; ++hp) {
      const int h = int(hp / panels), col = int(hp % panels) * kPanel;
      float* out = &wkvb[hp * R * kPanel];
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < kPanel && col + j < HD; ++j) out[size_t(r) * kPanel + j] = w4_weight(B, r, h * HD + col + j);
    }
  });
  const double scale = 1.0 / std::sqrt(double(QH));
  struct Partial {
    std::vector<double> m, l, acc;  // per head: running max, sum, sum of p*v
  };
  // A fixed number of chunks, not one per core: the softmax merge below
  // follows the split, so a split by core count would let the last bits of
  // the reference depend on the machine that computes it.
  constexpr size_t kMlaChunks = 64;
  size_t chunks = std::min<size_t>(rows, kMlaChunks);
  size_t per = (rows + chunks - 1) / chunks;
  std::vector<Partial> parts(chunks);
  parallel_for(chunks, [&](size_t c0, size_t c1) {
    std::vector<double> ct(size_t(kExpandRows) * R), kvb(size_t(kExpandRows) * HDP);
    for (size_t ci = c0; ci < c1; ++ci) {
      Partial& P = parts[ci];
      P.m.assign(H, -INFINITY);
      P.l.assign(H, 0.0);
      P.acc.assign(size_t(H) * V, 0.0);
      const size_t t_end = std::min(rows, (ci + 1) * per);
      for (int h = 0; h < H; ++h) {
        const double* qn = &q[size_t(h) * QH];
        for (size_t t0 = ci * per; t0 < t_end; t0 += kExpandRows) {
          const int n_rows = int(std::min<size_t>(kExpandRows, t_end - t0));
          for (int i = 0; i < kExpandRows; ++i)  // rows past the chunk's end: zeros, not used
            for (int r = 0; r < R; ++r)
              ct[size_t(i) * R + r] = i < n_rows ? bf16_to_float(st.c_kv[(t0 + i) * R + r]) : 0.0;
          expand_rows(ct.data(), n_rows, R, &wkvb[size_t(h) * HDP * R], panels, kvb.data());
          for (int i = 0; i < n_rows; ++i) {
            const size_t t = t0 + i;
            double* kn = &kvb[size_t(i) * HDP];
            round_span(kn, HD);
            double s = 0;
            for (int d = 0; d < NOPE; ++d) s += qn[d] * kn[d];
            for (int j = 0; j < ROPE; ++j) s += qn[NOPE + j] * bf16_to_float(st.k_rope[t * ROPE + j]);
            s *= scale;
            double m = std::max(P.m[h], s);
            double corr = std::exp(P.m[h] - m), p = std::exp(s - m);
            P.l[h] = P.l[h] * corr + p;
            for (int d = 0; d < V; ++d) P.acc[size_t(h) * V + d] = P.acc[size_t(h) * V + d] * corr + p * kn[NOPE + d];
            P.m[h] = m;
          }
        }
      }
    }
  });
  Vec o(size_t(H) * V);
  for (int h = 0; h < H; ++h) {
    double m = -INFINITY;
    for (auto& P : parts)
      if (!P.m.empty()) m = std::max(m, P.m[h]);
    double l = 0;
    std::vector<double> acc(V, 0.0);
    for (auto& P : parts) {
      if (P.m.empty() || P.l[h] == 0) continue;
      double corr = std::exp(P.m[h] - m);
      l += P.l[h] * corr;
      for (int d = 0; d < V; ++d) acc[d] += P.acc[size_t(h) * V + d] * corr;
    }
    for (int d = 0; d < V; ++d) o[size_t(h) * V + d] = round_bf16(acc[d] / l);
  }
  tr.put("o", o);
  *o_out = to_bf16(o);
  return linear(W.o, o);
}

// One expert: gate, up and down products accumulate without rounding in
// between ("fp32 accumulation"); only the MoE's sum is rounded to bf16. This
// is what the golden implementation does.
Vec expert_ffn(const QLinear& gate, const QLinear& up, const QLinear& down, const Vec& x) {
  Vec g(gate.N), u(up.N), y(down.N);
  w4_linear(gate, x.data(), g.data());
  w4_linear(up, x.data(), u.data());
  Vec a(g.size());
  for (size_t i = 0; i < g.size(); ++i) a[i] = silu(g[i]) * u[i];
  w4_linear(down, a.data(), y.data());
  return y;
}

Vec moe(const KimiConfig& c, const MoeWeights& W, const Vec& xn, const Tracer& tr, const std::vector<int>* forced,
        std::vector<int>* topk, std::vector<float>* logits_out) {
  const int E = c.n_experts;
  Vec logits = bf16_linear_t(W.router, E, c.hidden, xn);
  tr.put("router", logits);
  logits_out->assign(logits.begin(), logits.end());
  // Softmax is monotonic, so experts are ranked by logit; equal bf16 logits
  // are ordered as PyTorch's CPU top-k orders them (see topk.h).
  const int K = c.n_active;
  std::vector<float> lf(logits.begin(), logits.end());
  std::vector<topk_detail::Item> scratch(E);
  std::vector<int> order(K);
  torch_topk(lf.data(), E, K, order.data(), scratch.data());
  double mx = logits[order[0]], total = 0;
  Vec p(E);
  for (int e = 0; e < E; ++e) total += (p[e] = std::exp(logits[e] - mx));
  *topk = forced && !forced->empty() ? *forced : order;
  double wsum = 0;
  for (int e : *topk) wsum += p[e] / total;
  Vec out(c.hidden, 0.0);
  for (int e : *topk) {
    double w = p[e] / total / (wsum + 1e-9) * c.routed_scaling;
    Vec y = expert_ffn(W.gate.expert(e), W.up.expert(e), W.down.expert(e), xn);
    for (int i = 0; i < c.hidden; ++i) out[i] += w * y[i];
  }
  for (int s = 0; s < c.n_shared; ++s) {
    Vec y = expert_ffn(W.s_gate.expert(s), W.s_up.expert(s), W.s_down.expert(s), xn);
    for (int i = 0; i < c.hidden; ++i) out[i] += y[i];
  }
  round_all(out);
  return out;
}

}  // namespace

void oracle_layers(const KimiWeights& w, KimiState* state, int first, int last, std::vector<double>* hidden,
                   StepOutput* out, OracleTrace* trace, const Routing* routing) {
  const KimiConfig& c = w.cfg;
  Vec& x = *hidden;
  for (int i = first; i < last; ++i) {
    std::string prefix = "L";  // appended, not "L" + ... (GCC 12 warns of a false overlap there)
    prefix += std::to_string(i) + ".";
    Tracer tr{trace, prefix};
    const LayerWeights& L = w.layers[i];
    Vec xn = rms_norm(x, L.attn_norm, c.rms_eps);
    tr.put("xn", xn);
    Vec attn = c.is_kda(i) ? kda_layer(c, L.kda, state->layers[i], xn, tr, &out->attn_out[i])
                           : mla_layer(c, L.mla, state->layers[i], state->context, xn, tr, &out->ckv_row[i],
                                       &out->krope_row[i], &out->attn_out[i]);
    tr.put("attn_proj", attn);
    Vec h = add_round(x, attn);
    tr.put("h", h);
    Vec hn = rms_norm(h, L.moe_norm, c.rms_eps);
    tr.put("hn", hn);
    const std::vector<int>* forced = routing && size_t(i) < routing->size() ? &(*routing)[i] : nullptr;
    Vec m = moe(c, L.moe, hn, tr, forced, &out->topk[i], &out->router_logits[i]);
    tr.put("moe_out", m);
    x = add_round(h, m);
    tr.put("x", x);
  }
}

std::vector<double> start_step(const KimiConfig& c, const uint16_t* token, StepOutput* out) {
  out->topk.assign(c.layers(), {});
  out->router_logits.assign(c.layers(), {});
  out->ckv_row.assign(c.layers(), {});
  out->krope_row.assign(c.layers(), {});
  out->attn_out.assign(c.layers(), {});
  return from_bf16(token, c.hidden);
}

void finish_step(KimiState* state, const std::vector<double>& hidden, StepOutput* out) {
  state->context += 1;
  out->hidden = to_bf16(hidden);
}

void oracle_step(const KimiWeights& w, KimiState* state, const uint16_t* token, StepOutput* out,
                 OracleTrace* trace, const Routing* routing) {
  std::vector<double> x = start_step(w.cfg, token, out);
  oracle_layers(w, state, 0, w.cfg.layers(), &x, out, trace, routing);
  finish_step(state, x, out);
}

}  // namespace ktune::kimi
