// Program rewrites that run before partition (src/rewrite/).
//
// Norm deferral: a LayerNorm or RMSNorm finished in the GEMMs that read it. A row-affine normalization
//   y = (h - m) * r * g + beta        (m, r per-row values computed from h by reductions over its last dim;
//                                      RMSNorm: no m; g, beta per-column vectors, either may be absent)
// is recognised on the primitives (after decomposition, whatever wrote it: layer_norm, rms_norm, or a model's own
// ops with casts in between), not by op names. Scaling a row commutes with a right multiply, so a GEMM reader
// Z = y @ W (+ its epilogue) becomes
//   Z = r * (h @ W* - m (x) s) + c    with W* = diag(g) W rounded once to W's dtype, s = the column sums of the
//                                      rounded W* in fp32 (so that h @ W* - m s is (h - m) @ W* up to fp32
//                                      accumulation), c = beta @ W in fp32
// and y itself is no longer needed there. The producer of h then computes h and the row statistics only (no
// cross-CTA exchange); the row factors (r, m) are rebuilt per element where a reader needs them.
//
// Elementwise readers (a residual add of y) get their own copy of y's expression over h and the statistics, which
// their region computes per element, where that retires y; other readers keep reading y as before.
//
// The rewritten program is an ordinary program: the interpreters evaluate it exactly as the kernels will, and
// tests compare it with the original (docs/kernel-reduce.md, "Norms finished in the GEMMs that read them", gives
// the error bound).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "comfuse/graph.h"

namespace comfuse {

// One normalization the pass looked at.
struct NormSite {
  std::string norm;                       // y
  std::string source;                     // h
  std::vector<std::string> statistics;    // the reductions of h that y's row factors are computed from
  bool centered = false;                  // y subtracts a per-row value (LayerNorm), else scales only (RMSNorm)
  bool deferred = false;                  // at least one GEMM reader was rewritten
  std::vector<std::string> folded;        // GEMM readers now computed from h and the statistics
  std::vector<std::string> rebuilt;       // elementwise readers that compute y themselves from h and the statistics
  std::vector<std::string> kept;          // "reader: why" for readers that still read y
  std::string why;                        // not deferred: why
  std::string priced;                     // "auto": the planner's estimates the choice rests on (else empty)
};

struct DeferredProgram {
  Graph graph;                            // the rewritten program in partition form (the input's, where nothing changed)
  std::vector<NormSite> sites;
  // Names of nodes the rewrite made, by role:
  std::set<std::string> folds;            // depend on weights only (W*, s, c): the same on every run with the same weights
  std::set<std::string> row_side;         // per-row factors and per-element terms a folded reader applies in its epilogue
};

struct DeferOptions {
  bool enabled = true;                    // false: nothing is rewritten, and every site says so
  // Sites left as written whatever `enabled` says, by the norm's name (y), with the reason each site then gives:
  // where the planner estimates the program faster that way (CompilerOptions::defer_norms "auto").
  std::map<std::string, std::string> keep;
};

// Rewrites every normalization with at least one GEMM reader. `g` may hold composites (it is brought into
// partition form first: partition_form, graph.h). Never changes what the program computes beyond rounding: the
// folded weight is rounded once to W's dtype where y was rounded as the GEMM's operand.
DeferredProgram defer_norms(const Graph& g, const DeferOptions& opts = {});

// One line per site: what was rewritten, what was kept and why.
std::string explain_deferral(const std::vector<NormSite>& sites);
inline std::string explain_deferral(const DeferredProgram& d) { return explain_deferral(d.sites); }

}  // namespace comfuse
