#include "engine/compare_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors_writer.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// 10^e as a tick label: "1" for 0, else "1e-3", "1e2".
std::string decade_label(int64_t e) {
  return e == 0 ? std::string("1") : "1e" + std::to_string(e);
}

// The usual plot frame: 70 pixels left for the y labels, 32 below for the x labels.
constexpr int64_t kPlotWidth = 720, kPlotHeight = 360;
PixelRect plot_area() {
  return {70, 12, kPlotWidth - 16, kPlotHeight - 32};
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6)
      out.push_back(kAlphabet[(v >> s) & 63u]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out.push_back(kAlphabet[(v >> 18) & 63u]);
    out.push_back(kAlphabet[(v >> 12) & 63u]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63u] : '=');
    out.push_back('=');
  }
  return out;
}

// ---- the KL histogram --------------------------------------------------------------------------

double KlHistogram::lower_edge(size_t i) const {
  return std::pow(10.0, static_cast<double>(first_bin + static_cast<int64_t>(i)) /
                            static_cast<double>(bins_per_decade));
}

double KlHistogram::upper_edge(size_t i) const {
  return lower_edge(i + 1);
}

KlHistogram kl_histogram(const std::vector<double>& kl, int bins_per_decade, int max_decades) {
  STRATA_ASSERT(bins_per_decade >= 1 && max_decades >= 1, "histogram of ", bins_per_decade,
                " bins per decade over ", max_decades, " decades");
  KlHistogram h;
  h.bins_per_decade = bins_per_decade;
  auto bin_of = [&](double v) {
    return static_cast<int64_t>(std::floor(std::log10(v) * bins_per_decade));
  };
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (double v : kl) {
    if (!(v > 0.0) || !std::isfinite(v)) continue;
    lo = std::min(lo, bin_of(v));
    hi = std::max(hi, bin_of(v));
  }
  if (hi == INT64_MIN) {  // no positive value
    for (double v : kl)
      h.zero += v > 0.0 ? 0 : 1;
    return h;
  }
  lo = std::max(lo, hi + 1 - static_cast<int64_t>(max_decades) * bins_per_decade);
  h.first_bin = lo;
  h.counts.assign(static_cast<size_t>(hi - lo + 1), 0);
  for (double v : kl) {
    if (!(v > 0.0)) {
      ++h.zero;
      continue;
    }
    if (!std::isfinite(v)) continue;  // an infinite KL has no bin; the headline's max shows it
    int64_t b = bin_of(v);
    if (b < lo) {
      b = lo;
      ++h.clamped;
    }
    ++h.counts[static_cast<size_t>(b - lo)];
  }
  return h;
}

// ---- plots -------------------------------------------------------------------------------------

Canvas plot_layer_errors(const std::vector<LayerError>& layers) {
  Canvas c(kPlotWidth, kPlotHeight);
  const int64_t n = static_cast<int64_t>(layers.size());
  double ymax = 0.0;
  std::vector<double> xs, local, e2e;
  for (const LayerError& e : layers) {
    xs.push_back(static_cast<double>(e.index));
    local.push_back(e.rel_error);
    e2e.push_back(e.rel_error_end_to_end);
    for (double v : {e.rel_error, e.rel_error_end_to_end})
      if (std::isfinite(v)) ymax = std::max(ymax, v);
  }
  const double yhi = ymax > 0.0 ? ymax * 1.08 : 1.0;
  Axes ax(c, plot_area(), {-0.5, static_cast<double>(std::max<int64_t>(n, 1)) - 0.5}, {0.0, yhi});
  ax.y_ticks(nice_ticks(0.0, yhi, 6), true);
  std::vector<Tick> xt;
  for (const Tick& t : nice_ticks(0.0, static_cast<double>(std::max<int64_t>(n - 1, 1)), 12))
    if (t.at == std::floor(t.at) && t.at <= static_cast<double>(n - 1)) xt.push_back(t);
  ax.x_ticks(xt);
  ax.frame();
  const int marker = n <= 64 ? 3 : 0;
  ax.polyline(xs, local, kBlue, 2, marker);
  ax.polyline(xs, e2e, kOrange, 2, marker);
  return c;
}

