// `strata compare --report DIR`: the comparison as a page a person opens (docs/COMPARE.md "The
// report"). DIR/report.html is self-contained: the headline numbers, what was simulated, the
// per-layer and per-MoE-layer tables, and the plots as PNGs in data URIs (base64), each also
// written beside it:
//   layer_error.png      per decoder layer, rel_error and rel_error_end_to_end vs layer index
//   kl_histogram.png     the per-position KL divergence in log10-spaced bins (kl_histogram)
//   expert_coverage.png  MoE layers x experts, colour = tokens the source routed to each
//                        expert on the comparison's tokens; the experts the calibration left
//                        without tokens (ExpertStats::uncalibrated) crossed out in red
//                        (filled red when a cell is under 6 pixels); a colour bar on the right
//                        (absent for a model without MoE layers)
// A script in the page checks, once it has loaded, that every plot decoded (img.complete and
// naturalWidth > 0), puts a visible notice in place of one that did not, and records the count
// on the body: data-plots-rendered="3 of 3".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/plot.h"
#include "engine/compare.h"

namespace strata {

// The per-position KL divergences in bins of 1 / bins_per_decade decades: a value v > 0 falls in
// the bin floor(log10(v) * bins_per_decade) (in units of 1 / bins_per_decade decades), whose edges
// are 10^(bin / bins_per_decade) and 10^((bin + 1) / bins_per_decade). The bins run from the
// smallest positive value's to the largest's, at most max_decades decades: smaller values are
// counted in the first bin (`clamped` says how many). Zero KL (and rounding's tiny negatives:
// KL is >= 0 in exact arithmetic) has a bin of its own, `zero`, drawn apart at the left.
struct KlHistogram {
  int bins_per_decade = 4;
  int64_t first_bin = 0;              // the first bin's index (edges above)
  std::vector<int64_t> counts;        // counts[i]: bin first_bin + i
  int64_t zero = 0;                   // values <= 0
  int64_t clamped = 0;                // positive values below the first bin, counted in it
  double lower_edge(size_t i) const;  // of counts[i]
  double upper_edge(size_t i) const;
};
KlHistogram kl_histogram(const std::vector<double>& kl, int bins_per_decade = 4,
                         int max_decades = 12);

// The plots (the PNG files are their Canvas::png()).
Canvas plot_layer_errors(const std::vector<LayerError>& layers);
Canvas plot_kl_histogram(const KlHistogram& h);
Canvas plot_expert_coverage(const std::vector<ExpertStats>& experts);

// Creates DIR when needed; throws strata::Error when it cannot (run before the comparison).
void prepare_report_dir(const std::string& dir);
// Writes DIR/report.html and the PNGs (creating DIR), each file atomically. Throws strata::Error
// when DIR cannot be made or written.
void write_compare_report(const CompareResult& r, const std::string& dir);

// RFC 4648 base64 (with padding) of `bytes`.
std::string base64_encode(const std::string& bytes);

}  // namespace strata
