// `shoal report` (tools/report.h) and its parts: the PNG encoder checked by decoding its output
// here (chunk CRCs, header, every pixel), the raster, font and chart, file names made from
// hostile metric names, and the report of a run made in the test: escaped record, stragglers,
// every plot present, nothing written outside OUT; then `shoal report` as a real process.
#include "tools/report.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>

#include "common/error.h"
#include "run/run_directory.h"
#include "tests/process_util.h"
#include "tools/bitmap_font.h"
#include "tools/plot.h"
#include "tools/png_writer.h"
#include "tools/run_summary.h"
#include "track/tracker.h"

namespace shoal::test {
namespace {

namespace fs = std::filesystem;
using tools::Image;
using tools::Rgb;

constexpr std::string_view kSignature("\x89PNG\r\n\x1a\n", 8);

uint32_t readU32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) |
         uint32_t{static_cast<uint8_t>(s[at + 3])};
}

struct Decoded {
  int width = 0, height = 0;
  std::vector<std::string> chunkTypes;
  std::vector<uint8_t> rgb;  // rows of R, G, B
};

// A strict reader of exactly what encodePng writes: every chunk's CRC checked, IHDR as
// documented, filter type 0 on every row. Fails the test (and returns what it has) otherwise.
Decoded decodePng(const std::string& png) {
  Decoded d;
  EXPECT_EQ(png.substr(0, 8), kSignature);
  std::string idat;
  size_t at = 8;
  while (at + 12 <= png.size()) {
    const uint32_t len = readU32(png, at);
    EXPECT_LE(at + 12 + len, png.size());
    if (at + 12 + len > png.size()) return d;
    const std::string type = png.substr(at + 4, 4);
    const std::string data = png.substr(at + 8, len);
    const uLong crc =
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(png.data() + at + 4), 4 + len);
    EXPECT_EQ(readU32(png, at + 8 + len), static_cast<uint32_t>(crc)) << type;
    d.chunkTypes.push_back(type);
    if (type == "IHDR") {
      EXPECT_EQ(len, 13u);
      d.width = static_cast<int>(readU32(data, 0));
      d.height = static_cast<int>(readU32(data, 4));
      EXPECT_EQ(data.substr(8), std::string("\x08\x02\x00\x00\x00", 5));
    } else if (type == "IDAT") {
      idat += data;
    } else if (type == "IEND") {
      EXPECT_EQ(len, 0u);
    }
    at += 12 + len;
  }
  EXPECT_EQ(at, png.size());
  const size_t row = static_cast<size_t>(d.width) * 3 + 1;
  std::vector<uint8_t> raw(row * d.height + 1);  // one spare byte: a longer stream shows
  uLongf rawSize = raw.size();
  EXPECT_EQ(
      uncompress(raw.data(), &rawSize, reinterpret_cast<const Bytef*>(idat.data()), idat.size()),
      Z_OK);
  EXPECT_EQ(rawSize, row * d.height);
  for (int y = 0; y < d.height && rawSize == row * d.height; ++y) {
    EXPECT_EQ(raw[y * row], 0) << "filter type of row " << y;
    d.rgb.insert(d.rgb.end(), raw.begin() + y * row + 1, raw.begin() + (y + 1) * row);
  }
  return d;
}

TEST(Png, RoundTripKeepsEveryPixelAndTheChunksAreValid) {
  Image img(7, 5, {10, 20, 30});
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 7; ++x) {
      img.set(x, y,
              {static_cast<uint8_t>(x * 36), static_cast<uint8_t>(y * 60),
               static_cast<uint8_t>((x * 7 + y * 13) % 256)});
    }
  }
  img.set(6, 4, {255, 255, 255});
  const Decoded d = decodePng(tools::encodePng(img));
  EXPECT_EQ(d.width, 7);
  EXPECT_EQ(d.height, 5);
  EXPECT_EQ(d.chunkTypes, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  ASSERT_EQ(d.rgb.size(), 7u * 5 * 3);
  EXPECT_EQ(d.rgb, img.pixels());
  EXPECT_EQ(d.rgb[(4 * 7 + 6) * 3], 255);
  EXPECT_EQ(d.rgb[(2 * 7 + 3) * 3 + 1], 120);
}

TEST(Png, ALargeFlatImageCompressesAndOnePixelImageWorks) {
  Image big(800, 360);
  const std::string png = tools::encodePng(big);
  EXPECT_LT(png.size(), 8000u);
  const Decoded d = decodePng(png);
  EXPECT_EQ(d.rgb, big.pixels());
  const Decoded one = decodePng(tools::encodePng(Image(1, 1, {1, 2, 3})));
  EXPECT_EQ(one.rgb, (std::vector<uint8_t>{1, 2, 3}));
}

