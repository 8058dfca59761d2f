// The C++ oracle against the golden vectors of the independent
// implementation: every case and step, every output, cosine >= 0.9999 and
// the same experts.
#include <doctest/doctest.h>

#include <cstdio>
#include <map>

#include "base/bf16.h"
#include "kernels/kimi/golden.h"

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
