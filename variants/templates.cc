#include "variants/templates.h"

#include <set>
#include <sstream>

namespace ktune::variants {

const std::map<std::string, std::string>& embedded_table();  // embedded_files.cc (generated)

const std::string* embedded_file(const std::string& path) {
  auto& t = embedded_table();
  auto it = t.find(path);
  return it == t.end() ? nullptr : &it->second;
}

std::vector<std::string> embedded_files() {
  std::vector<std::string> out;
  for (auto& [path, text] : embedded_table()) out.push_back(path);
  return out;
}

namespace {

bool inline_into(const std::string& text, std::set<std::string>* seen, std::string* out, std::string* err) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t p = line.find_first_not_of(" \t");
    const std::string directive = "#include \"kernels/";
    if (p != std::string::npos && line.compare(p, directive.size(), directive) == 0) {
      size_t start = line.find('"', p) + 1, end = line.find('"', start);
      std::string path = line.substr(start, end - start);
      const std::string* inc = embedded_file(path);
      if (!inc) {
        *err = "include of \"" + path + "\": no such kernel file";
        return false;
      }
      if (seen->insert(path).second) {
        *out += "// ---- begin " + path + "\n";
        if (!inline_into(*inc, seen, out, err)) return false;
        *out += "// ---- end " + path + "\n";
      }
      continue;
    }
    if (p != std::string::npos && line.compare(p, 12, "#pragma once") == 0) continue;
    *out += line;
    *out += '\n';
  }
  return true;
}

}  // namespace

bool inline_includes(const std::string& text, std::string* out, std::string* err) {
  std::set<std::string> seen;
  out->clear();
  return inline_into(text, &seen, out, err);
}

bool render_source(const std::map<std::string, std::string>& defines, const std::string& body, std::string* out,
                   std::string* err) {
  std::string text = "// Rendered by ktune. Sizes and knobs:\n";
  for (auto& [name, value] : defines) text += "#define " + name + " " + value + "\n";
  std::string inlined;
  if (!inline_includes(body, &inlined, err)) return false;
  *out = text + inlined;
  return true;
}

std::map<std::string, std::string> knob_defines(const KnobSpace& space, const json& point) {
  std::map<std::string, std::string> out;
  for (const Knob& k : space.knobs) {
    const json& v = point.contains(k.name) ? point[k.name] : k.default_value;
    std::string value = v.dump();
    if (v.is_string())  // an enumeration: its position in the list of values
      for (size_t i = 0; i < k.values.size(); ++i)
        if (k.values[i] == v) value = std::to_string(i);
    out[k.macro] = value;
  }
  return out;
}

}  // namespace ktune::variants
