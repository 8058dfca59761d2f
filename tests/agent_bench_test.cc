// `ktune bench` (agent/bench.h) through the real binary on the host
// backend: validation's worst figures, timing (each step alone, and batches
// of steps back to back), and --rounds, which times the variants in turn and
// reports each one's median of its rounds' medians; and validation alone at
// chosen cases, repeated, with every failing case named.
#include <doctest/doctest.h>

#include <algorithm>

#include "agent/backend.h"
#include "agent/bench.h"
#include "agent/evaluator.h"
#include "base/fs.h"
#include "base/json.h"
#include "kernels/kimi/templates.h"
#include "sandbox/process.h"
#include "tests/traces_fixture.h"

using namespace ktune;
using traces::testing::TempDir;

namespace {

sandbox::ProcessResult run_bench_cli(const TempDir& tmp, std::vector<std::string> args) {
  sandbox::ProcessSpec spec;
  spec.argv = {std::string(KTUNE_BINARY_DIR) + "/ktune", "bench", "--backend", "host", "--size", "tiny"};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.workdir = tmp.file("work");
  spec.env = sandbox::clean_env(spec.workdir);
  spec.limits.timeout_s = 300;
  sandbox::ProcessResult r;
  std::string err;
  REQUIRE_MESSAGE(sandbox::run_process(spec, &r, &err), err);
  return r;
}

}  // namespace

TEST_CASE("bench --rounds times every variant once a round, in turn, and reports the median of the rounds") {
  TempDir tmp;
  sandbox::ProcessResult r = run_bench_cli(tmp, {"--no-baseline", "--seeds", "1", "--samples", "3", "--rounds", "3",
                                                 "--knobs", "{}", "--knobs", R"({"threads":1})", "--json",
                                                 tmp.file("bench.json")});
  REQUIRE_MESSAGE(r.ok(), r.describe() << ": " << r.err << r.out);
  std::string err;
  CHECK(r.out.find("the median of 3 rounds' medians") != std::string::npos);
  CHECK(r.out.find("each round's median (us), in the order timed:") != std::string::npos);
  CHECK(r.out.find("back to back (us per step: batches of 32 steps") != std::string::npos);

  std::string text;
  REQUIRE_MESSAGE(read_file(tmp.file("bench.json"), &text, &err), err);
  const json results = json::parse(text);
  REQUIRE(results["variants"].size() == 2);
  for (const json& v : results["variants"]) {
    CHECK(v["outcome"] == "ok");
    // Every gated output, the layers' attention outputs included, with its
    // worst cosine and relative error over the validation cases.
    for (const char* output : {"hidden", "S", "conv", "cache_row", "attn_out"}) {
      INFO(output);
      CHECK(v["worst_cosine"].value(output, 0.0) > 0.999);
      CHECK(v["worst_rel_l2"].value(output, 1.0) < 0.05);
    }
    REQUIRE(!v["timings"].empty());
    for (const json& t : v["timings"]) {
      std::vector<double> rounds = t["rounds_us"].get<std::vector<double>>();
      REQUIRE(rounds.size() == 3);
      for (double us : rounds) CHECK(us > 0);
      std::sort(rounds.begin(), rounds.end());
      CHECK(t["median_us"].get<double>() == doctest::Approx(rounds[1]));
      // Each round also timed 5 batches of 32 steps back to back; the
      // figure is the median of the rounds' medians of the batches' means.
      CHECK(t["back_to_back_steps"] == 32);
      std::vector<double> batches = t["back_to_back_us"].get<std::vector<double>>();
      REQUIRE(batches.size() == 5);
      for (double us : batches) CHECK(us > 0);
      std::vector<double> b2b_rounds = t["back_to_back_rounds_us"].get<std::vector<double>>();
      REQUIRE(b2b_rounds.size() == 3);
      std::sort(b2b_rounds.begin(), b2b_rounds.end());
      CHECK(b2b_rounds[0] > 0);
      CHECK(t["back_to_back_median_us"].get<double>() == doctest::Approx(b2b_rounds[1]));
    }
  }
}

