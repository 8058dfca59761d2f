// Tests of the sandbox's child processes with real programs (sh, cat, seq,
// g++): exit statuses and signals, output capture, stdin, limits, timeouts
// that kill whole process groups, the secret-free environment, and the
// line-protocol child that hosts the runner.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/fs.h"
#include "sandbox/process.h"

using namespace ktune;
using namespace ktune::sandbox;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    std::string error;
    REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-process-test-", &path, &error), error);
  }
  ~TempDir() { remove_tree(path); }
};

ProcessSpec spec_for(std::vector<std::string> argv, const std::string& workdir, double timeout_s = 10) {
  ProcessSpec spec;
  spec.argv = std::move(argv);
  spec.workdir = workdir;
  spec.env = clean_env(workdir);
  spec.limits.timeout_s = timeout_s;
  return spec;
}

ProcessResult run(const ProcessSpec& spec) {
  ProcessResult result;
  std::string error;
  REQUIRE_MESSAGE(run_process(spec, &result, &error), error);
  return result;
}

ProcessResult run(std::vector<std::string> argv, const std::string& workdir, double timeout_s = 10) {
  return run(spec_for(std::move(argv), workdir, timeout_s));
}

std::string read_text(const std::string& path) {
  std::string text, error;
  REQUIRE_MESSAGE(read_file(path, &text, &error), error);
  return text;
}

// Gone, or a zombie waiting for an init that may never reap it (as in some
// containers): either way it runs no more.
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::string stat, error;
  if (!read_file("/proc/" + std::to_string(pid) + "/stat", &stat, &error)) return true;
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

