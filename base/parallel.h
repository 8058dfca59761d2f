// parallel_for: splits [0, n) into contiguous chunks over worker threads.
// Used by the oracle and the weight generator, which are embarrassingly
// parallel over columns or tensor chunks.
#pragma once
#include <algorithm>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace ktune {

inline int worker_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? int(std::min(n, 64u)) : 1;
}

// fn(begin, end) is called on disjoint chunks; at most `threads` at once.
inline void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, int threads = 0) {
  if (threads <= 0) threads = worker_count();
  size_t t = std::min<size_t>(threads, n);
  if (t <= 1) {
    if (n) fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  size_t chunk = (n + t - 1) / t;
  for (size_t b = 0; b < n; b += chunk) pool.emplace_back(fn, b, std::min(n, b + chunk));
  for (auto& th : pool) th.join();
}

}  // namespace ktune