Canvas plot_kl_histogram(const KlHistogram& h) {
  Canvas c(kPlotWidth, kPlotHeight);
  // Slots along x: the zero bin [0, 1), a gap, then bin i at [1.5 + i, 2.5 + i).
  const double nb = static_cast<double>(h.counts.size());
  int64_t most = h.zero;
  for (int64_t k : h.counts)
    most = std::max(most, k);
  const double yhi = most > 0 ? static_cast<double>(most) * 1.08 : 1.0;
  Axes ax(c, plot_area(), {0.0, 1.5 + std::max(nb, 1.0)}, {0.0, yhi});
  std::vector<Tick> yt;
  for (const Tick& t : nice_ticks(0.0, yhi, 6))
    if (t.at == std::floor(t.at)) yt.push_back(t);
  ax.y_ticks(yt, true);
  constexpr double kGap = 0.1;  // between neighbouring bars
  ax.bar(kGap, 1.0 - kGap, static_cast<double>(h.zero), kGrey);
  for (size_t i = 0; i < h.counts.size(); ++i) {
    const double x0 = 1.5 + static_cast<double>(i);
    ax.bar(x0 + kGap / 2, x0 + 1.0 - kGap / 2, static_cast<double>(h.counts[i]), kBlue);
  }
  // A tick at every bin edge, labelled at the decades.
  std::vector<Tick> xt = {{0.5, "0"}};
  for (size_t i = 0; i <= h.counts.size() && !h.counts.empty(); ++i) {
    const int64_t b = h.first_bin + static_cast<int64_t>(i);
    xt.push_back({1.5 + static_cast<double>(i),
                  b % h.bins_per_decade == 0 ? decade_label(b / h.bins_per_decade) : ""});
  }
  ax.x_ticks(xt);
  ax.frame();
  return c;
}