bool becomes_gone(pid_t pid, double within_s) {
  double deadline = mono_seconds() + within_s;
  while (!process_gone(pid)) {
    if (mono_seconds() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

struct UniqueDescriptor {
  int fd;
  explicit UniqueDescriptor(int fd) : fd(fd) {}
  ~UniqueDescriptor() {
    if (fd >= 0) close(fd);
  }
};

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("run_process reports exit codes and signals") {
  TempDir dir;
  ProcessResult result = run({"sh", "-c", "exit 3"}, dir.path);
  CHECK(result.exit_code == 3);
  CHECK(result.signal == 0);
  CHECK_FALSE(result.ok());
  CHECK(result.describe() == "exit 3");

  result = run({"true"}, dir.path);
  CHECK(result.ok());
  CHECK(result.describe() == "exit 0");

  result = run({"sh", "-c", "kill -SEGV $$"}, dir.path);
  CHECK(result.signal == SIGSEGV);
  CHECK_FALSE(result.ok());
  CHECK(result.describe() == "killed by SIGSEGV");

  CHECK(run({"sh", "-c", "kill -ABRT $$"}, dir.path).describe() == "killed by SIGABRT");
  CHECK(run({"sh", "-c", "kill -BUS $$"}, dir.path).describe() == "killed by SIGBUS");
}

TEST_CASE("run_process captures stdout and stderr and keeps their tails") {
  TempDir dir;
  ProcessResult result = run({"sh", "-c", "echo out; echo err >&2"}, dir.path);
  CHECK(result.out == "out\n");
  CHECK(result.err == "err\n");

  std::string numbers;
  for (int i = 1; i <= 100000; ++i) numbers += std::to_string(i) + "\n";
  ProcessSpec spec = spec_for({"sh", "-c", "seq 1 100000; seq 1 100000 >&2"}, dir.path);
  spec.capture_bytes = 10;
  result = run(spec);
  CHECK(result.ok());
  CHECK(result.out == numbers.substr(numbers.size() - 10));
  CHECK(result.err == numbers.substr(numbers.size() - 10));
}

TEST_CASE("run_process feeds stdin, also to a child that does not read it") {
  TempDir dir;
  std::string data;
  for (int i = 0; data.size() < (3 << 20); ++i) data += "line " + std::to_string(i) + "\n";
  ProcessSpec spec = spec_for({"cat"}, dir.path);
  spec.stdin_data = data;
  spec.capture_bytes = 4 << 20;
  ProcessResult result = run(spec);
  CHECK(result.ok());
  CHECK(result.out == data);

  spec.argv = {"sh", "-c", "exit 0"};  // exits without reading: no hang, no SIGPIPE in this process
  result = run(spec);
  CHECK(result.ok());
}

TEST_CASE("the workdir is created and is the child's cwd, HOME and TMPDIR") {
  TempDir dir;
  std::string workdir = dir.path + "/a/b";
  ProcessResult result = run({"sh", "-c", "pwd -P; echo \"$HOME\"; echo \"$TMPDIR\""}, workdir);
  std::string real = std::filesystem::canonical(workdir).string();
  CHECK(result.out == real + "\n" + workdir + "\n" + workdir + "\n");
}

TEST_CASE("a program that is not on the child's PATH is reported, not run") {
  TempDir dir;
  ProcessResult result;
  std::string error;
  CHECK_FALSE(run_process(spec_for({"no-such-program-ktune"}, dir.path), &result, &error));
  CHECK(error.find("no-such-program-ktune") != std::string::npos);
  CHECK(error.find("No such file") != std::string::npos);
}

TEST_CASE("a timeout kills the child's whole process group") {
  TempDir dir;
  double start = mono_seconds();
  ProcessResult result = run({"sh", "-c", "sleep 100 & echo $! > gc.pid; sleep 100"}, dir.path, 0.5);
  double elapsed = mono_seconds() - start;
  CHECK(result.timed_out);
  CHECK(result.signal == SIGKILL);
  CHECK_FALSE(result.ok());
  CHECK(elapsed < 1.5);
  CHECK(result.describe().rfind("timed out after 0.", 0) == 0);
  pid_t grandchild = std::stoi(read_text(dir.path + "/gc.pid"));
  CHECK(becomes_gone(grandchild, 2.0));
}

TEST_CASE("what a child leaves running in its group dies when it exits") {
  TempDir dir;
  double start = mono_seconds();
  // The background sleep holds stdout open; run_process must not wait for it.
  ProcessResult result = run({"sh", "-c", "sleep 100 & echo $! > gc.pid; echo done"}, dir.path, 10);
  CHECK(mono_seconds() - start < 2.0);
  CHECK(result.ok());
  CHECK(result.out == "done\n");
  pid_t grandchild = std::stoi(read_text(dir.path + "/gc.pid"));
  CHECK(becomes_gone(grandchild, 2.0));
}

TEST_CASE("a memory limit stops a program that allocates too much") {
  TempDir dir;
  std::string error;
  REQUIRE(write_file_atomic(dir.path + "/hog.cc", R"(
#include <cstdlib>
int main() {
  const size_t n = size_t(2) << 30;
  volatile char* p = static_cast<volatile char*>(std::malloc(n));
  if (!p) return 3;
  for (size_t i = 0; i < n; i += 4096) p[i] = 1;
  return p[n - 4096] == 1 ? 0 : 4;
}
)",
                              &error));
  ProcessResult compile = run({"g++", "-O0", "-o", "hog", "hog.cc"}, dir.path, 60);
  REQUIRE_MESSAGE(compile.ok(), compile.err);

  ProcessSpec spec = spec_for({"./hog"}, dir.path);
  spec.limits.memory_bytes = size_t(256) << 20;
  ProcessResult result = run(spec);
  CHECK_FALSE(result.ok());
  CHECK((result.exit_code == 3 || result.signal != 0));
}

TEST_CASE("the limits reach the child, and none of this process's descriptors do") {
  TempDir dir;
  UniqueDescriptor leak_candidate(open("/dev/null", O_RDONLY));  // deliberately not close-on-exec
  REQUIRE(leak_candidate.fd >= 3);
  ProcessSpec spec = spec_for({"sh", "-c", "ls /proc/$$/fd; ulimit -c; ulimit -t; ulimit -v"}, dir.path);
  spec.limits.cpu_seconds = 7;
  spec.limits.memory_bytes = size_t(256) << 20;
  ProcessResult result = run(spec);
  // fds 0 1 2; core files off; 7 CPU seconds; 262144 KiB of address space
  CHECK(result.out == "0\n1\n2\n0\n7\n262144\n");
}

TEST_CASE("a CPU-time limit stops a busy loop") {
  TempDir dir;
  ProcessSpec spec = spec_for({"sh", "-c", "while :; do :; done"}, dir.path);
  spec.limits.cpu_seconds = 0.5;  // rounded up to 1 s
  ProcessResult result = run(spec);
  CHECK_FALSE(result.timed_out);
  CHECK(result.describe() == "killed by SIGXCPU");
}

TEST_CASE("clean_env passes on no secrets and little else") {
  TempDir dir;
  ScopedEnv api_key("FOO_API_KEY", "sk-foo");
  ScopedEnv token("MY_TOKEN", "tok");
  ScopedEnv openai("OPENAI_API_KEY", "sk-openai");
  ScopedEnv unrelated("KTUNE_TEST_UNRELATED", "x");
  ScopedEnv cuda("CUDA_MODULE_LOADING", "LAZY");

  auto env = clean_env(dir.path, {{"X_SECRET", "v"}, {"db_password", "p"}, {"EXTRA_SETTING", "yes"}});
  CHECK(env.at("HOME") == dir.path);
  CHECK(env.at("TMPDIR") == dir.path);
  CHECK(env.at("LANG") == "C.UTF-8");
  CHECK(env.at("CUDA_MODULE_LOADING") == "LAZY");
  CHECK(env.at("EXTRA_SETTING") == "yes");
  CHECK(env.count("PATH") == 1);
  for (const char* absent : {"FOO_API_KEY", "MY_TOKEN", "OPENAI_API_KEY", "X_SECRET", "db_password",
                             "KTUNE_TEST_UNRELATED"})
    CHECK_MESSAGE(env.count(absent) == 0, absent);

  ProcessSpec spec = spec_for({"env"}, dir.path);
  spec.env = env;
  std::string printed = "\n" + run(spec).out;
  CHECK(printed.find("\nPATH=") != std::string::npos);
  CHECK(printed.find("\nHOME=" + dir.path + "\n") != std::string::npos);
  for (const char* secret : {"FOO_API_KEY", "MY_TOKEN", "OPENAI_API_KEY", "X_SECRET", "sk-", "db_password"})
    CHECK_MESSAGE(printed.find(secret) == std::string::npos, secret);
}

TEST_CASE("clean_env passes a profiler's settings on only under KTUNE_NO_CUPTI") {
  TempDir dir;
  ScopedEnv preload("LD_PRELOAD", "/opt/ncu/libInjection.so");
  ScopedEnv launch("NV_TPS_LAUNCH_TOKEN", "t1");
  ScopedEnv injection("CUDA_INJECTION64_PATH", "/opt/ncu/inj.so");
  ScopedEnv secret("MY_TOKEN", "tok");
  {
    auto env = clean_env(dir.path);
    for (const char* absent : {"LD_PRELOAD", "NV_TPS_LAUNCH_TOKEN", "CUDA_INJECTION64_PATH", "KTUNE_NO_CUPTI"})
      CHECK_MESSAGE(env.count(absent) == 0, absent);
  }
  {
    ScopedEnv zero("KTUNE_NO_CUPTI", "0");  // "0" is not set
    CHECK_FALSE(under_profiler());
    CHECK(clean_env(dir.path).count("NV_TPS_LAUNCH_TOKEN") == 0);
  }
  ScopedEnv off("KTUNE_NO_CUPTI", "1");
  CHECK(under_profiler());
  auto env = clean_env(dir.path, {{"LD_PRELOAD", "/from/extra.so"}});
  CHECK(env.at("KTUNE_NO_CUPTI") == "1");
  CHECK(env.at("NV_TPS_LAUNCH_TOKEN") == "t1");
  CHECK(env.at("CUDA_INJECTION64_PATH") == "/opt/ncu/inj.so");
  CHECK(env.at("LD_PRELOAD") == "/from/extra.so");  // extra still wins
  CHECK(env.count("MY_TOKEN") == 0);                // other secrets still stay behind
}

TEST_CASE("LineChild round-trips lines with cat, a multi-megabyte one too") {
  TempDir dir;
  LineChild child;
  std::string error, line;
  bool timed_out = false;
  REQUIRE_MESSAGE(child.start(spec_for({"cat"}, dir.path), dir.path + "/stderr.log", &error), error);
  CHECK(child.running());

  REQUIRE(child.send("hello", &error));
  REQUIRE(child.receive(&line, 5, &timed_out, &error));
  CHECK(line == "hello");

  for (const char* text : {"one", "two", "three"}) REQUIRE(child.send(text, &error));
  for (const char* text : {"one", "two", "three"}) {
    REQUIRE(child.receive(&line, 5, &timed_out, &error));
    CHECK(line == text);
  }

  // cat echoes while we are still writing: send() must not deadlock.
  std::string big;
  for (int i = 0; big.size() < (8 << 20); ++i) big += "{\"x\":" + std::to_string(i) + "},";
  REQUIRE_MESSAGE(child.send(big, &error), error);
  REQUIRE_MESSAGE(child.receive(&line, 10, &timed_out, &error), error);
  CHECK(line.size() == big.size());
  CHECK(line == big);

  child.kill();
  CHECK_FALSE(child.running());
  CHECK(child.exit_description() == "killed by SIGKILL");
}

TEST_CASE("LineChild: receive times out on a silent child, which can then be killed") {
  TempDir dir;
  LineChild child;
  std::string error, line;
  bool timed_out = false;
  REQUIRE(child.start(spec_for({"sleep", "30"}, dir.path), dir.path + "/stderr.log", &error));
  double start = mono_seconds();
  CHECK_FALSE(child.receive(&line, 0.3, &timed_out, &error));
  double elapsed = mono_seconds() - start;
  CHECK(timed_out);
  CHECK(elapsed >= 0.25);
  CHECK(elapsed < 2.0);
  CHECK(child.running());
  pid_t pid = child.pid();
  child.kill();
  CHECK_FALSE(child.running());
  CHECK(process_gone(pid));
}

TEST_CASE("LineChild: a child that dies mid-request is reported with its signal") {
  TempDir dir;
  LineChild child;
  std::string error, line;
  bool timed_out = false;
  std::string stderr_path = dir.path + "/stderr.log";
  REQUIRE(child.start(spec_for({"sh", "-c", "echo started >&2; read l; kill -SEGV $$"}, dir.path), stderr_path,
                      &error));
  REQUIRE(child.send("request", &error));
  CHECK_FALSE(child.receive(&line, 5, &timed_out, &error));
  CHECK_FALSE(timed_out);
  CHECK(error.find("SIGSEGV") != std::string::npos);
  CHECK(child.exit_description() == "killed by SIGSEGV");
  CHECK_FALSE(child.running());
  CHECK(read_text(stderr_path) == "started\n");

  CHECK_FALSE(child.receive(&line, 1, &timed_out, &error));  // still an error, not a hang
  CHECK(error.find("SIGSEGV") != std::string::npos);
}

TEST_CASE("LineChild: writing to a dead child fails without hurting the parent") {
  TempDir dir;
  LineChild child;
  std::string error;
  REQUIRE(child.start(spec_for({"sh", "-c", "exit 7"}, dir.path), dir.path + "/stderr.log", &error));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(child.send(std::string(1 << 20, 'x'), &error));  // EPIPE, not SIGPIPE
  CHECK(error.find("exit 7") != std::string::npos);
  CHECK_FALSE(child.running());
  CHECK_FALSE(child.send("again", &error));
  CHECK(error.find("not running") != std::string::npos);
}

TEST_CASE("LineChild: start reports a program that cannot run") {
  TempDir dir;
  LineChild child;
  std::string error;
  CHECK_FALSE(child.start(spec_for({"no-such-runner-ktune"}, dir.path), dir.path + "/stderr.log", &error));
  CHECK(error.find("no-such-runner-ktune") != std::string::npos);
  CHECK_FALSE(child.running());
}
