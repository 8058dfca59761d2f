#include "measure/host_runtime.h"

namespace ktune::measure {

HostRuntime::HostRuntime(int threads) {
  if (threads < 1) threads = 1;
  abi_.parallel = &HostRuntime::parallel;
  abi_.max_threads = threads;
  abi_.impl = this;
  // The calling thread is thread 0 of every region; the pool holds the rest.
  for (int i = 1; i < threads; ++i) workers_.emplace_back(&HostRuntime::worker, this, i);
}

HostRuntime::~HostRuntime() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void HostRuntime::parallel(const KtHostRuntime* rt, void (*body)(void*, int, int), void* ctx, int nthreads) {
  static_cast<HostRuntime*>(rt->impl)->run(body, ctx, nthreads);
}

void HostRuntime::run(void (*body)(void*, int, int), void* ctx, int nthreads) {
  ++launches_;
  if (nthreads < 1) nthreads = 1;
  if (nthreads > threads()) nthreads = threads();
  if (nthreads == 1) {
    body(ctx, 0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = body;
    ctx_ = ctx;
    nthreads_ = nthreads;
    pending_ = nthreads - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  body(ctx, 0, nthreads);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

void HostRuntime::worker(int index) {
  long seen = 0;
  for (;;) {
    void (*body)(void*, int, int);
    void* ctx;
    int n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= nthreads_) continue;
      body = body_;
      ctx = ctx_;
      n = nthreads_;
    }
    body(ctx, index, n);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

}  // namespace ktune::measure