TEST_CASE("bench --case, --contexts and --repeat choose the validation cases; a context outside the cache is refused") {
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
  agent::BenchOptions o;
  std::vector<std::pair<int, int>> cases;
  REQUIRE_MESSAGE(agent::bench_cases(o, cfg, &cases, &err), err);
  // The default: 3 seeds at the session's contexts (5, 130) and the timed one (130).
  CHECK(cases == std::vector<std::pair<int, int>>{{1001, 5}, {1001, 130}, {1002, 5}, {1002, 130}, {1003, 5}, {1003, 130}});
  o.seeds = 2;
  o.contexts = {7};
  o.repeat = 2;
  REQUIRE_MESSAGE(agent::bench_cases(o, cfg, &cases, &err), err);
  CHECK(cases == std::vector<std::pair<int, int>>{{1001, 7}, {1002, 7}, {1001, 7}, {1002, 7}});
  o.cases = {{42, 0}, {9, 133}};  // exact cases win over --seeds and --contexts
  o.repeat = 1;
  REQUIRE_MESSAGE(agent::bench_cases(o, cfg, &cases, &err), err);
  CHECK(cases == o.cases);
  o.cases = {{42, cfg.max_context()}};
  CHECK_FALSE(agent::bench_cases(o, cfg, &cases, &err));
  CHECK(err.find("outside the tiny config's cache") != std::string::npos);
  o.cases = {{42, -1}};
  CHECK_FALSE(agent::bench_cases(o, cfg, &cases, &err));

  TempDir tmp;
  sandbox::ProcessResult bad = run_bench_cli(tmp, {"--no-baseline", "--validate-only", "--case", "42"});
  CHECK(bad.exit_code != 0);
  CHECK(bad.err.find("expected SEED:CONTEXT, got '42'") != std::string::npos);
  bad = run_bench_cli(tmp, {"--no-baseline", "--validate-only", "--case", "42:100000"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("context 100000 is outside") != std::string::npos);
}

TEST_CASE("bench --validate-only validates the chosen cases and stops; a wrong variant's failing cases are named") {
  TempDir tmp;
  sandbox::ProcessResult r = run_bench_cli(tmp, {"--no-baseline", "--validate-only", "--case", "77:3", "--case",
                                                 "78:130", "--repeat", "2", "--json", tmp.file("valid.json")});
  REQUIRE_MESSAGE(r.ok(), r.describe() << ": " << r.err << r.out);
  CHECK(r.out.find("not timed (--validate-only)") != std::string::npos);
  CHECK(r.out.find("worst cosine over 4 cases") != std::string::npos);
  CHECK(r.out.find("failed: 0 of 4") != std::string::npos);
  CHECK(r.out.find("megakernel us") == std::string::npos);  // no timing table
  std::string text, err;
  REQUIRE_MESSAGE(read_file(tmp.file("valid.json"), &text, &err), err);
  const json results = json::parse(text);
  REQUIRE(results["variants"].size() == 1);
  const json& cases = results["variants"][0]["cases"];
  REQUIRE(cases.size() == 4);  // each case's check, in the order run
  CHECK(cases[0]["seed"] == 77);
  CHECK(cases[1]["context"] == 130);
  CHECK(cases[2]["seed"] == 77);
  for (const json& c : cases) {
    CHECK(c["passed"] == true);
    CHECK(c["metrics"].contains("L0.logits"));  // the host kernel reports its router logits (ABI 4)
  }
  CHECK(results["variants"][0]["timings"].empty());

  // A recorded variant that copies the input token to the output: every
  // case fails, each is named, and each repeated case failed every time.
  kimi::KimiConfig cfg;
  agent::BackendSpec spec;
  std::string source;
  REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
  REQUIRE_MESSAGE(agent::backend_spec("host", &spec, &err), err);
  REQUIRE(read_file(std::string(KTUNE_SOURCE_DIR) + "/tests/data/host_wrong.cc", &source, &err));
  agent::Variant v;
  REQUIRE_MESSAGE(agent::render_variant(cfg, spec, *kimi::megakernel_template("host"), json::object(), source, &v, &err),
                  err);
  const std::string db = tmp.file("runs.sqlite");
  {
    traces::Store store;
    int64_t session = 0;
    REQUIRE_MESSAGE(store.open(db, &err), err);
    REQUIRE_MESSAGE(store.create_session({{"task", "kimi"}, {"size", "tiny"}, {"backend", "host"}}, &session, &err), err);
    REQUIRE_MESSAGE(store.record(session, "variant", 0,
                                 {{"id", v.id}, {"template", v.template_name}, {"backend", "host"}, {"source", v.source},
                                  {"knobs", v.knobs}, {"origin", "test"}},
                                 &err),
                    err);
  }
  r = run_bench_cli(tmp, {"--no-baseline", "--validate-only", "--db", db, "--variant", v.id.substr(0, 12), "--case",
                          "77:3", "--case", "78:130", "--repeat", "2"});
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("wrong_answer") != std::string::npos);
  CHECK(r.out.find("failed: 4 of 4") != std::string::npos);
  CHECK(r.out.find("seed 77 context 3: ") != std::string::npos);
  CHECK(r.out.find("seed 78 context 130: ") != std::string::npos);
  CHECK(r.out.find("seed 77 context 3 failed 2 of 2 runs") != std::string::npos);
  CHECK(r.out.find("seed 78 context 130 failed 2 of 2 runs") != std::string::npos);
}
