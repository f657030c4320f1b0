// A tiny bitmap font for the report's plots (tools/plot.h), so axis labels, titles and legends
// are in the PNG itself. Shoal's own glyphs: 5x7 pixels on a 6x9 cell (one column and row of
// spacing; row 7 holds the descenders of g j p q y , and the underscore), drawn for digits,
// lower-case letters and . - + : % / _ ( ) , = and space. Upper-case letters are drawn with the
// lower-case glyphs (metric names are lower case); any other character is drawn as '?'.
// Stateless and thread-safe.
#pragma once

#include <string_view>

#include "tools/png_writer.h"

namespace shoal::tools {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 8;  // 7 above the baseline, 1 below
inline constexpr int kCellWidth = 6;
inline constexpr int kCellHeight = 9;

// Pixels `text` takes at `scale` (each glyph pixel a scale x scale square).
int textWidth(std::string_view text, int scale = 1);

// Draws `text` with its cell's top-left corner at (x, y); clipped at the image's edges.
void drawText(Image& image, int x, int y, std::string_view text, Rgb color, int scale = 1);

}  // namespace shoal::tools
