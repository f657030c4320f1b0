// The IDX format of (Fashion-)MNIST, as Debian's dataset-fashion-mnist ships it (gzip).
//
// A missing, truncated or corrupt file is an InvalidArgument naming the file and what is wrong
// (bad gzip stream, wrong magic number, dimensions that disagree with the data, a label outside
// 0..9, images and labels of different counts). Nothing is returned half-read.
#pragma once

#include <torch/torch.h>

#include <string>

namespace shoal::train {

struct IdxDataset {
  torch::Tensor images;  // [n, 1, 28, 28] float32, scaled to [0, 1] then standardized
  torch::Tensor labels;  // [n] int64
  int64_t size() const { return labels.size(0); }
  // The first n samples (views, no copy); all of them when n <= 0 or n >= size().
  IdxDataset first(int64_t n) const {
    if (n <= 0 || n >= size()) return *this;
    return {images.slice(0, 0, n), labels.slice(0, 0, n)};
  }
};

// Reads <dir>/<prefix>-images-idx3-ubyte.gz and <dir>/<prefix>-labels-idx1-ubyte.gz; prefix is
// "train" or "t10k". limit > 0 keeps only the first `limit` samples (as first(limit)), but the
// files are still read and checked whole: only the conversion to float is saved, which is most
// of the time (the 60,000 training images are 188 MB as float32).
IdxDataset readIdxDataset(const std::string& dir, const std::string& prefix, int64_t limit = 0);

inline const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace shoal::train
