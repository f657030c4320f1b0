// Numeric command-line flags for the examples: taken as text by CLI11, then read by the one
// configuration parser (common/env.h) with its range, so "-5", "5x", "nan" and "inf" are
// one-line errors like a bad SHOAL_* variable.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"

namespace shoal::examples {

struct NumericFlags {
  std::vector<std::function<void()>> parsers;

  template <typename T>
  void integer(CLI::App& app, const std::string& name, T& into, int64_t min, int64_t max,
               const std::string& help) {
    auto text = std::make_shared<std::string>();
    app.add_option(name, *text, fmt::format("{} ({} to {}; default {})", help, min, max, into));
    parsers.push_back([text, name, &into, min, max] {
      if (!text->empty()) into = static_cast<T>(parseInteger(name, *text, min, max));
    });
  }
  void number(CLI::App& app, const std::string& name, double& into, double min, double max,
              const std::string& help) {
    auto text = std::make_shared<std::string>();
    app.add_option(name, *text, fmt::format("{} ({} to {}; default {})", help, min, max, into));
    parsers.push_back([text, name, &into, min, max] {
      if (!text->empty()) into = parseNumber(name, *text, min, max);
    });
  }
  void parseAll() {
    for (auto& p : parsers) p();
  }
};

}  // namespace shoal::examples
