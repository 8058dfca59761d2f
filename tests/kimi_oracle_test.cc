// The C++ oracle against the golden vectors of the independent
// implementation: every case and step, every output, cosine >= 0.9999 and
// the same experts. And its MLA attention, which is computed in blocks of
// rows and heads for speed, against the spec's form written out row by row.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "base/bf16.h"
#include "kernels/kimi/golden.h"
#include "kernels/kimi/oracle.h"

using namespace ktune;
using namespace ktune::kimi;

namespace {

void check_file(const std::string& name) {
  std::string dir = find_golden_dir();
  if (dir.empty()) {
    MESSAGE("SKIPPED: golden vectors not found (set KTUNE_GOLDEN_DIR or put shared/golden beside the checkout)");
    return;
  }
  GoldenFile g;
  std::string err;
  REQUIRE_MESSAGE(g.load(dir + "/" + name, &err), err);
  std::vector<GoldenCheck> checks;
  for (auto& c : g.cases) {
    StepFn step = [&](KimiState* st, const std::vector<uint16_t>& tok, StepOutput* out, std::string*) {
      oracle_step(g.weights, st, tok.data(), out);
      return true;
    };
    REQUIRE_MESSAGE(check_golden_case(g, c, step, GoldenOptions{}, &checks, &err), err);
  }
  // Worst cosine per kind of output, printed for the record.
  std::map<std::string, double> worst;
  int failed = 0;
  for (auto& ch : checks) {
    std::string kind = ch.name.substr(ch.name.rfind('.') + 1);
    worst.try_emplace(kind, 1.0);
    worst[kind] = std::min(worst[kind], ch.sim.cosine);
    if (!ch.ok) {
      ++failed;
      std::printf("  FAIL %s cos=%.6f rel_l2=%.3g\n", ch.name.c_str(), ch.sim.cosine, ch.sim.rel_l2);
    }
  }
  std::printf("golden %s: %zu checks over %zu cases;", name.c_str(), checks.size(), g.cases.size());
  for (auto& [k, v] : worst) std::printf(" %s>=%.6f", k.c_str(), v);
  std::printf("\n");
  CHECK(failed == 0);
}

}  // namespace

TEST_CASE("oracle reproduces golden kimi-tiny") { check_file("kimi-tiny.safetensors"); }
TEST_CASE("oracle reproduces golden kimi-top8") { check_file("kimi-top8.safetensors"); }

TEST_CASE("the oracle's MLA attention is the spec's form computed row by row") {
  // The spec's form: every cached row's c_kv through kv_b (k_nope and v
  // rounded to bf16), scores with the roped q, softmax over all rows, o
  // rounded to bf16. Written here plainly (two passes, no blocks); the
  // oracle's online softmax may round the last bits of a sum differently,
  // so o may differ by one bf16 ulp in a rare element, never more.
  KimiConfig cfg;
  std::string err;
  REQUIRE(KimiConfig::preset("tiny", &cfg, &err));
  KimiWeights w;
  REQUIRE_MESSAGE(load_weights(cfg, 1, &w, &err), err);
  int m = 0;
  while (m < cfg.layers() && cfg.is_kda(m)) ++m;
  REQUIRE(m < cfg.layers());
  const QLinear& B = w.layers[m].mla.kv_b;
  const int H = cfg.mla_heads, NOPE = cfg.qk_nope, ROPE = cfg.qk_rope, QH = NOPE + ROPE, R = cfg.kv_lora,
            V = cfg.v_head, HD = NOPE + V;
  for (int context : {0, 5, 97}) {
    KimiState st = make_state(cfg, 11, context);
    std::vector<uint16_t> token = make_token(cfg, 11);
    OracleTrace trace;
    StepOutput out;
    oracle_step(w, &st, token.data(), &out, &trace);
    const std::string L = "L" + std::to_string(m) + ".";
    const std::vector<float>& q = trace[L + "q_roped"];
    const std::vector<float>& o = trace[L + "o"];
    REQUIRE(q.size() == size_t(H) * QH);
    REQUIRE(o.size() == size_t(H) * V);
    const LayerState& S = st.layers[m];
    const int rows = context + 1;  // the step's own row appended
    std::vector<double> kvb(size_t(rows) * B.N);
    for (int t = 0; t < rows; ++t)
      for (int n = 0; n < B.N; ++n) {
        double acc = 0;
        for (int r = 0; r < R; ++r) acc += double(bf16_to_float(S.c_kv[size_t(t) * R + r])) * w4_weight(B, r, n);
        kvb[size_t(t) * B.N + n] = round_bf16(acc);
      }
    int equal = 0, within_ulp = 0;
    for (int h = 0; h < H; ++h) {
      std::vector<double> s(rows), p(rows);
      double mx = -INFINITY, l = 0;
      for (int t = 0; t < rows; ++t) {
        const double* kn = &kvb[size_t(t) * B.N + size_t(h) * HD];
        double dot = 0;
        for (int d = 0; d < NOPE; ++d) dot += q[size_t(h) * QH + d] * kn[d];
        for (int j = 0; j < ROPE; ++j)
          dot += q[size_t(h) * QH + NOPE + j] * double(bf16_to_float(S.k_rope[size_t(t) * ROPE + j]));
        s[t] = dot / std::sqrt(double(QH));
        mx = std::max(mx, s[t]);
      }
      for (int t = 0; t < rows; ++t) l += (p[t] = std::exp(s[t] - mx));
      for (int d = 0; d < V; ++d) {
        double acc = 0;
        for (int t = 0; t < rows; ++t) acc += p[t] * kvb[size_t(t) * B.N + size_t(h) * HD + NOPE + d];
        const double want = round_bf16(acc / l), got = o[size_t(h) * V + d];
        const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(want), 1e-30)) - 7);
        equal += got == want;
        within_ulp += std::fabs(got - want) <= ulp;
      }
    }
    INFO("context " << context << ": " << equal << " of " << H * V << " equal");
    CHECK(within_ulp == H * V);
    CHECK(equal >= H * V * 99 / 100);
  }
}

