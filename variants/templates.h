// Kernel templates and rendering. A template is a source file of the task
// (kept in kernels/, embedded in the binary at build time) plus its knob
// space. Rendering a variant gives one self-contained translation unit:
// the task's size #defines, the knob #defines, then the template with its
// `#include "kernels/..."` lines replaced by the embedded files. The variant
// id is the hash of that text, so equal sources are one variant.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "base/json.h"
#include "variants/knobs.h"

namespace ktune::variants {

struct Template {
  std::string name;     // e.g. "kimi-mega-cuda-v1"
  std::string backend;  // "host", "cuda" (also built for "cuda-emu")
  std::string file;     // embedded path, e.g. "kernels/kimi/cuda/megakernel.cu"
  KnobSpace space;
  int max_launches = 1;  // launches per step a variant may make (0 = any)
  std::string summary;   // one line for listings and prompts
};

// The text of an embedded repository file, or nullptr.
const std::string* embedded_file(const std::string& path);
// Paths of all embedded files.
std::vector<std::string> embedded_files();

// Replaces `#include "kernels/..."` lines by the embedded files (each once).
// An include of an unknown kernels/ file is an error.
bool inline_includes(const std::string& text, std::string* out, std::string* err);

// Builds the translation unit: `defines` (name -> value) as #define lines,
// then `body` with its includes inlined. For a template, body is the
// embedded file; for a designer-written source, the source itself.
bool render_source(const std::map<std::string, std::string>& defines, const std::string& body, std::string* out,
                   std::string* err);

// #defines for a knob point of a space (macro -> value, strings unquoted).
std::map<std::string, std::string> knob_defines(const KnobSpace& space, const json& point);

}  // namespace ktune::variants
