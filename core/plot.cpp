#include "core/plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/png.h"

namespace strata {
namespace {

// The 5x7 font: 7 rows per glyph, top first, bit 4 the leftmost column.
struct Glyph {
  char c;
  std::array<uint8_t, 7> rows;
};

constexpr std::array<Glyph, 16> kFont = {{
    {'0', {0b01110, 0b10001, 0b10011, 0b10101, 0b11001, 0b10001, 0b01110}},
    {'1', {0b00100, 0b01100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110}},
    {'2', {0b01110, 0b10001, 0b00001, 0b00010, 0b00100, 0b01000, 0b11111}},
    {'3', {0b11111, 0b00010, 0b00100, 0b00010, 0b00001, 0b10001, 0b01110}},
    {'4', {0b00010, 0b00110, 0b01010, 0b10010, 0b11111, 0b00010, 0b00010}},
    {'5', {0b11111, 0b10000, 0b11110, 0b00001, 0b00001, 0b10001, 0b01110}},
    {'6', {0b00110, 0b01000, 0b10000, 0b11110, 0b10001, 0b10001, 0b01110}},
    {'7', {0b11111, 0b00001, 0b00010, 0b00100, 0b01000, 0b01000, 0b01000}},
    {'8', {0b01110, 0b10001, 0b10001, 0b01110, 0b10001, 0b10001, 0b01110}},
    {'9', {0b01110, 0b10001, 0b10001, 0b01111, 0b00001, 0b00010, 0b01100}},
    {'.', {0, 0, 0, 0, 0, 0b01100, 0b01100}},
    {'-', {0, 0, 0, 0b11111, 0, 0, 0}},
    {'+', {0, 0b00100, 0b00100, 0b11111, 0b00100, 0b00100, 0}},
    {'e', {0, 0, 0b01110, 0b10001, 0b11111, 0b10000, 0b01110}},
    {'%', {0b11000, 0b11001, 0b00010, 0b00100, 0b01000, 0b10011, 0b00011}},
    {' ', {0, 0, 0, 0, 0, 0, 0}},
}};

const Glyph& glyph(char c) {
  const Glyph* found = nullptr;
  for (const Glyph& g : kFont)
    if (g.c == c) found = &g;
  STRATA_ASSERT(found, "the plot font has no glyph for '", c, "'");
  return *found;
}

}  // namespace

Rgb viridis(double t) {
  static constexpr std::array<Rgb, 9> kStops = {{{68, 1, 84},
                                                 {71, 45, 123},
                                                 {59, 82, 139},
                                                 {44, 114, 142},
                                                 {33, 145, 140},
                                                 {40, 174, 128},
                                                 {94, 201, 98},
                                                 {173, 220, 48},
                                                 {253, 231, 37}}};
  if (!(t > 0.0)) return kStops.front();  // also NaN
  if (t >= 1.0) return kStops.back();
  const double pos = t * 8.0;
  const size_t i = static_cast<size_t>(pos);
  const double f = pos - static_cast<double>(i);
  auto mix = [&](uint8_t a, uint8_t b) {
    return static_cast<uint8_t>(std::lround(a + (static_cast<double>(b) - a) * f));
  };
  const Rgb &a = kStops[i], &b = kStops[i + 1];
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

// ---- Canvas ------------------------------------------------------------------------------------

Canvas::Canvas(int64_t width, int64_t height, Rgb background) : width_(width), height_(height) {
  STRATA_ASSERT(width > 0 && height > 0, "canvas of ", width, " x ", height);
  rgb_.resize(static_cast<size_t>(width * height * 3));
  for (size_t i = 0; i < rgb_.size(); i += 3) {
    rgb_[i] = background.r;
    rgb_[i + 1] = background.g;
    rgb_[i + 2] = background.b;
  }
}

Rgb Canvas::at(int64_t x, int64_t y) const {
  STRATA_ASSERT(x >= 0 && x < width_ && y >= 0 && y < height_, "pixel (", x, ", ", y,
                ") outside the canvas");
  const size_t i = static_cast<size_t>((y * width_ + x) * 3);
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Canvas::set(int64_t x, int64_t y, Rgb c) {
  if (x < 0 || x >= width_ || y < 0 || y >= height_) return;
  const size_t i = static_cast<size_t>((y * width_ + x) * 3);
  rgb_[i] = c.r;
  rgb_[i + 1] = c.g;
  rgb_[i + 2] = c.b;
}

void Canvas::fill_rect(int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb c) {
  x0 = std::max<int64_t>(x0, 0);
  y0 = std::max<int64_t>(y0, 0);
  x1 = std::min(x1, width_);
  y1 = std::min(y1, height_);
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = x0; x < x1; ++x)
      set(x, y, c);
}

void Canvas::line(int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb c, int thickness) {
  const int64_t dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int64_t sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  const int64_t before = (thickness - 1) / 2, after = thickness / 2;
  int64_t err = dx + dy;
  for (;;) {
    fill_rect(x0 - before, y0 - before, x0 + after + 1, y0 + after + 1, c);
    if (x0 == x1 && y0 == y1) break;
    const int64_t e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void Canvas::text(int64_t x, int64_t y, std::string_view s, Rgb c, int scale) {
  for (char ch : s) {
    const Glyph& g = glyph(ch);
    for (int64_t row = 0; row < kGlyphHeight; ++row)
      for (int64_t col = 0; col < 5; ++col)
        if ((g.rows[static_cast<size_t>(row)] >> (4 - col)) & 1u)
          fill_rect(x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale,
                    c);
    x += 6 * scale;
  }
}

int64_t Canvas::text_width(std::string_view s, int scale) {
  return s.empty() ? 0 : static_cast<int64_t>(s.size()) * 6 * scale - scale;
}

std::string Canvas::png() const {
  return png_encode(rgb_, width_, height_);
}

// ---- ticks -------------------------------------------------------------------------------------

std::string tick_label(double v) {
  if (v == 0.0) return "0";  // not "-0"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::vector<Tick> nice_ticks(double lo, double hi, int count) {
  std::vector<Tick> ticks;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi) || count < 1) return ticks;
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10.0 * mag;
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * mag >= raw * (1.0 - 1e-9)) {
      step = m * mag;
      break;
    }
  }
  const double first = std::ceil(lo / step - 1e-9);
  for (double k = first; k * step <= hi + step * 1e-9; k += 1.0) {
    const double v = k * step;
    ticks.push_back({v, tick_label(std::fabs(v) < step * 1e-9 ? 0.0 : v)});
  }
  return ticks;
}

