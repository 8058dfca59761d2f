// `ktune export` (see export.h): reads a variant from the store, checks that
// it is a one-launch CUDA megakernel, recovers its config from the source's
// #defines and writes the module's files from the embedded export/ sources.
#include "agent/export.h"

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include "agent/backend.h"
#include "agent/evaluator.h"
#include "base/fs.h"
#include "base/sha256.h"
#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/templates.h"
#include "kernels/kimi/weights.h"
#include "traces/store.h"
#include "variants/templates.h"

namespace ktune::agent {

namespace {

const char* kTemplate = "kimi-mega-cuda";

// cuda-emu variants carry the CPU emulator inlined at the top (see
// render_variant); the GPU build must not see it.
std::string without_emulator(const std::string& source) {
  const std::string begin = "// ---- begin kernels/emu/cuda_emu.h\n", end = "// ---- end kernels/emu/cuda_emu.h\n";
  size_t b = source.find(begin), e = source.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return source;
  return source.substr(0, b) + source.substr(e + end.size());
}

// The `#define NAME VALUE` lines a rendered source starts with.
std::map<std::string, std::string> leading_defines(const std::string& source) {
  std::map<std::string, std::string> out;
  std::istringstream in(source);
  std::string line;
  const std::regex define(R"(#define\s+(\w+)\s+(\S+)\s*)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, define)) out[m[1]] = m[2];
    else if (!line.empty() && line.rfind("//", 0) != 0) break;
  }
  return out;
}

// A JSON value as a Python literal; a top-level object gets one key per line.
std::string python_literal(const json& v, bool top = false) {
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + python_literal(v[i]);
    return s + "]";
  }
  if (v.is_object()) {
    std::string s = "{";
    size_t i = 0;
    for (auto& [k, x] : v.items()) {
      s += top ? "\n    " : (i++ ? ", " : "");
      s += json(k).dump() + ": " + python_literal(x) + (top ? "," : "");
    }
    return s + (top && !v.empty() ? "\n}" : "}");
  }
  return v.dump();  // numbers; strings in JSON's escapes, which Python reads alike
}

// Replaces each @KEY@ of `text`; a placeholder left over is an error (the
// embedded template and this code disagree).
bool fill(const std::string& name, std::string text, const std::map<std::string, std::string>& values,
          std::string* out, std::string* err) {
  for (auto& [key, value] : values) {
    const std::string mark = "@" + key + "@";
    for (size_t p = text.find(mark); p != std::string::npos; p = text.find(mark, p + value.size()))
      text.replace(p, mark.size(), value);
  }
  std::smatch m;
  if (std::regex_search(text, m, std::regex("@[A-Z_]+@"))) {
    *err = "the embedded " + name + " has an unknown placeholder " + m.str();
    return false;
  }
  *out = std::move(text);
  return true;
}

const std::string* embedded(const std::string& path, std::string* err) {
  const std::string* text = variants::embedded_file(path);
  if (!text) *err = path + " is not embedded in this ktune binary";
  return text;
}

bool recorded_variant(const ExportOptions& o, traces::VariantRow* v, std::string* err) {
  if (o.variant.empty()) {
    *err = "no variant (a recorded variant id, best, or --knobs JSON)";
    return false;
  }
  if (!file_exists(o.db)) {
    *err = "no database at " + o.db;
    return false;
  }
  traces::Store store;
  return store.open(o.db, err) && store.variant(o.variant, v, err);
}

// The megakernel template rendered at the options' knobs (unrecorded: its
// record says origin "knobs").
bool knob_variant(const ExportOptions& o, traces::VariantRow* v, std::string* err) {
  json knobs = json::parse(o.knobs, nullptr, false);
  if (knobs.is_discarded() || !knobs.is_object()) {
    *err = "--knobs is not a JSON object: " + o.knobs;
    return false;
  }
  kimi::KimiConfig cfg;
  BackendSpec spec;  // rendering needs only the backend's name, not its compiler
  spec.name = "cuda";
  Variant r;
  if (!kimi::KimiConfig::preset(o.size, &cfg, err) ||
      !render_variant(cfg, spec, *kimi::find_template(kTemplate), knobs, "", &r, err))
    return false;
  v->id = r.id;
  v->template_name = r.template_name;
  v->backend = r.backend;
  v->source = r.source;
  v->knobs = r.knobs;
  v->origin = "knobs";
  v->rationale = "rendered by ktune export --knobs";
  return true;
}

json config_json(const kimi::KimiConfig& cfg) {
  json j = cfg.to_json();
  j["rms_eps"] = cfg.rms_eps;
  return j;
}

}  // namespace