TEST_CASE("bf16 rounding is round-to-nearest-even") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0)
  CHECK(float_to_bf16(1.00390625f) == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even (1+2^-6)
  CHECK(float_to_bf16(1.01171875f) == 0x3f82);
  CHECK(double_to_bf16(1.00390625) == 0x3f80);
  CHECK(double_to_bf16(1.0039062500001) == 0x3f81);
  CHECK(float_to_bf16(-2.5f) == 0xc020);
}

TEST_CASE("rounding a double to bf16 on its bits is frexp's rounding, everywhere (as bf16 and in double)") {
  // Every bf16 exponent, both signs, fractions at and around the ties (the
  // dropped bits 0, just under half, half, just over), and random bits.
  std::vector<double> values = {0.0, -0.0, INFINITY, -INFINITY, NAN, 0x1p-126, 0x1p-127, 0x1.ffp127, 0x1.ff8p127,
                                0x1.fffffffffffffp127, 0x1p128, 3.4028234663852886e38, 1e-300, -1e300};
  uint64_t x = 12345;
  for (int exp = -140; exp <= 129; ++exp)
    for (uint64_t frac7 : {0ull, 1ull, 63ull, 64ull, 126ull, 127ull})
      for (uint64_t low : {0ull, 1ull, (1ull << 44) - 1, 1ull << 44, (1ull << 44) + 1, (1ull << 45) - 1}) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        for (uint64_t tail : {low, x >> 19})
          for (uint64_t sign : {0ull, 1ull}) {
            uint64_t u = (sign << 63) | (uint64_t(exp + 1023) << 52) | (frac7 << 45) | (tail & ((1ull << 45) - 1));
            double d;
            std::memcpy(&d, &u, 8);
            values.push_back(d);
          }
      }
  int differ = 0, differ_in_double = 0;
  for (double d : values) {
    differ += double_to_bf16(d) != double_to_bf16_general(d);
    const double want = bf16_to_float(double_to_bf16_general(d)), got = round_bf16(d);
    uint64_t a, b;
    std::memcpy(&a, &want, 8);
    std::memcpy(&b, &got, 8);
    differ_in_double += a != b;
  }
  CHECK(values.size() > 6000);
  CHECK(differ == 0);
  CHECK(differ_in_double == 0);
  CHECK(double_to_bf16(0x1.ff8p127) == 0x7f80);  // rounds up past float's range: infinity
  CHECK(double_to_bf16(0x1.01p0) == 0x3f80);     // exactly half an ulp above 1: ties to even, down
  CHECK(double_to_bf16(0x1.03p0) == 0x3f82);     // half an ulp above 1+2^-7: ties to even, up
}
