#include "measure/cupti_counter.h"

#include <cupti.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include "base/fs.h"
#include "sandbox/process.h"

namespace ktune::measure {

namespace {

struct Cupti {
  decltype(&cuptiActivityEnable) Enable = nullptr;
  decltype(&cuptiActivityDisable) Disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) RegisterCallbacks = nullptr;
  decltype(&cuptiActivityFlushAll) FlushAll = nullptr;
  decltype(&cuptiActivityGetNextRecord) GetNextRecord = nullptr;
};

Cupti g_cupti;
std::atomic<int> g_kernels{0};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 1 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (g_cupti.GetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
      ++g_kernels;
  free(buffer);
}

}  // namespace

CuptiCounter::CuptiCounter() {
  // Under a profiler (ncu, nsys) the profiler owns CUPTI: loading a second
  // copy and registering callbacks crashes the process.
  if (sandbox::under_profiler()) {
    reason_ = "disabled by KTUNE_NO_CUPTI (running under a profiler)";
    return;
  }
  // The runner ships a copy beside itself when the device machine may lack one.
  std::vector<std::string> names = {join_path(self_dir(), "libcupti.so.13"), "libcupti.so.13", "libcupti.so.12",
                                    "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                                    "/usr/local/cuda/lib64/libcupti.so"};
  void* h = nullptr;
  for (auto& n : names)
    if ((h = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL))) break;
  if (!h) {
    reason_ = "libcupti not found";
    return;
  }
  g_cupti.Enable = reinterpret_cast<decltype(g_cupti.Enable)>(dlsym(h, "cuptiActivityEnable"));
  g_cupti.Disable = reinterpret_cast<decltype(g_cupti.Disable)>(dlsym(h, "cuptiActivityDisable"));
  g_cupti.RegisterCallbacks =
      reinterpret_cast<decltype(g_cupti.RegisterCallbacks)>(dlsym(h, "cuptiActivityRegisterCallbacks"));
  g_cupti.FlushAll = reinterpret_cast<decltype(g_cupti.FlushAll)>(dlsym(h, "cuptiActivityFlushAll"));
  g_cupti.GetNextRecord = reinterpret_cast<decltype(g_cupti.GetNextRecord)>(dlsym(h, "cuptiActivityGetNextRecord"));
  if (!g_cupti.Enable || !g_cupti.Disable || !g_cupti.RegisterCallbacks || !g_cupti.FlushAll ||
      !g_cupti.GetNextRecord) {
    reason_ = "libcupti lacks the activity API";
    return;
  }
  if (g_cupti.RegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    reason_ = "cuptiActivityRegisterCallbacks failed";
    return;
  }
  ok_ = true;
}

void CuptiCounter::begin() {
  if (!ok_) return;
  g_kernels = 0;
  if (g_cupti.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    ok_ = false;
    reason_ = "cuptiActivityEnable failed";
  }
}

int CuptiCounter::end(int fallback) {
  if (!ok_) return fallback;
  g_cupti.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_cupti.Disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  g_cupti.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  return g_kernels.load();
}

}  // namespace ktune::measure
