// `ktune probe` and `ktune bench`: the measure phase on its own (device
// facts, bandwidth, launch and barrier cost, the floor per context), and
// the side-by-side benchmark of the baseline and a megakernel variant at
// every decode shape of the task, validated, timed by the same runner in
// the same run, with the speedup and the fraction of the floor reached.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"
#include "kernels/kimi/config.h"

namespace ktune::agent {

struct BenchOptions {
  std::string task = "kimi-linear";
  std::string size = "full";
  std::string backend = "cuda";
  std::vector<json> knob_sets;  // one megakernel variant each (defaults where absent); none: the defaults
  std::string db, variant;      // or: a variant recorded in a database (its source is used as is)
  int samples = 0, warmup = -1;
  int seeds = 3;
  // Validation cases: `cases` exactly (seed, context) when given, else
  // `seeds` seeds at `contexts` (none: every context a session validates at
  // and every timed one); each case `repeat` times, so an intermittent
  // answer shows as some repeats failing.
  std::vector<std::pair<int, int>> cases;
  std::vector<int> contexts;
  int repeat = 1;
  bool timing = true;  // false: validate only (no timing, table or profiles)
  uint64_t weights_seed = 0;
  std::string runner;
  std::string json_out;         // also write the results here
  bool with_baseline = true;
  int rounds = 1;               // times each variant is timed, in turn with the others (A B A B ...)
};

// The cases `ktune bench` validates at, as `o` says; an error for a context
// outside the cache the runner holds for `cfg`.
bool bench_cases(const BenchOptions& o, const kimi::KimiConfig& cfg, std::vector<std::pair<int, int>>* out,
                 std::string* err);

int run_probe(const std::string& backend, const std::string& size, const std::string& runner);
int run_bench(const BenchOptions& opts);

}  // namespace ktune::agent
