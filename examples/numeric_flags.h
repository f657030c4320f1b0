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
#include "common/error.h"

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
  // As number(), but `min` itself is refused too: a number above min, at most max.
  void numberAbove(CLI::App& app, const std::string& name, double& into, double min, double max,
                   const std::string& help) {
    auto text = std::make_shared<std::string>();
    app.add_option(name, *text,
                   fmt::format("{} (above {}, at most {}; default {})", help, min, max, into));
    parsers.push_back([text, name, &into, min, max] {
      if (text->empty()) return;
      // One message for every refusal, "1" as "nan": the range is not parseNumber's.
      double d = min;
      try {
        d = parseNumber(name, *text, min, max);
      } catch (const InvalidArgument&) {
      }
      if (!(d > min)) {
        SHOAL_THROW(InvalidArgument, "{}='{}': expected a finite number above {}, at most {}", name,
                    *text, min, max);
      }
      into = d;
    });
  }
  void parseAll() {
    for (auto& p : parsers) p();
  }
};

// An example's main(): parses the command line (CLI11, then the numeric flags), then runs
// `body`. Configuration errors (a bad flag, a bad SHOAL_* variable, a missing data set: CLI11's
// errors and InvalidArgument) print one line "<name>: error: ..." and exit 2; any other
// failure prints "<name>: ..." and exits 1.
inline int runExample(const char* name, CLI::App& app, NumericFlags& numbers, int argc, char** argv,
                      const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
    numbers.parseAll();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "{}: error: {}\n", name, e.what());
    return 2;
  } catch (const InvalidArgument& e) {
    fmt::print(stderr, "{}: error: {}\n", name, e.what());
    return 2;
  }
  try {
    return body();
  } catch (const InvalidArgument& e) {
    fmt::print(stderr, "{}: error: {}\n", name, e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", name, e.what());
    return 1;
  }
}

}  // namespace shoal::examples
