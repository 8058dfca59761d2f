// A variant's launch tables (kernels/kimi/cuda/abi.h): the step's
// ktune_launches and the optional once-per-load ktune_prepare. Read the same
// way by the cuda backend (module globals) and the emulator (dlsym), so
// both accept and refuse the same tables with the same messages.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kernels/kimi/cuda/abi.h"

namespace ktune::measure {

// A table's exported symbols and the entry counts it may have. min_entries
// 0 makes it optional: a variant that exports neither symbol has none.
struct LaunchTableSymbols {
  const char* count;
  const char* table;
  int min_entries, max_entries;
};
inline constexpr LaunchTableSymbols kStepTable{"ktune_num_launches", "ktune_launches", 1, KT_MAX_LAUNCHES};
inline constexpr LaunchTableSymbols kPrepareTable{"ktune_num_prepare", "ktune_prepare", 0, KT_MAX_PREPARE};

// Copies `bytes` of the exported symbol `name` into `out`. False with `err`
// if it cannot; *absent is then true when the variant does not export it.
using ReadSymbol = std::function<bool(const char* name, void* out, size_t bytes, bool* absent, std::string* err)>;

bool read_launch_table(const LaunchTableSymbols& t, const ReadSymbol& read, std::vector<KtLaunch>* out,
                       std::string* err);

// Whether the runner loads a variant of ABI version `abi` (KT_ABI_OLDEST to
// KT_ABI_VERSION); false with the reason.
bool abi_supported(int abi, std::string* err);

// Whether a variant of ABI version `abi` writes attn_out (abi.h: from 3 on),
// so the runner reports, and validation checks, its attention outputs.
inline bool abi_reports_attn_out(int abi) { return abi >= 3; }
// Whether a variant of ABI version `abi` writes logits_out (abi.h: from 4 on).
inline bool abi_reports_logits(int abi) { return abi >= 4; }

// An entry's grid in blocks (abi.h: > 0 as given, 0 all that fit on every
// SM, -n n per SM), given how many blocks fit on one SM.
int resolve_grid(const KtLaunch& l, int per_sm, int sms);

// The text of a failed prepare launch: "prepare launch 2 (ktune_k5) failed: why".
std::string prepare_error(size_t index, const KtLaunch& l, const std::string& why);

}  // namespace ktune::measure
