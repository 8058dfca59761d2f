// The golden vectors (../shared/golden): loads a golden file, rebuilds each
// case's fed state, and compares a step function's outputs with the
// recorded ones, output by output. The oracle and every backend that can run
// the golden sizes are checked through this one path.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "base/compare.h"
#include "kernels/kimi/oracle.h"

namespace ktune::kimi {

struct GoldenCase {
  int index = 0;
  int seed = 0;
  int context = 0;
  int steps = 0;
};

struct GoldenFile {
  KimiWeights weights;
  std::vector<GoldenCase> cases;

  bool load(const std::string& path, std::string* err);
  KimiState fed_state(const GoldenCase& c, int capacity) const;
  std::vector<uint16_t> token(const GoldenCase& c) const;
};

struct GoldenCheck {
  std::string name;  // e.g. "case3.step1.2.S"
  Similarity sim;
  bool same_experts = true;  // for topk_idx entries
  bool ok = false;
};

// Runs `step` for every step of the case (each continuing from the last
// one's hidden and state) and compares hidden, S, windows, cache rows and
// experts against the file. `min_cosine` is the gate (0.9999 per the README).
using StepFn = std::function<bool(KimiState* state, const std::vector<uint16_t>& token, StepOutput* out,
                                  std::string* err)>;
struct GoldenOptions {
  double min_cosine = 0.9999;
  // Compare the chosen experts as sets (a kernel may list equal-logit
  // experts in another order; the sum they feed is the same).
  bool experts_as_set = false;
  // Feed every step from the golden file's own previous outputs instead of
  // from the step function's: each step then starts from an identical state,
  // which is how the spec validates a kernel (its own drift cannot flip a
  // near-tie in a later step).
  bool refeed = false;
};

bool check_golden_case(const GoldenFile& g, const GoldenCase& c, const StepFn& step, const GoldenOptions& opts,
                       std::vector<GoldenCheck>* checks, std::string* err);

// $KTUNE_GOLDEN_DIR, else the shared/golden folder beside the checkout,
// else /work/shared/golden; empty when none is found.
std::string find_golden_dir();

}  // namespace ktune::kimi
