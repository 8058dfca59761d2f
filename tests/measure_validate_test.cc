// Validation (measure/validate.h): the near-tie rule for experts, the
// recheck against the oracle routed as the kernel routed, the attention
// outputs and the gate's relative error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "base/bf16.h"
#include "base/fs.h"
#include "kernels/kimi/oracle.h"
#include "kernels/kimi/weights.h"
#include "measure/oracle_pool.h"
#include "measure/validate.h"

using namespace ktune;

TEST_CASE("within_rounding_of_topk: the top-k, ties, and one bf16 ulp across the boundary") {
  // 1.0 and 1.0078125 are neighbouring bf16 values (8 significant bits).
  const float next = 1.0078125f, two_up = 1.015625f;
  CHECK(measure::within_rounding_of_topk({3.0f, 2.0f, 1.0f, 0.5f}, {0, 1}));
  CHECK(measure::within_rounding_of_topk({3.0f, 2.0f, 1.0f, 0.5f}, {1, 0}));  // order does not matter
  CHECK_FALSE(measure::within_rounding_of_topk({3.0f, 2.0f, 1.0f, 0.5f}, {0, 2}));
  CHECK(measure::within_rounding_of_topk({3.0f, 1.0f, 1.0f, 0.5f}, {0, 2}));  // a tie broken the other way
  CHECK(measure::within_rounding_of_topk({3.0f, next, 1.0f, 0.5f}, {0, 2}));   // one ulp
  CHECK_FALSE(measure::within_rounding_of_topk({3.0f, two_up, 1.0f, 0.5f}, {0, 2}));
  CHECK(measure::within_rounding_of_topk({3.0f, -1.0f, -next, 0.5f}, {0, 3}));
  CHECK(measure::within_rounding_of_topk({3.0f, -1.0f, -next, -2.0f}, {0, 2}));  // negative neighbours
  CHECK_FALSE(measure::within_rounding_of_topk({3.0f, 2.0f, 1.0f}, {0, 0}));      // the same expert twice
  CHECK_FALSE(measure::within_rounding_of_topk({3.0f, 2.0f, 1.0f}, {0, 7}));      // out of range
  // The shortfall in ulps: 0 for a top-k, 1 for one ulp, 2 for two.
  CHECK(measure::topk_shortfall_ulps({3.0f, 2.0f, 1.0f, 0.5f}, {0, 1}) == 0.0);
  CHECK(measure::topk_shortfall_ulps({3.0f, next, 1.0f, 0.5f}, {0, 2}) == 1.0);
  CHECK(measure::topk_shortfall_ulps({3.0f, two_up, 1.0f, 0.5f}, {0, 2}) == 2.0);
}

namespace {

struct Tiny {
  kimi::KimiWeights w;
  Tiny() {
    std::string err;
    REQUIRE(kimi::KimiConfig::preset("tiny", &w.cfg, &err));
    REQUIRE_MESSAGE(kimi::generate_weights(w.cfg, 5, &w.file, &err), err);
    REQUIRE_MESSAGE(w.bind(&err), err);
  }
};

// The oracle's experts of layer `layer` ranked by logit (best first).
std::vector<int> ranked(const std::vector<float>& logits) {
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  return order;
}

// Seed 3 at context 5, and a "kernel" whose layer 0 takes the first
// expert outside the oracle's top-k instead of the last one inside it: the
// oracle's own answer routed that way.
struct NeighbourFlip {
  measure::OracleCase ref, flipped;
  kimi::Routing kernel;
  int kept_out = -1, taken_in = -1;
  explicit NeighbourFlip(const kimi::KimiWeights& w) {
    ref = measure::compute_oracle_case(w, 3, 5);
    const std::vector<int> order = ranked(ref.out.router_logits[0]);
    kept_out = order[w.cfg.n_active - 1];
    taken_in = order[w.cfg.n_active];
    kernel.assign(w.cfg.layers(), {});
    kernel[0] = ref.out.topk[0];
    std::replace(kernel[0].begin(), kernel[0].end(), kept_out, taken_in);
    flipped = measure::compute_oracle_case(w, 3, 5, &kernel);
  }
};

}  // namespace

