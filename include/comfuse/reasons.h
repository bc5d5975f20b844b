// Reasons are for people. Every decision of partition, the planner and the rewrites is data (verdicts, configs,
// node sets); the prose next to it says why, and may be reworded at will. To keep it so, every reason those stages
// produce passes through reason(), which a test can make scramble its text: the CPU test that does
// (tests/cpu/test_reasons.cpp) compiles programs with and without scrambling and requires the same decisions.
#pragma once

#include <string>

namespace comfuse {

// The text as produced, or scrambled where a test asked for it (set_reason_scrambling).
std::string reason(std::string text);
// Tests only: scramble every reason from now on (true) or stop (false). Not thread-safe against concurrent compiles.
void set_reason_scrambling(bool on);

}  // namespace comfuse
