// A host variant that does not compile: a compile_error with the compiler's
// message as evidence.
#include "kernels/kimi/host/runtime.h"

extern "C" int ktune_host_step(const KimiDeviceArgs* a, const KtHostRuntime*) {
  return a->no_such_field;
}