TEST_CASE("the oracle routed as it routes itself gives the same answer, routed otherwise another") {
  Tiny t;
  measure::OracleCase own = measure::compute_oracle_case(t.w, 3, 5);
  kimi::Routing same = own.out.topk;
  measure::OracleCase again = measure::compute_oracle_case(t.w, 3, 5, &same);
  CHECK(again.out.hidden == own.out.hidden);
  CHECK(again.out.topk == own.out.topk);
  REQUIRE(own.out.router_logits.size() == size_t(t.w.cfg.layers()));
  CHECK(own.out.router_logits[0].size() == size_t(t.w.cfg.n_experts));

  kimi::Routing other(t.w.cfg.layers());
  other[0] = own.out.topk[0];
  other[0].back() = ranked(own.out.router_logits[0])[t.w.cfg.n_active];  // the first expert left out
  measure::OracleCase routed = measure::compute_oracle_case(t.w, 3, 5, &other);
  CHECK(routed.out.topk[0] == other[0]);
  CHECK(routed.out.hidden != own.out.hidden);
}

TEST_CASE("a kernel that picks the neighbour across the top-k boundary is checked against the oracle routed alike") {
  Tiny t;
  const kimi::KimiConfig& cfg = t.w.cfg;
  // From a kernel that does not report its logits (ABI version 3): judged
  // by the oracle's logits alone.
  NeighbourFlip nf(t.w);
  auto& [ref, flipped, kernel, kept_out, taken_in] = nf;
  flipped.out.router_logits.clear();
  std::string err, dir;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-validate-test-", &dir, &err), err);
  const std::string file = join_path(dir, "case.safetensors");
  REQUIRE_MESSAGE(measure::write_case_outputs(file, cfg, flipped.state, flipped.out, &err), err);

  measure::Gate gate;
  measure::CaseCheck first;
  REQUIRE_MESSAGE(measure::check_case(cfg, ref, file, gate, &first, &err), err);
  CHECK_FALSE(first.experts_match);
  const double flipped_cosine = first.metrics["hidden"]["cosine"].get<double>();
  CHECK(flipped_cosine < 0.9999);  // the flip shows in the output

  SUBCASE("logits far apart: the difference stands, and says where") {
    const double ulps = measure::topk_shortfall_ulps(ref.out.router_logits[0], kernel[0]);
    REQUIRE(ulps > 1.0);
    REQUIRE_FALSE(measure::within_rounding_of_topk(ref.out.router_logits[0], kernel[0]));
    measure::CaseCheck check = first;
    check.passed = false;  // as a failed case: the failure names the layer too
    check.failure = "hidden: cosine below the gate";
    REQUIRE_MESSAGE(measure::recheck_near_ties(t.w, ref, file, gate, &check, &err), err);
    CHECK(check.routing_note.find("layer 0") != std::string::npos);
    CHECK(check.routing_note.find("ulps below its top-") != std::string::npos);
    CHECK(check.failure.find("hidden: cosine below the gate; other experts than the oracle's in layer 0") == 0);
    CHECK_FALSE(check.passed);
    CHECK(check.metrics["hidden"]["cosine"].get<double>() == flipped_cosine);
  }
  SUBCASE("logits one bf16 ulp apart: rechecked, and it passes") {
    // As if the oracle's two logits were neighbours (a rounding away).
    std::vector<float>& logits = ref.out.router_logits[0];
    logits[taken_in] = bf16_to_float(uint16_t(float_to_bf16(logits[kept_out]) - 1));
    REQUIRE(measure::within_rounding_of_topk(logits, kernel[0]));
    measure::CaseCheck check = first;
    REQUIRE_MESSAGE(measure::recheck_near_ties(t.w, ref, file, gate, &check, &err), err);
    CHECK(check.passed);
    CHECK_FALSE(check.experts_match);
    CHECK(check.routing_note.find("layer(s) 0 (1.0 ulps) of its logits, within one bf16 ulp") != std::string::npos);
    CHECK(check.metrics["hidden"]["cosine"].get<double>() > 0.99999);
    CHECK_FALSE(check.metrics.contains("L0.logits"));  // not reported, not judged
    CHECK(check.routing_note.find("the logits too") == std::string::npos);
  }
  SUBCASE("experts the kernel did not write leave the first check standing") {
    kimi::StepOutput unwritten = flipped.out;
    for (auto& layer : unwritten.topk) std::fill(layer.begin(), layer.end(), -1);
    REQUIRE_MESSAGE(measure::write_case_outputs(file, cfg, flipped.state, unwritten, &err), err);
    measure::CaseCheck check;
    REQUIRE_MESSAGE(measure::check_case(cfg, ref, file, gate, &check, &err), err);
    const measure::CaseCheck before = check;
    REQUIRE_MESSAGE(measure::recheck_near_ties(t.w, ref, file, gate, &check, &err), err);
    CHECK(check.routing_note.empty());
    CHECK(check.failure == before.failure);
    CHECK(check.passed == before.passed);
  }
  SUBCASE("a kernel whose experts match is left alone") {
    measure::CaseCheck same;
    same.experts_match = true;
    same.passed = true;
    REQUIRE(measure::recheck_near_ties(t.w, ref, "no such file", gate, &same, &err));
    CHECK(same.routing_note.empty());
  }
  remove_tree(dir);
}

