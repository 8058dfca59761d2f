#include "measure/oracle_pool.h"

namespace ktune::measure {

OraclePool::~OraclePool() {
  for (auto& [key, f] : cases_) f.wait();
}

void OraclePool::prefetch(int seed, int context) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(seed, context);
  if (cases_.count(key)) return;
  cases_[key] = std::async(std::launch::async, [this, seed, context] {
                  return compute_oracle_case(w_, seed, context);
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
  return c;
}

}  // namespace ktune::measure
