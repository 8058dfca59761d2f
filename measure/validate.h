// Validation: one case's outputs from the runner against the oracle's, output
// by output (hidden, each K layer's S and conv windows, each M layer's new
// cache rows, each layer's attention output and router logits), by cosine similarity and
// relative L2 error, with NaN/Inf and unwritten (poisoned) values counted.
// The gate is applied here, in ktune's own process, so a variant cannot fake
// it.
#pragma once
#include <string>

#include "base/json.h"
#include "kernels/kimi/oracle.h"

namespace ktune::measure {

struct Gate {
  double min_cosine = 0.99;  // the spec asks for at least 0.98
  // Cosine does not see a wrong scale (an attention output 5% low has
  // cosine 1). Valid kernels measure at most ~0.004 on every output (bf16
  // rounding; RESULTS.md, runs 192 and 194), under a seventh of this.
  double max_rel_l2 = 0.03;
  json to_json() const { return {{"min_cosine", min_cosine}, {"max_rel_l2", max_rel_l2}}; }
};

// The oracle's answer for one (seed, context) case.
struct OracleCase {
  int seed = 0, context = 0;
  kimi::KimiState state;   // after the step
  kimi::StepOutput out;
};

// With `routing`: the oracle routed as given (kimi::oracle_step).
OracleCase compute_oracle_case(const kimi::KimiWeights& w, int seed, int context,
                               const kimi::Routing* routing = nullptr);

// What every context of a seed shares in its oracle answer: the layers
// before the first M layer (the same token and K states at every context;
// only the M layers' caches differ). An attempt validates 3 seeds at 3
// contexts; each seed's prefix is computed once, not three times.
struct SeedPrefix {
  int seed = 0, layers = 0;    // layers [0, layers) are done
  kimi::KimiState state;       // those layers' states after the step
  std::vector<double> hidden;  // the hidden after them
  kimi::StepOutput out;        // their outputs
};
SeedPrefix compute_seed_prefix(const kimi::KimiWeights& w, int seed);
// compute_oracle_case(w, prefix.seed, context), bit for bit, from the prefix.
OracleCase finish_oracle_case(const kimi::KimiWeights& w, const SeedPrefix& prefix, int context);

struct CaseCheck {
  int seed = 0, context = 0;
  bool passed = false;
  bool experts_match = true;  // same set of experts per layer (not gated: a flip shows in the outputs)
  std::string failure;        // the first output that failed, and why
  std::string routing_note;   // how the experts differ, when they do (recheck_near_ties)
  json metrics = json::object();  // output name -> {cosine, rel_l2, nonfinite, n}
  json to_json() const;
};

// One case's outputs as the runner writes them for the client to compare
// (safetensors: hidden, topk, L{i}.S/cq/ck/cv, L{i}.c_kv_row/k_rope_row, and
// L{i}.attn_out and L{i}.logits when the backend reports them).
bool write_case_outputs(const std::string& path, const kimi::KimiConfig& cfg, const kimi::KimiState& st,
                        const kimi::StepOutput& out, std::string* err);

// Reads a runner output file (runner.h) and compares it with `ref`.
bool check_case(const kimi::KimiConfig& cfg, const OracleCase& ref, const std::string& file, const Gate& gate,
                CaseCheck* out, std::string* err);

// Whether `chosen` (k experts) is the top-k of `logits` (bf16 values) once
// ties and one unit in the last place are allowed: every chosen logit is at
// least every other one less one bf16 ulp. A kernel that sums the router's
// dot products in another order than the oracle may round a logit one ulp
// the other way and so pick the neighbour across the top-k boundary; the
// spec's rounding points cannot rule that out.
bool within_rounding_of_topk(const std::vector<float>& logits, const std::vector<int>& chosen);

// How far `chosen` falls short of the top-k of `logits`: the highest logit
// left out minus the lowest one chosen, in bf16 ulps of the larger (0 when
// `chosen` is a top-k; infinite for an expert out of range or chosen twice).
double topk_shortfall_ulps(const std::vector<float>& logits, const std::vector<int>& chosen);

// After check_case found other experts than the oracle's: when in every
// layer that differs the kernel's choice is explained by rounding, the case
// is checked again, as strictly, against the oracle routed as the kernel
// routed (`check` is replaced and says so in routing_note); otherwise
// `check` stands, and routing_note (and `failure`, when it failed) says
// which layer and how many ulps short. Layer by layer, against the oracle
// routed as the kernel routed the layers before (a flip changes what later
// layers see), a choice is explained by rounding when
// - the kernel reports its logits (abi.h, version 4 on): its experts are
//   the top-k of its own logits; the logits are then gated with the other
//   outputs, so a flip can be only as deep as the logits' own error allows
//   (a kernel summing in another order than the oracle, and rounding its
//   inputs at other points, the MLA's absorbed form among them, moved a
//   near-tie by 3 ulps once in the ~1300 cases of RESULTS runs 296-302);
// - it does not: its experts are within one bf16 ulp of the top-k of the
//   oracle's logits (within_rounding_of_topk).
bool recheck_near_ties(const kimi::KimiWeights& w, const OracleCase& ref, const std::string& file, const Gate& gate,
                       CaseCheck* check, std::string* err);

}  // namespace ktune::measure
