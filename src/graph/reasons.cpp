// reasons.h: the one place prose passes through on its way out of a decision.
#include "comfuse/reasons.h"

#include <algorithm>
#include <atomic>

namespace comfuse {

namespace {
std::atomic<bool> scrambling{false};
}

std::string reason(std::string text) {
  if (!scrambling.load(std::memory_order_relaxed)) return text;
  // reversed and with every letter shifted: no prefix, word or number of the original survives in place
  std::reverse(text.begin(), text.end());
  for (char& c : text)
    if (c >= 'a' && c <= 'z') c = static_cast<char>('a' + (c - 'a' + 7) % 26);
  return "~" + text;
}

void set_reason_scrambling(bool on) { scrambling.store(on, std::memory_order_relaxed); }

}  // namespace comfuse
