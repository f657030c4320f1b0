#include "train/pipeline/transfer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/tensor_types.h"

namespace shoal::train::pipeline {

namespace {

constexpr int64_t kHeaderMagic = 0x53484f414c505031;  // "SHOALPP1"

std::string shapeText(const std::vector<int64_t>& shape, torch::ScalarType dtype) {
  return fmt::format("[{}] {}", fmt::join(shape, ", "), c10::toString(dtype));
}

// The torch types that may cross stages, numbered by Shoal (never torch's enum values, which
// are not a wire format).
constexpr torch::ScalarType kWireTypes[] = {torch::kFloat32,  torch::kFloat64, torch::kFloat16,
                                            torch::kBFloat16, torch::kInt32,   torch::kInt64,
                                            torch::kUInt8};
}  // namespace

int64_t wireType(torch::ScalarType t) {
  for (size_t i = 0; i < std::size(kWireTypes); ++i) {
    if (kWireTypes[i] == t) return static_cast<int64_t>(i);
  }
  SHOAL_THROW(InvalidArgument, "pipeline: tensors of type {} cannot cross stages",
              c10::toString(t));
}

std::optional<torch::ScalarType> fromWireType(int64_t index) {
  if (index < 0 || index >= static_cast<int64_t>(std::size(kWireTypes))) return std::nullopt;
  return kWireTypes[index];
}

Transfers::Transfers(std::shared_ptr<comm::Group> pipe, const Schedule& schedule,
                     std::vector<BoundarySpec> boundaries, Options options)
    : pipe_(std::move(pipe)),
      schedule_(schedule),
      boundaries_(std::move(boundaries)),
      options_(options),
      rank_(pipe_->rank()) {
  SHOAL_CHECK(static_cast<int>(boundaries_.size()) == schedule_.virtualStages() - 1,
              "pipeline: {} boundary specs for {} virtual stages", boundaries_.size(),
              schedule_.virtualStages());
}

void Transfers::beginStep(int64_t step, const std::vector<Action>& list) {
  step_ = step;
  headers_.clear();
  for (const Action& a : list) {
    if (a.kind != ActionKind::kRecvActivation && a.kind != ActionKind::kRecvGradient) continue;
    const int b = schedule_.boundary(rank_, a);
    const int t = tag(b, isGradient(a.kind), false);
    PendingHeader h{a, std::make_shared<Header>(), nullptr};
    h.work = comm::irecv(*pipe_, h.header->data(), h.header->size(), DataType::kInt64,
                         schedule_.peer(rank_, a), t);
    headers_[t].push_back(std::move(h));
  }
}

void Transfers::checkShape(const Action& action, const char* what, int boundary, int64_t microBatch,
                           const std::vector<int64_t>& shape, torch::ScalarType dtype) const {
  const BoundarySpec& spec = boundaries_[boundary];
  const bool ok = dtype == spec.dtype && shape.size() == spec.sampleShape.size() + 1 &&
                  std::equal(spec.sampleShape.begin(), spec.sampleShape.end(), shape.begin() + 1);
  if (ok) return;
  std::vector<int64_t> expected{-1};
  expected.insert(expected.end(), spec.sampleShape.begin(), spec.sampleShape.end());
  SHOAL_THROW(MismatchError, "{}{} {}, but the plan has {} across boundary {} (-1: any batch size)",
              what,
              microBatch == action.microBatch ? "" : fmt::format(" (micro-batch {})", microBatch),
              shapeText(shape, dtype), shapeText(expected, spec.dtype), boundary);
}

void Transfers::send(const Action& action, const torch::Tensor& tensor) {
  const int b = schedule_.boundary(rank_, action);
  const bool grad = isGradient(action.kind);
  checkShape(action, grad ? "it sends a gradient of" : "it sends an activation of", b,
             action.microBatch, tensor.sizes().vec(), tensor.scalar_type());
  SHOAL_CHECK(tensor.dim() <= kMaxDims, "pipeline: a {}-dimensional tensor cannot cross stages",
              tensor.dim());
  PendingSend s;
  s.tensor = tensor.detach().contiguous();
  s.header = std::make_shared<Header>();
  Header& h = *s.header;
  h.fill(0);
  h[0] = kHeaderMagic;
  h[1] = step_;
  h[2] = action.microBatch;
  h[3] = wireType(s.tensor.scalar_type());
  h[4] = s.tensor.dim();
  for (int64_t d = 0; d < s.tensor.dim(); ++d) h[5 + d] = s.tensor.size(d);
  const int peer = schedule_.peer(rank_, action);
  s.headerWork =
      comm::isend(*pipe_, h.data(), h.size(), DataType::kInt64, peer, tag(b, grad, false));
  s.payloadWork = comm::isend(*pipe_, s.tensor.data_ptr(), static_cast<size_t>(s.tensor.numel()),
                              toShoalType(s.tensor.scalar_type()), peer, tag(b, grad, true));
  sends_.push_back(std::move(s));
}

torch::Tensor Transfers::recv(const Action& action) {
  const int b = schedule_.boundary(rank_, action);
  const bool grad = isGradient(action.kind);
  auto& queue = headers_[tag(b, grad, false)];
  SHOAL_ASSERT(!queue.empty() && queue.front().action == action,
               "pipeline: receive {} was not posted for this step", describe(action));
  PendingHeader pending = std::move(queue.front());
  queue.pop_front();
  pending.work->wait();
  const Header& h = *pending.header;
  const int peer = schedule_.peer(rank_, action);
  if (h[0] != kHeaderMagic || !fromWireType(h[3]) || h[4] < 1 || h[4] > kMaxDims) {
    SHOAL_THROW(ProtocolError,
                "pipeline rank {}: {} from pipeline rank {}: not a pipeline header (magic "
                "{:#x}, type {}, {} dimensions)",
                rank_, describe(action), peer, h[0], h[3], h[4]);
  }
  std::vector<int64_t> shape(h.begin() + 5, h.begin() + 5 + h[4]);
  const torch::ScalarType dtype = *fromWireType(h[3]);
  // The size is checked before anything is allocated for it.
  size_t bytes = c10::elementSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && bytes > options_.maxBytes / static_cast<size_t>(d))) {
      SHOAL_THROW(ProtocolError,
                  "pipeline rank {}: {} from pipeline rank {}: shape [{}] is negative or over "
                  "the {}-byte limit",
                  rank_, describe(action), peer, fmt::join(shape, ", "), options_.maxBytes);
    }
    bytes *= static_cast<size_t>(d);
  }
  if (h[1] != step_ || h[2] != action.microBatch) {
    SHOAL_THROW(MismatchError,
                "pipeline rank {}: {} of step {}: pipeline rank {} sent micro-batch {} of step "
                "{} instead (the ranks run different schedules)",
                rank_, describe(action), step_, peer, h[2], h[1]);
  }
  checkShape(action, grad ? "it received a gradient of" : "it received an activation of", b, h[2],
             shape, dtype);
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  comm::irecv(*pipe_, t.data_ptr(), static_cast<size_t>(t.numel()), toShoalType(dtype), peer,
              tag(b, grad, true))
      ->wait();
  return t;
}

void Transfers::endStep() {
  for (auto& s : sends_) {
    s.headerWork->wait();
    s.payloadWork->wait();
  }
  sends_.clear();
  for (auto& [t, queue] : headers_) {
    SHOAL_ASSERT(queue.empty(), "pipeline: {} header receives left on tag {} at the step's end",
                 queue.size(), t);
  }
}

void Transfers::abandon() {
  // The engine may still write into a posted receive's buffer or read a send's until the
  // operation ends (its channel fails, at the latest at its deadline, or the group is
  // destroyed): each buffer is handed to its operation, to be freed when it ends, so that
  // nothing here waits for that.
  for (auto& s : sends_) {
    s.headerWork->onDone([keep = s.header](std::exception_ptr) {});
    s.payloadWork->onDone([keep = s.tensor](std::exception_ptr) {});
  }
  for (auto& [t, queue] : headers_) {
    for (auto& h : queue) h.work->onDone([keep = h.header](std::exception_ptr) {});
  }
  sends_.clear();
  headers_.clear();
}

Transfers::~Transfers() {
  abandon();
}

}  // namespace shoal::train::pipeline