TEST_CASE("a kernel that reports its logits: a flip that is their top-k is rechecked with them; one that is not fails") {
  // The same flip in layer 0 (the first expert outside the oracle's top-k
  // taken for the last one inside it), from a kernel that reports its
  // router logits (ABI version 4): its logits decide whether its choice is
  // a tie broken by rounding, and are then gated like any output.
  Tiny t;
  const kimi::KimiConfig& cfg = t.w.cfg;
  NeighbourFlip nf(t.w);
  auto& [ref, flipped, kernel, kept_out, taken_in] = nf;
  const double depth = measure::topk_shortfall_ulps(ref.out.router_logits[0], kernel[0]);
  REQUIRE(depth > 1.0);  // beyond the one-ulp rule of a kernel without logits
  // The kernel's own layer-0 logits: the oracle's, with the two experts'
  // values exchanged, so that its choice is their top-k.
  std::vector<float> own = ref.out.router_logits[0];
  std::swap(own[kept_out], own[taken_in]);
  REQUIRE(measure::topk_shortfall_ulps(own, kernel[0]) == 0.0);
  std::string err, dir;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-validate-test-", &dir, &err), err);
  const std::string file = join_path(dir, "case.safetensors");
  measure::Gate gate;
  auto judged = [&](const std::vector<float>& layer0_logits) {
    kimi::StepOutput out = flipped.out;  // later layers: the oracle's logits for what they see
    out.router_logits[0] = layer0_logits;
    REQUIRE_MESSAGE(measure::write_case_outputs(file, cfg, flipped.state, out, &err), err);
    measure::CaseCheck check;
    REQUIRE_MESSAGE(measure::check_case(cfg, ref, file, gate, &check, &err), err);
    CHECK_FALSE(check.experts_match);
    REQUIRE_MESSAGE(measure::recheck_near_ties(t.w, ref, file, gate, &check, &err), err);
    return check;
  };
  // How far the exchange moves the logits, as the gate measures it.
  double moved = 0, norm = 0;
  for (size_t e = 0; e < own.size(); ++e) {
    moved += (own[e] - ref.out.router_logits[0][e]) * (own[e] - ref.out.router_logits[0][e]);
    norm += ref.out.router_logits[0][e] * ref.out.router_logits[0][e];
  }
  const double moved_rel_l2 = std::sqrt(moved / norm);

  SUBCASE("the choice is the top-k of its logits: rechecked against the oracle routed alike, logits gated") {
    gate.max_rel_l2 = 2 * moved_rel_l2 + 0.01;  // a gate the exchange is within
    measure::CaseCheck check = judged(own);
    CHECK(check.passed);
    CHECK_FALSE(check.experts_match);
    CHECK(check.routing_note.find("the top-k of the kernel's own logits") != std::string::npos);
    CHECK(check.metrics["L0.logits"]["rel_l2"].get<double>() == doctest::Approx(moved_rel_l2).epsilon(0.01));
    CHECK(check.metrics["hidden"]["cosine"].get<double>() > 0.99999);
  }
  SUBCASE("the same choice with logits further off than the gate allows: it fails on the logits") {
    gate.max_rel_l2 = moved_rel_l2 / 2;
    measure::CaseCheck check = judged(own);
    CHECK_FALSE(check.passed);
    CHECK(check.failure.find("L0.logits: relative L2 error") == 0);
  }
  SUBCASE("the choice is not the top-k of its own logits: the difference stands, and says so") {
    gate.max_rel_l2 = 2 * moved_rel_l2 + 0.01;
    measure::CaseCheck check = judged(ref.out.router_logits[0]);
    CHECK(check.routing_note.find("layer 0's experts are not the top-") != std::string::npos);
    CHECK(check.routing_note.find("of the kernel's own logits") != std::string::npos);
    CHECK(check.metrics["hidden"]["cosine"].get<double>() < 0.9999);  // judged against the unflipped oracle
  }
  SUBCASE("logits left unwritten: gated as unwritten, and the one-ulp rule decides the flip") {
    std::vector<float> poisoned(own.size(), NAN);
    measure::CaseCheck check = judged(poisoned);
    CHECK_FALSE(check.passed);
    CHECK(check.routing_note.find("ulps below its top-") != std::string::npos);
    CHECK(check.metrics["L0.logits"]["nonfinite"].get<int>() == cfg.n_experts);
  }
  remove_tree(dir);
}

