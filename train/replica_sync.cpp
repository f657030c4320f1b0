#include "train/replica_sync.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/tensor_types.h"

namespace shoal::train {

namespace {

std::string describeParam(const std::string& name, const torch::Tensor& t) {
  std::ostringstream s;
  s << name << " " << t.sizes() << " " << t.dtype();
  return s.str();
}

std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

void checkSameParameters(comm::Group& group, const std::vector<std::string>& names,
                         const std::vector<torch::Tensor>& params, torch::nn::Module& module,
                         const std::string& who) {
  std::string mine;
  for (size_t i = 0; i < params.size(); ++i) mine += describeParam(names[i], params[i]) + "\n";
  for (auto& b : module.named_buffers(true)) {
    mine += describeParam("buffer " + b.key(), b.value()) + "\n";
  }
  const std::string reference = comm::broadcastBytes(group, mine);
  std::string difference;
  if (mine != reference) {
    auto a = splitLines(mine), b = splitLines(reference);
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    difference = fmt::format("rank {} has {} where rank 0 has {}", group.rank(),
                             i < a.size() ? "'" + a[i] + "'" : "no more parameters",
                             i < b.size() ? "'" + b[i] + "'" : "no more parameters");
  }
  // Every rank learns every difference, so every rank fails with the same message.
  int64_t len = static_cast<int64_t>(difference.size());
  comm::allreduce(group, &len, 1, DataType::kInt64, ReduceOp::kMax);
  if (len == 0) return;
  std::string mineFixed = difference;
  mineFixed.resize(static_cast<size_t>(len), '\0');
  std::string all(static_cast<size_t>(len) * group.size(), '\0');
  comm::allgather(group, mineFixed.data(), all.data(), static_cast<size_t>(len), DataType::kUInt8);
  for (int r = 0; r < group.size(); ++r) {
    std::string d = all.substr(static_cast<size_t>(r * len), static_cast<size_t>(len));
    d = d.substr(0, d.find('\0'));
    if (!d.empty()) {
      SHOAL_THROW(MismatchError, "rank {}: {}: the ranks registered different parameters: {}",
                  group.rank(), who, d);
    }
  }
}

void broadcastFromRankZero(comm::Group& group, const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard noGrad;
  // One broadcast per dtype: a flat copy of all tensors of that type.
  std::vector<torch::ScalarType> types;
  for (auto& t : tensors) {
    if (std::find(types.begin(), types.end(), t.scalar_type()) == types.end()) {
      types.push_back(t.scalar_type());
    }
  }
  for (auto type : types) {
    std::vector<torch::Tensor> parts;
    for (auto& t : tensors) {
      if (t.scalar_type() == type) parts.push_back(t.reshape(-1));
    }
    auto flat = torch::cat(parts).contiguous();
    comm::broadcast(group, flat.data_ptr(), static_cast<size_t>(flat.numel()), toShoalType(type),
                    0);
    int64_t at = 0;
    for (auto& t : tensors) {
      if (t.scalar_type() != type) continue;
      t.copy_(flat.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
  }
}

}  // namespace shoal::train
