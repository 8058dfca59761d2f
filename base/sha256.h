// SHA-256 of a byte string, as lowercase hex. Variants and builds are named by
// the hash of what defines them, so the same source is never built or
// measured twice.
#pragma once
#include <string>
#include <string_view>

namespace ktune {
std::string sha256_hex(std::string_view data);
}
