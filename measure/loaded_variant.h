// A variant loaded into the runner's process from a shared library: a host
// variant (g++ build of a host template) or a CUDA variant built for the
// CPU emulator. Checks the exported ABI version and sizes before anything
// runs, so a variant built for another config is a launch_error with a
// clear message, not a wrong answer or a crash.
#pragma once
#include <string>
#include <vector>

#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/host/runtime.h"

namespace ktune::measure {

typedef int (*KtEmuLaunchFn)(int kernel, int grid, int block, int smem, int cooperative, const void* args,
                             const void* launch_args, char* err, int errlen);

class LoadedVariant {
 public:
  LoadedVariant() = default;
  ~LoadedVariant();
  LoadedVariant(const LoadedVariant&) = delete;
  LoadedVariant& operator=(const LoadedVariant&) = delete;

  // `signature` is the ktune_config the task expects.
  bool load(const std::string& path, const std::vector<int>& signature, std::string* err);
  long long scratch_bytes() const { return scratch_bytes_; }
  int abi_version() const { return abi_version_; }
  // Host variants: one decode step.
  KtHostStepFn host_step() const { return host_step_; }
  // Emulated CUDA variants: the step's launch table, the prepare table
  // (empty when the variant has none; abi.h) and the launcher.
  const std::vector<KtLaunch>& launches() const { return launches_; }
  const std::vector<KtLaunch>& prepare() const { return prepare_; }
  KtEmuLaunchFn emu_launch() const { return emu_launch_; }

 private:
  void* handle_ = nullptr;
  long long scratch_bytes_ = 0;
  int abi_version_ = 0;
  KtHostStepFn host_step_ = nullptr;
  KtEmuLaunchFn emu_launch_ = nullptr;
  std::vector<KtLaunch> launches_;
  std::vector<KtLaunch> prepare_;
};

// Checks an exported ktune_config against the expected one; describes the
// first difference.
bool check_signature(const int* got, const std::vector<int>& want, std::string* err);

}  // namespace ktune::measure
