// A CPU study, not part of ktune: where the oracle's time goes at the full
// size. A GPU session validates each attempt on 3 fresh seeds at every
// validation context; run 338 spent ~11 s an attempt waiting for those
// 9 cases. This times, at each validation context, building the state and
// the oracle's step (what grows with the context is the MLA layer's latent
// cache expanded through kv_b); then the 9 cases of an attempt computed the
// way OraclePool computed them until session 47, each case in its own
// thread, and through the OraclePool as it is (each seed's layers before
// the first M layer computed once, each case finished from them).
//
// What it showed (RESULTS.md, run 339): on the device machine's CPU (16
// Xeon cores, AVX-512) the 9 cases took 3.3-4.4 s with d998811's oracle and
// 1.3 s with the bit rounding, the AVX-512 expansion tiles and the
// vectorized w4_linear, with the same output hashes.
//
// Build: cmake --build build --target oracle_time
// Run:   build/oracle_time [contexts=61,2048,8192]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kimi/config.h"
#include "kernels/kimi/oracle.h"
#include "kernels/kimi/state.h"
#include "kernels/kimi/weights.h"
#include "measure/oracle_pool.h"
#include "measure/validate.h"

using namespace ktune;
using namespace ktune::kimi;

namespace {
// FNV-1a over every output of a step: versions of the oracle that must agree
// bit for bit print the same hashes.
uint64_t hash_outputs(const StepOutput& o) {
  uint64_t h = 1469598103934665603ull;
  auto bytes = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  bytes(o.hidden.data(), o.hidden.size() * 2);
  for (const auto& v : o.topk) bytes(v.data(), v.size() * sizeof(int));
  for (const auto& v : o.router_logits) bytes(v.data(), v.size() * 4);
  for (const auto& v : o.ckv_row) bytes(v.data(), v.size() * 2);
  for (const auto& v : o.krope_row) bytes(v.data(), v.size() * 2);
  for (const auto& v : o.attn_out) bytes(v.data(), v.size() * 2);
  return h;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  KimiConfig cfg;
  if (argc > 1) {
    cfg.validate_contexts.clear();
    std::stringstream ss(argv[1]);
    for (std::string item; std::getline(ss, item, ',');) cfg.validate_contexts.push_back(std::atoi(item.c_str()));
  }
  KimiWeights w;
  std::string err;
  double t0 = now();
  if (!load_weights(cfg, 0, &w, &err)) {
    std::fprintf(stderr, "oracle_time: %s\n", err.c_str());
    return 1;
  }
  std::printf("weights: %.2f s\n", now() - t0);
  for (int ctx : cfg.validate_contexts) {
    t0 = now();
    KimiState state = make_state(cfg, 11, ctx);
    const std::vector<uint16_t> token = make_token(cfg, 11);
    double t1 = now();
    StepOutput out;
    oracle_step(w, &state, token.data(), &out);
    double t2 = now();
    std::printf("context %5d: state %.2f s, step %.2f s, outputs %016llx\n", ctx, t1 - t0, t2 - t1,
                (unsigned long long)hash_outputs(out));
  }
  t0 = now();
  std::vector<std::future<measure::OracleCase>> cases;
  for (int s = 0; s < 3; ++s)
    for (int ctx : cfg.validate_contexts)
      cases.push_back(std::async(std::launch::async, [&w, s, ctx] { return measure::compute_oracle_case(w, 100 + s, ctx); }));
  uint64_t all = 0;
  for (auto& c : cases) all = all * 31 + hash_outputs(c.get().out);
  std::printf("an attempt's %zu cases, concurrently: %.2f s, outputs %016llx\n", cases.size(), now() - t0,
              (unsigned long long)all);
  // The same cases through the OraclePool, which computes each seed's
  // layers before the first M layer once: the same outputs, less work.
  t0 = now();
  {
    measure::OraclePool pool(w);
    for (int s = 0; s < 3; ++s)
      for (int ctx : cfg.validate_contexts) pool.prefetch(100 + s, ctx);
    all = 0;
    for (int s = 0; s < 3; ++s)
      for (int ctx : cfg.validate_contexts) all = all * 31 + hash_outputs(pool.take(100 + s, ctx).out);
  }
  std::printf("the same through the OraclePool (shared layers once a seed): %.2f s, outputs %016llx\n", now() - t0,
              (unsigned long long)all);
  return 0;
}
