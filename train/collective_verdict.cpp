#include "train/collective_verdict.h"

#include <exception>

#include "comm/collectives.h"
#include "common/error.h"

namespace shoal::train {

void onEveryRank(comm::Group& group, const std::string& what, const std::function<void()>& body) {
  std::exception_ptr error;
  std::string message;
  try {
    body();
  } catch (const std::exception& e) {
    error = std::current_exception();
    message = e.what();
  }
  int failed = error ? group.rank() : group.size();
  comm::allreduce(group, &failed, 1, DataType::kInt32, ReduceOp::kMin);
  if (failed == group.size()) return;
  message = comm::broadcastBytes(group, std::move(message), failed, size_t{1} << 16);
  if (failed == group.rank()) std::rethrow_exception(error);
  SHOAL_THROW(InvalidArgument, "rank {}: {} failed on rank {}: {}", group.rank(), what, failed,
              message);
}

}  // namespace shoal::train