bool config_from_source(const std::string& source, kimi::KimiConfig* out, std::string* err) {
  std::map<std::string, std::string> d = leading_defines(source);
  kimi::KimiConfig c;
  c.name = "custom";
  auto number = [&](const char* key, double* v) {
    auto it = d.find(key);
    if (it == d.end()) {
      *err = std::string("the source does not start with ktune's size #defines (") + key + " is missing)";
      return false;
    }
    try {
      size_t used = 0;
      *v = std::stod(it->second, &used);
      if (used == it->second.size()) return true;
    } catch (const std::exception&) {
    }
    *err = std::string(key) + " is " + it->second + ", not a number";
    return false;
  };
  struct Field {
    const char* key;
    int* value;
  };
  int layers = 0, pattern_m = 0;
  const Field ints[] = {{"KT_D", &c.hidden},     {"KT_KH", &c.kda_heads}, {"KT_KD", &c.kda_head_dim},
                        {"KT_MH", &c.mla_heads}, {"KT_R", &c.kv_lora},    {"KT_NOPE", &c.qk_nope},
                        {"KT_ROPE", &c.qk_rope}, {"KT_VH", &c.v_head},    {"KT_E", &c.n_experts},
                        {"KT_TOPK", &c.n_active}, {"KT_NSH", &c.n_shared}, {"KT_I", &c.moe_inter},
                        {"KT_G", &c.group},      {"KT_LAYERS", &layers},  {"KT_PATTERN_M", &pattern_m}};
  for (const Field& f : ints) {
    double v = 0;
    if (!number(f.key, &v)) return false;
    *f.value = int(v);
  }
  if (!number("KT_ROPE_THETA", &c.rope_theta) || !number("KT_SCALING", &c.routed_scaling) ||
      !number("KT_EPS", &c.rms_eps))
    return false;
  if (layers < 1 || layers > KT_MAX_LAYERS) {
    *err = "KT_LAYERS is " + std::to_string(layers);
    return false;
  }
  c.pattern.clear();
  for (int i = 0; i < layers; ++i) c.pattern += (pattern_m >> i) & 1 ? 'M' : 'K';
  if (!c.check(err)) return false;
  // Rendering the config again must give the very same #defines.
  std::map<std::string, std::string> again = kimi::config_defines(c);
  for (auto& [key, value] : again)
    if (d[key] != value) {
      *err = key + " is " + d[key] + " where ktune renders " + value;
      return false;
    }
  for (const char* name : {"full", "small", "tiny", "top8"}) {
    kimi::KimiConfig preset;
    if (kimi::KimiConfig::preset(name, &preset, err) && kimi::config_defines(preset) == again) {
      c = preset;
      break;
    }
  }
  *out = c;
  return true;
}

