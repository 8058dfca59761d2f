#include "base/fs.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace ktune {

bool read_file(const std::string& path, std::string* out, std::string* err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *err = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool write_file_atomic(const std::string& path, const std::string& data, std::string* err) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o) {
      *err = "cannot write " + tmp + ": " + std::strerror(errno);
      return false;
    }
    o.write(data.data(), std::streamsize(data.size()));
    if (!o) {
      *err = "short write to " + tmp;
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *err = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

bool make_dirs(const std::string& path, std::string* err) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    *err = "cannot create " + path + ": " + ec.message();
    return false;
  }
  return true;
}

bool file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

bool make_temp_dir(const std::string& parent, const std::string& prefix, std::string* out, std::string* err) {
  if (!make_dirs(parent, err)) return false;
  std::string tmpl = join_path(parent, prefix + "XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back(0);
  if (!mkdtemp(buf.data())) {
    *err = "mkdtemp " + tmpl + ": " + std::strerror(errno);
    return false;
  }
  *out = buf.data();
  return true;
}

std::string cache_dir() {
  if (const char* d = std::getenv("KTUNE_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return join_path(d, "ktune");
  const char* home = std::getenv("HOME");
  return join_path(home && *home ? home : "/tmp", ".cache/ktune");
}

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (!b.empty() && b[0] == '/') return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

}  // namespace ktune
