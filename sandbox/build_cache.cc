// The compiler driver and its cache (see build_cache.h). One directory per
// key holds the source, the artifact, the log and result.json; result.json
// is written last, so its presence is what makes a build a hit.
#include "sandbox/build_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string_view>

#include "base/fs.h"
#include "base/sha256.h"
#include "sandbox/cubin_check.h"

namespace ktune::sandbox {
namespace {

constexpr size_t kLogCaptureBytes = 1 << 20;

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// The command as a shell would need it typed, for the record.
std::string command_line_of(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& arg : argv) {
    if (!line.empty()) line += ' ';
    bool plain = !arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789_-+=/.,:@%") == std::string::npos;
    line += plain ? arg : "'" + replace_all(arg, "'", "'\\''") + "'";
  }
  return line;
}

// Fills `out` from a finished build in `key_dir`; false when there is none
// (never built, timed out, or killed before result.json was written), or
// when its artifact has since gone missing.
bool load_finished(const std::string& key_dir, const BuildRequest& req, BuildResult* out) {
  std::string text, ignored;
  if (!read_file(join_path(key_dir, "result.json"), &text, &ignored)) return false;
  json record = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record["ok"].is_boolean() || !record["log"].is_string() ||
      !record["command_line"].is_string() || !record["resources"].is_object())
    return false;  // damaged, or from an incompatible ktune: build again
  std::string artifact = join_path(key_dir, req.artifact_name);
  bool ok = record["ok"].get<bool>();
  if (ok && !file_exists(artifact)) return false;
  out->ok = ok;
  out->cached = true;
  out->artifact = ok ? artifact : "";
  out->log = record["log"].get<std::string>();
  out->command_line = record["command_line"].get<std::string>();
  out->seconds = 0;
  out->timed_out = false;
  out->resources = record["resources"];
  return true;
}

// An exclusive flock on <dir>/<key>.lock while it lives. Every holder opens
// its own descriptor, and flock locks taken through different descriptors
// exclude each other even inside one process, so this one lock keeps both
// threads and processes from building the same key twice at once.
class KeyLock {
 public:
  bool acquire(const std::string& path, std::string* error) {
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      *error = "cannot open " + path + ": " + std::strerror(errno);
      return false;
    }
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      *error = "cannot lock " + path + ": " + std::strerror(errno);
      return false;
    }
    return true;
  }
  ~KeyLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }

 private:
  int fd_ = -1;
};

// The number written just before `suffix` in `line` ("Used 128 registers"
// with suffix " registers" gives 128); false when the line has none.
bool number_before(const std::string& line, std::string_view suffix, long long* value) {
  size_t end = line.find(suffix);
  if (end == std::string::npos) return false;
  size_t begin = end;
  while (begin > 0 && line[begin - 1] >= '0' && line[begin - 1] <= '9') --begin;
  return begin < end && std::from_chars(line.data() + begin, line.data() + end, *value).ec == std::errc();
}

// The function a ptxas line starts describing, or "" when it starts none.
std::string function_named(const std::string& line) {
  static constexpr std::string_view kEntry = "Compiling entry function '";
  static constexpr std::string_view kProperties = "Function properties for ";
  if (size_t at = line.find(kEntry); at != std::string::npos) {
    size_t begin = at + kEntry.size();
    size_t end = line.find('\'', begin);
    return line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }
  if (size_t at = line.find(kProperties); at != std::string::npos) {
    std::string name = line.substr(at + kProperties.size());
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    return name;
  }
  return "";
}

}  // namespace

std::string BuildCache::key_of(const BuildRequest& req) {
  std::string command;
  for (const std::string& arg : req.command) {
    if (!command.empty()) command += '\x1f';
    command += arg;
  }
  return sha256_hex(req.source + '\0' + command + '\0' + req.compiler_id + '\0' + req.source_name + '\0' +
                    req.artifact_name + (req.refuse_ldgsts_defect ? "\x1frefuse_ldgsts_defect" : ""));
}

