// Text made with a printf format (numbers and lengths of time in prompts,
// progress lines and reports), so that every part of ktune writes them one way.
#pragma once
#include <cstdio>
#include <string>

namespace ktune {

// What std::snprintf(fmt, args...) writes, whatever its length.
template <class... Args>
std::string formatted(const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string s(n > 0 ? size_t(n) : 0, '\0');
  std::snprintf(s.data(), s.size() + 1, fmt, args...);
  return s;
}

// A length of time for people: "4.2s", "1m23s", "2h05m".
inline std::string duration_text(double s) {
  if (s < 60) return formatted("%.1fs", s);
  const int whole = static_cast<int>(s);
  if (whole < 3600) return formatted("%dm%02ds", whole / 60, whole % 60);
  return formatted("%dh%02dm", whole / 3600, whole % 3600 / 60);
}

}  // namespace ktune