TEST(Image, DrawsClipsAndRefusesBadSizes) {
  EXPECT_THROW(Image(0, 5), InvalidArgument);
  EXPECT_THROW(Image(5, -1), InvalidArgument);
  EXPECT_THROW(Image(Image::kMaxSide + 1, 5), InvalidArgument);
  Image img(20, 10);
  EXPECT_THROW(img.at(20, 0), InvalidArgument);
  img.fillRect(-5, -5, 8, 8, {1, 2, 3});  // clipped to [0, 3) x [0, 3)
  EXPECT_EQ(img.at(2, 2), (Rgb{1, 2, 3}));
  EXPECT_EQ(img.at(3, 3), tools::kWhite);
  img.set(-1, 100, {0, 0, 0});  // ignored
  // A horizontal 3 px line along y = 5.5: pixel centres on it are fully covered, those 3 rows
  // away not at all, the rows at its edge partly.
  img.line(4, 5.5, 16, 5.5, {200, 0, 0}, 3);
  EXPECT_EQ(img.at(10, 5), (Rgb{200, 0, 0}));
  EXPECT_EQ(img.at(10, 4), (Rgb{200, 0, 0}));
  EXPECT_EQ(img.at(10, 1), tools::kWhite);
  img.line(0, 0, std::numeric_limits<double>::quiet_NaN(), 3, {0, 0, 0}, 2);  // nothing
  img.line(-1000, -1000, 1000, 1000, {0, 0, 200}, 1);  // clipped, not an error
  EXPECT_EQ(img.at(9, 9).b, 200);
  // Anti-aliasing: a 1 px line between pixel centres leaves blended (neither white nor ink)
  // pixels.
  Image aa(10, 10);
  aa.line(0, 5, 10, 5, {0, 0, 0}, 1);
  const Rgb edge = aa.at(5, 4);
  EXPECT_GT(edge.r, 0);
  EXPECT_LT(edge.r, 255);
}

TEST(Font, DrawsInkInsideTheCellsOnly) {
  EXPECT_EQ(tools::textWidth("loss", 1), 4 * tools::kCellWidth);
  EXPECT_EQ(tools::textWidth("ab", 2), 4 * tools::kCellWidth);
  Image img(40, 20);
  tools::drawText(img, 2, 3, "1_", {0, 0, 0});
  int ink = 0;
  for (int y = 0; y < 20; ++y) {
    for (int x = 0; x < 40; ++x) {
      if (img.at(x, y) == tools::kBlack) {
        ++ink;
        EXPECT_GE(x, 2);
        EXPECT_LT(x, 2 + 2 * tools::kCellWidth);
        EXPECT_GE(y, 3);
        EXPECT_LT(y, 3 + tools::kGlyphHeight);
      }
    }
  }
  // '1' is 10 pixels and '_' its 5 in the descender row (y = 3 + 7).
  EXPECT_EQ(ink, 15);
  for (int x = 8; x < 13; ++x) EXPECT_EQ(img.at(x, 10), tools::kBlack);
  // Upper case uses the lower-case glyphs; unknown characters draw '?'.
  Image a(12, 10), b(12, 10), q(12, 10), u(12, 10);
  tools::drawText(a, 0, 0, "A", tools::kBlack);
  tools::drawText(b, 0, 0, "a", tools::kBlack);
  tools::drawText(q, 0, 0, "?", tools::kBlack);
  tools::drawText(u, 0, 0, "\x01", tools::kBlack);
  EXPECT_EQ(a.pixels(), b.pixels());
  EXPECT_EQ(q.pixels(), u.pixels());
}

bool hasColor(const Image& img, Rgb c) {
  for (int y = 0; y < img.height(); ++y) {
    for (int x = 0; x < img.width(); ++x) {
      if (img.at(x, y) == c) return true;
    }
  }
  return false;
}

TEST(Plot, DrawsEachSeriesInItsColourAndSkipsNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Rgb red{220, 0, 0}, blue{0, 0, 220};
  const Image img = tools::drawLineChart(
      {{.label = "rank 0", .points = {{0, 1}, {1, nan}, {2, 3}, {3, 2}}, .color = red, .width = 3},
       {.label = "rank 1", .points = {{0, 2}, {3, 0.5}}, .color = blue, .width = 3}},
      {.width = 400, .height = 240, .title = "loss"});
  EXPECT_EQ(img.width(), 400);
  EXPECT_EQ(img.height(), 240);
  EXPECT_TRUE(hasColor(img, red));
  EXPECT_TRUE(hasColor(img, blue));
  EXPECT_THROW(tools::drawLineChart({}, {.width = 50, .height = 50}), InvalidArgument);
}