BuildResult BuildCache::build(const BuildRequest& req) {
  BuildResult result;
  result.key = key_of(req);
  std::error_code cwd_error;
  std::string root = std::filesystem::absolute(dir_, cwd_error).string();
  if (cwd_error) root = dir_;
  std::string key_dir = join_path(root, result.key);
  // result.json appears atomically, so a hit needs no lock.
  if (load_finished(key_dir, req, &result)) return result;

  std::string error;
  KeyLock lock;
  if (!make_dirs(key_dir, &error) || !lock.acquire(join_path(root, result.key + ".lock"), &error)) {
    result.log = error;
    return result;
  }
  // Another thread or process may have built it while we waited.
  if (load_finished(key_dir, req, &result)) return result;

  std::string source = join_path(key_dir, req.source_name);
  std::string artifact = join_path(key_dir, req.artifact_name);
  std::remove(artifact.c_str());  // a leftover of a killed build must not pass for this one's output
  if (!write_file_atomic(source, req.source, &error)) {
    result.log = error;
    return result;
  }
  ProcessSpec spec;
  for (const std::string& arg : req.command)
    spec.argv.push_back(replace_all(replace_all(arg, "{src}", source), "{out}", artifact));
  spec.workdir = key_dir;
  spec.env = clean_env(key_dir);
  spec.limits.timeout_s = req.timeout_s;
  spec.limits.memory_bytes = req.memory_bytes;
  spec.limits.cpu_seconds = req.cpu_seconds;
  spec.capture_bytes = kLogCaptureBytes;
  result.command_line = command_line_of(spec.argv);

  ProcessResult run;
  if (!run_process(spec, &run, &error)) {
    result.log = error;  // not cached: the toolchain is at fault, not the source
    return result;
  }
  result.seconds = run.wall_s;
  result.timed_out = run.timed_out;
  result.log = run.out + run.err;
  result.ok = run.ok() && file_exists(artifact);
  if (!run.ok())
    result.log += "\n[ktune: the compiler ended: " + run.describe() + "]\n";
  else if (!result.ok)
    result.log += "\n[ktune: the command succeeded but wrote no " + req.artifact_name + "]\n";
  result.resources = parse_ptxas_resources(result.log);
  if (result.ok && req.refuse_ldgsts_defect) {
    std::string cubin;
    if (!read_file(artifact, &cubin, &error)) {
      result.ok = false;
      result.log += "\n[ktune: error: " + error + "]\n";
      return result;  // not cached: the file system is at fault, not the source
    }
    if (std::string defect = cubin_defect(cubin); !defect.empty()) {
      result.ok = false;
      result.log += "\n[ktune: error: the build is refused: " + defect + "]\n";
    }
  }
  if (result.ok) result.artifact = artifact;
  // Not cached: a busy machine may well finish next time, and a compiler
  // killed by a signal has usually hit the memory limit, not a fault in the source.
  if (run.timed_out || run.signal != 0) return result;

  json record = {{"ok", result.ok},
                 {"log", result.log},
                 {"command_line", result.command_line},
                 {"seconds", result.seconds},
                 {"resources", result.resources},
                 {"timed_out", false}};
  // A failed write only costs a rebuild next time, so the build still counts.
  if (write_file_atomic(join_path(key_dir, "build.log"), result.log, &error))
    write_file_atomic(join_path(key_dir, "result.json"), record.dump(2), &error);
  return result;
}

json parse_ptxas_resources(const std::string& log) {
  struct Field {
    std::string_view suffix;
    const char* name;
    bool summed;  // spills add up over functions; the rest is the worst function's
  };
  static constexpr Field kFields[] = {{" registers", "registers", false},
                                      {" bytes smem", "smem_bytes", false},
                                      {" bytes stack frame", "stack_frame", false},
                                      {" bytes spill stores", "spill_stores", true},
                                      {" bytes spill loads", "spill_loads", true}};
  json totals = json::object(), functions = json::object();
  std::string function;  // the one the lines being read describe
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    // ptxas lines, and the indented "N bytes stack frame, ..." line under
    // "Function properties for": nothing else in a compiler log counts.
    if (line.find("ptxas") == std::string::npos && line.find("bytes stack frame") == std::string::npos)
      continue;
    if (std::string name = function_named(line); !name.empty()) function = name;
    for (const Field& field : kFields) {
      long long value;
      if (!number_before(line, field.suffix, &value)) continue;
      json& total = totals[field.name];
      if (total.is_null())
        total = value;
      else
        total = field.summed ? total.get<long long>() + value : std::max(total.get<long long>(), value);
      if (!function.empty()) functions[function][field.name] = value;
    }
  }
  if (!functions.empty()) totals["functions"] = functions;
  return totals;
}

}  // namespace ktune::sandbox
