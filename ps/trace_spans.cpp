#include "ps/trace_spans.h"

#include <algorithm>
#include <string_view>

namespace shoal::ps {

namespace {

TraceSpan begun(TraceSink& sink, std::string_view name) {
  TraceSpan span;
  span.name.assign(name);
  span.category = "ps";
  span.thread = TraceSink::currentThread();
  span.beginNs = sink.now();
  return span;
}

}  // namespace

std::optional<TraceSpan> beginCallSpan(TraceSink* sink, RequestKind kind, int worker, int64_t step,
                                       const std::string* key) {
  if (sink == nullptr) return std::nullopt;
  std::optional<TraceSpan> span(begun(*sink, toString(kind)));
  span->asyncId = sink->nextAsyncId();
  span->add("worker", worker);
  span->add("step", step);
  if (key != nullptr) span->add("key", std::string_view(*key));
  return span;
}

void endCallSpan(TraceSink& sink, TraceSpan span, RequestKind kind,
                 const std::vector<std::shared_ptr<Exchange>>& xs,
                 std::exception_ptr error) noexcept {
  try {
    const bool pushes = kind == RequestKind::kPush || kind == RequestKind::kPushPull;
    const bool pulls = kind == RequestKind::kPull || kind == RequestKind::kPushPull;
    span.add("shards", xs.size());
    uint64_t sent = 0, received = 0, version = UINT64_MAX;
    int64_t lead = 0;
    for (const auto& x : xs) {
      sent += x->request.bytes;
      if (x->into) received += x->reply.bytes;
      version = std::min<uint64_t>(version, x->reply.version);
      lead = std::max(lead,
                      static_cast<int64_t>(x->reply.step) - static_cast<int64_t>(x->reply.slowest));
    }
    if (pushes) {
      span.add("bytes", sent);
      if (!xs.empty() && xs[0]->request.encoding != static_cast<uint8_t>(Encoding::kRaw)) {
        span.add("encoding", toString(static_cast<Encoding>(xs[0]->request.encoding)));
      }
    }
    if (pulls && !error && !xs.empty()) {
      span.add("pulled_bytes", received);
      span.add("version", version);
      span.add("lead", lead);
    }
    if (error) span.add("error", std::string_view(traceErrorLine(error)));
    span.endNs = sink.now();
    sink.record(std::move(span));
  } catch (...) {
    // Out of memory building an argument: the span is lost, the call is not.
  }
}

std::optional<TraceSpan> beginApplySpan(TraceSink* sink) {
  if (sink == nullptr) return std::nullopt;
  return begun(*sink, "apply");
}

void endApplySpan(TraceSink& sink, TraceSpan span, const AppliedUpdate& u) noexcept {
  try {
    span.add("worker", u.worker);
    span.add("step", u.step);
    if (u.key != nullptr) span.add("key", std::string_view(*u.key));
    span.add("elements", u.elements);
    span.add("version", u.version);
    span.add("contributions", u.contributions);
    span.add("lead", u.lead);
    span.add("from", std::string_view(u.fromSlots ? "slots" : "arrival"));
    span.endNs = sink.now();
    sink.record(std::move(span));
  } catch (...) {
    // Out of memory building an argument: the span is lost, the update is not.
  }
}

}  // namespace shoal::ps
