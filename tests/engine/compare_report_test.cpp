// engine/compare_report.h: the KL histogram's bins worked by hand, base64 against RFC 4648's
// test vectors, the heat map's cells and marks at their hand-computed pixels, and the page
// written with its plots embedded and beside it.
#include "engine/compare_report.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

TEST(CompareReport, KlHistogramBinsByHand) {
  // 4 bins per decade: bin = floor(log10(v) * 4).
  //   0.002: log10 = -2.699, x4 = -10.8 -> bin -11 (edges 10^-2.75 = 0.00178, 10^-2.5 = 0.00316)
  //   0.05:  -1.301 -> -5.2 -> bin -6;   0.3: -0.523 -> -2.09 -> bin -3;  0.31 -> bin -3
  // 0 and a rounding's -1e-18 go to the zero bin.
  const KlHistogram h = kl_histogram({0.0, -1e-18, 0.002, 0.05, 0.3, 0.31});
  EXPECT_EQ(h.zero, 2);
  EXPECT_EQ(h.first_bin, -11);
  ASSERT_EQ(h.counts.size(), 9u);  // bins -11 .. -3
  EXPECT_EQ(h.counts, (std::vector<int64_t>{1, 0, 0, 0, 0, 1, 0, 0, 2}));
  EXPECT_EQ(h.clamped, 0);
  EXPECT_NEAR(h.lower_edge(0), 0.0017783, 1e-6);
  EXPECT_NEAR(h.upper_edge(0), 0.0031623, 1e-6);
  EXPECT_NEAR(h.upper_edge(8), 0.3162278, 1e-6);  // 10^(-2/4)
  // At most max_decades decades: 1e-20 is counted in the first bin, 12 decades below 1.
  const KlHistogram c = kl_histogram({1e-20, 0.5}, 4, 12);
  EXPECT_EQ(c.first_bin, -2 - 48 + 1);  // 0.5 is in bin -2 (log10 x 4 = -1.2); 48 bins
  ASSERT_EQ(c.counts.size(), 48u);
  EXPECT_EQ(c.counts.front(), 1);
  EXPECT_EQ(c.counts.back(), 1);
  EXPECT_EQ(c.clamped, 1);
  // Nothing positive: only the zero bin.
  const KlHistogram z = kl_histogram({0.0, 0.0});
  EXPECT_EQ(z.zero, 2);
  EXPECT_TRUE(z.counts.empty());
}

TEST(CompareReport, Base64Rfc4648Vectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

ExpertStats moe_layer(int64_t layer, std::vector<int64_t> tokens,
                      std::optional<std::vector<int64_t>> idle) {
  ExpertStats x;
  x.layer = layer;
  x.router = "model.layers." + std::to_string(layer) + ".mlp.gate";
  x.experts = static_cast<int64_t>(tokens.size());
  x.top_k = 2;
  x.tokens_source = tokens;
  x.tokens_quantized = tokens;
  x.uncalibrated = std::move(idle);
  return x;
}

bool has_colour(const Canvas& c, int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb colour) {
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = x0; x < x1; ++x)
      if (c.at(x, y) == colour) return true;
  return false;
}

// 2 MoE layers x 4 experts: cells of 24 x 24 pixels (760 / 4 and 420 / 2, capped at 24), the area
// from (60, 10): layer row r, expert e at x [60 + 24 e, 84 + 24 e), y [10 + 24 r, 34 + 24 r).
TEST(CompareReport, HeatMapCellsAndUncalibratedMarks) {
  const Canvas c = plot_expert_coverage(
      {moe_layer(1, {0, 10, 20, 40}, std::vector<int64_t>{1}), moe_layer(3, {40, 5, 0, 0}, {})});
  // Colours: tokens / 40 on the viridis scale, at the cells' corners (the cross keeps off them).
  EXPECT_EQ(c.at(60, 10), viridis(0.0));    // layer 1, expert 0: no token
  EXPECT_EQ(c.at(132, 10), viridis(1.0));   // layer 1, expert 3: 40
  EXPECT_EQ(c.at(108, 33), viridis(0.5));   // layer 1, expert 2: 20
  EXPECT_EQ(c.at(60, 34), viridis(1.0));    // layer 3, expert 0: 40
  EXPECT_EQ(c.at(84, 57), viridis(0.125));  // layer 3, expert 1: 5
  // Layer 1's expert 1 crossed out in red, through its centre; no other cell has red.
  EXPECT_EQ(c.at(84 + 12, 10 + 12), kRed);
  EXPECT_TRUE(has_colour(c, 84, 10, 108, 34, kRed));
  EXPECT_FALSE(has_colour(c, 60, 10, 84, 34, kRed));
  EXPECT_FALSE(has_colour(c, 108, 10, 156, 34, kRed));
  EXPECT_FALSE(has_colour(c, 60, 34, 156, 58, kRed));
}

