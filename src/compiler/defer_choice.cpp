// CompilerOptions::defer_norms "auto": which norms are finished in the GEMMs that read them, priced by the planner.
// Each site the rewrite can defer is priced as the whole program twice, with it deferred and with it left as
// written, from the planner's estimates of every region in the form it would run (fused or the library form); a site
// is deferred where that estimate is lower by kDeferMargin. Sites are taken in program order, each against the
// choices before it.
#include <algorithm>

#include "../plan/plan_text.h"
#include "comfuse/compiler.h"

namespace comfuse {

namespace {

using plan_text::fmt;

// A region's estimate in the form it runs: the library form's, else the fused kernel's (which a C++ program runs
// where fusion does not pay and no pass serves), else the GEMM with a separate pass (a region no kernel serves,
// which then runs on the plain path: priced alike in both programs).
double region_us(const PlanDecision& d) {
  if (d.form == RegionForm::Library && d.library_us >= 0) return d.library_us;
  if (d.fused_us >= 0) return d.fused_us;
  return std::max(0.0, d.unfused_us);
}

// The planner's estimate of g rewritten as `o` says: the sum over its regions (folds are computed once per binding of
// the weights, and are not counted).
double program_us(const Graph& g, const DeferOptions& o, const PlanOptions& po, int64_t rows) {
  DeferredProgram d = defer_norms(g, o);
  const bool rewrote = std::any_of(d.sites.begin(), d.sites.end(), [](const NormSite& s) { return s.deferred; });
  const Graph& program = rewrote ? d.graph : g;
  const PartitionHints hints = program_hints(g, d.row_side);   // (as a C++ program partitions it)
  const Partition p = partition(program.symbolic() ? bind_rows(program, rows) : program, hints);
  double total = 0;
  for (size_t i = 0; i < p.regions.size(); ++i) {
    PlanDecision pd;
    try {
      pd = plan_region(p.regions[i].spec, po.for_region(static_cast<int>(i)));
    } catch (const std::exception&) {   // an option this program's regions cannot take: the planner's own choice
      pd = plan_region(p.regions[i].spec);
    }
    total += region_us(pd);
  }
  return total;
}

}  // namespace

DeferralChoice choose_deferral(const Graph& g, const std::string& setting, const PlanOptions& po, int64_t rows) {
  if (setting != "" && setting != "on" && setting != "off" && setting != "auto")
    throw CompileError("unknown defer_norms setting '" + setting + "' (on, off, auto, or empty for the default: off)");
  DeferralChoice c;
  c.options.enabled = setting == "on" || setting == "auto";
  if (setting != "auto") return c;
  // The region configs a caller fixed are numbered in one program's regions, and the two programs number theirs
  // differently: priced with the planner's own configs.
  PlanOptions priced = po;
  priced.region_configs.clear();
  const DeferredProgram all = defer_norms(g, c.options);
  double current = -1;
  for (const NormSite& s : all.sites) {
    if (!s.deferred) continue;
    if (current < 0) current = program_us(g, c.options, priced, rows);
    DeferOptions without = c.options;
    without.keep[s.norm] = "";
    const double as_written = program_us(g, without, priced, rows);
    const std::string estimates =
        fmt("the planner's estimate of the program: ~%.0f us with it finished in its readers, ~%.0f us as written "
            "(--defer-norms auto: finished in its readers where %.0f%% lower)",
            current, as_written, 100 * kDeferMargin);
    if (current >= as_written * (1.0 - kDeferMargin)) {   // deferred only where it is estimated clearly faster
      without.keep[s.norm] = estimates;
      c.options = std::move(without);
      current = as_written;
    } else {
      c.priced[s.norm] = estimates;
    }
  }
  return c;
}

DeferredProgram defer_norms(const Graph& g, const DeferralChoice& c) {
  DeferredProgram d = defer_norms(g, c.options);
  for (NormSite& s : d.sites)
    if (auto it = c.priced.find(s.norm); it != c.priced.end() && s.deferred) s.priced = it->second;
  return d;
}

}  // namespace comfuse
