// Reading the machine code of an sm_90 cubin, and refusing the one form of
// it that a known compiler defect produces. A build whose code would fault
// on the GPU is better refused where it is built, with the reason, than
// found as an illegal instruction in the middle of a timed session.
//
// The defect: ptxas 13.0.88 (CUDA 13.0) encoded some cp.async copies that
// carry an L2 cache policy as LDGSTS with a uniform register in the shared
// address (opcode bits 0xdae), reading the address part and the policy from
// uniform registers that no instruction of the kernel writes; the step died
// with cudaErrorIllegalInstruction (RESULTS.md, runs 299-302). Every other
// LDGSTS it emitted is 0xfae. Only CUDA 13.0 is checked: another release
// may use the form correctly, and ktune has seen none.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ktune::sandbox {

// One 128-bit sm_90 instruction: its low and high 64-bit words.
using Instruction = std::pair<uint64_t, uint64_t>;

// The code of each kernel (ELF section ".text.<name>") in a cubin's bytes:
// (name, instructions). Empty when the bytes are no little-endian 64-bit
// ELF; sections that reach past the end are cut at it.
std::vector<std::pair<std::string, std::vector<Instruction>>> cubin_kernels(const std::string& elf);

// LDGSTS instructions in a kernel's code, and how many of them are in the
// uniform-address form above.
struct CopyForms {
  int ldgsts = 0;
  int uniform_address = 0;
};
CopyForms count_copy_forms(const std::vector<Instruction>& code);

// Whether `compiler_id` (the output of `nvcc --version`) is a release whose
// defect cubin_defect() looks for.
bool compiler_has_ldgsts_defect(const std::string& compiler_id);

// The reason to refuse a cubin's bytes, or "" when none of its kernels has
// the form; the reason names the kernels and counts the copies.
std::string cubin_defect(const std::string& elf);

}  // namespace ktune::sandbox
