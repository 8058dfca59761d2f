#include "measure/launch_table.h"

namespace ktune::measure {

bool read_launch_table(const LaunchTableSymbols& t, const ReadSymbol& read, std::vector<KtLaunch>* out,
                       std::string* err) {
  out->clear();
  int n = 0;
  bool absent = false;
  if (!read(t.count, &n, sizeof n, &absent, err)) {
    if (!absent || t.min_entries > 0) return false;
    err->clear();  // an optional table the variant does not have
    return true;
  }
  if (n < t.min_entries || n > t.max_entries) {
    *err = std::string(t.count) + " = " + std::to_string(n) + " is out of range (" + std::to_string(t.min_entries) +
           ".." + std::to_string(t.max_entries) + ")";
    return false;
  }
  if (n == 0) return true;
  out->resize(size_t(n));
  if (!read(t.table, out->data(), out->size() * sizeof(KtLaunch), &absent, err)) {
    if (absent) *err = std::string(t.count) + " = " + std::to_string(n) + " but the variant does not export " + t.table;
    out->clear();
    return false;
  }
  return true;
}

int resolve_grid(const KtLaunch& l, int per_sm, int sms) {
  return l.grid > 0 ? l.grid : (l.grid == 0 ? per_sm * sms : -l.grid * sms);
}

std::string prepare_error(size_t index, const KtLaunch& l, const std::string& why) {
  return "prepare launch " + std::to_string(index) + " (ktune_k" + std::to_string(l.kernel) + ") failed: " + why;
}

bool abi_supported(int abi, std::string* err) {
  if (abi >= KT_ABI_OLDEST && abi <= KT_ABI_VERSION) return true;
  *err = "variant ABI version " + std::to_string(abi) + ", runner speaks " + std::to_string(KT_ABI_OLDEST) + " to " +
         std::to_string(KT_ABI_VERSION);
  return false;
}

}  // namespace ktune::measure
