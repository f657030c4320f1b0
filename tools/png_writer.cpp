#include "tools/png_writer.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "common/error.h"
#include "common/trace_file.h"

namespace shoal::tools {
namespace {

void putU32(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

// length, type, data, CRC-32 of type and data (PNG spec, section 5.3).
void putChunk(std::string& out, std::string_view type, std::string_view data) {
  putU32(out, static_cast<uint32_t>(data.size()));
  const size_t typeAt = out.size();
  out.append(type);
  out.append(data);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(out.data() + typeAt), type.size() + data.size());
  putU32(out, static_cast<uint32_t>(crc));
}

}  // namespace

Image::Image(int width, int height, Rgb background) : width_(width), height_(height) {
  if (width < 1 || height < 1 || width > kMaxSide || height > kMaxSide) {
    SHOAL_THROW(InvalidArgument, "image {}x{}: each side must be in [1, {}]", width, height,
                kMaxSide);
  }
  pixels_.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < pixels_.size(); i += 3) {
    pixels_[i] = background.r;
    pixels_[i + 1] = background.g;
    pixels_[i + 2] = background.b;
  }
}

Rgb Image::at(int x, int y) const {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) {
    SHOAL_THROW(InvalidArgument, "pixel ({}, {}) outside the {}x{} image", x, y, width_, height_);
  }
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {pixels_[i], pixels_[i + 1], pixels_[i + 2]};
}

void Image::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  pixels_[i] = c.r;
  pixels_[i + 1] = c.g;
  pixels_[i + 2] = c.b;
}

void Image::blend(int x, int y, Rgb c, double alpha) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_ || !(alpha > 0)) return;
  alpha = std::min(alpha, 1.0);
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  auto mix = [alpha](uint8_t under, uint8_t over) {
    return static_cast<uint8_t>(std::lround(under + (over - under) * alpha));
  };
  pixels_[i] = mix(pixels_[i], c.r);
  pixels_[i + 1] = mix(pixels_[i + 1], c.g);
  pixels_[i + 2] = mix(pixels_[i + 2], c.b);
}

void Image::fillRect(int x, int y, int w, int h, Rgb c) {
  const int xa = std::max(0, x), ya = std::max(0, y);
  const int xb = std::min(width_, x + std::max(0, w)), yb = std::min(height_, y + std::max(0, h));
  for (int py = ya; py < yb; ++py) {
    for (int px = xa; px < xb; ++px) set(px, py, c);
  }
}

// Each pixel in the segment's bounding box is covered by how far its centre lies inside the
// stroke: distance to the segment against half the thickness, with a one-pixel ramp at the edge.
// That is the anti-aliasing, and round ends and joins come for free.
void Image::line(double x0, double y0, double x1, double y1, Rgb c, double thickness) {
  if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1) ||
      !std::isfinite(thickness) || thickness <= 0) {
    return;
  }
  const double half = thickness / 2;
  const double reach = half + 1;
  // Clip the box to the image first, so a segment far outside costs nothing.
  const int xa = std::max(0, static_cast<int>(std::floor(std::min(x0, x1) - reach)));
  const int xb = std::min(width_ - 1, static_cast<int>(std::ceil(std::max(x0, x1) + reach)));
  const int ya = std::max(0, static_cast<int>(std::floor(std::min(y0, y1) - reach)));
  const int yb = std::min(height_ - 1, static_cast<int>(std::ceil(std::max(y0, y1) + reach)));
  const double dx = x1 - x0, dy = y1 - y0;
  const double len2 = dx * dx + dy * dy;
  for (int py = ya; py <= yb; ++py) {
    for (int px = xa; px <= xb; ++px) {
      const double cx = px + 0.5, cy = py + 0.5;
      double t = len2 > 0 ? ((cx - x0) * dx + (cy - y0) * dy) / len2 : 0;
      t = std::clamp(t, 0.0, 1.0);
      const double ex = cx - (x0 + t * dx), ey = cy - (y0 + t * dy);
      const double coverage = std::clamp(half + 0.5 - std::sqrt(ex * ex + ey * ey), 0.0, 1.0);
      if (coverage > 0) blend(px, py, c, coverage);
    }
  }
}

std::string encodePng(const Image& image) {
  const int w = image.width(), h = image.height();
  // The raw stream: each row is its filter type byte (0) and then its pixels.
  const size_t rowBytes = static_cast<size_t>(w) * 3;
  std::string raw;
  raw.reserve((rowBytes + 1) * h);
  const auto& px = image.pixels();
  for (int y = 0; y < h; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(px.data() + y * rowBytes), rowBytes);
  }
  uLongf packedSize = compressBound(raw.size());
  std::string packed(packedSize, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(packed.data()), &packedSize,
                           reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9);
  if (rc != Z_OK) SHOAL_THROW(InternalError, "PNG: zlib compress2 failed ({})", rc);
  packed.resize(packedSize);

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  putU32(ihdr, static_cast<uint32_t>(w));
  putU32(ihdr, static_cast<uint32_t>(h));
  ihdr.push_back(8);  // bit depth
  ihdr.push_back(2);  // colour type: truecolour (RGB)
  ihdr.push_back(0);  // compression method: deflate
  ihdr.push_back(0);  // filter method: adaptive (type 0 used on every row)
  ihdr.push_back(0);  // no interlace
  putChunk(out, "IHDR", ihdr);
  putChunk(out, "IDAT", packed);
  putChunk(out, "IEND", "");
  return out;
}

void writePng(const std::string& path, const Image& image) {
  writeFileAtomically(path, encodePng(image));
}

}  // namespace shoal::tools
