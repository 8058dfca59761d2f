// Validation: one case's outputs from the runner against the oracle's, output
// by output (hidden, each K layer's S and conv windows, each M layer's new
// cache rows), by cosine similarity and relative L2 error, with NaN/Inf and
// unwritten (poisoned) values counted. The gate is applied here, in ktune's
// own process, so a variant cannot fake it.
#pragma once
#include <string>

#include "base/json.h"
#include "kernels/kimi/oracle.h"

namespace ktune::measure {

struct Gate {
  double min_cosine = 0.99;  // the spec asks for at least 0.98
  json to_json() const { return {{"min_cosine", min_cosine}}; }
};

// The oracle's answer for one (seed, context) case.
struct OracleCase {
  int seed = 0, context = 0;
  kimi::KimiState state;   // after the step
  kimi::StepOutput out;
};

OracleCase compute_oracle_case(const kimi::KimiWeights& w, int seed, int context);

struct CaseCheck {
  int seed = 0, context = 0;
  bool passed = false;
  bool experts_match = true;  // same set of experts per layer (not gated: a flip shows in the outputs)
  std::string failure;        // the first output that failed, and why
  json metrics = json::object();  // output name -> {cosine, rel_l2, nonfinite, n}
  json to_json() const;
};

// Reads a runner output file (runner.h) and compares it with `ref`.
bool check_case(const kimi::KimiConfig& cfg, const OracleCase& ref, const std::string& file, const Gate& gate,
                CaseCheck* out, std::string* err);

}  // namespace ktune::measure
