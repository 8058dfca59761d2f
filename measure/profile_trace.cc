#include "measure/profile_trace.h"

#include <algorithm>
#include <utility>

#include "kernels/kimi/cuda/abi.h"

namespace ktune::measure {

size_t profile_trace_words() { return KT_TRACE_WORDS; }

json trace_stamps(const std::vector<uint64_t>& t) {
  json stamps = json::array();
  for (uint64_t k = 0; !t.empty() && k < t[0] && 2 + 2 * k < t.size(); ++k)
    stamps.push_back({t[1 + 2 * k], t[2 + 2 * k]});
  return stamps;
}

json barrier_arrivals(const std::vector<uint64_t>& t) {
  json out = json::array();
  if (t.size() < size_t(KT_TRACE_WORDS)) return out;
  for (size_t k = 0; k < KT_TRACE_MAX_BARRIERS; ++k) {
    std::vector<std::pair<uint64_t, int>> at;  // (ns, block)
    for (int b = 0; b < KT_TRACE_MAX_BLOCKS; ++b)
      if (uint64_t ns = t[KT_TRACE_ARRIVALS + k * KT_TRACE_MAX_BLOCKS + b]) at.push_back({ns, b});
    if (at.empty()) break;
    std::sort(at.begin(), at.end());
    out.push_back({at.front().first, at[(at.size() - 1) / 2].first, at.back().first, at.back().second,
                   at[(at.size() - 1) * 9 / 10].first});
  }
  return out;
}

}  // namespace ktune::measure
