// A host variant that never returns: a timeout (the runner's process group
// is killed), and the session goes on.
#include "kernels/kimi/host/runtime.h"

extern "C" {
int ktune_abi_version = KT_ABI_VERSION;
int ktune_config[KT_CONFIG_FIELDS] = {KT_D, KT_KH, KT_KD, KT_MH, KT_R, KT_NOPE, KT_ROPE, KT_VH,
                                      KT_E, KT_TOPK, KT_NSH, KT_I, KT_G, KT_LAYERS, KT_PATTERN_M};
long long ktune_scratch_bytes = 0;
int ktune_host_step(const KimiDeviceArgs*, const KtHostRuntime*) {
  volatile bool forever = true;
  while (forever) {
  }
  return 0;
}
}
