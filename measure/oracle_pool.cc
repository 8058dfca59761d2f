#include "measure/oracle_pool.h"

#include <climits>

namespace ktune::measure {

OraclePool::~OraclePool() {
  for (auto& [key, f] : cases_) f.wait();
  for (auto& [seed, f] : prefixes_) f.wait();
}

void OraclePool::prefetch(int seed, int context) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(seed, context);
  if (cases_.count(key)) return;
  auto p = prefixes_.find(seed);
  if (p == prefixes_.end())
    p = prefixes_
            .emplace(seed, std::async(std::launch::async,
                                      [this, seed] {
                                        return std::make_shared<const SeedPrefix>(compute_seed_prefix(w_, seed));
                                      })
                               .share())
            .first;
  cases_[key] = std::async(std::launch::async, [this, context, prefix = p->second] {
                  return finish_oracle_case(w_, *prefix.get(), context);
                }).share();
}

OracleCase OraclePool::get(int seed, int context) {
  prefetch(seed, context);
  std::shared_future<OracleCase> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    f = cases_[{seed, context}];
  }
  return f.get();
}

OracleCase OraclePool::take(int seed, int context) {
  OracleCase c = get(seed, context);
  std::lock_guard<std::mutex> lock(mu_);
  cases_.erase({seed, context});
  // The seed's prefix goes with its last case (a later case of it computes it again).
  auto next = cases_.lower_bound({seed, INT_MIN});
  if (next == cases_.end() || next->first.first != seed) prefixes_.erase(seed);
  return c;
}

}  // namespace ktune::measure