bool export_variant(const ExportOptions& o, std::string* summary, std::string* err) {
  if (o.format != "torch-module") {
    *err = "unknown format '" + o.format + "' (the one format is torch-module)";
    return false;
  }
  if (o.out_dir.empty()) {
    *err = "no output directory (--out DIR)";
    return false;
  }
  traces::VariantRow v;
  if (!o.variant.empty() && !o.knobs.empty()) {
    *err = "give a recorded variant or --knobs, not both";
    return false;
  }
  if (!o.knobs.empty() ? !knob_variant(o, &v, err) : !recorded_variant(o, &v, err)) return false;
  const std::string name = "variant " + v.id.substr(0, 16);
  if (v.template_name != kTemplate || (v.backend != "cuda" && v.backend != "cuda-emu")) {
    *err = name + " is a " + v.template_name + " variant for the " + v.backend +
           " backend; only CUDA megakernel variants (template " + kTemplate +
           ", one launch per step) export to PyTorch";
    return false;
  }
  std::string source = without_emulator(v.source);
  std::smatch m;
  if (!std::regex_search(source, m, std::regex(R"(ktune_num_launches\s*=\s*(\d+)\s*;)")) || m[1] != "1" ||
      source.find("ktune_k0") == std::string::npos) {
    *err = name + " does not declare exactly one launch of ktune_k0";
    return false;
  }
  kimi::KimiConfig cfg;
  if (!config_from_source(source, &cfg, err)) {
    *err = name + ": " + *err;
    return false;
  }

  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(o.out_dir, ec) && !fs::is_directory(o.out_dir, ec)) {
    *err = o.out_dir + " exists and is not a directory";
    return false;
  }
  if (fs::is_directory(o.out_dir, ec) && !fs::is_empty(o.out_dir, ec) && !o.force) {
    *err = o.out_dir + " is not empty (--force writes into it, replacing the exported files)";
    return false;
  }

  const std::string* ext = embedded("export/kimi_ext.cu", err);
  const std::string* solution = ext ? embedded("export/solution.py.in", err) : nullptr;
  const std::string* eager = solution ? embedded("export/eager.py", err) : nullptr;
  const std::string* reference = eager ? embedded("export/reference.py", err) : nullptr;
  const std::string* readme = reference ? embedded("export/README.md.in", err) : nullptr;
  if (!readme) return false;

  json specs = json::array();
  for (const kimi::TensorSpec& s : kimi::weight_specs(cfg))
    specs.push_back({{"name", s.name}, {"dtype", dtype_name(s.dtype)}, {"shape", s.shape}});
  // A torch extension compiles the kernel for host and device at once:
  // there, `extern "C" __device__ T x = ...;` leaves x's host shadow
  // undefined, so the exported copy declares its ABI globals inside an
  // extern "C" block instead (same symbols, same values).
  source = std::regex_replace(source, std::regex(R"(extern "C" (__device__ [^;]*;))"), "extern \"C\" { $1 }");
  const std::string kernel_sha = sha256_hex(source);
  json record = {{"variant", v.id},
                 {"template", v.template_name},
                 {"backend", v.backend},
                 {"knobs", v.knobs},
                 {"parent", v.parent},
                 {"origin", v.origin},
                 {"rationale", v.rationale},
                 {"created_at", v.created_at},
                 {"config", config_json(cfg)},
                 {"abi_version", KT_ABI_VERSION},
                 {"launches_per_step", 1},
                 {"kernel_sha256", kernel_sha},
                 {"weights", specs}};
  const std::map<std::string, std::string> values = {
      {"VARIANT_ID", v.id},
      {"VARIANT_SHORT", v.id.substr(0, 16)},
      {"TEMPLATE", v.template_name},
      {"BACKEND", v.backend},
      {"CONFIG_NAME", cfg.name},
      {"KNOBS_PY", python_literal(v.knobs, true)},
      {"CONFIG_PY", python_literal(config_json(cfg), true)},
      {"KERNEL_SHA256", kernel_sha}};
  std::vector<std::pair<std::string, std::string>> files = {
      {"kernel.cu", source}, {"kimi_ext.cu", *ext}, {"eager.py", *eager}, {"reference.py", *reference}};
  std::string text;
  if (!fill("export/solution.py.in", *solution, values, &text, err)) return false;
  files.push_back({"solution.py", text});
  if (!fill("export/README.md.in", *readme, values, &text, err)) return false;
  files.push_back({"README.md", text});
  files.push_back({"variant.json", record.dump(2) + "\n"});

  if (!make_dirs(o.out_dir, err)) return false;
  for (auto& [file, content] : files)
    if (!write_file_atomic(join_path(o.out_dir, file), content, err)) return false;
  *summary = "exported " + name + " (" + v.template_name + ", " + v.backend + ", config " + cfg.name +
             ", knobs " + v.knobs.dump() + ") to " + o.out_dir + ":";
  for (auto& [file, content] : files) *summary += " " + file;
  *summary += "\nsee " + join_path(o.out_dir, "README.md") + " for how to use it";
  return true;
}

}  // namespace ktune::agent
