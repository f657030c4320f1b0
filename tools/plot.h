// Line charts into an Image (tools/png_writer.h), for `shoal report`'s plots: several series of
// (x, y) points, e.g. one metric per rank over steps plus their mean.
//
// What a chart carries, all drawn with tools/bitmap_font.h: the title (top), a frame with a few
// ticks and light grid lines on both axes, each axis's minimum and maximum labelled (and the
// ticks between), the x axis's name, and a legend (below the axes) with each series' colour.
// Points whose x or y is not finite (NaN) are skipped and break the line there; a series of one
// point is drawn as a dot, and each point of a series of at most 40 is marked with one. No series,
// or no finite point: an empty frame saying "no data". Stateless and thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tools/png_writer.h"

namespace shoal::tools {

struct PlotSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (x, y), in drawing order
  Rgb color;
  double width = 1.5;        // line thickness in pixels
  bool markersOnly = false;  // a scatter: every point a dot, no lines between them
};

struct ChartOptions {
  int width = 800;
  int height = 360;
  std::string title;
  std::string xLabel = "step";
};

// The i-th colour of the palette for per-rank lines (it repeats after 10); the mean is drawn in
// black.
Rgb seriesColor(size_t i);

// The chart. InvalidArgument for a size the Image refuses or too small for the frame (< 200 x
// 120).
Image drawLineChart(const std::vector<PlotSeries>& series, const ChartOptions& options);

// A number as the chart labels it: up to 4 significant digits, exponent form beyond
// [1e-3, 1e5), "nan" for NaN.
std::string formatValue(double v);

}  // namespace shoal::tools
