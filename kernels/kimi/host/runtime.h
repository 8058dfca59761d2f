// The contract between the trusted runner and a host (CPU) variant of the
// Kimi task. The variant is a shared library built by g++; it receives the
// same KimiDeviceArgs as a CUDA variant (the pointers are host memory) and
// a runtime whose `parallel` call is the host's "kernel launch": it runs a
// body on N threads of the runner's pool and returns when all are done.
// The runner counts those calls per step, as CUPTI counts launches on the
// GPU, so "one parallel region per step" is measured, not claimed.
#pragma once
#include "kernels/kimi/cuda/abi.h"

struct KtHostRuntime {
  void (*parallel)(const KtHostRuntime* rt, void (*body)(void* ctx, int thread, int nthreads), void* ctx,
                   int nthreads);
  int max_threads;  // threads the runner's pool has (the machine's cores)
  void* impl;       // runner-private
};

// A host variant exports (extern "C"):
//   int ktune_abi_version;                 = KT_ABI_VERSION
//   int ktune_config[KT_CONFIG_FIELDS];    the sizes it was built for (abi.h)
//   long long ktune_scratch_bytes;         scratch it needs (runner allocates, zeroes once)
//   int ktune_host_step(const KimiDeviceArgs* args, const KtHostRuntime* rt);
//       one decode step; 0 on success, nonzero on a detected error
typedef int (*KtHostStepFn)(const KimiDeviceArgs* args, const KtHostRuntime* rt);
