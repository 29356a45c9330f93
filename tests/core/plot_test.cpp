// core/plot.h against hand-worked pixels: a bar's extent for known values, a line's pixels, a
// glyph of the font, ticks, the colour scale's ends and a heat-map cell.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/plot.h"

namespace strata {
namespace {

int64_t count_colour(const Canvas& c, Rgb colour) {
  int64_t n = 0;
  for (int64_t y = 0; y < c.height(); ++y)
    for (int64_t x = 0; x < c.width(); ++x)
      n += c.at(x, y) == colour ? 1 : 0;
  return n;
}

// Area columns 10..109 (100 pixels: px spans 99) and rows 5..105 (101 pixels: py spans 100);
// x in [0, 10], y in [0, 100]. bar(2, 4, 30):
//   px(2) = 10 + round(0.2 * 99) = 30,  px(4) = 10 + round(0.4 * 99) = 50 (excluded),
//   py(30) = 105 - round(0.3 * 100) = 75,  py(0) = 105,
// so the bar is columns 30..49 and rows 75..105: 20 x 31 pixels.
TEST(Plot, BarExtentHandWorked) {
  Canvas c(120, 110);
  Axes ax(c, {10, 5, 110, 106}, {0, 10}, {0, 100});
  EXPECT_EQ(ax.px(0), 10);
  EXPECT_EQ(ax.px(10), 109);
  EXPECT_EQ(ax.py(0), 105);
  EXPECT_EQ(ax.py(100), 5);
  ax.bar(2, 4, 30, kBlue);
  EXPECT_EQ(count_colour(c, kBlue), 20 * 31);
  EXPECT_EQ(c.at(30, 75), kBlue);
  EXPECT_EQ(c.at(49, 105), kBlue);
  EXPECT_EQ(c.at(29, 90), kWhite);
  EXPECT_EQ(c.at(50, 90), kWhite);
  EXPECT_EQ(c.at(40, 74), kWhite);
  EXPECT_EQ(c.at(40, 106), kWhite);
  // A bar at or below y.lo draws nothing; one above y.hi is clipped at the canvas only.
  ax.bar(5, 6, 0, kRed);
  EXPECT_EQ(count_colour(c, kRed), 0);
}

TEST(Plot, HeatMapCellWithRowsTopDown) {
  // 4 rows of 10 pixels from the top: y range 0 (top) .. 4 (bottom); area rows 0..40.
  Canvas c(50, 50);
  Axes ax(c, {0, 0, 41, 41}, {0, 4}, {4, 0});
  EXPECT_EQ(ax.py(0), 0);
  EXPECT_EQ(ax.py(1), 10);
  ax.cell(1, 2, 1, 2, kOrange);  // column 1, row 1: pixels [10, 20) x [10, 20)
  EXPECT_EQ(count_colour(c, kOrange), 100);
  EXPECT_EQ(c.at(10, 10), kOrange);
  EXPECT_EQ(c.at(19, 19), kOrange);
  EXPECT_EQ(c.at(20, 19), kWhite);
  EXPECT_EQ(c.at(19, 9), kWhite);
}

TEST(Plot, LinePixels) {
  Canvas c(10, 10);
  c.line(1, 1, 5, 5, kBlack);
  EXPECT_EQ(count_colour(c, kBlack), 5);
  for (int i = 1; i <= 5; ++i)
    EXPECT_EQ(c.at(i, i), kBlack);
  Canvas h(10, 10);
  h.line(8, 2, 2, 2, kRed, 3);              // 7 pixels long, 3 thick: rows 1..3
  EXPECT_EQ(count_colour(h, kRed), 9 * 3);  // each end's square reaches one pixel beyond
  EXPECT_EQ(h.at(1, 1), kRed);
  EXPECT_EQ(h.at(9, 3), kRed);
  EXPECT_EQ(h.at(5, 4), kWhite);
}

TEST(Plot, GlyphsOfTheFont) {
  Canvas c(20, 10);
  c.text(1, 2, "4", kBlack);
  const char* want[7] = {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."};
  for (int row = 0; row < 7; ++row)
    for (int col = 0; col < 5; ++col)
      EXPECT_EQ(c.at(1 + col, 2 + row) == kBlack, want[row][col] == '#') << row << " " << col;
  EXPECT_EQ(count_colour(c, kBlack), 14);
  EXPECT_EQ(Canvas::text_width("1e-05"), 29);
  EXPECT_EQ(Canvas::text_width("%", 2), 10);
  // Scale 2: each font pixel is 2 x 2.
  Canvas d(20, 20);
  d.text(0, 0, ".", kBlack, 2);
  EXPECT_EQ(count_colour(d, kBlack), 4 * 4);
  EXPECT_EQ(d.at(2, 10), kBlack);
  EXPECT_EQ(d.at(5, 13), kBlack);
}

TEST(Plot, Ticks) {
  auto labels = [](const std::vector<Tick>& t) {
    std::string s;
    for (const Tick& k : t)
      s += k.label + " ";
    return s;
  };
  EXPECT_EQ(labels(nice_ticks(0, 1, 5)), "0 0.2 0.4 0.6 0.8 1 ");
  EXPECT_EQ(labels(nice_ticks(0, 37, 4)), "0 10 20 30 ");
  EXPECT_EQ(labels(nice_ticks(-0.03, 0.05, 4)), "-0.02 0 0.02 0.04 ");
  EXPECT_EQ(labels(nice_ticks(0, 0.00012, 3)), "0 5e-05 0.0001 ");
  EXPECT_TRUE(nice_ticks(1, 1, 5).empty());
  EXPECT_EQ(tick_label(1e-5), "1e-05");
  EXPECT_EQ(tick_label(15000), "1.5e+04");
}

TEST(Plot, ViridisEnds) {
  EXPECT_EQ(viridis(0), (Rgb{68, 1, 84}));
  EXPECT_EQ(viridis(-1), (Rgb{68, 1, 84}));
  EXPECT_EQ(viridis(0.5), (Rgb{33, 145, 140}));
  EXPECT_EQ(viridis(1), (Rgb{253, 231, 37}));
  // Halfway between the first two stops.
  EXPECT_EQ(viridis(1.0 / 16), (Rgb{70, 23, 104}));
}

}  // namespace
}  // namespace strata
