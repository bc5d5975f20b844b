// The planner's explanations: the printf-style number formatter its files share (plan.cpp, plan_b2b.cpp, and the
// compiler's defer_choice.cpp).
#pragma once
#include <cstdio>
#include <string>

namespace comfuse::plan_text {
// `f` with up to three numbers, at most 159 characters.
inline std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}
}  // namespace comfuse::plan_text