TEST_CASE("a near-tie flip whose consequences change later layers' experts is judged against the oracle routed alike") {
  // A seed and context where taking the neighbour across layer 0's top-k
  // boundary changes the experts of a later layer too (the later layer sees
  // another input). The later change is the oracle's own answer for that
  // input, so it is no difference of the kernel's.
  Tiny t;
  const kimi::KimiConfig& cfg = t.w.cfg;
  measure::OracleCase ref, flipped;
  kimi::Routing kernel;
  int kept_out = -1, taken_in = -1;
  bool found = false;
  for (int seed = 0; seed < 64 && !found; ++seed) {
    ref = measure::compute_oracle_case(t.w, seed, 5);
    const std::vector<int> order = ranked(ref.out.router_logits[0]);
    kept_out = order[cfg.n_active - 1];
    taken_in = order[cfg.n_active];
    kernel.assign(cfg.layers(), {});
    kernel[0] = ref.out.topk[0];
    std::replace(kernel[0].begin(), kernel[0].end(), kept_out, taken_in);
    flipped = measure::compute_oracle_case(t.w, seed, 5, &kernel);
    for (int i = 1; i < cfg.layers(); ++i) {
      std::set<int> a(flipped.out.topk[i].begin(), flipped.out.topk[i].end());
      std::set<int> b(ref.out.topk[i].begin(), ref.out.topk[i].end());
      found = found || a != b;
    }
  }
  REQUIRE_MESSAGE(found, "no seed below 64 where a layer-0 flip changes a later layer's experts");
  std::string err, dir;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-validate-test-", &dir, &err), err);
  const std::string file = join_path(dir, "case.safetensors");
  flipped.out.router_logits.clear();  // a kernel that does not report them
  REQUIRE_MESSAGE(measure::write_case_outputs(file, cfg, flipped.state, flipped.out, &err), err);
  // As if the oracle's two logits in layer 0 were neighbours.
  std::vector<float>& logits = ref.out.router_logits[0];
  logits[taken_in] = bf16_to_float(uint16_t(float_to_bf16(logits[kept_out]) - 1));
  measure::Gate gate;
  measure::CaseCheck check;
  REQUIRE_MESSAGE(measure::check_case(cfg, ref, file, gate, &check, &err), err);
  CHECK_FALSE(check.experts_match);
  REQUIRE_MESSAGE(measure::recheck_near_ties(t.w, ref, file, gate, &check, &err), err);
  CHECK(check.passed);
  CHECK(check.routing_note.find("layer(s) 0 (1.0 ulps) of its logits, within one bf16 ulp;") !=
        std::string::npos);  // layer 0 alone flipped
  CHECK(check.metrics["hidden"]["cosine"].get<double>() > 0.99999);
  remove_tree(dir);
}

