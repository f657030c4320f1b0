#include "tools/sweep_plots.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "tools/plot.h"

namespace shoal::tools {
namespace {

using run::sweep::ParamKind;
using run::sweep::TrialStatus;

constexpr Rgb kStoppedColor{150, 150, 150};

// A parameter's name as a file name's part (names are already [A-Za-z0-9_.-]).
std::string fileStem(const std::string& name) {
  std::string s;
  for (char c : name) s += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
  return s;
}

}  // namespace

int writeSweepPlots(const std::string& dir, const run::sweep::SweepConfig& c,
                    const run::sweep::SweepResult& r) {
  const std::string plots = dir + "/plots";
  std::error_code ec;
  std::filesystem::create_directories(plots, ec);
  if (ec) throwSystemError("plots directory " + plots, ec.value());

  const auto finishedSeries = [&](auto x) {
    PlotSeries done{"completed", {}, seriesColor(0), 3, true};
    PlotSeries stopped{"stopped early", {}, kStoppedColor, 3, true};
    for (const auto& t : r.trials) {
      if (std::isnan(t.metric)) continue;
      if (t.status == TrialStatus::kCompleted) {
        done.points.emplace_back(x(t), t.metric);
      } else if (t.status == TrialStatus::kPruned || t.status == TrialStatus::kTimedOut) {
        stopped.points.emplace_back(x(t), t.metric);
      }
    }
    return std::vector<PlotSeries>{done, stopped};
  };

  std::vector<PlotSeries> byTrial =
      finishedSeries([](const run::sweep::TrialRecord& t) { return static_cast<double>(t.id); });
  PlotSeries bestSoFar{"best so far", {}, kBlack, 1.5};
  double best = NAN;
  for (const auto& t : r.trials) {
    if (t.status != TrialStatus::kCompleted) continue;
    if (run::sweep::isBetter(c.direction, t.metric, best)) best = t.metric;
    bestSoFar.points.emplace_back(static_cast<double>(t.id), best);
  }
  byTrial.push_back(bestSoFar);
  int written = 0;
  writePng(
      plots + "/metric_by_trial.png",
      drawLineChart(byTrial, {.title = fmt::format("{} by trial", c.metric), .xLabel = "trial"}));
  ++written;

  for (size_t i = 0; i < c.parameters.size(); ++i) {
    const run::sweep::Parameter& p = c.parameters[i];
    std::string xLabel = p.log ? fmt::format("log10({})", p.name) : p.name;
    if (p.kind == ParamKind::kChoice) {
      xLabel += " (";
      for (size_t k = 0; k < p.choices.size() && k < 8; ++k) {
        xLabel += fmt::format("{}{}={}", k == 0 ? "" : ", ", k,
                              run::sweep::formatParameter(p, static_cast<double>(k)));
      }
      xLabel += p.choices.size() > 8 ? ", ...)" : ")";
    }
    const auto series = finishedSeries([&](const run::sweep::TrialRecord& t) {
      return p.log ? std::log10(t.params[i]) : t.params[i];
    });
    writePng(plots + "/metric_vs_" + fileStem(p.name) + ".png",
             drawLineChart(series,
                           {.title = fmt::format("{} vs {}", c.metric, p.name), .xLabel = xLabel}));
    ++written;
  }
  return written;
}

}  // namespace shoal::tools
