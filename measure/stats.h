// Statistics of timing samples and the noise-aware comparison the decide
// step uses: a candidate is faster only when its advantage exceeds both a
// minimum gain and the measured spread of the two medians.
#pragma once
#include <string>
#include <vector>

#include "base/json.h"

namespace ktune::measure {

struct SampleStats {
  size_t n = 0;
  double median = 0, p10 = 0, p90 = 0, mad = 0, min = 0, max = 0, mean = 0;
  // Robust relative standard error of the median: 1.2533 * 1.4826 * MAD / sqrt(n) / median.
  double rel_se() const;
  json to_json() const;
};

SampleStats summarize(std::vector<double> samples);

// A score over several contexts: the geometric mean of the medians, and its
// relative standard error.
struct Score {
  double us = 0;
  double rel_se = 0;
};
Score combine(const std::vector<SampleStats>& per_context);

struct Verdict {
  bool faster = false;
  double gain = 0;       // (best - candidate) / best
  double threshold = 0;  // what the gain had to exceed
  std::string reason;
};

// Is `candidate` faster than `best` beyond `min_gain` and beyond three
// combined standard errors?
Verdict judge(const Score& candidate, const Score& best, double min_gain);

}  // namespace ktune::measure
