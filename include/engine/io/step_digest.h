// Step digests (docs/replay.md; definition: docs/checkpoint-format.md, "Step digests"):
// what one optimizer step left, as 64-bit digests of each tensor of the state plus the
// step's loss, RNG position and data position. Training records one per step in the run
// directory's step_digests.jsonl; every checkpoint carries the digest of its own step
// (trainer/step_digest), which anyone can recompute from the file's tensors.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/checkpoint.h"
#include "engine/io/env.h"

namespace engine {

// What step `global_step` left. Every list is sorted by name.
struct StepDigest {
  int64_t global_step = 0;
  int64_t epoch = 0;           // the 1-based epoch the step belonged to
  int64_t step_in_epoch = 0;   // the step's 1-based place in that epoch
  uint64_t shuffle_offset = 0; // the data position: the epoch's shuffle draw (trainer/epoch_shuffle_offset)
  // The RNG position: each stream's counter after the step ("dropout", "init", "shuffle").
  std::vector<std::pair<std::string, uint64_t>> rng;
  uint64_t loss = 0;  // the digest of the step's per-sample losses (their places in the epoch)
  // Each tensor of groups "model" and "optimizer" as "<group>/<key>":
  // "model/conv1.weight", "optimizer/exp_avg/conv1.weight", ...
  std::vector<std::pair<std::string, uint64_t>> tensors;

  // The one number a checkpoint stores: global_step, shuffle_offset, the RNG counters,
  // the loss and the tensors' digests folded in that order (kernels/step_digest.h).
  uint64_t combined() const;
};

// The digest of the step a checkpoint was saved after, computed from what it stores (the
// batch size from its config). Throws CheckpointError when a piece is missing.
StepDigest step_digest_of(const Checkpoint& ckpt, const std::string& path);
// The digest the checkpoint carries (trainer/step_digest, as uint64).
uint64_t stored_step_digest(const Checkpoint& ckpt, const std::string& path);

// "0123456789abcdef": 16 lower-case hex digits, and back (nothing on malformed text).
std::string digest_hex(uint64_t d);
std::optional<uint64_t> parse_digest_hex(const std::string& text);

// Where two records of the same step differ: what a bisect prints.
struct StepDigestDifference {
  bool data_position = false;  // shuffle_offset, epoch or step_in_epoch
  std::vector<std::string> rng;      // the streams whose counters differ
  bool loss = false;
  std::vector<std::string> tensors;  // the tensors whose digests differ (and those only one has)
  bool any() const { return data_position || loss || !rng.empty() || !tensors.empty(); }
};
StepDigestDifference compare_step_digests(const StepDigest& a, const StepDigest& b);

// The run directory's record of every step (step_digests.jsonl). One line per step:
// eight hex digits of the CRC-32 of the JSON text, a space, the JSON text, "\n". A line
// whose CRC does not match, or a last line without its "\n", is a torn tail (a kill
// during the write): read() cuts it, reports it and trusts nothing from it on.
namespace step_digest_log {

inline constexpr const char* kFileName = "step_digests.jsonl";

struct Contents {
  std::vector<StepDigest> steps;  // in file order, ascending global_step
  // Bytes of the file that hold sound records; a torn or damaged tail starts here.
  uint64_t sound_bytes = 0;
  // Set when lines after sound_bytes were cut: why ("line 812: CRC mismatch").
  std::string cut_reason;
};

// Reads `path` (null env: Env::posix()). A missing file is empty Contents; a line in
// the middle that is damaged cuts everything from it on (reported in cut_reason).
// Records out of order (a step not above the one before) count as damage too.
Contents read(const std::string& path, Env* env = nullptr);

// The text of one record's line, "\n" included.
std::string line_of(const StepDigest& d);

// Appends records to a run's log. open() cuts what read() would cut and every record
// after `keep_through_step` (steps the run is about to train again from its
// checkpoint), so the file continues with the resumed run's steps.
class Writer {
 public:
  Writer() = default;
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  // Throws std::runtime_error naming the file when it cannot be opened or cut.
  void open(const std::string& path, int64_t keep_through_step, Env* env = nullptr);
  bool is_open() const { return fd_ >= 0; }
  // Appends (one write for all of them); throws std::runtime_error on a failed write.
  void append(const std::vector<StepDigest>& records);
  // fsync: the records appended so far survive the host's crash too.
  void sync();
  void close();
  // What open() cut and why (empty when nothing was damaged).
  const std::string& cut_reason() const { return cut_reason_; }

 private:
  Env* env_ = nullptr;
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string cut_reason_;
};

}  // namespace step_digest_log
}  // namespace engine