TEST(Plot, NoDataDrawsAnEmptyFrame) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& series : std::vector<std::vector<tools::PlotSeries>>{
           {}, {{.label = "rank 0", .points = {{0, nan}}, .color = {220, 0, 0}}}}) {
    const Image img = tools::drawLineChart(series, {.width = 300, .height = 200, .title = "x"});
    EXPECT_FALSE(hasColor(img, {220, 0, 0}) && series.empty());
    int ink = 0;
    for (uint8_t v : img.pixels()) ink += v != 255;
    EXPECT_GT(ink, 100);  // frame and "no data"
  }
  EXPECT_EQ(tools::formatValue(0.5), "0.5");
  EXPECT_EQ(tools::formatValue(123456789.0), "1.235e+08");
  EXPECT_EQ(tools::formatValue(nan), "nan");
}

TEST(ReportNames, FileStemsStayInsideTheFolder) {
  std::set<std::string> taken;
  EXPECT_EQ(tools::reportFileStem("loss", taken), "loss");
  EXPECT_EQ(tools::reportFileStem("sys/rss_bytes", taken), "sys_rss_bytes");
  EXPECT_EQ(tools::reportFileStem("../evil/name", taken), "___evil_name");
  EXPECT_EQ(tools::reportFileStem("..", taken), "__");
  EXPECT_EQ(tools::reportFileStem(".hidden", taken), "_hidden");
  EXPECT_EQ(tools::reportFileStem("sys_rss_bytes", taken), "sys_rss_bytes-2");
  EXPECT_EQ(tools::reportFileStem("LOSS", taken), "LOSS-2");
  EXPECT_EQ(tools::reportFileStem("a b\\c\n<d>", taken), "a_b_c__d_");
  const std::string longName = tools::reportFileStem(std::string(300, 'x'), taken);
  EXPECT_EQ(longName.size(), 200u);
  for (const std::string& s : taken) {
    EXPECT_EQ(s.find('/'), std::string::npos);
    EXPECT_NE(s[0], '.');
  }
  EXPECT_EQ(tools::htmlEscape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
}

TEST(RunSummary, StatisticsSkipNaNButKeepItAsLast) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const tools::RankStats s = tools::rankStats(3, {{0, 2}, {1, nan}, {2, 4}, {3, nan}});
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.count, 4u);
  EXPECT_TRUE(std::isnan(s.last));
  EXPECT_EQ(s.min, 2);
  EXPECT_EQ(s.max, 4);
  EXPECT_EQ(s.mean, 3);
}

// Every file under `root`, relative to it.
std::set<std::string> filesUnder(const std::string& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    out.insert(fs::relative(e.path(), root).string());
  }
  return out;
}

run::RunRecord record(const std::string& name) {
  run::RunRecord r;
  r.name = name;
  r.command = {"train", "--note", "<script>alert('x')</script>", "a&b"};
  r.workingDirectory = "/work";
  r.gitRevision = "0123456789abcdef0123456789abcdef01234567";
  r.hosts = {"node<1>:2", "node2:2"};
  r.ranks = 2;
  r.startedNs = 1'700'000'000'000'000'000;
  r.endedNs = r.startedNs + 125'000'000'000;
  r.status = "succeeded";
  r.exitCode = 0;
  r.attempts = 1;
  return r;
}

// A run of 2 ranks as fashion_mnist logs it; rank 1 computes twice as long. With
// `computeRatio`, also the job's compute_ratio, which marks rank 1 in its last two windows.
std::string makeRun(const std::string& root, const std::string& name, bool computeRatio) {
  const std::string dir = root + "/" + name;
  fs::create_directories(dir);
  run::writeRunRecord(dir, record(name));
  for (int rank = 0; rank < 2; ++rank) {
    track::Tracker t({.path = run::metricsPath(dir), .rank = rank});
    for (int step = 0; step < 20; ++step) {
      t.log("loss", step,
            step == 7 ? std::numeric_limits<double>::quiet_NaN() : 2.0 / (1 + step) + 0.1 * rank);
      t.log("step_time_s", step, rank == 0 ? 0.06 : 0.11);  // compute 50 ms vs 100 ms
      t.log("comm_wait_s", step, 0.01);
      t.log("sys/rss_bytes", step, 1e8 + rank * 1e6 + step);
      t.log("../evil/name", step, step);
    }
    if (computeRatio) {
      const double ratios[2][3] = {{1.0, 0.6, 0.55}, {1.1, 1.6, 1.7}};
      for (int w = 0; w < 3; ++w) t.log("compute_ratio", 10 * (w + 1), ratios[rank][w]);
    }
    if (rank == 0) t.log("test_accuracy", 19, 0.8);
    t.flush(std::chrono::seconds(30));
  }
  return dir;
}

