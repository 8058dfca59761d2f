// HostRuntime: the runner's side of kernels/kimi/host/runtime.h. A fixed
// pool of worker threads (the host's "SMs"); KtHostRuntime::parallel runs a
// body on N of them and is counted as one launch.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/kimi/host/runtime.h"

namespace ktune::measure {

class HostRuntime {
 public:
  explicit HostRuntime(int threads);
  ~HostRuntime();
  HostRuntime(const HostRuntime&) = delete;
  HostRuntime& operator=(const HostRuntime&) = delete;

  const KtHostRuntime* abi() const { return &abi_; }
  // Parallel regions started since the last reset.
  long launches() const { return launches_.load(); }
  void reset_launches() { launches_ = 0; }
  int threads() const { return int(workers_.size()) + 1; }

 private:
  static void parallel(const KtHostRuntime* rt, void (*body)(void*, int, int), void* ctx, int nthreads);
  void run(void (*body)(void*, int, int), void* ctx, int nthreads);
  void worker(int index);

  KtHostRuntime abi_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  long generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  void (*body_)(void*, int, int) = nullptr;
  void* ctx_ = nullptr;
  int nthreads_ = 0;
  std::atomic<long> launches_{0};
};

}  // namespace ktune::measure
