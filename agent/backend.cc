#include "agent/backend.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "base/fs.h"
#include "sandbox/cubin_check.h"
#include "sandbox/process.h"

namespace ktune::agent {

std::string find_nvcc() {
  if (const char* h = std::getenv("CUDA_HOME"); h && file_exists(join_path(h, "bin/nvcc"))) return join_path(h, "bin/nvcc");
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find(':', start);
      std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!dir.empty() && file_exists(join_path(dir, "nvcc"))) return join_path(dir, "nvcc");
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  return file_exists("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : "";
}

namespace {

// The compiler's own description of itself: part of every build's key, so a
// compiler upgrade rebuilds everything.
std::string compiler_id(const std::string& compiler) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(compiler);
  if (it != cache.end()) return it->second;
  sandbox::ProcessSpec spec;
  spec.argv = {compiler, "--version"};
  spec.workdir = join_path(cache_dir(), "tmp");
  spec.env = sandbox::clean_env(spec.workdir);
  spec.limits.timeout_s = 30;
  sandbox::ProcessResult r;
  std::string err;
  std::string id = run_process(spec, &r, &err) && r.ok() ? r.out : compiler;
  cache[compiler] = id;
  return id;
}

}  // namespace

sandbox::BuildRequest BackendSpec::build_request(const std::string& source) const {
  sandbox::BuildRequest r;
  r.source = source;
  r.timeout_s = build_timeout_s;
  r.memory_bytes = build_memory_bytes;
  r.cpu_seconds = build_timeout_s;  // each compiler process: CPU time bounded as well as wall time
  if (name == "cuda") {
    std::string nvcc = find_nvcc();
    r.source_name = "variant.cu";
    r.artifact_name = "variant.cubin";
    r.command = {nvcc, "-arch=sm_90a", "-O3", "-cubin", "-lineinfo", "-Xptxas", "-v", "-o", "{out}", "{src}"};
    // KTUNE_CUDA_LINK=separate: separate compilation (-rdc), then nvlink.
    // Every out-of-line device function is then compiled to the standard
    // calling convention, so its instruction schedule depends on its own
    // source only. Compiled as one program (the default, and faster), the
    // shared GEMV loop is rescheduled whenever any other part of the kernel
    // changes, which moves the timed step by up to 10 us; comparing two
    // kernel changes under `separate` tells their own effect (RESULTS, runs 83-84).
    if (const char* link = std::getenv("KTUNE_CUDA_LINK"); link && std::string(link) == "separate") {
      const std::string nvlink = nvcc.substr(0, nvcc.size() - 4) + "nvlink";  // beside nvcc (find_nvcc: ".../nvcc")
      r.command = {"sh", "-c",
                   "\"$0\" -arch=sm_90a -O3 -rdc=true -cubin -lineinfo -Xptxas -v -o \"{out}.o\" \"{src}\" && "
                   "\"$1\" -arch=sm_90a -o \"{out}\" \"{out}.o\"",
                   nvcc, nvlink};
    }
    r.compiler_id = compiler_id(nvcc);
    r.refuse_ldgsts_defect = sandbox::compiler_has_ldgsts_defect(r.compiler_id);
    r.memory_bytes = 0;  // nvcc's children map more than an RLIMIT_AS allows for
  } else {
    r.source_name = "variant.cc";
    r.artifact_name = "variant.so";
    if (name == "host")
      r.command = {"g++", "-std=c++17", "-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-o", "{out}",
                   "-x", "c++", "{src}"};
    else  // cuda-emu: the CUDA source through the emulator header
      r.command = {"g++", "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-o", "{out}", "-x", "c++", "{src}"};
    r.compiler_id = compiler_id("g++");
  }
  return r;
}

bool backend_spec(const std::string& name, BackendSpec* out, std::string* err) {
  BackendSpec b;
  b.name = name;
  int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (name == "host") {
    b.templates = "host";
    b.builds_overlap_timing = false;
    b.warmup = 2;
    b.samples = 15;
    b.build_workers = std::min(cores, 4);
    b.runner_memory_bytes = size_t(8) << 30;
  } else if (name == "cuda") {
    if (find_nvcc().empty()) {
      *err = "the cuda backend needs nvcc (on PATH or in /usr/local/cuda/bin)";
      return false;
    }
    b.templates = "cuda";
    b.builds_overlap_timing = true;
    b.warmup = 10;
    b.samples = 60;
    b.build_workers = std::max(1, std::min(cores - 2, 8));
    b.build_timeout_s = 300;
    b.step_timeout_s = 30;
  } else if (name == "cuda-emu") {
    b.templates = "cuda";
    b.builds_overlap_timing = false;
    b.warmup = 0;
    b.samples = 2;
    b.build_workers = std::min(cores, 2);
    b.build_timeout_s = 300;
    b.step_timeout_s = 600;
    b.runner_memory_bytes = size_t(16) << 30;
  } else {
    *err = "unknown backend '" + name + "' (expected host, cuda or cuda-emu)";
    return false;
  }
  *out = b;
  return true;
}

}  // namespace ktune::agent
