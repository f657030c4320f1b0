#include "tests/ddp_test_util.h"

#include "tests/thread_ranks.h"

namespace shoal::test {

std::ostream& operator<<(std::ostream& o, const Case& c) {
  return o << c.name;
}

Data makeData(int batches) {
  torch::manual_seed(42);
  Data d;
  for (int i = 0; i < batches; ++i) {
    d.x.push_back(torch::randn({kRanks * kBatch, 8}));
    d.y.push_back(torch::randint(0, 4, {kRanks * kBatch}, torch::kInt64));
  }
  return d;
}

Net makeNet(const Case& c) {
  torch::manual_seed(7);
  return Net(c.unused, c.batchNorm, c.shared);
}

std::unique_ptr<torch::optim::Optimizer> makeOpt(Net& net, const Case& c) {
  train::OptimizerOptions o;
  o.kind = c.optimizer;
  o.lr = 0.05;
  return train::makeOptimizer(net->parameters(), o);
}

torch::Tensor rows(const torch::Tensor& t, int rank) {
  return t.slice(0, rank * kBatch, (rank + 1) * kBatch);
}

std::vector<torch::Tensor> stateOf(Net& net) {
  std::vector<torch::Tensor> s;
  for (auto& p : net->parameters()) s.push_back(p.detach().clone());
  for (auto& b : net->buffers()) s.push_back(b.clone());
  return s;
}

std::vector<std::string> lossOnTwoRanks(
    const Case& c,
    const std::function<void(train::DistributedDataParallel&, const torch::Tensor&)>& then) {
  torch::set_num_threads(1);
  std::vector<Net> nets;
  for (int r = 0; r < 2; ++r) nets.push_back(makeNet(c));
  auto data = makeData(1);
  return runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::DistributedDataParallel ddp(nets[g.rank()].ptr(), g.shared_from_this());
    then(ddp, torch::nn::functional::cross_entropy(nets[g.rank()]->forward(rows(data.x[0], 0)),
                                                   rows(data.y[0], 0)));
  });
}

std::vector<torch::Tensor> localGradients(const Case& c, const torch::Tensor& x,
                                          const torch::Tensor& y) {
  Net net = makeNet(c);
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : net->parameters()) g.push_back(p.grad().clone());
  return g;
}

}  // namespace shoal::test
