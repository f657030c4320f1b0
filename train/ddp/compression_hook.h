// Gradient compression as a DDP communication hook (train/ddp/comm_hook.h): what
// `--compression` selects (comm/compress/spec.h) for DistributedDataParallel and ZeRO stage 1.
//
//   DdpOptions o;
//   o.commHook = ddp::compressionHook(compress::CompressionSpec::parse("powersgd:4,warmup=50"));
//
// Per codec, for one bucket of float32 gradients (other dtypes: the plain average):
// - fp16 / bf16: cast, one average all-reduce in the 16-bit type (accumulating in float32),
//   cast back.
// - topk:D: e = grad + residual; the ceil(D * n) largest |e| as (index, value) pairs, one
//   all-gather of every rank's pairs, summed and divided by the world size.
// - onebit: e = grad + residual; signs and one scale, one all-gather, summed and divided.
// - powersgd:R: each gradient that is a matrix (n x m, viewed as 2-D; R < min(n, m)) becomes
//   P = M Q (all-reduced), P orthogonalized, Q = M^T P (all-reduced), M ~ P Q^T, with
//   M = grad + residual and Q kept from the last step (warm start); the others (biases, small
//   matrices) are averaged uncompressed in the same bucket.
// Residuals are kept per parameter, so they survive DDP's one rebuild of the bucket layout;
// after `warmupSteps` synchronized steps of the plain average, compression starts.
//
// topk and onebit with `momentum=M` (momentum correction, comm/compress/momentum_correction.h):
// each rank keeps a velocity u = M u + g per element and compresses the accumulation of
// velocities (the residual); top-k also zeroes u where it sent. What finish() leaves in the
// buffer is then an update to apply as plain SGD: the optimizer must have no momentum of its
// own (momentum 0, not Adam's moments; train::Trainer refuses otherwise). The warm-up steps and
// buckets that are not float32 send u whole: heavy-ball SGD. Velocities, like residuals, are
// kept per parameter.
//
// Checkpoints (DDP's and ZeRO's, through train/hook_checkpoint.h) save each rank's residuals
// and velocities, PowerSGD's Q and the warm-up's step count (CommHook::exportState), so a job
// resumed at the same world size goes on exactly as one that never stopped; at another world
// size every rank starts from the mean of the saved residuals.
//
// topk and onebit with `dense=N`: each parameter of at most N elements is sent whole (averaged
// exactly; with momentum, heavy-ball SGD), and each larger one is encoded on its own (top-k:
// ceil(D * numel) of its elements; 1-bit: its own scale) instead of the bucket as one. For the
// small tensors a codec's share is too little (1% of a 30 K-weight output layer is 300 weights a
// step) at a small price in bytes.
//
// Every rank must use the same spec (the collectives would not match: MismatchError on every
// rank). The hook keeps state: one hook per DistributedDataParallel. Threads and blocking as
// CommHook (start() never waits; finish() may run PowerSGD's second all-reduce).
#pragma once

#include <memory>

#include "comm/compress/spec.h"
#include "train/ddp/comm_hook.h"

namespace shoal::train::ddp {

// The hook for `spec`; kNone gives averageAllreduce().
std::shared_ptr<CommHook> compressionHook(const compress::CompressionSpec& spec);

}  // namespace shoal::train::ddp
