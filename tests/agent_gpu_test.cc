// GPU tests (doctest suite and CTest label "gpu"): the CUDA megakernel and
// baseline on the real device, against the golden vectors and the oracle,
// launches counted by CUPTI, and a faulting and a hanging variant turned
// into attempt outcomes. Where there is no GPU they report SKIPPED with
// the reason.
#include <doctest/doctest.h>

#include <cstdio>

#include "agent/evaluator.h"
#include "base/fs.h"
#include "kernels/kimi/golden.h"
#include "kernels/kimi/templates.h"
#include "measure/golden_check.h"
#include "measure/runner_backend.h"
#include "sandbox/build_cache.h"
#include "tests/measure_fixture.h"

using namespace ktune;

namespace {

bool have_gpu() {
  kimi::KimiConfig cfg;
  std::string err;
  kimi::KimiConfig::preset("tiny", &cfg, &err);
  agent::BackendSpec spec;
  if (!agent::backend_spec("cuda", &spec, &err) || !measure::make_backend("cuda", cfg, &err)) {
    MESSAGE("SKIPPED (no GPU): " << err);
    return false;
  }
  return true;
}

// Where the tests run from another tree (the device machine), these point
// at the copy of the sources and the built runner.
std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::string test_data(const std::string& name) {
  std::string text, err;
  std::string dir = env_or("KTUNE_SOURCE_DIR", KTUNE_SOURCE_DIR);
  REQUIRE_MESSAGE(read_file(dir + "/tests/data/" + name, &text, &err), err);
  return text;
}

// Renders and builds a variant for the GPU; returns the cubin path.
std::string build_cuda(const kimi::KimiConfig& cfg, const std::string& tmpl, const json& knobs,
                       const std::string& body = "", agent::Variant* out = nullptr) {
  agent::BackendSpec spec;
  std::string err;
  REQUIRE(agent::backend_spec("cuda", &spec, &err));
  agent::Variant v;
  REQUIRE_MESSAGE(agent::render_variant(cfg, spec, *kimi::find_template(tmpl), knobs, body, &v, &err), err);
  sandbox::BuildCache cache(join_path(cache_dir(), "builds"));
  sandbox::BuildResult r = cache.build(spec.build_request(v.source));
  REQUIRE_MESSAGE(r.ok, r.log);
  std::printf("  built %s %s: %s\n", tmpl.c_str(), knobs.dump().c_str(), r.resources.dump().c_str());
  if (out) *out = v;
  return r.artifact;
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("GPU: megakernel and baseline reproduce golden kimi-tiny") {
    if (!have_gpu()) return;
    std::string dir = kimi::find_golden_dir();
    if (dir.empty()) {
      MESSAGE("SKIPPED: golden vectors not found (set KTUNE_GOLDEN_DIR)");
      return;
    }
    kimi::GoldenFile g;
    std::string err;
    REQUIRE_MESSAGE(g.load(dir + "/kimi-tiny.safetensors", &err), err);
    struct Case {
      std::string tmpl;
      json knobs;
    };
    for (const Case& c :
         {Case{"kimi-mega-cuda", {{"threads", 128}}},
          Case{"kimi-mega-cuda", {{"dequant", "fma"}, {"stages", 0}, {"feed", "cp_async"}, {"barrier", "counter"}}},
          Case{"kimi-mega-cuda", {{"barrier", "coop"}, {"threads", 512}, {"stages", 2}, {"feed", "cp_async"}}},
          // The light warpgroup: 512 threads, registers lent by two warpgroups (setmaxnreg).
          Case{"kimi-mega-cuda", {{"light_warps", 4}}},
          Case{"kimi-base-cuda", json::object()}}) {
      std::string cubin = build_cuda(g.weights.cfg, c.tmpl, c.knobs);
      auto be = measure::make_backend("cuda", g.weights.cfg, &err);
      REQUIRE_MESSAGE(be, err);
      REQUIRE_MESSAGE(be->init(g.weights, 512, &err), err);
      REQUIRE_MESSAGE(be->load(cubin, &err), err);
      kimi::GoldenOptions opts;
      opts.experts_as_set = true;
      opts.refeed = true;
      measure::GoldenSummary sum;
      REQUIRE_MESSAGE(measure::check_golden_file(*be, g, opts, &sum, &err), err);
      std::printf("gpu %s %s: %s\n", c.tmpl.c_str(), c.knobs.dump().c_str(), sum.describe().c_str());
      for (auto& f : sum.failures) std::printf("  FAIL %s\n", f.c_str());
      CHECK(sum.failed == 0);
      if (c.tmpl == "kimi-mega-cuda") CHECK(sum.launches == 1);
      else CHECK(sum.launches > 100);
    }
  }

  TEST_CASE("GPU: a variant's prepare table runs once per load, before the first step, on the weights alone") {
    // tests/measure_prepare_test.cc's first case on the device.
    if (!have_gpu()) return;
    kimi::KimiConfig cfg;
    std::string err;
    REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
    const kimi::KimiWeights w = measure::testing::generated_weights(cfg, 5);
    const unsigned sum = measure::testing::prepare_router_sum(w);
    REQUIRE(sum != 0);
    auto prepare_variant = [&](int mode) {
      return build_cuda(cfg, "kimi-mega-cuda", {}, "#define KT_TEST_PREPARE " + std::to_string(mode) + "\n" +
                                                       test_data("cuda_prepare.cu"));
    };
    using measure::testing::step_words;
    using measure::testing::words;
    auto be = measure::make_backend("cuda", cfg, &err);
    REQUIRE_MESSAGE(be, err);
    REQUIRE_MESSAGE(be->init(w, 512, &err), err);
    REQUIRE_MESSAGE(be->load(prepare_variant(1), &err), err);
    CHECK(be->declared_launches() == 1);
    // {router sum, prepare runs, steps, 2 * sum + 1 (k2 after k1), 1: prepare saw no step arguments}
    CHECK(step_words(*be, cfg, 5) == words({sum, 1, 1, 2 * sum + 1, 1}));
    CHECK(step_words(*be, cfg, 6, false) == words({sum, 1, 2, 2 * sum + 1, 1}));
    REQUIRE_MESSAGE(be->load(prepare_variant(1), &err), err);
    CHECK(step_words(*be, cfg, 5) == words({sum, 1, 1, 2 * sum + 1, 1}));
    REQUIRE_MESSAGE(be->load(prepare_variant(0), &err), err);
    CHECK(step_words(*be, cfg, 5) == words({0, 0, 1, 0, 0}));
    // A malformed table is refused by name.
    CHECK_FALSE(be->load(prepare_variant(2), &err));
    CHECK(err == "ktune_num_prepare = -1 is out of range (0..64)");
  }

  TEST_CASE("GPU: a prepare kernel that faults is a device_fault, one that hangs a timeout, and the runner goes on") {
    if (!have_gpu()) return;
    kimi::KimiConfig cfg;
    std::string err, work;
    REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
    auto prepare_variant = [&](int mode) {
      return build_cuda(cfg, "kimi-mega-cuda", {}, "#define KT_TEST_PREPARE " + std::to_string(mode) + "\n" +
                                                       test_data("cuda_prepare.cu"));
    };
    const std::string hang = prepare_variant(4), fault = prepare_variant(5), good = prepare_variant(1);
    REQUIRE(make_temp_dir("/tmp", "ktune-gpu-test-", &work, &err));
    measure::RunnerClient runner;
    measure::testing::start_runner(&runner, env_or("KTUNE_RUNNER", std::string(KTUNE_BINARY_DIR) + "/ktune-runner"),
                                   "cuda", "tiny", work);
    auto load = [&](const std::string& cubin) { return runner.call({{"op", "load"}, {"artifact", cubin}}, 5); };
    measure::RunnerReply r = load(fault);
    std::printf("gpu prepare fault: %s: %s\n", r.outcome.c_str(), r.error.c_str());
    CHECK(r.outcome == "device_fault");
    CHECK(r.error.find("prepare launch 0 (ktune_k1) failed: ") == 0);
    r = load(hang);
    std::printf("gpu prepare hang: %s: %s\n", r.outcome.c_str(), r.error.c_str());
    CHECK(r.outcome == "timeout");
    r = load(good);
    CHECK(r.ok);
    CHECK(runner.starts() == 3);
    runner.stop();
    remove_tree(work);
  }

  TEST_CASE("GPU: megakernel knob settings validate against the oracle; faults and hangs are outcomes") {
    if (!have_gpu()) return;
    kimi::KimiConfig cfg;
    std::string err;
    REQUIRE(kimi::KimiConfig::preset("small", &cfg, &err));
    kimi::KimiWeights w;
    REQUIRE_MESSAGE(kimi::load_weights(cfg, 0, &w, &err), err);
    agent::BackendSpec spec;
    REQUIRE(agent::backend_spec("cuda", &spec, &err));
    std::string work;
    REQUIRE(make_temp_dir("/tmp", "ktune-gpu-test-", &work, &err));
    measure::RunnerClient runner;
    measure::testing::start_runner(&runner, env_or("KTUNE_RUNNER", std::string(KTUNE_BINARY_DIR) + "/ktune-runner"),
                                   "cuda", "small", work);
    measure::OraclePool oracle(w);
    agent::Evaluator ev(w, spec, runner, oracle, work + "/runner", measure::Gate{}, 20);
    std::vector<std::pair<int, int>> cases;
    for (int s : {11, 12, 13})
      for (int ctx : cfg.validate_contexts) cases.push_back({s, ctx});
    auto validate = [&](const std::string& cubin, int max_launches) {
      agent::Measurement m;
      if (ev.load(cubin, &m)) ev.validate(cases, max_launches, &m);
      return m;
    };
    for (const json& knobs : {json::object(),
                              json{{"blocks_per_sm", 2},
                                   {"threads", 128},
                                   {"barrier", "counter"},
                                   {"attn_rows", 16},
                                   {"stages", 0},
                                   {"feed", "cp_async"}},
                              json{{"unroll", 8},
                                   {"waves", 2},
                                   {"load_hint", "plain"},
                                   {"prefetch", 0},
                                   {"stages", 0},
                                   {"feed", "cp_async"}},
                              json{{"attn_heads", 32}, {"dequant", "fma"}, {"stages", 6}, {"feed", "cp_async"}},
                              json{{"kda_start", "heads"}, {"handoff", "fence"}}}) {
      agent::Measurement m = validate(build_cuda(cfg, "kimi-mega-cuda", knobs), 1);
      std::printf("gpu small %s: %s %s launches %d\n", knobs.dump().c_str(), m.outcome.c_str(), m.error.c_str(),
                  m.launches);
      CHECK(m.outcome == "ok");
      CHECK(m.launches == 1);
    }
    // An out-of-bounds write: a device fault, then a fresh runner works.
    agent::Measurement fault = validate(build_cuda(cfg, "kimi-mega-cuda", {}, test_data("cuda_fault.cu")), 1);
    std::printf("gpu fault: %s: %s\n", fault.outcome.c_str(), fault.error.c_str());
    CHECK(fault.outcome == "device_fault");
    CHECK(validate(build_cuda(cfg, "kimi-mega-cuda", {}), 1).outcome == "ok");
    // A hang: killed at the deadline, a timeout, then a fresh runner works.
    agent::Evaluator quick(w, spec, runner, oracle, work + "/runner", measure::Gate{}, 5);
    agent::Measurement hang;
    REQUIRE(quick.load(build_cuda(cfg, "kimi-mega-cuda", {}, test_data("cuda_hang.cu")), &hang));
    quick.validate({{1, 64}}, 1, &hang);
    std::printf("gpu hang: %s: %s\n", hang.outcome.c_str(), hang.error.c_str());
    CHECK(hang.outcome == "timeout");
    CHECK(validate(build_cuda(cfg, "kimi-mega-cuda", {}), 1).outcome == "ok");
    CHECK(runner.starts() == 3);
    runner.stop();
    remove_tree(work);
  }
}
