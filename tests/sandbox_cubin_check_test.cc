// Tests of the cubin reader and the LDGSTS defect check: ELF files written
// here byte by byte, one run through the build cache with a real process,
// and a cubin from the real nvcc (skipped without one). The megakernel's
// own case, a copy ptxas 13.0 does mis-encode, is in agent_cuda_build_test.
#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/fs.h"
#include "sandbox/build_cache.h"
#include "sandbox/cubin_check.h"

using namespace ktune;
using namespace ktune::sandbox;

namespace {

// A little-endian 64-bit ELF with the given sections (name, bytes), as the
// reader needs it: the header's section table fields and each section's
// name, offset and size. Section 0 is the null section, the last one the
// section names.
std::string elf_with(const std::vector<std::pair<std::string, std::string>>& sections) {
  std::string names(1, '\0'), body;
  std::vector<std::array<uint64_t, 3>> table = {{0, 0, 0}};  // name, offset, size
  auto add = [&](const std::string& name, const std::string& bytes) {
    while ((64 + body.size()) % 16) body.push_back('\0');
    table.push_back({names.size(), 64 + body.size(), bytes.size()});
    names += name + '\0';
    body += bytes;
  };
  for (const auto& [name, bytes] : sections) add(name, bytes);
  const uint64_t names_index = table.size();
  add(".shstrtab", names + ".shstrtab" + '\0');
  std::string elf(64, '\0');
  elf += body;
  while (elf.size() % 8) elf.push_back('\0');
  const uint64_t shoff = elf.size();
  auto put = [&](size_t at, uint64_t v, size_t bytes) { std::memcpy(&elf[at], &v, bytes); };
  std::memcpy(&elf[0], "\x7f" "ELF\x02\x01\x01", 7);
  put(0x28, shoff, 8);
  put(0x3a, 64, 2);
  put(0x3c, table.size(), 2);
  put(0x3e, names_index, 2);
  for (const auto& [name, offset, size] : table) {
    std::string sh(64, '\0');
    std::memcpy(&sh[0], &name, 4);
    std::memcpy(&sh[0x18], &offset, 8);
    std::memcpy(&sh[0x20], &size, 8);
    elf += sh;
  }
  return elf;
}

// Instructions as a section's bytes: each opcode in the low word's low bits.
std::string code_of(const std::vector<uint64_t>& low_words) {
  std::string bytes;
  for (uint64_t low : low_words) {
    const uint64_t high = 0x000fe20000000000ull;  // anything: the check reads the low word
    bytes.append(reinterpret_cast<const char*>(&low), 8);
    bytes.append(reinterpret_cast<const char*>(&high), 8);
  }
  return bytes;
}

constexpr uint64_t kPlainCopy = 0x0000000402047fae, kUniformCopy = 0x0800000402047dae, kOther = 0x0000000000007918;

}  // namespace

TEST_CASE("cubin_kernels lists each kernel's code, and count_copy_forms its LDGSTS forms") {
  const std::string elf = elf_with({{".nv.info", "not code"},
                                    {".text.ktune_k0", code_of({kOther, kPlainCopy, kUniformCopy, kUniformCopy})},
                                    {".text.ktune_k1", code_of({kPlainCopy, kOther})}});
  const auto kernels = cubin_kernels(elf);
  REQUIRE(kernels.size() == 2);
  CHECK(kernels[0].first == "ktune_k0");
  CHECK(kernels[1].first == "ktune_k1");
  REQUIRE(kernels[0].second.size() == 4);
  CHECK(kernels[0].second[1].first == kPlainCopy);
  CHECK(kernels[0].second[1].second == 0x000fe20000000000ull);
  const CopyForms k0 = count_copy_forms(kernels[0].second), k1 = count_copy_forms(kernels[1].second);
  CHECK(k0.ldgsts == 3);
  CHECK(k0.uniform_address == 2);
  CHECK(k1.ldgsts == 1);
  CHECK(k1.uniform_address == 0);

  const std::string why = cubin_defect(elf);
  INFO(why);
  CHECK(why.find("2 cp.async copies") == 0);
  CHECK(why.find("ktune_k0 (2)") != std::string::npos);
  CHECK(why.find("ktune_k1") == std::string::npos);
  CHECK(why.find("illegal instruction") != std::string::npos);
  CHECK(cubin_defect(elf_with({{".text.ktune_k0", code_of({kPlainCopy, kOther})}})) == "");
}

TEST_CASE("a file that is no cubin, or a cut one, reads as no kernels and no defect") {
  const std::string elf = elf_with({{".text.ktune_k0", code_of({kUniformCopy, kUniformCopy, kUniformCopy})}});
  CHECK(cubin_kernels("").empty());
  CHECK(cubin_kernels("not an ELF file at all, but long enough to have a header's worth of bytes in it.").empty());
  std::string big_endian = elf;
  big_endian[5] = 2;
  CHECK(cubin_kernels(big_endian).empty());
  CHECK(cubin_defect(big_endian) == "");
  // Cut anywhere, the reader stays inside the bytes it has (the section
  // table is at the end, so most cuts lose it and with it every kernel).
  for (size_t size = 0; size < elf.size(); size += 7) {
    const std::string cut = elf.substr(0, size);
    for (const auto& [name, code] : cubin_kernels(cut)) CHECK(code.size() <= 3);
  }
  CHECK(cubin_kernels(elf).size() == 1);
}

