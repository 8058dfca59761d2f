// Tests of the build cache with the real g++: builds, hits, cached compile
// errors, uncached timeouts, one build per key under concurrency, parallel
// builds of different keys, and the ptxas resource parser.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "base/clock.h"
#include "base/fs.h"
#include "sandbox/build_cache.h"

using namespace ktune;
using namespace ktune::sandbox;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    std::string error;
    REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-build-test-", &path, &error), error);
  }
  ~TempDir() { remove_tree(path); }
};

BuildRequest shared_library(const std::string& source) {
  BuildRequest req;
  req.source = source;
  req.source_name = "variant.cc";
  req.artifact_name = "variant.so";
  req.command = {"g++", "-shared", "-fPIC", "-O1", "-o", "{out}", "{src}"};
  req.compiler_id = "g++ (test)";
  req.timeout_s = 60;
  return req;
}

// nvcc on PATH or in /usr/local/cuda/bin; "" when there is none.
std::string find_nvcc() {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/local/cuda/bin";
  for (size_t begin = 0; begin <= dirs.size();) {
    size_t end = std::min(dirs.find(':', begin), dirs.size());
    std::string candidate = dirs.substr(begin, end - begin) + "/nvcc";
    if (end > begin && access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  return "";
}

}  // namespace

TEST_CASE("BuildCache builds a shared library once, then serves it from the cache") {
  TempDir dir;
  BuildCache cache(dir.path + "/cache");
  BuildRequest req = shared_library("extern \"C\" int answer() { return 42; }\n");

  BuildResult first = cache.build(req);
  REQUIRE_MESSAGE(first.ok, first.log);
  CHECK_FALSE(first.cached);
  CHECK_FALSE(first.timed_out);
  CHECK(first.key == BuildCache::key_of(req));
  CHECK(first.artifact == dir.path + "/cache/" + first.key + "/variant.so");
  CHECK(file_exists(first.artifact));
  CHECK(file_exists(dir.path + "/cache/" + first.key + "/result.json"));
  CHECK(file_exists(dir.path + "/cache/" + first.key + "/variant.cc"));
  CHECK(first.seconds > 0);
  CHECK(first.command_line.find("g++ -shared") == 0);
  CHECK(first.command_line.find(dir.path + "/cache/" + first.key + "/variant.cc") != std::string::npos);
  CHECK(first.resources == json::object());  // g++ prints no ptxas lines

  // The artifact is a real library.
  void* library = dlopen(first.artifact.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(library, dlerror());
  void* answer = dlsym(library, "answer");
  REQUIRE(answer != nullptr);
  CHECK(reinterpret_cast<int (*)()>(answer)() == 42);
  dlclose(library);

  BuildResult second = cache.build(req);
  CHECK(second.ok);
  CHECK(second.cached);
  CHECK(second.seconds == 0);
  CHECK(second.artifact == first.artifact);
  CHECK(second.command_line == first.command_line);

  // Everything that shapes the output is in the key.
  BuildRequest other = req;
  other.compiler_id = "g++ 13";
  CHECK(BuildCache::key_of(other) != first.key);
  other = req;
  other.command[3] = "-O2";
  CHECK(BuildCache::key_of(other) != first.key);
  other = req;
  other.source += " ";
  CHECK(BuildCache::key_of(other) != first.key);
  other = req;
  other.timeout_s = 1;  // how long we wait is not
  CHECK(BuildCache::key_of(other) == first.key);
}

TEST_CASE("a compile error is kept as evidence and cached") {
  TempDir dir;
  BuildCache cache(dir.path);
  BuildRequest req = shared_library("int broken( { return 0; }\n");
  BuildResult first = cache.build(req);
  CHECK_FALSE(first.ok);
  CHECK_FALSE(first.cached);
  CHECK_FALSE(first.timed_out);
  CHECK(first.artifact.empty());
  CHECK(first.log.find("error") != std::string::npos);
  CHECK(first.log.find("variant.cc") != std::string::npos);

  BuildResult second = cache.build(req);
  CHECK_FALSE(second.ok);
  CHECK(second.cached);
  CHECK(second.log == first.log);
}

TEST_CASE("a timed-out build is not cached") {
  TempDir dir;
  BuildCache cache(dir.path);
  BuildRequest req = shared_library("int f() { return 1; }\n");
  req.command = {"sleep", "5"};
  req.timeout_s = 0.5;
  double start = mono_seconds();
  BuildResult first = cache.build(req);
  CHECK(mono_seconds() - start < 2.0);
  CHECK(first.timed_out);
  CHECK_FALSE(first.ok);
  CHECK(first.log.find("timed out") != std::string::npos);
  CHECK_FALSE(file_exists(dir.path + "/" + first.key + "/result.json"));

  BuildResult second = cache.build(req);
  CHECK_FALSE(second.cached);
  CHECK(second.timed_out);
}

TEST_CASE("a compiler killed by a signal is not cached") {
  TempDir dir;
  BuildCache cache(dir.path);
  BuildRequest req = shared_library("int f() { return 1; }\n");
  req.command = {"sh", "-c", "echo compiling; kill -KILL $$"};
  BuildResult first = cache.build(req);
  CHECK_FALSE(first.ok);
  CHECK_FALSE(first.timed_out);
  CHECK(first.log.find("compiling") != std::string::npos);
  CHECK(first.log.find("killed by SIGKILL") != std::string::npos);
  CHECK_FALSE(cache.build(req).cached);
}

TEST_CASE("a lost artifact or a damaged record means building again") {
  TempDir dir;
  BuildCache cache(dir.path);
  BuildRequest req = shared_library("int g() { return 2; }\n");
  BuildResult first = cache.build(req);
  REQUIRE_MESSAGE(first.ok, first.log);

  std::remove(first.artifact.c_str());
  BuildResult rebuilt = cache.build(req);
  CHECK(rebuilt.ok);
  CHECK_FALSE(rebuilt.cached);
  CHECK(file_exists(rebuilt.artifact));

  std::string error;
  REQUIRE(write_file_atomic(dir.path + "/" + first.key + "/result.json", "{\"ok\": tru", &error));
  BuildResult after_damage = cache.build(req);
  CHECK(after_damage.ok);
  CHECK_FALSE(after_damage.cached);
  CHECK(cache.build(req).cached);
}

TEST_CASE("four threads asking for the same new build compile it once") {
  TempDir dir;
  BuildCache cache(dir.path);
  BuildRequest req = shared_library("extern \"C\" int seven() { return 7; }\n");
  // Runs in <dir>/<key>, so ../count is <dir>/count: one line per real build.
  req.command = {"sh", "-c", "echo x >> ../count; sleep 0.2; g++ -shared -fPIC -o {out} {src}"};
  std::vector<BuildResult> results(4);
  std::vector<std::thread> threads;
  for (BuildResult& result : results) threads.emplace_back([&] { result = cache.build(req); });
  for (std::thread& thread : threads) thread.join();

  std::string count, error;
  REQUIRE(read_file(dir.path + "/count", &count, &error));
  CHECK(count == "x\n");
  int real_builds = 0;
  for (const BuildResult& result : results) {
    CHECK_MESSAGE(result.ok, result.log);
    CHECK(result.artifact == results[0].artifact);
    real_builds += result.cached ? 0 : 1;
  }
  CHECK(real_builds == 1);
}

TEST_CASE("builds of different sources run in parallel") {
  TempDir dir;
  BuildCache cache(dir.path);
  std::vector<BuildResult> results(2);
  std::vector<std::thread> threads;
  double start = mono_seconds();
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      BuildRequest req = shared_library("// variant " + std::to_string(i) + "\n");
      req.command = {"sh", "-c", "sleep 0.6; cp {src} {out}"};
      results[size_t(i)] = cache.build(req);
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(mono_seconds() - start < 1.1);
  CHECK(results[0].ok);
  CHECK(results[1].ok);
  CHECK(results[0].key != results[1].key);
}

TEST_CASE("a cubin built by the real nvcc comes with its registers and shared memory") {
  std::string nvcc = find_nvcc();
  if (nvcc.empty()) {
    MESSAGE("skipped: no nvcc on PATH or in /usr/local/cuda/bin");
    return;
  }
  TempDir dir;
  BuildCache cache(dir.path);
  BuildRequest req;
  req.source =
      "__global__ void kimi_step(float* a) {\n"
      "  __shared__ float s[1024];\n"
      "  s[threadIdx.x] = a[threadIdx.x];\n"
      "  __syncthreads();\n"
      "  a[threadIdx.x] = s[1023 - threadIdx.x];\n"
      "}\n";
  req.source_name = "variant.cu";
  req.artifact_name = "variant.cubin";
  req.command = {nvcc, "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", "{out}", "{src}"};
  req.compiler_id = nvcc;
  BuildResult result = cache.build(req);
  REQUIRE_MESSAGE(result.ok, result.log);
  CHECK(result.resources["registers"].get<int>() > 0);
  CHECK(result.resources["smem_bytes"] == 4096);
  CHECK(result.resources["functions"]["_Z9kimi_stepPf"]["smem_bytes"] == 4096);
  CHECK(cache.build(req).resources == result.resources);
}

TEST_CASE("parse_ptxas_resources reads nvcc -Xptxas -v output") {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'kimi_step' for 'sm_90a'\n"
      "ptxas info    : Function properties for kimi_step\n"
      "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 128 registers, used 1 barriers, 48 bytes cmem[0], 1024 bytes smem\n"
      "ptxas info    : Compiling entry function 'kimi_prefill' for 'sm_90a'\n"
      "ptxas info    : Function properties for kimi_prefill\n"
      "    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
      "ptxas info    : Used 96 registers, 49152 bytes smem, 400 bytes cmem[0]\n";
  json resources = parse_ptxas_resources(log);
  CHECK(resources["registers"] == 128);
  CHECK(resources["smem_bytes"] == 49152);
  CHECK(resources["stack_frame"] == 8);
  CHECK(resources["spill_stores"] == 12);
  CHECK(resources["spill_loads"] == 20);
  CHECK(resources["functions"]["kimi_step"]["registers"] == 128);
  CHECK(resources["functions"]["kimi_step"]["smem_bytes"] == 1024);
  CHECK(resources["functions"]["kimi_step"]["spill_loads"] == 12);
  CHECK(resources["functions"]["kimi_prefill"]["registers"] == 96);
  CHECK(resources["functions"]["kimi_prefill"]["smem_bytes"] == 49152);

  json unnamed = parse_ptxas_resources("ptxas info    : Used 32 registers, 352 bytes cmem[0]\n");
  CHECK(unnamed == json{{"registers", 32}});

  CHECK(parse_ptxas_resources("") == json::object());
  CHECK(parse_ptxas_resources("variant.cc:1:5: error: expected ')' with 3 registers\n") == json::object());
}
