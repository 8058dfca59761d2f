#include "measure/loaded_variant.h"

#include <dlfcn.h>

#include <cstring>

#include "measure/launch_table.h"

namespace ktune::measure {

LoadedVariant::~LoadedVariant() {
  if (handle_) dlclose(handle_);
}

bool check_signature(const int* got, const std::vector<int>& want, std::string* err) {
  static const char* names[] = {"hidden",    "kda_heads", "kda_head_dim", "mla_heads", "kv_lora",
                                "qk_nope",   "qk_rope",   "v_head",       "n_experts", "n_active",
                                "n_shared",  "moe_inter", "group",        "layers",    "pattern"};
  for (size_t i = 0; i < want.size() && i < KT_CONFIG_FIELDS; ++i)
    if (got[i] != want[i]) {
      *err = std::string("variant was built for ") + names[i] + " = " + std::to_string(got[i]) +
             " but the task has " + std::to_string(want[i]);
      return false;
    }
  return true;
}

bool LoadedVariant::load(const std::string& path, const std::vector<int>& signature, std::string* err) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    *err = std::string("cannot load variant: ") + dlerror();
    return false;
  }
  auto sym = [&](const char* name) { return dlsym(handle_, name); };
  auto* abi = static_cast<int*>(sym("ktune_abi_version"));
  auto* config = static_cast<int*>(sym("ktune_config"));
  auto* scratch = static_cast<long long*>(sym("ktune_scratch_bytes"));
  if (!abi || !config || !scratch) {
    *err = "variant does not export ktune_abi_version, ktune_config and ktune_scratch_bytes";
    return false;
  }
  if (!abi_supported(*abi, err)) return false;
  if (!check_signature(config, signature, err)) return false;
  scratch_bytes_ = *scratch;
  abi_version_ = *abi;
  host_step_ = reinterpret_cast<KtHostStepFn>(sym("ktune_host_step"));
  emu_launch_ = reinterpret_cast<KtEmuLaunchFn>(sym("ktune_emu_launch"));
  if (emu_launch_) {
    ReadSymbol read = [&](const char* name, void* out, size_t bytes, bool* absent, std::string* e) {
      const void* p = sym(name);
      *absent = !p;
      if (!p) *e = std::string("variant does not export ") + name;
      else std::memcpy(out, p, bytes);
      return p != nullptr;
    };
    if (!read_launch_table(kStepTable, read, &launches_, err) || !read_launch_table(kPrepareTable, read, &prepare_, err))
      return false;
  }
  if (!host_step_ && !emu_launch_) {
    *err = "variant exports neither ktune_host_step nor ktune_emu_launch";
    return false;
  }
  return true;
}

}  // namespace ktune::measure
