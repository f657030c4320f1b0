#include "tools/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "tools/bitmap_font.h"

namespace shoal::tools {
namespace {

constexpr Rgb kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                            {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                            {188, 189, 34},  {23, 190, 207}};
constexpr Rgb kFrame{120, 120, 120};
constexpr Rgb kGrid{232, 232, 232};
constexpr Rgb kText{50, 50, 50};
constexpr int kTicks = 4;  // intervals per axis: 5 labelled positions
constexpr size_t kMarkedPoints = 40;

bool finite(const std::pair<double, double>& p) {
  return std::isfinite(p.first) && std::isfinite(p.second);
}

// Legend entries laid out left to right, wrapping: their rows' count for the layout, and the
// drawing itself when `image` is given.
int layoutLegend(const std::vector<PlotSeries>& series, int left, int right, int top,
                 Image* image) {
  int x = left, rows = series.empty() ? 0 : 1;
  for (const PlotSeries& s : series) {
    const int w = 18 + textWidth(s.label) + 14;
    if (x + w > right && x > left) {
      x = left;
      ++rows;
    }
    if (image != nullptr) {
      const int y = top + (rows - 1) * (kCellHeight + 5);
      image->fillRect(x, y + 2, 14, 4, s.color);
      drawText(*image, x + 18, y, s.label, kText);
    }
    x += w;
  }
  return rows;
}

}  // namespace

Rgb seriesColor(size_t i) {
  return kPalette[i % std::size(kPalette)];
}

std::string formatValue(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  const double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e5)) return fmt::format("{:.3e}", v);
  return fmt::format("{:.4g}", v);
}

Image drawLineChart(const std::vector<PlotSeries>& series, const ChartOptions& options) {
  if (options.width < 200 || options.height < 120) {
    SHOAL_THROW(InvalidArgument, "chart {}x{}: at least 200x120", options.width, options.height);
  }
  Image img(options.width, options.height);
  const int W = options.width, H = options.height;

  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const PlotSeries& s : series) {
    for (const auto& p : s.points) {
      if (!finite(p)) continue;
      x0 = std::min(x0, p.first);
      x1 = std::max(x1, p.first);
      y0 = std::min(y0, p.second);
      y1 = std::max(y1, p.second);
    }
  }
  const bool empty = !(x0 <= x1);
  // Room for the y labels: the widest of the labels drawn.
  int labelWidth = textWidth("0.000");
  if (!empty) {
    for (int i = 0; i <= kTicks; ++i) {
      const double y = y0 + (y1 - y0) * i / kTicks;
      labelWidth = std::max(labelWidth, textWidth(formatValue(y)));
    }
  }
  const int L = 12 + labelWidth, R = W - 16, T = 14 + 2 * kCellHeight;
  const int legendRows = layoutLegend(series, L, R, 0, nullptr);
  const int B = H - (2 * kCellHeight + 14) - legendRows * (kCellHeight + 5);
  if (B - T < 40) SHOAL_THROW(InvalidArgument, "chart {}x{}: too small for its legend", W, H);

  drawText(img, L, 6, options.title, kText, 2);
  if (empty) {
    img.fillRect(L, T, R - L, 1, kFrame);
    img.fillRect(L, B, R - L, 1, kFrame);
    img.fillRect(L, T, 1, B - T, kFrame);
    img.fillRect(R, T, 1, B - T + 1, kFrame);
    drawText(img, (L + R - textWidth("no data", 2)) / 2, (T + B) / 2 - kCellHeight, "no data",
             kText, 2);
    layoutLegend(series, L, R, B + 2 * kCellHeight + 14, &img);
    return img;
  }
  // A flat range still needs a height (and a single step a width) to map onto.
  if (x0 == x1) {
    x0 -= 1;
    x1 += 1;
  }
  if (y0 == y1) {
    const double pad = std::fabs(y0) * 0.1 + 1e-9;
    y0 -= pad;
    y1 += pad;
  }
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (R - L); };
  auto py = [&](double y) { return B - (y - y0) / (y1 - y0) * (B - T); };

  // Grid and ticks first, so the lines are drawn over them.
  for (int i = 0; i <= kTicks; ++i) {
    const int gx = L + (R - L) * i / kTicks, gy = B - (B - T) * i / kTicks;
    img.fillRect(gx, T, 1, B - T, kGrid);
    img.fillRect(L, gy, R - L, 1, kGrid);
    img.fillRect(gx, B, 1, 5, kFrame);
    img.fillRect(L - 5, gy, 5, 1, kFrame);
    const std::string yl = formatValue(y0 + (y1 - y0) * i / kTicks);
    drawText(img, L - 8 - textWidth(yl), gy - 3, yl, kText);
    // Steps are whole numbers: label them so unless the range is too short to tell apart.
    const double xv = x0 + (x1 - x0) * i / kTicks;
    const std::string xl =
        x1 - x0 >= kTicks ? fmt::format("{}", std::llround(xv)) : formatValue(xv);
    const int w = textWidth(xl);
    drawText(img, std::clamp(gx - w / 2, 0, W - w), B + 8, xl, kText);
  }
  drawText(img, (L + R - textWidth(options.xLabel)) / 2, B + 8 + kCellHeight + 2, options.xLabel,
           kText);

  for (const PlotSeries& s : series) {
    // At most about two points per pixel column: a long run stays cheap to draw.
    const size_t stride = std::max<size_t>(1, s.points.size() / (2 * static_cast<size_t>(R - L)));
    const std::pair<double, double>* prev = nullptr;
    const std::pair<double, double>* first = nullptr;
    size_t drawn = 0;
    for (size_t i = 0; i < s.points.size(); i += stride) {
      const auto& p = s.points[i];
      if (!finite(p)) {
        prev = nullptr;  // a gap, not a line across it
        continue;
      }
      if (prev != nullptr && !s.markersOnly) {
        img.line(px(prev->first), py(prev->second), px(p.first), py(p.second), s.color, s.width);
      }
      prev = &p;
      if (drawn++ == 0) first = &p;
    }
    // Few points (per-epoch metrics, a lone point): each is marked, so a straight line between
    // two measurements is not read as measured all along.
    if (drawn == 1) {
      img.line(px(first->first), py(first->second), px(first->first), py(first->second), s.color,
               s.width + 3);
    } else if (drawn <= kMarkedPoints || s.markersOnly) {
      for (const auto& p : s.points) {
        if (finite(p))
          img.line(px(p.first), py(p.second), px(p.first), py(p.second), s.color, s.width + 3);
      }
    }
  }
  // The frame last, so lines at the extremes do not cover it.
  img.fillRect(L, T, R - L, 1, kFrame);
  img.fillRect(L, B, R - L + 1, 1, kFrame);
  img.fillRect(L, T, 1, B - T, kFrame);
  img.fillRect(R, T, 1, B - T, kFrame);
  layoutLegend(series, L, R, B + 2 * kCellHeight + 14, &img);
  return img;
}

}  // namespace shoal::tools
