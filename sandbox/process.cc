// Child processes under limits (see process.h). Everything the child needs
// is prepared before fork(): ktune builds in several threads at once, and
// between fork() and exec() the child of a threaded program may only make
// async-signal-safe calls (no malloc, no locks), so the child side below
// only makes system calls.
#include "sandbox/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "base/clock.h"
#include "base/fs.h"

namespace ktune::sandbox {
namespace {

constexpr const char* kDefaultPath = "/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin";
constexpr size_t kReadChunk = 1 << 16;
constexpr size_t kMaxLineBytes = size_t(1) << 30;

std::string system_error(const std::string& what, int err = errno) {
  return what + ": " + std::strerror(err);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by " + signal_name(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

// Milliseconds for poll(), rounded up so a deadline is never busy-polled.
int poll_ms(double seconds) {
  if (seconds <= 0) return 0;
  return int(std::min(std::ceil(seconds * 1000), double(INT_MAX)));
}

// Owns a file descriptor; closes it when it goes.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Close-on-exec, so children started by other threads do not inherit it.
bool make_pipe(UniqueFd* read_end, UniqueFd* write_end, std::string* error) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    *error = system_error("pipe");
    return false;
  }
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  return true;
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Writing to a pipe whose reader is gone raises SIGPIPE, whose default
// action would kill ktune. While this object lives SIGPIPE is blocked in the
// calling thread (the kernel sends it to the writing thread), and one raised
// meanwhile is discarded on the way out, so the write just fails with EPIPE.
// This leaves ktune's own SIGPIPE handling (e.g. `ktune history | head`) alone.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &saved_mask_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      timespec no_wait{};
      while (sigtimedwait(&sigpipe_, nullptr, &no_wait) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t sigpipe_, saved_mask_;
  bool was_pending_ = false;
};

// Appends to a capture that keeps only the last `cap` bytes. The front is
// cut in large steps so a chatty child does not cost a copy per read.
void append_tail(std::string* capture, const char* data, size_t n, size_t cap) {
  capture->append(data, n);
  if (capture->size() > 2 * cap + kReadChunk) capture->erase(0, capture->size() - cap);
}

void trim_to_tail(std::string* capture, size_t cap) {
  if (capture->size() > cap) capture->erase(0, capture->size() - cap);
}

// The paths execve() should try for argv[0], in order, as execvp() would
// search them, but on the child's PATH rather than ktune's.
std::vector<std::string> exec_candidates(const std::string& program,
                                         const std::map<std::string, std::string>& env) {
  if (program.find('/') != std::string::npos) return {program};
  auto path = env.find("PATH");
  std::string dirs = path != env.end() ? path->second : kDefaultPath;
  std::vector<std::string> candidates;
  size_t begin = 0;
  while (true) {
    size_t end = dirs.find(':', begin);
    std::string dir = dirs.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    candidates.push_back(join_path(dir.empty() ? "." : dir, program));  // an empty entry means "."
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return candidates;
}

std::vector<char*> c_string_array(const std::vector<std::string>& strings) {
  std::vector<char*> array;
  for (const std::string& s : strings) array.push_back(const_cast<char*>(s.c_str()));
  array.push_back(nullptr);
  return array;
}

struct ResourceLimit {
  int resource;
  rlim_t value;
};

std::vector<ResourceLimit> resource_limits(const Limits& limits) {
  std::vector<ResourceLimit> out = {{RLIMIT_CORE, 0}};
  if (limits.memory_bytes > 0) out.push_back({RLIMIT_AS, rlim_t(limits.memory_bytes)});
  if (limits.cpu_seconds > 0) out.push_back({RLIMIT_CPU, rlim_t(std::ceil(limits.cpu_seconds))});
  if (limits.file_bytes > 0) out.push_back({RLIMIT_FSIZE, rlim_t(limits.file_bytes)});
  return out;
}

// What the child sends back through the report pipe when it cannot exec.
// A successful exec closes the pipe (close-on-exec) with nothing written.
struct StartFailure {
  enum Step { kChdir, kExec } step;
  int error;
};

[[noreturn]] void report_start_failure(int report_fd, StartFailure::Step step, int err) {
  StartFailure failure{step, err};
  ssize_t ignored = write(report_fd, &failure, sizeof failure);
  (void)ignored;  // should even this fail, the parent still sees exit 127
  _exit(127);
}

// The child side of fork(): only system calls from here on.
[[noreturn]] void become_child(int stdin_fd, int stdout_fd, int stderr_fd, int report_fd,
                               const char* workdir, const std::vector<ResourceLimit>& limits,
                               const std::vector<char*>& candidates, char* const* argv, char* const* envp,
                               unsigned open_max) {
  setpgid(0, 0);  // its own group, so a timeout can kill everything it started
  // Ignored signals and the signal mask survive exec; the child starts clean.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &default_action, nullptr);
  sigset_t no_signals;
  sigemptyset(&no_signals);
  sigprocmask(SIG_SETMASK, &no_signals, nullptr);

  dup2(stdin_fd, 0);
  dup2(stdout_fd, 1);
  dup2(stderr_fd, 2);
  // Nothing else of ktune's (sockets, the store, other children's pipes) may
  // leak into the child. The report pipe closes itself at exec.
  auto close_span = [open_max](unsigned first, unsigned last) {
    if (first > last || close_range(first, last, 0) == 0) return;
    for (unsigned fd = first; fd <= last && fd < open_max; ++fd) close(int(fd));
  };
  close_span(3, unsigned(report_fd) - 1);
  close_span(unsigned(report_fd) + 1, ~0u);

  if (*workdir && chdir(workdir) != 0) report_start_failure(report_fd, StartFailure::kChdir, errno);
  for (const ResourceLimit& limit : limits) {
    // The CPU limit's hard value is one second later: SIGXCPU first, then SIGKILL.
    rlimit value{limit.value, limit.resource == RLIMIT_CPU ? limit.value + 1 : limit.value};
    setrlimit(limit.resource, &value);
  }
  int exec_error = ENOENT;
  for (char* candidate : candidates) {
    if (!candidate) break;
    execve(candidate, argv, envp);
    if (errno == EACCES) {
      exec_error = EACCES;  // keep looking, but report this if nothing else runs
    } else if (errno != ENOENT && errno != ENOTDIR) {
      exec_error = errno;
      break;
    }
  }
  report_start_failure(report_fd, StartFailure::kExec, exec_error);
}

// Starts spec.argv with the given descriptors as its stdin, stdout and
// stderr. Returns after the exec succeeded (or with why it did not).
bool spawn(const ProcessSpec& spec, int stdin_fd, int stdout_fd, int stderr_fd, pid_t* pid,
           std::string* error) {
  if (spec.argv.empty()) {
    *error = "empty command";
    return false;
  }
  if (!spec.workdir.empty() && !make_dirs(spec.workdir, error)) return false;

  std::vector<std::string> candidates = exec_candidates(spec.argv[0], spec.env);
  std::vector<std::string> env_entries;
  for (const auto& [name, value] : spec.env) env_entries.push_back(name + "=" + value);
  std::vector<char*> candidate_array = c_string_array(candidates);
  std::vector<char*> argv = c_string_array(spec.argv);
  std::vector<char*> envp = c_string_array(env_entries);
  std::vector<ResourceLimit> limits = resource_limits(spec.limits);
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  unsigned open_max = unsigned(std::min<rlim_t>(nofile.rlim_cur, 1u << 20));

  UniqueFd report_read, report_write;
  if (!make_pipe(&report_read, &report_write, error)) return false;
  pid_t child = fork();
  if (child < 0) {
    *error = system_error("fork");
    return false;
  }
  if (child == 0) {
    become_child(stdin_fd, stdout_fd, stderr_fd, report_write.get(), spec.workdir.c_str(), limits,
                 candidate_array, argv.data(), envp.data(), open_max);
  }
  report_write.reset();
  StartFailure failure{};
  ssize_t n;
  do {
    n = read(report_read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n != ssize_t(sizeof failure)) {
    *pid = child;
    return true;
  }
  waitpid(child, nullptr, 0);
  if (failure.step == StartFailure::kChdir) {
    *error = system_error("cannot enter " + spec.workdir, failure.error);
  } else {
    *error = system_error("cannot run '" + spec.argv[0] + "'", failure.error);
    auto path = spec.env.find("PATH");
    if (spec.argv[0].find('/') == std::string::npos)
      *error += " (PATH=" + (path != spec.env.end() ? path->second : std::string(kDefaultPath)) + ")";
  }
  return false;
}

// Whether the child has ended, without reaping it: while it is an unreaped
// zombie its pid, and so its process group id, cannot be reused, so killing
// the group afterwards cannot hit a stranger.
bool has_exited(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

// A descriptor that becomes readable when the child exits, so poll() can
// wait for output and for the exit at once; -1 where the kernel lacks it.
int open_exit_fd(pid_t pid) { return int(syscall(SYS_pidfd_open, pid, 0)); }

int wait_for(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

bool looks_secret(const std::string& name) {
  std::string upper = name;
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  for (const char* word : {"KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"})
    if (upper.find(word) != std::string::npos) return true;
  return false;
}

// A profiler's injection settings (ncu, nsys): a runner that gets only some
// of them, say LD_PRELOAD without the launch token, crashes at start.
bool profiler_variable(const std::string& name) {
  for (const char* prefix : {"KTUNE_NO_CUPTI", "LD_PRELOAD", "CUDA_INJECTION", "NVTX_INJECTION", "NV_", "NSYS_", "NCU_"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

std::string ProcessResult::describe() const {
  if (timed_out) {
    char text[64];
    std::snprintf(text, sizeof text, "timed out after %.1f s", wall_s);
    return text;
  }
  if (signal != 0) return "killed by " + signal_name(signal);
  return "exit " + std::to_string(exit_code);
}

bool run_process(const ProcessSpec& spec, ProcessResult* result, std::string* error) {
  *result = ProcessResult{};
  UniqueFd stdin_read, stdin_write, stdout_read, stdout_write, stderr_read, stderr_write;
  if (!make_pipe(&stdin_read, &stdin_write, error) || !make_pipe(&stdout_read, &stdout_write, error) ||
      !make_pipe(&stderr_read, &stderr_write, error))
    return false;
  double start = mono_seconds();
  double deadline = start + spec.limits.timeout_s;
  pid_t pid;
  if (!spawn(spec, stdin_read.get(), stdout_write.get(), stderr_write.get(), &pid, error)) return false;
  stdin_read.reset();
  stdout_write.reset();
  stderr_write.reset();

  SigpipeBlock sigpipe_block;  // the child may exit without reading its stdin
  set_nonblocking(stdin_write.get());
  size_t stdin_sent = 0;
  if (spec.stdin_data.empty()) stdin_write.reset();
  UniqueFd exit_fd(open_exit_fd(pid));
  bool exited = false;
  char chunk[kReadChunk];

  // Until the child has exited and both pipes are drained, or the deadline.
  while (true) {
    if (!exited && has_exited(pid)) {
      exited = true;
      kill(-pid, SIGKILL);  // what it left behind in its group
    }
    if (exited && !stdout_read && !stderr_read) break;
    double left = deadline - mono_seconds();
    if (left <= 0) break;
    // Without an exit descriptor, look at the child every 10 ms.
    int wait_ms = exit_fd || exited ? poll_ms(left) : std::min(poll_ms(left), 10);
    pollfd fds[4] = {{stdin_write.get(), POLLOUT, 0},
                     {stdout_read.get(), POLLIN, 0},
                     {stderr_read.get(), POLLIN, 0},
                     {exited ? -1 : exit_fd.get(), POLLIN, 0}};
    if (poll(fds, 4, wait_ms) < 0) {
      if (errno == EINTR) continue;
      *error = system_error("poll");
      kill(-pid, SIGKILL);
      wait_for(pid);
      return false;
    }
    if (fds[0].revents) {
      size_t n = std::min(spec.stdin_data.size() - stdin_sent, kReadChunk);
      ssize_t written = write(stdin_write.get(), spec.stdin_data.data() + stdin_sent, n);
      if (written > 0) stdin_sent += size_t(written);
      bool failed = written < 0 && errno != EAGAIN && errno != EINTR;  // EPIPE: it stopped reading
      if (failed || stdin_sent == spec.stdin_data.size()) stdin_write.reset();
    }
    auto capture = [&](const pollfd& entry, UniqueFd* fd, std::string* text) {
      if (!entry.revents) return;
      ssize_t n = read(fd->get(), chunk, sizeof chunk);
      if (n > 0)
        append_tail(text, chunk, size_t(n), spec.capture_bytes);
      else if (n == 0 || errno != EINTR)
        fd->reset();  // EOF
    };
    capture(fds[1], &stdout_read, &result->out);
    capture(fds[2], &stderr_read, &result->err);
  }

  if (!exited) {
    kill(-pid, SIGKILL);
    result->timed_out = true;
  }
  int status = wait_for(pid);
  result->wall_s = mono_seconds() - start;
  if (WIFEXITED(status)) result->exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result->signal = WTERMSIG(status);
  trim_to_tail(&result->out, spec.capture_bytes);
  trim_to_tail(&result->err, spec.capture_bytes);
  return true;
}

bool under_profiler() {
  const char* off = std::getenv("KTUNE_NO_CUPTI");
  return off && *off && std::string(off) != "0";
}

std::map<std::string, std::string> clean_env(const std::string& workdir,
                                             const std::map<std::string, std::string>& extra) {
  // What compilers and the CUDA driver need; everything else stays behind.
  static const char* const kPassedOn[] = {
      "CUDA_HOME",       "CUDA_PATH",           "CUDA_VISIBLE_DEVICES",
      "CUDA_CACHE_PATH", "CUDA_MODULE_LOADING", "LD_LIBRARY_PATH",
      "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "KTUNE_CACHE_DIR"};
  std::map<std::string, std::string> env;
  const char* path = std::getenv("PATH");
  env["PATH"] = path && *path ? path : kDefaultPath;
  env["HOME"] = workdir;
  env["TMPDIR"] = workdir;
  env["LANG"] = "C.UTF-8";
  for (const char* name : kPassedOn)
    if (const char* value = std::getenv(name)) env[name] = value;
  for (const auto& [name, value] : extra) env[name] = value;
  std::erase_if(env, [](const auto& entry) { return looks_secret(entry.first); });
  // Under a profiler (KTUNE_NO_CUPTI set, README) the children must see its
  // settings, a launch token among them, so these skip the secret filter.
  if (under_profiler())
    for (char** entry = environ; *entry; ++entry) {
      const std::string text = *entry;
      const size_t eq = text.find('=');
      if (eq != std::string::npos && profiler_variable(text.substr(0, eq))) env.emplace(text.substr(0, eq), text.substr(eq + 1));
    }
  return env;
}

LineChild::~LineChild() { kill(); }

bool LineChild::start(const ProcessSpec& spec, const std::string& stderr_path, std::string* error) {
  kill();  // a second start replaces the first child
  buffer_.clear();
  exit_description_.clear();
  UniqueFd stderr_file(open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!stderr_file) {
    *error = system_error("cannot open " + stderr_path);
    return false;
  }
  UniqueFd stdin_read, stdin_write, stdout_read, stdout_write;
  if (!make_pipe(&stdin_read, &stdin_write, error) || !make_pipe(&stdout_read, &stdout_write, error))
    return false;
  pid_t pid;
  if (!spawn(spec, stdin_read.get(), stdout_write.get(), stderr_file.get(), &pid, error)) return false;
  set_nonblocking(stdin_write.get());
  pid_ = pid;
  to_child_ = stdin_write.release();
  from_child_ = stdout_read.release();
  return true;
}

bool LineChild::send(const std::string& line, std::string* error, double timeout_s) {
  if (!running()) {
    *error = not_running_error();
    return false;
  }
  std::string data = line + '\n';
  SigpipeBlock sigpipe_block;
  double deadline = mono_seconds() + timeout_s;
  bool child_output_open = from_child_ >= 0;
  size_t sent = 0;
  while (sent < data.size()) {
    double left = deadline - mono_seconds();
    if (left <= 0) {
      kill();
      char text[96];
      std::snprintf(text, sizeof text, "the child took no input for %.1f s and was killed", timeout_s);
      *error = text;
      return false;
    }
    pollfd fds[2] = {{to_child_, POLLOUT, 0}, {child_output_open ? from_child_ : -1, POLLIN, 0}};
    if (poll(fds, 2, poll_ms(left)) < 0) {
      if (errno == EINTR) continue;
      *error = system_error("poll");
      return false;
    }
    // At EOF the child is ending; the next write says so with EPIPE.
    if (fds[1].revents && !read_available()) child_output_open = false;
    if (!fds[0].revents) continue;
    ssize_t written = write(to_child_, data.data() + sent, std::min(data.size() - sent, size_t(1) << 20));
    if (written > 0) {
      sent += size_t(written);
    } else if (written < 0 && errno != EAGAIN && errno != EINTR) {
      std::string why = std::strerror(errno);
      kill();
      *error = "cannot write to the child (" + why + "); it ended: " + exit_description_;
      return false;
    }
  }
  return true;
}

bool LineChild::receive(std::string* line, double timeout_s, bool* timed_out, std::string* error) {
  *timed_out = false;
  double deadline = mono_seconds() + timeout_s;
  size_t searched = 0;  // buffer_ before this holds no newline
  while (true) {
    size_t newline = buffer_.find('\n', searched);
    if (newline != std::string::npos) {
      line->assign(buffer_, 0, newline);
      buffer_.erase(0, newline + 1);
      return true;
    }
    searched = buffer_.size();
    if (!running()) {
      *error = not_running_error();
      return false;
    }
    if (buffer_.size() > kMaxLineBytes) {
      kill();
      *error = "the child sent a line longer than 1 GiB and was killed";
      return false;
    }
    double left = deadline - mono_seconds();
    if (left <= 0) {
      *timed_out = true;
      char text[64];
      std::snprintf(text, sizeof text, "no answer within %.1f s", timeout_s);
      *error = text;
      return false;
    }
    pollfd fd{from_child_, POLLIN, 0};
    int ready = poll(&fd, 1, poll_ms(left));
    if (ready < 0 && errno != EINTR) {
      *error = system_error("poll");
      return false;
    }
    if (ready > 0 && !read_available()) {
      // EOF: the child died, or closed its stdout, which ends the
      // conversation either way. Killing a child that already exited does
      // not change how it ended.
      kill();
      *error = exit_description_;
      return false;
    }
  }
}

void LineChild::kill() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  reap();
}

bool LineChild::read_available() {
  char chunk[kReadChunk];
  ssize_t n;
  do {
    n = read(from_child_, chunk, sizeof chunk);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  buffer_.append(chunk, size_t(n));
  return true;
}

void LineChild::reap() {
  exit_description_ = describe_wait_status(wait_for(pid_));
  pid_ = -1;
  for (int* fd : {&to_child_, &from_child_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

std::string LineChild::not_running_error() const {
  if (exit_description_.empty()) return "the child is not running";
  return "the child is not running (it ended: " + exit_description_ + ")";
}

}  // namespace ktune::sandbox
