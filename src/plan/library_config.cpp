// The library form's pass config for a Spec (plan.h, library_config_for): its tile, and how its row reductions
// exchange partials (docs/codegen.md, "The forms of a region").
#include <string>

#include "comfuse/codegen.h"  // psi_rejects, psi_exchanges, psi_pass_splits, psi_merges
#include "comfuse/plan.h"

namespace comfuse {

std::optional<KernelConfig> library_config_for(const FusionSpec& fs, std::string* why) {
  std::string first_why;
  // 64 x 128 tiles: 64 fp32 values per thread, so that several CTAs share an SM and keep its loads in flight (a
  // 64 x 256 reduction tile took 255 registers and spilled). Two GEMMs on one A: 64 x 256 fragments, an output tile
  // of 128 (150 registers).
  const int wide_first = fs.gemm.paired() ? 1 : 0;
  const int tiles[2] = {wide_first ? 256 : 128, wide_first ? 128 : 256};
  for (int tile_n : tiles) {
    KernelConfig c = library_config(tile_n);
    if (psi_exchanges(fs)) {
      // A pass with one exchange before its last stage runs split, 1-wide through L2 (psi_pass_splits), where its one
      // reduction is not a merged pair or the row is wider than a DSMEM cluster holds; otherwise the row block in one
      // cluster of exactly its column blocks where DSMEM holds it, else L2. Measured on an H100
      // (docs/data/pass_split_2026-12-07h_h100.md): split against the cluster at N = 1024, RMSNorm 4-6% faster,
      // softmax equal, LayerNorm 8% slower; against the one-pass L2 form 9-34% faster (N = 1024 and 4096).
      const int cols = static_cast<int>((fs.gemm.n + tile_n - 1) / tile_n);
      const bool split = cols > 1 && psi_pass_splits(fs) && (cols > kDsmemMaxCols || !psi_merges(fs));
      c.merged = split && psi_merges(fs);
      c.transport = !split && cols <= kDsmemMaxCols && cols > 1 ? Transport::DsmemPeerToPeer : Transport::L2;
      if (c.transport != Transport::L2) c.cluster_n = cols;
    }
    auto rejected = psi_rejects(fs, c);
    if (!rejected) return c;
    if (first_why.empty()) first_why = *rejected;
  }
  if (why) *why = "no pass template: " + first_why;
  return std::nullopt;
}

}  // namespace comfuse
