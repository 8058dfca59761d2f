// The portable top-k against libstdc++'s nth_element + sort (what PyTorch's
// CPU top-k runs), on random values with many ties.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "base/rng.h"
#include "kernels/kimi/topk.h"

using namespace ktune;
using namespace ktune::kimi;

TEST_CASE("torch_topk orders ties like libstdc++ nth_element + sort") {
  Rng rng(7);
  int mismatches = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    int n = std::vector<int>{16, 32, 64, 100}[trial % 4];
    int k = std::min(n, std::vector<int>{1, 4, 8, 9, 16}[(trial / 4) % 5]);
    int distinct = 1 + int(rng.below(trial % 3 == 0 ? 4 : 40));  // few distinct values: many ties
    std::vector<float> v(n);
    for (auto& x : v) x = float(rng.below(distinct)) * 0.25f - 1.0f;
    std::vector<std::pair<float, int>> q(n);
    for (int j = 0; j < n; ++j) q[j] = {v[j], j};
    auto cmp = [](const std::pair<float, int>& a, const std::pair<float, int>& b) { return a.first > b.first; };
    std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), cmp);
    std::sort(q.begin(), q.begin() + (k - 1), cmp);
    std::vector<int> got(k);
    std::vector<topk_detail::Item> scratch(n);
    torch_topk(v.data(), n, k, got.data(), scratch.data());
    for (int j = 0; j < k; ++j) mismatches += got[j] != q[j].second;

  }
  CHECK(mismatches == 0);
}