Canvas plot_expert_coverage(const std::vector<ExpertStats>& experts) {
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(experts.size()));
  int64_t cols = 1, most = 0;
  for (const ExpertStats& x : experts) {
    cols = std::max(cols, x.experts);
    for (int64_t t : x.tokens_source)
      most = std::max(most, t);
  }
  const int64_t cw = std::clamp<int64_t>(760 / cols, 2, 24);
  const int64_t ch = std::clamp<int64_t>(420 / rows, 2, 24);
  const int64_t left = 60, top = 10;
  const int64_t area_w = cols * cw + 1, area_h = rows * ch + 1;
  const int64_t bar_x = left + area_w + 20, bar_w = 16, bar_h = std::max<int64_t>(area_h, 140);
  Canvas c(bar_x + bar_w + 70, top + bar_h + 36);
  // Rows top down: layer i of the list covers y in [i, i + 1).
  Axes ax(c, {left, top, left + area_w, top + area_h}, {0.0, static_cast<double>(cols)},
          {static_cast<double>(rows), 0.0});
  const double scale = static_cast<double>(std::max<int64_t>(most, 1));
  for (size_t r = 0; r < experts.size(); ++r) {
    const ExpertStats& x = experts[r];
    const double y = static_cast<double>(r);
    for (int64_t e = 0; e < x.experts; ++e) {
      const double xe = static_cast<double>(e);
      ax.cell(xe, xe + 1.0, y, y + 1.0,
              viridis(static_cast<double>(x.tokens_source[static_cast<size_t>(e)]) / scale));
    }
    if (!x.uncalibrated) continue;
    for (int64_t e : *x.uncalibrated) {
      if (e < 0 || e >= x.experts) continue;
      const int64_t x0 = ax.px(static_cast<double>(e)), y0 = ax.py(y);
      if (cw >= 6 && ch >= 6) {
        const int t = cw >= 10 && ch >= 10 ? 2 : 1;
        c.line(x0 + 1, y0 + 1, x0 + cw - 2, y0 + ch - 2, kRed, t);
        c.line(x0 + cw - 2, y0 + 1, x0 + 1, y0 + ch - 2, kRed, t);
      } else {
        c.fill_rect(x0, y0, x0 + cw, y0 + ch, kRed);
      }
    }
  }
  ax.frame();
  // Row labels: the layer index, every k-th row so that they stay 9 pixels apart.
  const int64_t every_row = (9 + ch - 1) / ch;
  for (size_t r = 0; r < experts.size(); r += static_cast<size_t>(every_row)) {
    const std::string label = std::to_string(experts[r].layer);
    c.text(left - 8 - Canvas::text_width(label),
           ax.py(static_cast<double>(r)) + ch / 2 - Canvas::kGlyphHeight / 2, label, kBlack);
  }
  // Column labels: the expert index, every k-th (1, 2, 5, 10, 20, ...) so that they fit.
  const int64_t widest = Canvas::text_width(std::to_string(cols - 1)) + 6;
  int64_t every_col = 1;
  for (int64_t m = 1; every_col * cw < widest; m *= 10) {
    for (int64_t k : {1, 2, 5}) {
      every_col = k * m;
      if (every_col * cw >= widest) break;
    }
  }
  std::vector<Tick> xt;
  for (int64_t e = 0; e < cols; e += every_col)
    xt.push_back({static_cast<double>(e) + 0.5, std::to_string(e)});
  ax.x_ticks(xt);
  // The colour bar: 0 at the bottom, the most tokens at the top, ticks on its right.
  Axes bar(c, {bar_x, top, bar_x + bar_w, top + bar_h}, {0.0, 1.0}, {0.0, scale});
  for (int64_t y = top; y < top + bar_h; ++y)
    c.fill_rect(bar_x, y, bar_x + bar_w, y + 1,
                viridis(static_cast<double>(top + bar_h - 1 - y) / static_cast<double>(bar_h - 1)));
  bar.frame();
  for (const Tick& t : nice_ticks(0.0, scale, 5)) {
    if (t.at != std::floor(t.at)) continue;
    const int64_t y = bar.py(t.at);
    c.line(bar_x + bar_w + 1, y, bar_x + bar_w + 4, y, kBlack);
    c.text(bar_x + bar_w + 7, y - Canvas::kGlyphHeight / 2, t.label, kBlack);
  }
  return c;
}

// ---- the page ----------------------------------------------------------------------------------

namespace {

struct Plot {
  std::string file, alt, title, axes, caption;
  Canvas canvas;
};

constexpr const char* kStyle = R"(<style>
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 70em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #f0f0f0; }
td.l, th.l { text-align: left; }
figure { margin: 1em 0 2em; }
figcaption { max-width: 60em; }
.swatch { display: inline-block; width: 1.6em; height: 0.6em; margin: 0 0.3em; }
.broken { color: #b00; font-weight: bold; border: 2px solid #b00; padding: 1em; }
</style>
)";

// Runs once the page and its images have loaded.
constexpr const char* kScript = R"(<script>
window.addEventListener('load', function () {
  var plots = document.querySelectorAll('img.plot');
  var rendered = 0;
  plots.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) {
      rendered++;
    } else {
      var notice = document.createElement('p');
      notice.className = 'broken';
      notice.textContent = 'This plot did not render: ' + img.alt;
      img.replaceWith(notice);
    }
  });
  document.body.setAttribute('data-plots-rendered', rendered + ' of ' + plots.length);
});
</script>
)";

std::string swatch(Rgb c) {
  char buf[96];
  std::snprintf(buf, sizeof buf,
                "<span class=\"swatch\" style=\"background:#%02x%02x%02x\"></span>", c.r, c.g, c.b);
  return buf;
}

std::string number(double v, const char* f = "%.6g") {
  return std::isfinite(v) ? format_double(f, v) : std::string("n/a");
}

