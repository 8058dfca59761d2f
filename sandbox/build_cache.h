// The compiler driver and its cache. A build is named by the SHA-256 of what
// determines its output (source, compiler identity, flags), so a variant is
// compiled at most once per machine; builds run in the sandbox with a
// timeout, in parallel, and their logs are kept as evidence.
#pragma once
#include <string>
#include <vector>

#include "base/json.h"
#include "sandbox/process.h"

namespace ktune::sandbox {

struct BuildRequest {
  std::string source;                // the complete translation unit
  std::string source_name;           // file name inside the build dir, e.g. "variant.cu"
  std::string artifact_name;         // e.g. "variant.cubin" or "variant.so"
  std::vector<std::string> command;  // argv; "{src}" and "{out}" (anywhere in an element) become absolute paths
  std::string compiler_id;           // e.g. the output of `nvcc --version`; part of the key
  double timeout_s = 300;
  size_t memory_bytes = 0;
  double cpu_seconds = 0;            // RLIMIT_CPU per compiler process (0: none)
  // The artifact is an sm_90 cubin from a compiler with the LDGSTS defect
  // (cubin_check.h): a build whose code has that form fails, with the
  // reason in its log. Part of the key.
  bool refuse_ldgsts_defect = false;
};

struct BuildResult {
  bool ok = false;
  bool cached = false;
  std::string key;            // the hash
  std::string artifact;       // absolute path when ok
  std::string log;            // compiler stdout + stderr (tail)
  std::string command_line;   // what ran, for the record
  double seconds = 0;         // 0 when cached
  bool timed_out = false;
  json resources = json::object();  // parsed from the log: registers, spills, smem (nvcc -Xptxas -v)
};

// On disk: <dir>/<key>/ holds the source, the artifact, build.log and
// result.json ({ok, log, command_line, seconds, resources, timed_out}).
// result.json is written last, so a build killed midway is not a hit.
// Compile errors and refused artifacts are cached (they are deterministic); timeouts, compilers
// killed by a signal (out of memory, mostly) and a compiler that cannot be
// started are not (the next call retries). <dir>/<key>.lock files stay
// behind (empty; they serialize builds of the key).
// The command runs with clean_env(<dir>/<key>) and that directory as cwd.
class BuildCache {
 public:
  explicit BuildCache(std::string dir) : dir_(std::move(dir)) {}
  // Thread-safe: concurrent builds of different keys run in parallel; the
  // same key is built once (a second caller waits for the first), also
  // across processes sharing `dir` (an flock on <dir>/<key>.lock).
  BuildResult build(const BuildRequest& req);
  static std::string key_of(const BuildRequest& req);
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// Reads "Used N registers, ... N bytes smem, N bytes stack frame, N bytes
// spill stores" lines of ptxas -v into {"registers":..,"smem_bytes":..,..}:
// registers, smem_bytes and stack_frame are maxima over functions,
// spill_stores and spill_loads sums; "functions" maps each named function
// to its own values. Keys that never appear are absent (a log without
// ptxas lines gives an empty object).
json parse_ptxas_resources(const std::string& log);

}  // namespace ktune::sandbox
