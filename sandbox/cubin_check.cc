// Reading an sm_90 cubin's kernels and the LDGSTS form ptxas 13.0 mis-encodes
// (see cubin_check.h).
#include "sandbox/cubin_check.h"

#include <cstring>

namespace ktune::sandbox {
namespace {

constexpr uint64_t kOpcodeMask = 0xfff;
constexpr uint64_t kLdgsts = 0xfae;                // shared address in registers (and an immediate)
constexpr uint64_t kLdgstsUniformAddress = 0xdae;  // ... plus a uniform register: the mis-encoded form

}  // namespace

std::vector<std::pair<std::string, std::vector<Instruction>>> cubin_kernels(const std::string& elf) {
  std::vector<std::pair<std::string, std::vector<Instruction>>> kernels;
  // A little-endian field of `bytes` bytes at `at`; 0 past the end, so a
  // truncated file reads as sections of nothing rather than out of bounds.
  auto word = [&](uint64_t at, uint64_t bytes) {
    uint64_t v = 0;
    if (at <= elf.size() && bytes <= elf.size() - at) std::memcpy(&v, elf.data() + at, bytes);
    return v;
  };
  constexpr char kMagic[] = "\x7f" "ELF";
  if (elf.size() < 64 || elf.compare(0, 4, kMagic) != 0 || elf[4] != 2 /* 64-bit */ || elf[5] != 1 /* LE */)
    return kernels;
  const uint64_t shoff = word(0x28, 8), shentsize = word(0x3a, 2), shnum = word(0x3c, 2), shstrndx = word(0x3e, 2);
  if (shentsize < 0x40) return kernels;
  const uint64_t names = word(shoff + shstrndx * shentsize + 0x18, 8);
  static const std::string kPrefix = ".text.";
  for (uint64_t i = 0; i < shnum; ++i) {
    const uint64_t sh = shoff + i * shentsize;
    const uint64_t name_at = names + word(sh, 4), offset = word(sh + 0x18, 8), size = word(sh + 0x20, 8);
    if (name_at >= elf.size()) continue;
    const std::string name(elf.c_str() + name_at, strnlen(elf.c_str() + name_at, elf.size() - name_at));
    if (name.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    std::vector<Instruction> code;
    for (uint64_t at = offset; at < offset + size && at <= elf.size() && elf.size() - at >= 16; at += 16)
      code.push_back({word(at, 8), word(at + 8, 8)});
    kernels.push_back({name.substr(kPrefix.size()), std::move(code)});
  }
  return kernels;
}

CopyForms count_copy_forms(const std::vector<Instruction>& code) {
  CopyForms forms;
  for (const Instruction& ins : code) {
    const uint64_t opcode = ins.first & kOpcodeMask;
    forms.ldgsts += opcode == kLdgsts || opcode == kLdgstsUniformAddress;
    forms.uniform_address += opcode == kLdgstsUniformAddress;
  }
  return forms;
}

bool compiler_has_ldgsts_defect(const std::string& compiler_id) {
  return compiler_id.find("release 13.0,") != std::string::npos;
}

std::string cubin_defect(const std::string& elf) {
  std::string found;
  int copies = 0;
  for (const auto& [name, code] : cubin_kernels(elf)) {
    const CopyForms forms = count_copy_forms(code);
    if (forms.uniform_address == 0) continue;
    copies += forms.uniform_address;
    found += (found.empty() ? "" : ", ") + name + " (" + std::to_string(forms.uniform_address) + ")";
  }
  if (found.empty()) return "";
  return std::to_string(copies) + " cp.async cop" + (copies == 1 ? "y" : "ies") +
         " compiled to the LDGSTS form that ptxas 13.0 mis-encodes (a uniform-register shared address; "
         "it faults with an illegal instruction on the GPU) in " + found +
         "; a copy without an L2 cache policy, or another register budget, avoids it";
}

}  // namespace ktune::sandbox