void headline_html(std::ostringstream& os, const CompareResult& r) {
  os << "<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    os << "<tr><th class=\"l\">" << k << "</th><td class=\"l\">" << v << "</td></tr>\n";
  };
  row("source", html_escape(r.source_dir));
  row("quantized", html_escape(r.quantized_dir));
  row("quant_algo", r.quant_algo.empty() ? "none (no hf_quant_config.json: run as is)"
                                         : html_escape(r.quant_algo));
  row("KV cache algorithm", r.kv_cache_algo.empty() ? "none" : html_escape(r.kv_cache_algo));
  row("activations simulated", r.activations_simulated ? "yes" : "no");
  row("KV cache simulated", r.kv_cache_simulated ? "yes" : "no");
  row("data", str(r.sequences, " sequences, ", r.tokens, " tokens, ", r.positions, " positions, ",
                  r.predicted, " predicted"));
  row("KL divergence (source || quantized), nats",
      "mean " + number(r.mean_kl) + ", median " + number(r.median_kl) + ", p99 " +
          number(r.p99_kl) + ", max " + number(r.max_kl));
  row("top-1 agreement", number(r.top1_agreement, "%.4f"));
  row("perplexity",
      "source " + number(r.ppl_source, "%.4f") + ", quantized " + number(r.ppl_quantized, "%.4f"));
  os << "</table>\n";
}

void tables_html(std::ostringstream& os, const CompareResult& r, const KlHistogram& h) {
  os << "<h2>Decoder layers</h2>\n<table>\n<tr><th>layer</th><th>rel_error (given the source's "
        "inputs)</th><th>rel_error_end_to_end</th></tr>\n";
  for (const LayerError& e : r.layers)
    os << "<tr><td>" << e.index << "</td><td>" << number(e.rel_error, "%.4g") << "</td><td>"
       << number(e.rel_error_end_to_end, "%.4g") << "</td></tr>\n";
  os << "</table>\n";
  if (!r.experts.empty()) {
    os << "<h2>MoE layers</h2>\n<table>\n<tr><th>layer</th><th class=\"l\">router</th><th>experts"
          "</th><th>top-k</th><th>routing agreement</th><th>given the source's inputs</th>"
          "<th class=\"l\">experts without calibration tokens</th><th class=\"l\">tokens per "
          "expert, source/quantized</th></tr>\n";
    for (const ExpertStats& x : r.experts) {
      os << "<tr><td>" << x.layer << "</td><td class=\"l\">" << html_escape(x.router) << "</td><td>"
         << x.experts << "</td><td>" << x.top_k << "</td><td>"
         << number(x.routing_agreement, "%.4f") << "</td><td>"
         << number(x.routing_agreement_local, "%.4f") << "</td><td class=\"l\">";
      if (!x.uncalibrated) {
        os << "not recorded by the export";
      } else if (x.uncalibrated->empty()) {
        os << "none";
      } else {
        for (size_t i = 0; i < x.uncalibrated->size(); ++i)
          os << (i ? " " : "") << (*x.uncalibrated)[i];
      }
      os << "</td><td class=\"l\"><details><summary>" << x.experts << " experts</summary><code>";
      for (int64_t e = 0; e < x.experts; ++e)
        os << (e ? " " : "") << e << ":" << x.tokens_source[static_cast<size_t>(e)] << "/"
           << x.tokens_quantized[static_cast<size_t>(e)];
      os << "</code></details></td></tr>\n";
    }
    os << "</table>\n";
  }
  os << "<h2>KL divergence histogram</h2>\n<table id=\"kl-histogram\">\n<tr><th>from</th><th>to"
        "</th><th>positions</th></tr>\n<tr><td>0</td><td>0</td><td>"
     << h.zero << "</td></tr>\n";
  for (size_t i = 0; i < h.counts.size(); ++i)
    os << "<tr><td>" << format_double("%.3g", h.lower_edge(i)) << "</td><td>"
       << format_double("%.3g", h.upper_edge(i)) << "</td><td>" << h.counts[i] << "</td></tr>\n";
  os << "</table>\n";
}

}  // namespace