TEST(CompareReport, LayerErrorsPlotsBothLines) {
  std::vector<LayerError> layers = {{0, 0.1, 0.1}, {1, 0.2, 0.3}, {2, 0.1, 0.4}};
  const Canvas c = plot_layer_errors(layers);
  int64_t blue = 0, orange = 0;
  for (int64_t y = 0; y < c.height(); ++y)
    for (int64_t x = 0; x < c.width(); ++x) {
      blue += c.at(x, y) == kBlue ? 1 : 0;
      orange += c.at(x, y) == kOrange ? 1 : 0;
    }
  EXPECT_GT(blue, 100);
  EXPECT_GT(orange, 100);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(CompareReport, PageEmbedsEveryPlot) {
  CompareResult r;
  r.source_dir = "src<&>";
  r.quantized_dir = "out";
  r.quant_algo = "NVFP4";
  r.sequences = 1;
  r.tokens = r.positions = 4;
  r.kl = {0.0, 0.001, 0.01, 0.1};
  r.layers = {{0, 0.01, 0.01}, {1, 0.02, 0.03}};
  r.experts = {moe_layer(1, {3, 0, 5}, std::vector<int64_t>{1})};
  const fs::path dir = fs::temp_directory_path() /
                       ("strata_report_test_" + std::to_string(getpid())) / "nested" / "report";
  write_compare_report(r, dir.string());
  const std::string html = slurp(dir / "report.html");
  for (const char* png : {"layer_error.png", "kl_histogram.png", "expert_coverage.png"}) {
    const std::string bytes = slurp(dir / png);
    ASSERT_GT(bytes.size(), 100u) << png;
    EXPECT_EQ(bytes.substr(1, 3), "PNG") << png;
    EXPECT_NE(html.find("src=\"data:image/png;base64," + base64_encode(bytes) + "\""),
              std::string::npos)
        << png << " is not embedded";
  }
  EXPECT_NE(html.find("data-plots-rendered"), std::string::npos);
  EXPECT_NE(html.find("img.complete && img.naturalWidth > 0"), std::string::npos);
  EXPECT_NE(html.find("src&lt;&amp;&gt;"), std::string::npos);  // escaped
  EXPECT_EQ(html.find("src<&>"), std::string::npos);
  // Nothing outside the page: no src= or href= but the data URIs.
  size_t at = 0, srcs = 0;
  while ((at = html.find("src=\"", at)) != std::string::npos) {
    EXPECT_EQ(html.compare(at, 16, "src=\"data:image/"), 0) << html.substr(at, 40);
    ++at;
    ++srcs;
  }
  EXPECT_EQ(srcs, 3u);
  EXPECT_EQ(html.find("href="), std::string::npos);
  fs::remove_all(dir.parent_path().parent_path());
  // A dense model: two plots, no heat map.
  r.experts.clear();
  write_compare_report(r, dir.string());
  EXPECT_FALSE(fs::exists(dir / "expert_coverage.png"));
  EXPECT_EQ(slurp(dir / "report.html").find("expert_coverage.png"), std::string::npos);
  fs::remove_all(dir.parent_path().parent_path());
}

TEST(CompareReport, UncreatableDirectoryIsAnError) {
  const fs::path file =
      fs::temp_directory_path() / ("strata_report_file_" + std::to_string(getpid()));
  std::ofstream(file) << "x";
  EXPECT_THROW(prepare_report_dir((file / "sub").string()), Error);
  fs::remove(file);
}

}  // namespace
}  // namespace strata
