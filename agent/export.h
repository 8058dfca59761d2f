// `ktune export`: a recorded CUDA megakernel variant as a self-contained
// PyTorch module (the KernelBench-Mega solution contract): solution.py
// (Model(cfg) with the spec's state-dict names, step() = one launch), the
// variant's source (kernel.cu) and the host wrapper PyTorch builds with it
// (kimi_ext.cu), a pure-PyTorch eager version and an fp64 reference for
// benchmarks and validation, a README and the variant's record.
// The Python side lives in export/ and is embedded in the binary.
#pragma once
#include <string>

#include "kernels/kimi/config.h"

namespace ktune::agent {

struct ExportOptions {
  std::string db;                       // the database holding the variant
  std::string variant;                  // id, unique prefix, or "best" (the latest session's best)
  std::string knobs;                    // instead of a recorded variant: the megakernel at these knobs (JSON)
  std::string size = "full";            // with knobs: the config preset
  std::string format = "torch-module";  // the only format so far
  std::string out_dir;
  bool force = false;                   // write into a non-empty out_dir
};

// Writes the module into opts.out_dir; `summary` says what was written.
// The variant is a recorded one (db + variant) or, with `knobs`, the CUDA
// megakernel template rendered at those knobs for the `size` preset.
// Errors (no database, no such variant, a variant that is not a one-launch
// CUDA megakernel, a non-empty directory without --force) say what to do.
bool export_variant(const ExportOptions& opts, std::string* summary, std::string* err);

// The config whose size #defines a rendered source starts with (the inverse
// of kimi::config_defines); named after the preset it equals, else "custom".
bool config_from_source(const std::string& source, kimi::KimiConfig* out, std::string* err);

}  // namespace ktune::agent