void prepare_report_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  STRATA_CHECK(!ec && fs::is_directory(dir), dir, ": cannot create the report directory (",
               ec ? ec.message() : "not a directory", "); give another --report DIR");
}

void write_compare_report(const CompareResult& r, const std::string& dir) {
  prepare_report_dir(dir);
  const KlHistogram h = kl_histogram(r.kl);
  std::vector<Plot> plots;
  plots.push_back(
      {"layer_error.png", "per-layer relative error", "Relative error per decoder layer",
       "x: decoder layer index; y: |Q_l(h) - S_l(h)| / |S_l(h)| (Frobenius norms over every "
       "token's hidden state)",
       "Relative error of each decoder layer's output vs layer index: " + swatch(kBlue) +
           "the error the layer adds, given the source's inputs (rel_error), and " +
           swatch(kOrange) +
           "the error accumulated up to it, the export run on its own inputs "
           "(rel_error_end_to_end).",
       plot_layer_errors(r.layers)});
  std::string hist = str(
      "Per-position KL divergence (source || quantized, nats), ", r.positions,
      " positions, in bins of 1/", h.bins_per_decade,
      " decade (log10-spaced; the x labels are the decades' edges). ", swatch(kGrey),
      "The bar at 0 counts the positions whose KL is zero (or rounding's tiny negatives): ", h.zero,
      ". ", swatch(kBlue), "KL > 0.");
  if (h.clamped > 0)
    hist += str(" ", h.clamped, " positions below ", format_double("%.3g", h.lower_edge(0)),
                " are counted in the first bin.");
  plots.push_back({"kl_histogram.png", "histogram of the per-position KL divergence",
                   "KL divergence per position",
                   "x: KL(source || quantized) in nats, log10 scale (a tick at every bin edge); "
                   "y: positions",
                   hist, plot_kl_histogram(h)});
  if (!r.experts.empty()) {
    plots.push_back(
        {"expert_coverage.png", "expert coverage heat map", "Expert coverage",
         "x: routed expert index; y: MoE layer (decoder layer index); colour: tokens routed",
         "Expert coverage: one row per MoE layer (labelled with its decoder layer index), one "
         "column per routed expert; colour = tokens the source routed to the expert on these "
         "positions (every top-k slot counts; the colour bar on the right gives the scale). " +
             swatch(kRed) +
             "Experts that got no calibration tokens (the export's strata_run.json) are crossed "
             "out in red (filled red when the cells are too small for a cross)" +
             (r.experts.front().uncalibrated ? std::string(".")
                                             : std::string("; this export does not record "
                                                           "them.")),
         plot_expert_coverage(r.experts)});
  }
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>strata "
        "compare: "
     << html_escape(r.quantized_dir) << "</title>\n"
     << kStyle << kScript << "</head>\n<body data-plots-rendered=\"not checked\">\n"
     << "<h1>strata compare</h1>\n";
  headline_html(os, r);
  os << "<h2>Plots</h2>\n";
  for (const Plot& p : plots) {
    const std::string png = p.canvas.png();
    write_file_atomic((fs::path(dir) / p.file).string(), png);
    os << "<h3>" << p.title << "</h3>\n<figure>\n<p>" << html_escape(p.axes)
       << "</p>\n<img class=\"plot\" alt=\"" << p.alt << "\" width=\"" << p.canvas.width()
       << "\" height=\"" << p.canvas.height() << "\" src=\"data:image/png;base64,"
       << base64_encode(png) << "\">\n<figcaption>" << p.caption << " (" << p.file
       << ")</figcaption>\n</figure>\n";
  }
  tables_html(os, r, h);
  os << "<p>Definitions of every number: docs/COMPARE.md.</p>\n</body>\n</html>\n";
  write_file_atomic((fs::path(dir) / "report.html").string(), os.str());
}

}  // namespace strata