TEST_CASE("each layer's attention output is checked: dropped, off in scale or unwritten, it fails") {
  // On random caches the MLA attention moves the hidden output too little
  // for its cosine to see it (RESULTS.md, "How much the validation sees of
  // the attention"), so the runner reports each layer's attention output
  // and validation checks it.
  Tiny t;
  const kimi::KimiConfig& cfg = t.w.cfg;
  const measure::OracleCase ref = measure::compute_oracle_case(t.w, 3, 5);
  REQUIRE(ref.out.attn_out.size() == size_t(cfg.layers()));
  int mla = -1;
  for (int i = 0; i < cfg.layers(); ++i) {
    CHECK(ref.out.attn_out[i].size() == size_t(cfg.attn_out_dim(i)));
    if (!cfg.is_kda(i)) mla = i;
  }
  REQUIRE_MESSAGE(mla >= 0, "the tiny preset has an MLA layer");
  const std::string name = "L" + std::to_string(mla) + ".attn_out";
  std::string err, dir;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-validate-test-", &dir, &err), err);
  const std::string file = join_path(dir, "case.safetensors");
  auto check = [&](const kimi::StepOutput& out) {
    measure::CaseCheck c;
    REQUIRE_MESSAGE(measure::write_case_outputs(file, cfg, ref.state, out, &err), err);
    REQUIRE_MESSAGE(measure::check_case(cfg, ref, file, measure::Gate{}, &c, &err), err);
    return c;
  };
  auto with_mla_output = [&](auto f) {
    kimi::StepOutput out = ref.out;
    for (uint16_t& v : out.attn_out[mla]) v = f(v);
    return out;
  };

  const measure::CaseCheck exact = check(ref.out);
  CHECK(exact.passed);
  for (int i = 0; i < cfg.layers(); ++i)
    CHECK(exact.metrics["L" + std::to_string(i) + ".attn_out"]["cosine"].get<double>() > 0.999999);

  SUBCASE("dropped") {
    const measure::CaseCheck c = check(with_mla_output([](uint16_t) { return uint16_t(0); }));
    CHECK_FALSE(c.passed);
    CHECK(c.failure.find(name + ": cosine") == 0);
  }
  SUBCASE("5% low: cosine 1, the relative error fails it") {
    const measure::CaseCheck c =
        check(with_mla_output([](uint16_t v) { return float_to_bf16(0.95f * bf16_to_float(v)); }));
    CHECK(c.metrics[name]["cosine"].get<double>() > 0.9999);
    CHECK_FALSE(c.passed);
    CHECK(c.failure.find(name + ": relative L2 error") == 0);
  }
  SUBCASE("unwritten") {
    const measure::CaseCheck c = check(with_mla_output([](uint16_t) { return uint16_t(0xffff); }));
    CHECK_FALSE(c.passed);
    CHECK(c.failure == name + ": " + std::to_string(cfg.mla_o_dim()) + " of " + std::to_string(cfg.mla_o_dim()) +
                           " values NaN/Inf or unwritten");
  }
  SUBCASE("not reported (a variant of ABI version 2): not judged") {
    kimi::StepOutput out = ref.out;
    for (auto& layer : out.attn_out) layer.clear();
    const measure::CaseCheck c = check(out);
    CHECK(c.passed);
    CHECK_FALSE(c.metrics.contains(name));
  }
  remove_tree(dir);
}