// The src of every <img> in `html`.
std::vector<std::string> imageSources(const std::string& html) {
  std::vector<std::string> out;
  const std::regex img("<img src=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), img); it != std::sregex_iterator();
       ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

TEST(Report, ARunsReportIsEscapedCompleteAndStaysInsideOut) {
  TempDir tmp;
  const std::string dir = makeRun(tmp.path, "first", true);
  const std::set<std::string> before = filesUnder(tmp.path);

  const tools::ReportResult r = tools::writeReport(dir);
  EXPECT_EQ(r.htmlPath, dir + "/report/report.html");
  const std::string html = readFile(r.htmlPath);
  ASSERT_FALSE(html.empty());

  // The record, escaped: the page has no script at all.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), std::string::npos)
      << html;
  EXPECT_NE(html.find("a&amp;b"), std::string::npos);
  EXPECT_NE(html.find("node&lt;1&gt;:2, node2:2"), std::string::npos);
  EXPECT_NE(html.find("0123456789abcdef0123456789abcdef01234567"), std::string::npos);
  EXPECT_NE(html.find("succeeded"), std::string::npos);
  EXPECT_NE(html.find("2023-11-14 22:13:20 UTC"), std::string::npos) << html;
  EXPECT_NE(html.find("2m 5s"), std::string::npos);
  EXPECT_NE(html.find("<th>exit code</th><td>0</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>attempts</th><td>1</td>"), std::string::npos);
  EXPECT_NE(html.find("<h3>../evil/name</h3>"), std::string::npos);

  // Rank 1, and only rank 1, is the straggler (by compute_ratio).
  EXPECT_NE(html.find("<span class=\"straggler-rank\" data-rank=\"1\">rank 1</span>"),
            std::string::npos)
      << html;
  EXPECT_EQ(html.find("data-rank=\"0\">rank 0</span>"), std::string::npos);
  EXPECT_NE(html.find("<tr data-rank=\"1\" class=\"straggler\" data-straggler=\"1\">"),
            std::string::npos);
  size_t marks = 0;
  for (size_t at = html.find("data-straggler"); at != std::string::npos;
       at = html.find("data-straggler", at + 1)) {
    ++marks;
  }
  EXPECT_EQ(marks, 1u);
  // The breakdown: rank 1's compute 100 ms, its comm wait 10 ms.
  EXPECT_NE(html.find("<td>110.00 ms</td><td>100.00 ms</td><td>10.00 ms</td>"), std::string::npos)
      << html;

  // Every plot referenced is a PNG in OUT; one per metric.
  const std::vector<std::string> sources = imageSources(html);
  EXPECT_EQ(sources.size(), 7u);
  EXPECT_EQ(r.plots, 7);
  for (const std::string& src : sources) {
    EXPECT_EQ(src.find('/'), std::string::npos) << src;
    const std::string path = dir + "/report/" + src;
    ASSERT_TRUE(fs::is_regular_file(path)) << path;
    const std::string png = readFile(path);
    EXPECT_EQ(png.substr(0, 8), kSignature) << src;
    const Decoded d = decodePng(png);
    EXPECT_EQ(d.width, 800);
    EXPECT_EQ(d.height, 360);
  }
  EXPECT_TRUE(fs::exists(dir + "/report/___evil_name.png"));
  EXPECT_TRUE(fs::exists(dir + "/report/sys_rss_bytes.png"));

  // Nothing new outside OUT but SQLite's own files beside the store.
  for (const std::string& f : filesUnder(tmp.path)) {
    if (before.count(f) || f.rfind("first/report", 0) == 0) continue;
    EXPECT_TRUE(f == "first/metrics.db-wal" || f == "first/metrics.db-shm") << f;
  }
  EXPECT_FALSE(fs::exists(tmp.path + "/evil"));
  EXPECT_FALSE(fs::exists(dir + "/evil"));
  // Kept for people looking at a failure (and at the plots): the build folder outlives TempDir.
  std::error_code ec;
  fs::copy_file(dir + "/report/loss.png", "report_loss.png", fs::copy_options::overwrite_existing,
                ec);
  // Again into the same folder: the same files, overwritten.
  EXPECT_EQ(tools::writeReport(dir).plots, 7);
}

TEST(Report, WithoutComputeRatioTheBreakdownFindsTheStraggler) {
  TempDir tmp;
  const std::string dir = makeRun(tmp.path, "second", false);
  const std::string out = tmp.path + "/elsewhere/out";
  const tools::ReportResult r = tools::writeReport(dir, out);
  EXPECT_EQ(r.htmlPath, out + "/report.html");
  const std::string html = readFile(r.htmlPath);
  EXPECT_NE(html.find("<span class=\"straggler-rank\" data-rank=\"1\">rank 1</span>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("no <code>compute_ratio</code> was logged"), std::string::npos);
  EXPECT_NE(html.find("<tr data-rank=\"1\" class=\"straggler\""), std::string::npos);
  EXPECT_EQ(html.find("<tr data-rank=\"0\" class=\"straggler\""), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/report"));
}

TEST(Report, TheBreakdownHasThreePartsAsAStackedBarAndTheConfigurationIsShown) {
  TempDir tmp;
  const std::string dir = tmp.path + "/parts";
  fs::create_directories(dir);
  run::RunRecord rec = record("parts");
  rec.configuration = {{"ranks", 2},
                       {"store", nullptr},
                       {"arguments", {"-n", "2", "-x", "A=<b>"}},
                       {"environment", {{"SHOAL_SECRET", "<redacted>"}, {"SHOAL_TIMEOUT", "30"}}}};
  run::writeRunRecord(dir, rec);
  // Steps of 60 ms: rank 0 computes 20 ms and waits 30 ms for rank 1, which computes 50 ms;
  // both move data for 10 ms. Step 3 of rank 1 logged no parts: comm_wait_s stands in.
  for (int rank = 0; rank < 2; ++rank) {
    track::Tracker t({.path = run::metricsPath(dir), .rank = rank});
    for (int step = 0; step < 4; ++step) {
      t.log("step_time_s", step, 0.06);
      if (rank == 1 && step == 3) {
        t.log("comm_wait_s", step, 0.01);
        continue;
      }
      t.log("compute_s", step, rank == 0 ? 0.02 : 0.05);
      t.log("communication_s", step, 0.01);
      t.log("waiting_s", step, rank == 0 ? 0.03 : 0.0);
    }
    t.flush(std::chrono::seconds(30));
  }
  const std::string html = readFile(tools::writeReport(dir).htmlPath);
  EXPECT_NE(html.find("<tr data-rank=\"0\"><td>0</td><td>4</td><td>60.00 ms</td><td>20.00 ms</td>"
                      "<td>10.00 ms</td><td>30.00 ms</td><td><span class=\"bar\">"
                      "<span class=\"compute\" style=\"width: 33.33%\"></span>"
                      "<span class=\"comm\" style=\"width: 16.67%\"></span>"
                      "<span class=\"wait\" style=\"width: 50.00%\"></span></span></td>"),
            std::string::npos)
      << html;
  // Rank 1's compute is 2.5x rank 0's: the straggler.
  EXPECT_NE(html.find("<tr data-rank=\"1\" class=\"straggler\" data-straggler=\"1\"><td>1</td>"
                      "<td>4</td><td>60.00 ms</td><td>50.00 ms</td>"
                      "<td>10.00 ms</td><td>0.00 ms</td><td><span class=\"bar\">"
                      "<span class=\"compute\" style=\"width: 83.33%\"></span>"
                      "<span class=\"comm\" style=\"width: 16.67%\"></span>"
                      "<span class=\"wait\" style=\"width: 0.00%\"></span></span></td>"),
            std::string::npos)
      << html;
  // The configuration: escaped, an object's entries one per row, absent ones left out.
  EXPECT_NE(html.find("<h2>Configuration</h2>"), std::string::npos);
  EXPECT_NE(html.find("<tr><th>ranks</th><td>2</td></tr>"), std::string::npos) << html;
  EXPECT_NE(html.find("<tr><th>arguments</th><td>-n 2 -x &#39;A=&lt;b&gt;&#39;</td></tr>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<tr><th>environment.SHOAL_SECRET</th><td>&lt;redacted&gt;</td></tr>"),
            std::string::npos);
  EXPECT_NE(html.find("<tr><th>environment.SHOAL_TIMEOUT</th><td>30</td></tr>"), std::string::npos);
  EXPECT_EQ(html.find("<th>store</th>"), std::string::npos);
}

// The job's own verdict (`straggler`, at its --straggler-threshold) decides, not the report's
// 1.3: rank 1's compute_ratio 1.4 is under the job's threshold (say 1.5), so it is no straggler;
// rank 0, named by the job in its last window, is one, though its ratio is 1.
TEST(Report, TheJobsOwnStragglerVerdictDecides) {
  TempDir tmp;
  const std::string dir = tmp.path + "/verdict";
  fs::create_directories(dir);
  run::writeRunRecord(dir, record("verdict"));
  for (int rank = 0; rank < 2; ++rank) {
    track::Tracker t({.path = run::metricsPath(dir), .rank = rank});
    for (int step = 0; step < 8; ++step) t.log("step_time_s", step, rank == 1 ? 0.14 : 0.1);
    for (int window : {3, 7}) {
      t.log("compute_ratio", window, rank == 1 ? 1.4 : 1.0);
      // Rank 0 named only in the last window; rank 1 only in the first.
      t.log("straggler", window, (rank == 0) == (window == 7) ? 1.0 : 0.0);
    }
    t.flush(std::chrono::seconds(30));
  }
  const std::string html = readFile(tools::writeReport(dir).htmlPath);
  EXPECT_NE(html.find("Straggler: <span class=\"straggler-rank\" data-rank=\"0\">rank 0</span> "
                      "(rule: named by the job's own monitor"),
            std::string::npos)
      << html;
  EXPECT_EQ(html.find("data-rank=\"1\">rank 1</span>"), std::string::npos) << html;
  EXPECT_NE(html.find("<tr data-rank=\"0\" class=\"straggler\""), std::string::npos) << html;
  EXPECT_EQ(html.find("<tr data-rank=\"1\" class=\"straggler\""), std::string::npos) << html;
}

TEST(Report, ARunWithoutMetricsIsItsRecordAlone) {
  TempDir tmp;
  const std::string dir = tmp.path + "/bare";
  fs::create_directories(dir);
  run::writeRunRecord(dir, record("bare"));
  const tools::ReportResult r = tools::writeReport(dir);
  EXPECT_EQ(r.plots, 0);
  const std::string html = readFile(r.htmlPath);
  EXPECT_NE(html.find("No metrics.db"), std::string::npos);
  EXPECT_NE(html.find("<th>name</th><td>bare</td>"), std::string::npos);
  EXPECT_NE(html.find("<h2>Configuration</h2>\n<p>Not recorded.</p>"), std::string::npos);
  EXPECT_FALSE(fs::exists(run::metricsPath(dir)));  // read-only: no store made
}

TEST(Report, ABadRunDirectoryIsOneLineNamingTheFile) {
  TempDir tmp;
  try {
    tools::writeReport(tmp.path + "/missing");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(tmp.path + "/missing/run.json"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(tmp.path + "/missing"));
  // A metrics.db that is not a metrics store.
  const std::string dir = tmp.path + "/junk";
  fs::create_directories(dir);
  run::writeRunRecord(dir, record("junk"));
  { std::ofstream(run::metricsPath(dir)) << "not sqlite at all, just text\n"; }
  EXPECT_THROW(tools::writeReport(dir), InvalidArgument);
}

TEST(ReportCommand, PrintsOneLineAndExitsTwoOnABadRun) {
  TempDir tmp;
  const std::string dir = makeRun(tmp.path, "cli", true);
  const ShellRun ok = runShell(fmt::format("{} report {} -o {}/out", SHOAL_BIN, dir, tmp.path));
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_EQ(ok.output,
            fmt::format("shoal report: {} -> {}/out/report.html (7 plots)\n", dir, tmp.path));
  EXPECT_TRUE(fs::exists(tmp.path + "/out/report.html"));

  const ShellRun bad = runShell(fmt::format("{} report {}/nothing", SHOAL_BIN, tmp.path));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_EQ(bad.output.rfind("shoal report: error: ", 0), 0u) << bad.output;
  EXPECT_EQ(std::count(bad.output.begin(), bad.output.end(), '\n'), 1) << bad.output;

  const ShellRun none = runShell(fmt::format("{} report", SHOAL_BIN));
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_EQ(std::count(none.output.begin(), none.output.end(), '\n'), 1) << none.output;
}

}  // namespace
}  // namespace shoal::test
