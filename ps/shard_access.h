// Who may touch a shard's values and optimizer state outside the server's lock.
//
// Note [Shard access]: a push is applied piece by piece while it arrives (Note [Update from the
// ring] in ps/shard.h) and a pull's reply is sent straight from the values, not from a copy, both
// outside the server's lock. So that a pull never sends a half-applied update and two updates
// never interleave, a shard has one writer or any number of readers at a time:
// - writer: a push applied as it arrives (from the request's check until its versions moved on,
//   a streamed push-pull's reply included), or a push completing a step from the slots;
// - reader: a pull's reply, until it is sent. A checkpoint waits for no writer.
// A waiting writer holds back new readers, so a stream of pulls cannot starve the updates. The
// holders only wait on their own worker's stream, which that worker is moving (it is in the
// exchange), so every hold ends, or that stream fails. A failed update keeps its write hold: the
// half-applied shard is never read again (the server stops).
//
// Threading: not thread-safe. Every call is made under the server's mutex; the server waits on
// its condition variable (bounded by its timeout) until canWrite() / canRead(), and wakes every
// waiter after each release. No call blocks or throws.
#pragma once

namespace shoal::ps {

class ShardAccess {
 public:
  bool canWrite() const { return !writer_ && readers_ == 0; }
  bool canRead() const { return !writer_ && writersWaiting_ == 0; }
  bool writerActive() const { return writer_; }

  // A writer announces itself before it waits, and withdraws if the wait fails.
  void queueWriter() { ++writersWaiting_; }
  void withdrawWriter() { --writersWaiting_; }
  // Requires canWrite(); takes the place queueWriter() announced.
  void beginWrite() {
    --writersWaiting_;
    writer_ = true;
  }
  void endWrite() { writer_ = false; }

  // Requires canRead().
  void beginRead() { ++readers_; }
  void endRead() { --readers_; }

 private:
  bool writer_ = false;
  int writersWaiting_ = 0;
  int readers_ = 0;
};

}  // namespace shoal::ps
