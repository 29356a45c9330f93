// Raster plots for reports (`strata compare --report`): a Canvas of RGB8 pixels, a 5x7 bitmap
// font for tick labels, and Axes that map data coordinates to pixels and draw ticks, lines, bars
// and heat-map cells. Titles, axis names and legends are the HTML around the image.
//
//   Canvas c(640, 360);
//   Axes ax(c, {60, 10, 630, 330}, {0, 10}, {0, 1});   // plot area, x range, y range
//   ax.frame();  ax.x_ticks(nice_ticks(0, 10, 6));  ax.y_ticks(nice_ticks(0, 1, 5), true);
//   ax.polyline({0, 5, 10}, {0, 0.5, 1}, kBlue);
//   std::string png = c.png();
//
// Pixel coordinates: x to the right, y down, (0, 0) the top-left pixel. A data point maps to
//   px(x) = area.left + round((x - x.lo) / (x.hi - x.lo) * (area.right - 1 - area.left))
//   py(y) = area.bottom - 1 - round((y - y.lo) / (y.hi - y.lo) * (area.bottom - 1 - area.top))
// (round half away from zero), so x.lo is the first column of the area and x.hi its last.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

inline constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrey{160, 160, 160},
    kLightGrey{225, 225, 225}, kBlue{31, 119, 180}, kOrange{255, 127, 14}, kRed{214, 39, 40};

// A colour of the viridis scale (dark purple at 0, green, yellow at 1), t clamped to [0, 1];
// piecewise linear through 9 of matplotlib's viridis colours.
Rgb viridis(double t);

class Canvas {
 public:
  Canvas(int64_t width, int64_t height, Rgb background = kWhite);
  int64_t width() const { return width_; }
  int64_t height() const { return height_; }
  const std::vector<uint8_t>& pixels() const { return rgb_; }  // rows top first, R G B each
  Rgb at(int64_t x, int64_t y) const;                          // throws outside the canvas

  // Drawing clips to the canvas.
  void set(int64_t x, int64_t y, Rgb c);
  // The pixels [x0, x1) x [y0, y1).
  void fill_rect(int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb c);
  // Bresenham's line from (x0, y0) to (x1, y1), both ends included; thickness t draws a t x t
  // square at each pixel of it (centred, the extra pixel right/down for even t).
  void line(int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb c, int thickness = 1);
  // Text in the 5x7 bitmap font, each glyph scaled by `scale`, its top-left corner at (x, y),
  // glyphs 6 x scale pixels apart. The font has "0123456789.-+e%" and space; any other character
  // is an internal error.
  void text(int64_t x, int64_t y, std::string_view s, Rgb c, int scale = 1);
  static int64_t text_width(std::string_view s, int scale = 1);  // 6 x scale per glyph, less 1
  static constexpr int64_t kGlyphHeight = 7;

  std::string png() const;  // core/png.h

 private:
  int64_t width_, height_;
  std::vector<uint8_t> rgb_;
};

struct PixelRect {
  int64_t left = 0, top = 0, right = 0, bottom = 0;  // [left, right) x [top, bottom)
};
struct DataRange {
  double lo = 0.0, hi = 1.0;
};

struct Tick {
  double at = 0.0;
  std::string label;
};

// At most about `count` ticks at multiples of 1, 2 or 5 x 10^k within [lo, hi], labelled with
// tick_label.
std::vector<Tick> nice_ticks(double lo, double hi, int count);
// printf's %g with 4 significant digits: "0", "0.25", "1e-05", "1.5e+04".
std::string tick_label(double v);

class Axes {
 public:
  Axes(Canvas& canvas, PixelRect area, DataRange x, DataRange y);
  int64_t px(double x) const;
  int64_t py(double y) const;
  const PixelRect& area() const { return area_; }

  // The area's border, one pixel outside it.
  void frame(Rgb c = kBlack);
  // Tick marks (4 pixels) below the frame with their labels centred under them.
  void x_ticks(const std::vector<Tick>& ticks, Rgb c = kBlack);
  // Tick marks left of the frame with their labels right-aligned before them; with `grid`, a
  // light line across the area at each.
  void y_ticks(const std::vector<Tick>& ticks, bool grid = false, Rgb c = kBlack);
  // The points joined by lines; a marker (a square of 2 * marker + 1 pixels) at each when
  // marker > 0. Non-finite points are skipped and break the line.
  void polyline(const std::vector<double>& xs, const std::vector<double>& ys, Rgb c,
                int thickness = 2, int marker = 0);
  // A bar over data x in [x0, x1) from y.lo up to y: the pixels px(x0) <= col < px(x1),
  // py(y) <= row <= py(y.lo) (none when y <= y.lo).
  void bar(double x0, double x1, double y, Rgb c);
  // The cell between data x0 and x1, y0 and y1: the columns from the lesser of px(x0), px(x1)
  // up to the greater (excluded), the rows likewise with py. A y range given high to low
  // (y.lo > y.hi) puts y.lo at the top: the rows of a heat map.
  void cell(double x0, double x1, double y0, double y1, Rgb c);

 private:
  Canvas& canvas_;
  PixelRect area_;
  DataRange x_, y_;
};

}  // namespace strata
