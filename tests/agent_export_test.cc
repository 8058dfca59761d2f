// `ktune export` (agent/export.h), through the real binary: a CUDA
// megakernel variant recorded in a database comes out as a PyTorch module
// directory; the kernel and its host wrapper compile with nvcc; the module
// imports on the CPU and names its weights exactly as the spec does
// (export/test_export_cpu.py, with Debian's python3-torch). Parts whose tool
// is missing report SKIPPED.
#include <doctest/doctest.h>

#include "agent/backend.h"
#include "agent/evaluator.h"
#include "agent/export.h"
#include "base/fs.h"
#include "base/sha256.h"
#include "kernels/kimi/golden.h"
#include "kernels/kimi/templates.h"
#include "sandbox/process.h"
#include "tests/traces_fixture.h"

using namespace ktune;
using traces::testing::TempDir;

namespace {

// Records a session holding one variant of `tmpl` rendered for `backend` and
// config `size` with default knobs; returns the variant.
agent::Variant record_variant(traces::Store& store, const std::string& size, const std::string& backend,
                              const std::string& tmpl) {
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset(size, &cfg, &err));
  agent::BackendSpec spec;
  spec.name = backend;
  agent::Variant v;
  REQUIRE_MESSAGE(agent::render_variant(cfg, spec, *kimi::find_template(tmpl), json::object(), "", &v, &err), err);
  int64_t session = 0;
  json started = {{"task", "kimi-linear"}, {"size", size},  {"backend", backend},        {"designer", "search"},
                  {"budget_s", 60},        {"seed", 1},     {"weights_seed", 0},         {"config", cfg.to_json()},
                  {"env", json::object()}, {"argv", json::array()}, {"options", json::object()}};
  REQUIRE_MESSAGE(store.create_session(started, &session, &err), err);
  REQUIRE_MESSAGE(store.record(session, "variant", 0, v.to_event(), &err), err);
  return v;
}

sandbox::ProcessResult run(const std::vector<std::string>& argv, const std::string& workdir, double timeout_s) {
  sandbox::ProcessSpec spec;
  spec.argv = argv;
  spec.workdir = workdir;
  spec.env = sandbox::clean_env(workdir);
  spec.limits.timeout_s = timeout_s;
  sandbox::ProcessResult r;
  std::string err;
  REQUIRE_MESSAGE(sandbox::run_process(spec, &r, &err), err);
  return r;
}

sandbox::ProcessResult ktune_export(const TempDir& tmp, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {std::string(KTUNE_BINARY_DIR) + "/ktune", "export"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, tmp.file("work"), 60);
}

const char* kFiles[] = {"kernel.cu", "kimi_ext.cu", "solution.py", "eager.py", "reference.py", "README.md",
                        "variant.json"};

}  // namespace

TEST_CASE("export: a CUDA megakernel variant of the full config becomes a PyTorch module directory") {
  TempDir tmp;
  traces::Store store;
  std::string err;
  REQUIRE(store.open(tmp.file("k.sqlite"), &err));
  agent::Variant v = record_variant(store, "full", "cuda", "kimi-mega-cuda");
  store.close();

  std::string out = tmp.file("module");
  sandbox::ProcessResult r =
      ktune_export(tmp, {"--db", tmp.file("k.sqlite"), v.id.substr(0, 12), "--format", "torch-module", "--out", out});
  REQUIRE_MESSAGE(r.ok(), r.describe() << ": " << r.err);
  CHECK(r.out.find("exported variant " + v.id.substr(0, 16)) != std::string::npos);
  for (const char* f : kFiles) CHECK_MESSAGE(file_exists(join_path(out, f)), f);

  std::string kernel, solution, record_text;
  REQUIRE(read_file(join_path(out, "kernel.cu"), &kernel, &err));
  CHECK(kernel == v.source);  // byte for byte what ktune measured: its hash is the variant id
  CHECK(sha256_hex(kernel) == v.id);
  REQUIRE(read_file(join_path(out, "solution.py"), &solution, &err));
  CHECK(solution.find("VARIANT_ID = \"" + v.id + "\"") != std::string::npos);
  CHECK(solution.find("\"hidden\": 2304") != std::string::npos);
  CHECK(solution.find("\"barrier\": \"counter\"") != std::string::npos);
  REQUIRE(read_file(join_path(out, "variant.json"), &record_text, &err));
  json record = json::parse(record_text);
  CHECK(record["variant"] == v.id);
  CHECK(record["config"]["name"] == "full");
  CHECK(record["knobs"] == v.knobs);
  CHECK(record["weights"].size() == kimi::weight_specs(kimi::KimiConfig{}).size());

  // A second export into the same directory needs --force.
  r = ktune_export(tmp, {"--db", tmp.file("k.sqlite"), v.id, "--out", out});
  CHECK_FALSE(r.ok());
  CHECK(r.err.find("--force") != std::string::npos);
  r = ktune_export(tmp, {"--db", tmp.file("k.sqlite"), v.id, "--out", out, "--force"});
  CHECK_MESSAGE(r.ok(), r.err);
}

TEST_CASE("export: --knobs exports the megakernel template at those knobs, no database needed") {
  TempDir tmp;
  const std::string out = tmp.file("module");
  sandbox::ProcessResult r = ktune_export(tmp, {"--knobs", "{\"unroll\": 2}", "--size", "small", "--out", out});
  REQUIRE_MESSAGE(r.ok(), r.err);
  CHECK(r.out.find("config small") != std::string::npos);
  std::string kernel, record, err;
  REQUIRE(read_file(join_path(out, "kernel.cu"), &kernel, &err));
  CHECK(kernel.find("#define KT_UNROLL 2") != std::string::npos);
  REQUIRE(read_file(join_path(out, "variant.json"), &record, &err));
  json j = json::parse(record);
  CHECK(j["knobs"]["unroll"] == 2);
  CHECK(j["origin"] == "knobs");
  CHECK(j["variant"].get<std::string>().size() == 64);
}