TEST_CASE("the gate's relative L2 error catches an output off in scale, which cosine cannot") {
  Tiny t;
  const measure::OracleCase ref = measure::compute_oracle_case(t.w, 3, 5);
  kimi::StepOutput out = ref.out;
  for (uint16_t& v : out.hidden) v = float_to_bf16(1.05f * bf16_to_float(v));
  std::string err, dir;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-validate-test-", &dir, &err), err);
  const std::string file = join_path(dir, "case.safetensors");
  REQUIRE_MESSAGE(measure::write_case_outputs(file, t.w.cfg, ref.state, out, &err), err);
  measure::CaseCheck c;
  REQUIRE_MESSAGE(measure::check_case(t.w.cfg, ref, file, measure::Gate{}, &c, &err), err);
  CHECK(c.metrics["hidden"]["cosine"].get<double>() > 0.9999);
  CHECK_FALSE(c.passed);
  CHECK(c.failure.find("hidden: relative L2 error") == 0);
  measure::Gate loose;
  loose.max_rel_l2 = 0.5;
  REQUIRE_MESSAGE(measure::check_case(t.w.cfg, ref, file, loose, &c, &err), err);
  CHECK(c.passed);
  remove_tree(dir);
}

// A seed's cases share the layers before the first M layer; computed once
// and finished per context (as the OraclePool does), each case must be the
// whole step's answer, bit for bit, state and outputs.
TEST_CASE("a case finished from its seed's shared layers is the whole step's, and the pool hands out the same") {
  Tiny t;
  const kimi::KimiConfig& cfg = t.w.cfg;
  auto check_same = [&](const measure::OracleCase& got, const measure::OracleCase& want) {
    CHECK(got.seed == want.seed);
    CHECK(got.context == want.context);
    CHECK(got.state.context == want.state.context);
    CHECK(got.out.hidden == want.out.hidden);
    CHECK(got.out.topk == want.out.topk);
    CHECK(got.out.router_logits == want.out.router_logits);
    CHECK(got.out.ckv_row == want.out.ckv_row);
    CHECK(got.out.krope_row == want.out.krope_row);
    CHECK(got.out.attn_out == want.out.attn_out);
    REQUIRE(got.state.layers.size() == want.state.layers.size());
    for (int i = 0; i < cfg.layers(); ++i) {
      INFO("layer " << i);
      const kimi::LayerState &g = got.state.layers[i], &w = want.state.layers[i];
      CHECK(g.S == w.S);
      CHECK(g.cq == w.cq);
      CHECK(g.ck == w.ck);
      CHECK(g.cv == w.cv);
      CHECK(g.c_kv == w.c_kv);
      CHECK(g.k_rope == w.k_rope);
    }
  };

  const measure::SeedPrefix prefix = measure::compute_seed_prefix(t.w, 4);
  int first_m = 0;
  while (cfg.is_kda(first_m)) ++first_m;
  CHECK(prefix.layers == first_m);
  REQUIRE(prefix.layers > 0);  // there is something to share
  for (int context : {0, 1, 5, 130}) {
    INFO("context " << context);
    check_same(measure::finish_oracle_case(t.w, prefix, context), measure::compute_oracle_case(t.w, 4, context));
  }
  // The contexts really differ after the shared layers.
  CHECK(measure::finish_oracle_case(t.w, prefix, 5).out.hidden !=
        measure::finish_oracle_case(t.w, prefix, 130).out.hidden);

  // The pool: two seeds at two contexts, taken in another order than asked,
  // one seed asked again after its prefix was let go.
  measure::OraclePool pool(t.w);
  for (int seed : {4, 9})
    for (int context : {5, 130}) pool.prefetch(seed, context);
  check_same(pool.take(9, 130), measure::compute_oracle_case(t.w, 9, 130));
  check_same(pool.take(4, 5), measure::compute_oracle_case(t.w, 4, 5));
  check_same(pool.take(4, 130), measure::compute_oracle_case(t.w, 4, 130));
  check_same(pool.get(4, 1), measure::compute_oracle_case(t.w, 4, 1));
  check_same(pool.take(9, 5), measure::compute_oracle_case(t.w, 9, 5));
}
