// The Kimi task's kernel templates: for each backend a baseline (one
// launch or parallel region per operation) and a megakernel (the whole step
// in one), with the megakernel's design levers as knobs. Also the size
// #defines every variant of a config is rendered with.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "kernels/kimi/config.h"
#include "variants/templates.h"

namespace ktune::kimi {

// "kimi-mega-cuda", "kimi-base-cuda", "kimi-mega-host", "kimi-base-host".
const std::vector<variants::Template>& templates();
const variants::Template* find_template(const std::string& name);
// The baseline and the megakernel template of a backend ("cuda-emu" uses
// the cuda templates).
const variants::Template* baseline_template(const std::string& backend);
const variants::Template* megakernel_template(const std::string& backend);

// KT_D, KT_KH, ... for a config (see kernels/kimi/cuda/abi.h).
std::map<std::string, std::string> config_defines(const KimiConfig& cfg);
// The ktune_config array a variant built for `cfg` must export.
std::vector<int> config_signature(const KimiConfig& cfg);

}  // namespace ktune::kimi
