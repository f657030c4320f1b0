// An RGB raster and its PNG encoding, for the plots of `shoal report` (tools/report.h): small
// enough to own, so the report needs no image library (zlib does the compression).
//
//   tools::Image img(640, 320);                       // white
//   img.line(10, 300, 600, 20, {200, 0, 0}, 2.0);     // anti-aliased, 2 px thick
//   img.fillRect(0, 0, 10, 10, {0, 0, 0});
//   tools::writePng("plot.png", img);
//
// Coordinates: x grows to the right, y downwards, (0, 0) is the top-left pixel's corner and
// pixel (x, y) covers [x, x+1) x [y, y+1). Drawing outside the image is clipped, never an error.
// Not thread-safe (one Image, one thread); no call blocks except writePng (file system).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::tools {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};

class Image {
 public:
  // At most kMaxSide pixels each way (a plot, not a photograph): InvalidArgument otherwise, or
  // for a side < 1.
  static constexpr int kMaxSide = 8192;
  Image(int width, int height, Rgb background = kWhite);

  int width() const { return width_; }
  int height() const { return height_; }

  // The pixel's colour; InvalidArgument outside the image.
  Rgb at(int x, int y) const;
  // Sets one pixel (ignored outside).
  void set(int x, int y, Rgb c);
  // Mixes `c` into one pixel with weight alpha in [0, 1] (ignored outside).
  void blend(int x, int y, Rgb c, double alpha);
  // Pixels [x, x+w) x [y, y+h), clipped.
  void fillRect(int x, int y, int w, int h, Rgb c);
  // A segment from (x0, y0) to (x1, y1), `thickness` pixels wide with round ends, its edges
  // anti-aliased (coverage blended in). Non-finite coordinates draw nothing.
  void line(double x0, double y0, double x1, double y1, Rgb c, double thickness = 1.0);

  // Rows top to bottom, 3 bytes (R, G, B) per pixel.
  const std::vector<uint8_t>& pixels() const { return pixels_; }

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

// The image as a PNG file's bytes: 8-bit RGB, no interlace, filter type 0 (none) on every row,
// one IDAT chunk (zlib, best compression). Plots are mostly flat colour, which deflate shrinks
// well without PNG's predictive filters.
std::string encodePng(const Image& image);

// Writes encodePng(image) to `path` atomically (a temporary beside it, renamed over it).
// SystemError naming the file if it cannot.
void writePng(const std::string& path, const Image& image);

}  // namespace shoal::tools
