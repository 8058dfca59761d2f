// `ktune bench` (agent/bench.h) through the real binary on the host
// backend: validation's worst figures, timing (each step alone, and batches
// of steps back to back), and --rounds, which times the variants in turn and
// reports each one's median of its rounds' medians.
#include <doctest/doctest.h>

#include <algorithm>

#include "base/fs.h"
#include "base/json.h"
#include "sandbox/process.h"
#include "tests/traces_fixture.h"

using namespace ktune;
using traces::testing::TempDir;

TEST_CASE("bench --rounds times every variant once a round, in turn, and reports the median of the rounds") {
  TempDir tmp;
  sandbox::ProcessSpec spec;
  spec.argv = {std::string(KTUNE_BINARY_DIR) + "/ktune", "bench", "--backend", "host", "--size", "tiny",
               "--no-baseline", "--seeds", "1", "--samples", "3", "--rounds", "3",
               "--knobs", "{}", "--knobs", R"({"threads":1})", "--json", tmp.file("bench.json")};
  spec.workdir = tmp.file("work");
  spec.env = sandbox::clean_env(spec.workdir);
  spec.limits.timeout_s = 300;
  sandbox::ProcessResult r;
  std::string err;
  REQUIRE_MESSAGE(sandbox::run_process(spec, &r, &err), err);
  REQUIRE_MESSAGE(r.ok(), r.describe() << ": " << r.err << r.out);
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
