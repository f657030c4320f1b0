// tools/serve/predict_request.h.
#include "tools/serve/predict_request.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace shoal::serve {

namespace {

using nlohmann::json;

// Appends one instance; `where` names it in errors ("instance 3").
void appendInstance(const json& row, size_t instanceSize, const std::string& where,
                    std::vector<float>& out) {
  if (!row.is_array()) SHOAL_THROW(InvalidArgument, "{} is not an array of numbers", where);
  if (row.size() != instanceSize) {
    SHOAL_THROW(InvalidArgument, "{} has {} values; the model takes {}", where, row.size(),
                instanceSize);
  }
  for (size_t i = 0; i < row.size(); ++i) {
    const json& v = row[i];
    if (!v.is_number()) {
      SHOAL_THROW(InvalidArgument, "{} value {} is a {}, not a number", where, i, v.type_name());
    }
    const double d = v.get<double>();
    // JSON has no NaN or infinity (and 1e999 fails to parse), but 1e39 overflows a float.
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
      SHOAL_THROW(InvalidArgument, "{} value {} is not a finite float32", where, i);
    }
    out.push_back(static_cast<float>(d));
  }
}

}  // namespace

PredictInput parsePredictRequest(std::string_view body, size_t instanceSize, size_t maxInstances) {
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) SHOAL_THROW(InvalidArgument, "the body is not JSON");
  if (!doc.is_object() || !doc.contains("inputs")) {
    SHOAL_THROW(InvalidArgument, "the body must be a JSON object with \"inputs\"");
  }
  const json& inputs = doc["inputs"];
  if (!inputs.is_array() || inputs.empty()) {
    SHOAL_THROW(InvalidArgument, "\"inputs\" must be a non-empty array");
  }
  PredictInput out;
  if (!inputs[0].is_array()) {  // one instance
    out.instances = 1;
    out.values.reserve(instanceSize);
    appendInstance(inputs, instanceSize, "the instance", out.values);
    return out;
  }
  if (inputs.size() > maxInstances) {
    SHOAL_THROW(InvalidArgument, "{} instances in one request; at most {}", inputs.size(),
                maxInstances);
  }
  out.instances = inputs.size();
  out.values.reserve(inputs.size() * instanceSize);
  for (size_t i = 0; i < inputs.size(); ++i) {
    appendInstance(inputs[i], instanceSize, "instance " + std::to_string(i), out.values);
  }
  return out;
}

std::string formatPredictResponse(const float* outputs, size_t instances, size_t classes,
                                  uint64_t modelVersion) {
  json rows = json::array();
  json argmax = json::array();
  for (size_t i = 0; i < instances; ++i) {
    const float* row = outputs + i * classes;
    json r = json::array();
    size_t best = 0;
    for (size_t c = 0; c < classes; ++c) {
      r.push_back(row[c]);
      if (row[c] > row[best]) best = c;
    }
    rows.push_back(std::move(r));
    argmax.push_back(best);
  }
  return json{
      {"outputs", std::move(rows)}, {"classes", std::move(argmax)}, {"model_version", modelVersion}}
      .dump();
}

std::string errorJson(const std::string& message) {
  return json{{"error", message.substr(0, message.find('\n'))}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

}  // namespace shoal::serve