// ---- Axes --------------------------------------------------------------------------------------

Axes::Axes(Canvas& canvas, PixelRect area, DataRange x, DataRange y)
    : canvas_(canvas), area_(area), x_(x), y_(y) {
  STRATA_ASSERT(area.right - area.left >= 2 && area.bottom - area.top >= 2, "plot area too small");
  STRATA_ASSERT(x.hi != x.lo && y.hi != y.lo, "empty data range");
}

int64_t Axes::px(double x) const {
  return area_.left + std::llround((x - x_.lo) / (x_.hi - x_.lo) *
                                   static_cast<double>(area_.right - 1 - area_.left));
}

int64_t Axes::py(double y) const {
  return area_.bottom - 1 -
         std::llround((y - y_.lo) / (y_.hi - y_.lo) *
                      static_cast<double>(area_.bottom - 1 - area_.top));
}

void Axes::frame(Rgb c) {
  const PixelRect& a = area_;
  canvas_.line(a.left - 1, a.top - 1, a.right, a.top - 1, c);
  canvas_.line(a.left - 1, a.bottom, a.right, a.bottom, c);
  canvas_.line(a.left - 1, a.top - 1, a.left - 1, a.bottom, c);
  canvas_.line(a.right, a.top - 1, a.right, a.bottom, c);
}

void Axes::x_ticks(const std::vector<Tick>& ticks, Rgb c) {
  for (const Tick& t : ticks) {
    const int64_t x = px(t.at);
    canvas_.line(x, area_.bottom + 1, x, area_.bottom + 4, c);
    canvas_.text(x - Canvas::text_width(t.label) / 2, area_.bottom + 7, t.label, c);
  }
}

void Axes::y_ticks(const std::vector<Tick>& ticks, bool grid, Rgb c) {
  for (const Tick& t : ticks) {
    const int64_t y = py(t.at);
    if (grid && y > area_.top && y < area_.bottom - 1)
      canvas_.line(area_.left, y, area_.right - 1, y, kLightGrey);
    canvas_.line(area_.left - 5, y, area_.left - 2, y, c);
    canvas_.text(area_.left - 8 - Canvas::text_width(t.label), y - Canvas::kGlyphHeight / 2,
                 t.label, c);
  }
}

void Axes::polyline(const std::vector<double>& xs, const std::vector<double>& ys, Rgb c,
                    int thickness, int marker) {
  STRATA_ASSERT(xs.size() == ys.size(), "polyline of ", xs.size(), " x and ", ys.size(), " y");
  bool have_prev = false;
  int64_t prev_x = 0, prev_y = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!std::isfinite(xs[i]) || !std::isfinite(ys[i])) {
      have_prev = false;
      continue;
    }
    const int64_t x = px(xs[i]), y = py(ys[i]);
    if (have_prev) canvas_.line(prev_x, prev_y, x, y, c, thickness);
    if (marker > 0) canvas_.fill_rect(x - marker, y - marker, x + marker + 1, y + marker + 1, c);
    have_prev = true;
    prev_x = x;
    prev_y = y;
  }
}

void Axes::bar(double x0, double x1, double y, Rgb c) {
  if (!(y > y_.lo)) return;
  canvas_.fill_rect(px(x0), py(y), px(x1), py(y_.lo) + 1, c);
}

void Axes::cell(double x0, double x1, double y0, double y1, Rgb c) {
  const int64_t a = px(x0), b = px(x1), p = py(y0), q = py(y1);
  canvas_.fill_rect(std::min(a, b), std::min(p, q), std::max(a, b), std::max(p, q), c);
}

}  // namespace strata