TEST_CASE("export: errors say what is wrong") {
  TempDir tmp;
  traces::Store store;
  std::string err;
  REQUIRE(store.open(tmp.file("k.sqlite"), &err));
  agent::Variant host = record_variant(store, "small", "host", "kimi-mega-host");
  agent::Variant base = record_variant(store, "small", "cuda", "kimi-base-cuda");
  agent::Variant emu = record_variant(store, "small", "cuda-emu", "kimi-mega-cuda");
  store.close();
  auto fails_with = [&](const std::vector<std::string>& args, const std::string& text) {
    sandbox::ProcessResult r = ktune_export(tmp, args);
    CHECK_FALSE(r.ok());
    CHECK_MESSAGE(r.err.find(text) != std::string::npos, "stderr: " << r.err);
  };
  const std::string db = tmp.file("k.sqlite"), out = tmp.file("module");
  fails_with({"--db", tmp.file("none.sqlite"), host.id, "--out", out}, "no database at");
  fails_with({"--db", db, "deadbeef", "--out", out}, "no variant with id or prefix 'deadbeef'");
  fails_with({"--db", db, host.id, "--out", out}, "only CUDA megakernel variants");
  fails_with({"--db", db, base.id, "--out", out}, "kimi-base-cuda variant");
  fails_with({"--db", db, emu.id, "--format", "onnx", "--out", out}, "unknown format 'onnx'");
  fails_with({"--knobs", "{\"threads\": 100}", "--out", out}, "invalid knobs");
  fails_with({"--knobs", "[1", "--out", out}, "not a JSON object");
  fails_with({"--knobs", "{}", "--size", "huge", "--out", out}, "huge");
  fails_with({"--db", db, emu.id, "--knobs", "{}", "--out", out}, "not both");
  fails_with({"--out", out}, "no variant");
  CHECK_FALSE(file_exists(out));

  // A variant rendered for the emulator exports without the emulator.
  sandbox::ProcessResult r = ktune_export(tmp, {"--db", db, emu.id, "--out", out});
  REQUIRE_MESSAGE(r.ok(), r.err);
  std::string kernel;
  REQUIRE(read_file(join_path(out, "kernel.cu"), &kernel, &err));
  CHECK(kernel.find("#define KT_EMULATION") == std::string::npos);
  CHECK(kernel.find("ktune_k0") != std::string::npos);
  CHECK(r.out.find("config small") != std::string::npos);
}

TEST_CASE("export: the sizes come back from a rendered source") {
  for (const char* size : {"full", "small", "tiny"}) {
    kimi::KimiConfig cfg, back;
    std::string err, source;
    REQUIRE(kimi::KimiConfig::preset(size, &cfg, &err));
    REQUIRE(variants::render_source(kimi::config_defines(cfg), "int x;\n", &source, &err));
    REQUIRE_MESSAGE(agent::config_from_source(source, &back, &err), err);
    CHECK(back.to_json() == cfg.to_json());
  }
  kimi::KimiConfig back;
  std::string err;
  CHECK_FALSE(agent::config_from_source("#define KT_D 2304\nint x;\n", &back, &err));
  CHECK(err.find("KT_KH is missing") != std::string::npos);
}

TEST_CASE("export: the module's CUDA code compiles and its Python imports and names its weights as the spec does") {
  TempDir tmp;
  traces::Store store;
  std::string err;
  REQUIRE(store.open(tmp.file("k.sqlite"), &err));
  agent::Variant v = record_variant(store, "full", "cuda", "kimi-mega-cuda");
  store.close();
  std::string out = tmp.file("module");
  sandbox::ProcessResult r = ktune_export(tmp, {"--db", tmp.file("k.sqlite"), v.id, "--out", out});
  REQUIRE_MESSAGE(r.ok(), r.err);

  std::string nvcc = agent::find_nvcc();
  if (nvcc.empty()) {
    MESSAGE("SKIPPED: no nvcc, the exported CUDA code was not compiled");
  } else {
    // kimi_ext.cu with the flags PyTorch's builder adds (for 9.0a: solution.py), minus PyTorch's own headers.
    r = run({nvcc, "-arch=sm_90a", "-O3", "-std=c++17", "-c", "-DKIMI_EXT_LAUNCHER_ONLY",
             "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-o",
             tmp.file("kimi_ext.o"), join_path(out, "kimi_ext.cu")},
            tmp.file("nvcc"), 600);
    CHECK_MESSAGE(r.ok(), "kimi_ext.cu + kernel.cu: " << r.describe() << "\n" << r.err);
  }

  if (!file_exists("/usr/bin/python3") || !run({"/usr/bin/python3", "-c", "import torch"}, tmp.file("py"), 120).ok()) {
    MESSAGE("SKIPPED: no torch for /usr/bin/python3");
    return;
  }
  std::vector<std::string> argv = {"/usr/bin/python3", std::string(KTUNE_SOURCE_DIR) + "/export/test_export_cpu.py",
                                   out};
  if (std::string golden = kimi::find_golden_dir(); !golden.empty()) argv.insert(argv.end(), {"--golden", golden});
  r = run(argv, tmp.file("py"), 600);
  CHECK_MESSAGE(r.ok(), "test_export_cpu.py: " << r.describe() << "\n" << r.out << r.err);
  MESSAGE(r.out);
}
