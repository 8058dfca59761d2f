// Small file-system helpers. Writes go through a temporary file and a rename,
// so a reader (or a process killed mid-write) never sees half a file.
#pragma once
#include <string>
#include <vector>

namespace ktune {

bool read_file(const std::string& path, std::string* out, std::string* err);
bool write_file_atomic(const std::string& path, const std::string& data, std::string* err);
bool make_dirs(const std::string& path, std::string* err);
bool file_exists(const std::string& path);
// Removes a file or a whole directory tree; missing is fine.
void remove_tree(const std::string& path);
// A new empty directory under `parent` with the given prefix.
bool make_temp_dir(const std::string& parent, const std::string& prefix, std::string* out, std::string* err);
// $KTUNE_CACHE_DIR, else $XDG_CACHE_HOME/ktune, else ~/.cache/ktune.
std::string cache_dir();
// Absolute path of the running executable's directory.
std::string self_dir();
std::string join_path(const std::string& a, const std::string& b);

}  // namespace ktune
