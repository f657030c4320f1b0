// Named tensors as bytes in a format Shoal owns: what data-parallel checkpoints
// (train/checkpoint.h) and full model states (train/full_state.h) hold inside their sealed files.
//
// Why not a libtorch archive: reading one runs libtorch's TorchScript importer over the file's
// `code/` records, and a crafted archive crashed it inside libtorch, out of Shoal's reach
// (fuzz/README.md). This decoder reads only fixed-size fields and lengths it has checked against
// the bytes left, so a tensor is never larger than the input that describes it.
//
// Layout, little-endian (x86-64 and aarch64): the magic "SHOALTB1", u32 version (1), u32 zero,
// u64 length + the kind of bundle ("checkpoint", "full-state": so that one is never read as the
// other), u64 tensor count, then per tensor: u64 length + name bytes, u64 length + dtype name (the
// names of train/shard_format.h: "float32", "int64", ...), u64 dimension count + one i64 per size,
// and the element bytes, row-major.
//
// Stateless free functions, thread-safe.
#pragma once

#include <torch/torch.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shoal::train {

using TensorBundle = std::vector<std::pair<std::string, torch::Tensor>>;

// The bytes of `tensors`, in order (each copied to a contiguous CPU tensor first), marked as a
// bundle of `kind`. InvalidArgument naming the tensor for a dtype the format does not hold
// (complex, quantized) or a name used twice.
std::string encodeTensorBundle(std::string_view kind, const TensorBundle& tensors);

// The tensors of `bytes`, in their order, as fresh CPU tensors. InvalidArgument, one line naming
// `what`, for anything but a whole, well-formed bundle of `kind`: another magic, version or kind
// (named), a length or
// count that does not fit in the bytes left, an unknown dtype, a negative or overflowing shape, a
// repeated name, a bool that is neither 0 nor 1, bytes left over. Allocates at most about
// bytes.size() before it has checked them.
TensorBundle decodeTensorBundle(std::string_view bytes, std::string_view kind,
                                const std::string& what);

// Whether `head` (a payload's first bytes) starts as a bundle does.
bool looksLikeTensorBundle(std::string_view head);

// Whether `head` starts as a zip file does: what the libtorch archives inside the sealed files of
// earlier Shoal versions were (read by nothing any more; callers name them in their refusal).
bool looksLikeLibtorchArchive(std::string_view head);

}  // namespace shoal::train
