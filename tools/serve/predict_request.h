// The JSON of POST /v1/predict, in and out. No libtorch, no HTTP: pure functions on strings.
//
// Request: {"inputs": [[x, ...], ...]} (a batch of instances) or {"inputs": [x, ...]} (one
// instance). An instance is a flat array of exactly `instanceSize` finite numbers (as float32).
// Response: {"outputs": [[logit, ...], ...], "classes": [argmax, ...], "model_version": V}:
// always a list per instance, one instance included.
//
// The body is untrusted: the caller bounds its size before parsing (the server's --max-body);
// the instance count is checked against maxInstances before anything is sized by it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::serve {

struct PredictInput {
  size_t instances = 0;
  std::vector<float> values;  // instances × instanceSize, row-major
};

// Parses a request body. Throws InvalidArgument with one line saying what is wrong (not JSON,
// no "inputs", an instance of the wrong length, a string or other non-number, a non-finite or
// out-of-float-range value, no instances, more than maxInstances) — the server's 400.
PredictInput parsePredictRequest(std::string_view body, size_t instanceSize, size_t maxInstances);

// The response body for `outputs` (instances × classes logits, row-major).
std::string formatPredictResponse(const float* outputs, size_t instances, size_t classes,
                                  uint64_t modelVersion);

// {"error": "<message, first line only>"}.
std::string errorJson(const std::string& message);

}  // namespace shoal::serve
