#include "instances.h"

namespace comfuse::gpu {
std::vector<Instance>& registry() {
  static std::vector<Instance> r;
  return r;
}
}  // namespace comfuse::gpu
