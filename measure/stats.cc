#include "measure/stats.h"

#include <algorithm>
#include <cmath>

#include "base/text.h"

namespace ktune::measure {

namespace {
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  double pos = q * double(sorted.size() - 1);
  size_t lo = size_t(pos);
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}
}  // namespace

double SampleStats::rel_se() const {
  if (n == 0 || median <= 0) return 0;
  return 1.2533 * 1.4826 * mad / std::sqrt(double(n)) / median;
}

json SampleStats::to_json() const {
  return {{"n", n}, {"median_us", median}, {"p10_us", p10}, {"p90_us", p90}, {"mad_us", mad},
          {"min_us", min}, {"max_us", max}, {"mean_us", mean}};
}

SampleStats summarize(std::vector<double> s) {
  SampleStats r;
  r.n = s.size();
  if (s.empty()) return r;
  std::sort(s.begin(), s.end());
  r.median = quantile(s, 0.5);
  r.p10 = quantile(s, 0.1);
  r.p90 = quantile(s, 0.9);
  r.min = s.front();
  r.max = s.back();
  double sum = 0;
  for (double v : s) sum += v;
  r.mean = sum / double(s.size());
  std::vector<double> dev;
  for (double v : s) dev.push_back(std::fabs(v - r.median));
  std::sort(dev.begin(), dev.end());
  r.mad = quantile(dev, 0.5);
  return r;
}

Score combine(const std::vector<SampleStats>& per_context) {
  Score sc;
  if (per_context.empty()) return sc;
  double log_sum = 0, var = 0;
  for (const SampleStats& s : per_context) {
    log_sum += std::log(std::max(s.median, 1e-9));
    var += s.rel_se() * s.rel_se();
  }
  double k = double(per_context.size());
  sc.us = std::exp(log_sum / k);
  sc.rel_se = std::sqrt(var) / k;  // the relative error of a geometric mean of independent medians
  return sc;
}

Verdict judge(const Score& candidate, const Score& best, double min_gain) {
  Verdict v;
  v.gain = best.us > 0 ? (best.us - candidate.us) / best.us : 0;
  double noise = 3.0 * std::sqrt(candidate.rel_se * candidate.rel_se + best.rel_se * best.rel_se);
  v.threshold = std::max(min_gain, noise);
  v.faster = v.gain > v.threshold;
  v.reason = std::string(v.faster ? "faster: " : "not faster: ") +
             formatted("%.2f us vs best %.2f us: %+.2f%% (needs > %.2f%%: %s)", candidate.us, best.us, -100.0 * v.gain,
                       100.0 * v.threshold, v.threshold > min_gain ? "3x the measured noise" : "the minimum gain");
  return v;
}

}  // namespace ktune::measure
