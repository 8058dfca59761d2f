// Child processes under limits: the only way ktune runs code it did not
// write (compilers on variant sources, the runner hosting a variant). Each
// child gets its own process group (a timeout kills the whole group), a
// private working directory, rlimits on memory and CPU time, and an
// environment built from scratch that never carries secrets. A child that
// moves itself out of its group (setsid) escapes the group kill; containing
// that would take PID namespaces or cgroups, which ktune does not use.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace ktune::sandbox {

struct Limits {
  double timeout_s = 60;        // wall clock; the process group is killed after it
  size_t memory_bytes = 0;      // RLIMIT_AS; 0 = no limit (CUDA needs a large address space)
  double cpu_seconds = 0;       // RLIMIT_CPU; 0 = no limit
  size_t file_bytes = 1ull << 32;  // RLIMIT_FSIZE: no runaway log files; 0 = no limit
  // RLIMIT_CORE is always 0: a crashing variant must not fill the disk with cores.
};

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is looked up on the environment's PATH
  std::string workdir;            // created if missing; the child's cwd and HOME
  std::map<std::string, std::string> env;  // the whole environment (see clean_env)
  Limits limits;
  std::string stdin_data;         // written to the child's stdin, then closed
  size_t capture_bytes = 1 << 16; // keep at most this much of stdout and of stderr (the tail)
};

struct ProcessResult {
  int exit_code = -1;    // when it exited normally
  int signal = 0;        // when a signal ended it (SIGKILL after a timeout too)
  bool timed_out = false;
  double wall_s = 0;
  std::string out;       // tail of stdout
  std::string err;       // tail of stderr
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
  // "exit 1", "killed by SIGSEGV", "timed out after 10.0 s" (the wall time)
  std::string describe() const;
};

// Runs to completion (or timeout). Returns false only when the child could
// not be started at all: `error` says why, e.g. "cannot run 'nvcc': No such
// file or directory (PATH=...)" when the program is not on the child's PATH
// (spec.env's PATH, not ktune's). A program that starts and fails is a
// true return with its exit code. When the child exits, whatever it left
// running in its process group is killed too, so background processes
// neither outlive a build nor hold its output pipes open.
bool run_process(const ProcessSpec& spec, ProcessResult* result, std::string* error);

// A minimal environment for children: PATH, LANG, TMPDIR, HOME=workdir, and
// the CUDA / compiler variables a build or a GPU run needs (CUDA_HOME,
// CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH, NVIDIA_*, ...). Variables whose
// names look secret (*KEY*, *TOKEN*, *SECRET*, *PASSWORD*, *CREDENTIAL*) are
// never copied, whatever `extra` asks for. Nothing else of ktune's
// environment is passed on (no proxies, no API settings), except under a
// profiler: with KTUNE_NO_CUPTI set, its injection settings (LD_PRELOAD,
// CUDA_INJECTION*, NV_*, NSYS_*, NCU_*) and KTUNE_NO_CUPTI itself go on too.
// `extra` overrides the defaults; `workdir` should be absolute.
std::map<std::string, std::string> clean_env(const std::string& workdir,
                                             const std::map<std::string, std::string>& extra = {});

// Whether ktune runs under a profiler (ncu, nsys): KTUNE_NO_CUPTI is set and
// not "0". The runner then leaves CUPTI to the profiler, and clean_env passes
// the profiler's settings on.
bool under_profiler();

// A long-lived child spoken to in lines over pipes (the runner). The child
// runs in its own process group with the same limits except the timeout,
// which applies per request instead (spec.stdin_data and capture_bytes are
// not used). Lines may be long (up to 1 GiB). Writing to a child that died
// fails with an error; it never raises SIGPIPE in ktune.
class LineChild {
 public:
  LineChild() = default;
  ~LineChild();
  LineChild(const LineChild&) = delete;
  LineChild& operator=(const LineChild&) = delete;

  // stderr goes to `stderr_path` (appended).
  bool start(const ProcessSpec& spec, const std::string& stderr_path, std::string* error);
  // Sends one line (a newline is added). Whatever the child writes
  // meanwhile is buffered for receive(), so a child that answers while it
  // reads cannot deadlock us. If the child takes nothing for timeout_s it is
  // killed (a half-sent line leaves the conversation unusable).
  bool send(const std::string& line, std::string* error, double timeout_s = 60);
  // Waits up to timeout_s for one line. On timeout returns false with
  // *timed_out = true; when the child dies returns false with `error`
  // describing how (exit code or signal).
  bool receive(std::string* line, double timeout_s, bool* timed_out, std::string* error);
  // Kills the whole process group (SIGKILL) and reaps it. Also the way to end
  // a child after a receive() timeout.
  void kill();
  bool running() const { return pid_ > 0; }
  int pid() const { return pid_; }
  // After the child is gone: how it ended ("killed by SIGSEGV", "exit 3").
  std::string exit_description() const { return exit_description_; }

 private:
  int pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string buffer_;
  std::string exit_description_;
  bool read_available();              // appends what the child wrote to buffer_; false at EOF
  void reap();                        // waits for the child, records how it ended, closes the pipes
  std::string not_running_error() const;
};

}  // namespace ktune::sandbox
