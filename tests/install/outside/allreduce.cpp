// An all-reduce over the ranks of `shoal run -n N`, built outside Shoal's tree against its
// installed headers and libraries. Exit status 0 only if every rank's sum is right.
#include <shoal/comm/collectives.h>
#include <shoal/run/init.h>

#include <cstdio>
#include <vector>

int main() {
  shoal::World w = shoal::init();
  const int n = w.group->size();
  std::vector<float> v(1 << 16, static_cast<float>(w.rank + 1));
  shoal::comm::allreduce(*w.group, v.data(), v.size(), shoal::DataType::kFloat32,
                         shoal::ReduceOp::kSum);
  const float want = n * (n + 1) / 2.0f;
  for (float x : v) {
    if (x != want) {
      std::printf("outside: rank %d of %d: wrong sum %g, want %g\n", w.rank, n, x, want);
      return 1;
    }
  }
  std::printf("outside: rank %d of %d: sum %g right\n", w.rank, n, want);
  return 0;
}
