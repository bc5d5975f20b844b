// The planner's decision for a back-to-back GEMM chain (see include/comfuse/plan.h, plan_b2b), from the chains
// measured on the H200 (src/plan/measured_b2b.csv).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "comfuse/codegen.h"  // psi_b2b_rejects
#include "comfuse/plan.h"
#include "comfuse/reasons.h"
#include "plan_text.h"

namespace comfuse {

using plan_text::fmt;

namespace {
B2BPlanDecision plan_b2b_measured(const B2BSpec& b) {
  B2BPlanDecision d;
  const double bytes = 2.0 * static_cast<double>(b.rows()) * static_cast<double>(b.n1()) *
                       (b.first.outputs[0].dtype == DType::F32 ? 4 : 2);   // S written, then read back
  const std::string traffic = fmt("%.0f MB written and read back, ~%.0f us at 4.24 TB/s", bytes / 1e6, bytes / 4.24e12 * 1e6);
  // What the flash-style kernel measured on the H200 (src/plan/measured_b2b.csv): the nearest workload of the
  // chain's form (log distance in rows per batch, K, N1, N2) stands for the chain.
  using Measured = MeasuredChain;
  const double rows = double(b.rows()) / double(std::max<int64_t>(b.batch, 1));
  const Measured* near = nullptr;
  double best = std::numeric_limits<double>::infinity();
  for (const Measured& m : measured_chains()) {
    if (m.form != b.form) continue;
    const double dist = std::fabs(std::log(rows / m.rows)) + std::fabs(std::log(double(b.first.gemm.k) / m.k)) +
                        std::fabs(std::log(double(b.n1()) / m.n1)) + std::fabs(std::log(double(b.n2()) / m.n2));
    if (!near || dist < best) best = dist, near = &m;   // (the first of the form where a distance is not a number)
  }
  std::string measured;
  if (near && near->form == B2BForm::Softmax)
    measured = fmt("%.2fx torch.compile's batched GEMMs and softmax, %.2fx SDPA's flash kernel", near->ratio,
                   near->ratio_sdpa) +
               fmt(" at %.0f rows per batch x K %.0f", near->rows, near->k) +
               fmt(" x N1 %.0f x N2 %.0f, the nearest measured chain", near->n1, near->n2);
  else if (near)
    measured = fmt("%.2fx two cuBLASLt GEMMs at %.0fx%.0f", near->ratio, near->rows, near->k) +
               fmt("x%.0fx%.0f", near->n1, near->n2) +
               (near->ratio_flash > 0 ? fmt(" (the cluster form; the flash-style form %.2fx)", near->ratio_flash) : "") +
               ", the nearest measured chain";

  // The instance measured fastest for the chain's shape class (docs/kernel-b2b.md, instance list of test_b2b).
  const int64_t k = b.first.gemm.k;
  B2BKernelConfig& c = d.config;
  if (b.form == B2BForm::Softmax) c = {128, 128, 64, 64, 64, false, 1};     // attention, Q block resident
  else if (b.n2() <= 64) c = {128, 128, 64, 64, 0, false, 1};                // the DLRM MLP
  else if (b.n2() <= 128) c = {128, 128, 128, 64, 0, false, 1};
  else if (k <= 256) c = {128, 64, 256, 128, 256, true, 1};                 // the first GELU MLP
  else c = {128, 64, 256, 64, 0, false, 1};
  // The form: the flash-style kernel puts one CTA on a tile; with fewer tiles than SMs the cluster form puts two,
  // each on half of N1's chunks (measured: 9.8 against 11.8 us at 4096x512x256x64; at 65536 rows, 512 tiles, the
  // flash-style form wins, 41.9 against 53.2 us). Softmax too (2026-12-02: attention with 8 / 16 / 64 tiles
  // 31.3 / 19.4 / 15.0 us against 52.1 / 31.0 / 17.8; with 1024 tiles or more the flash-style form wins). 128-row
  // tiles only.
  const double batches = b.batch > 1 && b.w1_batched ? double(b.batch) : 1.0;   // a tile never mixes batches
  const double tiles = batches * std::ceil(double(b.rows()) / batches / c.tile_m) * std::ceil(double(b.n2()) / c.tile_n2);
  std::string form = "flash-style B2B kernel";
  if (c.tile_m == 128 && tiles < kSms) {
    c.split_n1 = 2;
    form = fmt("cluster-form B2B kernel (%.0f tiles on ", tiles) + fmt("%.0f SMs: N1 split over 2-CTA clusters)", double(kSms));
  }
  const std::string before = "runs as two GEMMs with their epilogues, as before";
  if (b.form == B2BForm::Softmax && (k > 64 || b.n2() > 64)) {
    d.reason = fmt("the attention kernel is built and tested for head dims up to 64 (K %.0f, N2 %.0f here): ",
                   double(k), double(b.n2())) + before;
    return d;
  }
  if (auto why = psi_b2b_rejects(b, c)) {
    d.reason = "the B2B kernel cannot run it: " + *why + "; " + before;
    return d;
  }
  if (!near || near->ratio >= 1.0 || b.n2() > c.tile_n2) {
    const int64_t tiles = (b.n2() + c.tile_n2 - 1) / c.tile_n2;
    d.verdict = Verdict::Slower;
    d.reason = "fusion does not pay: " +
               (tiles > 1 ? fmt("N2 %.0f takes ", double(b.n2())) + fmt("%.0f column tiles, each recomputing GEMM1; ", double(tiles))
                          : std::string()) +
               measured + "; " + before + " (fusing would keep the intermediate, " + traffic + ", on chip)";
    return d;
  }
  d.fuse = true;
  d.verdict = Verdict::Fuse;
  d.reason = "fuse, " + form + " " + b2b_config_name(c) + ": measured " + measured +
             "; the intermediate (" + traffic + ") stays on chip";
  return d;
}

}  // namespace

B2BPlanDecision plan_b2b(const B2BSpec& b) {
  B2BPlanDecision d = plan_b2b_measured(b);
  d.reason = reason(std::move(d.reason));
  return d;
}

}  // namespace comfuse