TEST_CASE("only CUDA 13.0 is checked for the defect") {
  CHECK(compiler_has_ldgsts_defect("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"));
  CHECK_FALSE(compiler_has_ldgsts_defect("Cuda compilation tools, release 12.8, V12.8.93\n"));
  CHECK_FALSE(compiler_has_ldgsts_defect("Cuda compilation tools, release 13.1, V13.1.80\n"));
  CHECK_FALSE(compiler_has_ldgsts_defect("g++ (Debian 14.2.0-19) 14.2.0\n"));
}

TEST_CASE("the build cache refuses an artifact with the defect, says why, and keeps the refusal") {
  std::string dir, err;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-cubin-test-", &dir, &err), err);
  BuildCache cache(dir);
  BuildRequest req;
  // The "compiler" copies the source, a cubin written here, to the artifact.
  req.source = elf_with({{".text.ktune_k0", code_of({kPlainCopy, kUniformCopy})}});
  req.source_name = "variant.cu";
  req.artifact_name = "variant.cubin";
  req.command = {"cp", "{src}", "{out}"};
  req.compiler_id = "Cuda compilation tools, release 13.0, V13.0.88";
  req.timeout_s = 30;

  SUBCASE("refused") {
    req.refuse_ldgsts_defect = true;
    BuildResult first = cache.build(req);
    CHECK_FALSE(first.ok);
    CHECK_FALSE(first.cached);
    CHECK(first.artifact.empty());
    CHECK(first.log.find("[ktune: error: the build is refused: 1 cp.async copy compiled to the LDGSTS form") !=
          std::string::npos);
    CHECK(first.log.find("in ktune_k0 (1)") != std::string::npos);
    BuildResult again = cache.build(req);
    CHECK(again.cached);
    CHECK_FALSE(again.ok);
    CHECK(again.log == first.log);
  }
  SUBCASE("not checked: the same bytes build, under another key") {
    const std::string checked_key = [&] {
      BuildRequest checked = req;
      checked.refuse_ldgsts_defect = true;
      return BuildCache::key_of(checked);
    }();
    BuildResult r = cache.build(req);
    CHECK(r.ok);
    CHECK(r.key != checked_key);
    std::string bytes;
    REQUIRE(read_file(r.artifact, &bytes, &err));
    CHECK(bytes == req.source);
  }
  SUBCASE("a clean cubin passes the check") {
    req.refuse_ldgsts_defect = true;
    req.source = elf_with({{".text.ktune_k0", code_of({kPlainCopy, kPlainCopy})}});
    BuildResult r = cache.build(req);
    CHECK(r.ok);
    CHECK(r.log.find("refused") == std::string::npos);
  }
  remove_tree(dir);
}

TEST_CASE("a cubin from the real nvcc: its kernel and its cp.async copies are read") {
  std::string nvcc;
  for (const char* candidate : {"/usr/local/cuda/bin/nvcc", "/usr/bin/nvcc"})
    if (access(candidate, X_OK) == 0) nvcc = candidate;
  if (const char* home = std::getenv("CUDA_HOME"); home && access((std::string(home) + "/bin/nvcc").c_str(), X_OK) == 0)
    nvcc = std::string(home) + "/bin/nvcc";
  if (nvcc.empty()) {
    MESSAGE("skipped: no nvcc in CUDA_HOME, /usr/local/cuda/bin or /usr/bin");
    return;
  }
  std::string dir, err;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-cubin-test-", &dir, &err), err);
  BuildCache cache(dir);
  BuildRequest req;
  req.source =
      "extern \"C\" __global__ void copy_rows(const int4* src, int4* dst) {\n"
      "  __shared__ int4 rows[4][256];\n"
      "  for (int r = 0; r < 4; ++r) {\n"
      "    unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(&rows[r][threadIdx.x]));\n"
      "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\" :: \"r\"(to), \"l\"(src + r * 256 + threadIdx.x));\n"
      "  }\n"
      "  asm volatile(\"cp.async.wait_all;\" ::: \"memory\");\n"
      "  __syncthreads();\n"
      "  dst[threadIdx.x] = rows[3 - threadIdx.x % 4][255 - threadIdx.x];\n"
      "}\n";
  req.source_name = "variant.cu";
  req.artifact_name = "variant.cubin";
  req.command = {nvcc, "-arch=sm_90a", "-O3", "-cubin", "-o", "{out}", "{src}"};
  req.compiler_id = nvcc;
  req.refuse_ldgsts_defect = true;
  BuildResult r = cache.build(req);
  REQUIRE_MESSAGE(r.ok, r.log);
  std::string cubin;
  REQUIRE(read_file(r.artifact, &cubin, &err));
  const auto kernels = cubin_kernels(cubin);
  REQUIRE(kernels.size() == 1);
  CHECK(kernels[0].first == "copy_rows");
  const CopyForms forms = count_copy_forms(kernels[0].second);
  MESSAGE(kernels[0].second.size() << " instructions, " << forms.ldgsts << " LDGSTS");
  CHECK(forms.ldgsts == 4);
  CHECK(forms.uniform_address == 0);
  remove_tree(dir);
}
