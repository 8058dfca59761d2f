// OraclePool: oracle answers computed ahead, in background threads, so the
// device never waits for the CPU: while one attempt is measured, the next
// attempts' fresh validation cases are already being computed.
//
// Each seed's shared layers (SeedPrefix) are computed once, in their own
// task, and each of its cases finishes from them.
#pragma once
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "measure/validate.h"

namespace ktune::measure {

class OraclePool {
 public:
  explicit OraclePool(const kimi::KimiWeights& w) : w_(w) {}
  ~OraclePool();
  // Starts computing the case if it is not already known.
  void prefetch(int seed, int context);
  // The case (waits for it); it is then forgotten.
  OracleCase take(int seed, int context);
  // The case (waits for it), kept for later calls (a benchmark validating
  // several variants on the same cases).
  OracleCase get(int seed, int context);

 private:
  using Prefix = std::shared_future<std::shared_ptr<const SeedPrefix>>;
  const kimi::KimiWeights& w_;
  std::mutex mu_;
  std::map<std::pair<int, int>, std::shared_future<OracleCase>> cases_;
  std::map<int, Prefix> prefixes_;  // by seed, while a case of it is known
};

}  // namespace ktune::measure
