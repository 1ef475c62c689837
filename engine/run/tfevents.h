// TensorBoard event files: the per-epoch scalars of a run, so `tensorboard --logdir
// runs/` shows its curves. The format is TFRecord framing of protobuf `Event`
// messages, hand-encoded here (a few varints); no TensorFlow or protobuf library.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/env.h"
#include "engine/train/epoch_metrics.h"

namespace engine::tfevents {

// One TFRecord: uint64 length (LE), masked CRC-32C of the length, the payload,
// masked CRC-32C of the payload.
std::string frame_record(const std::string& payload);

// Event{wall_time, step 0, file_version "brain.Event:2"}: the first record of a file.
std::string file_version_event(double wall_time);

struct Scalar {
  std::string tag;
  float value = 0;
};
// Event{wall_time, step, summary{value{tag, simple_value}...}}.
std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& values);

// The complete event stream of a run: the file-version record, one event per epoch
// (step = epoch; the fields of epoch_metric_fields(), as tags) and,
// when given, test_loss and test_acc at the last epoch's step. Wall times are
// start_time plus the cumulative epoch_seconds, so the bytes for the epochs already
// written never change when the history grows.
std::string run_events(double start_time, const std::vector<EpochMetrics>& history,
                       const std::optional<EvalResult>& test);

// Rewrites RUN_DIR/tensorboard/events.out.tfevents.<start>.<host> from the whole
// history, atomically (temporary file, fsync, rename, directory fsync). The file name,
// and with it start_time, is kept from an existing event file in that directory, so a
// resumed run extends its file instead of adding a second one; a resumed run therefore
// neither duplicates nor loses epochs. Returns the path; throws CheckpointWriteError
// naming the file on failure. Every call, and the clock a new file's name takes, through `env`.
std::string write_run_events(Env& env, const std::string& run_dir, const std::vector<EpochMetrics>& history,
                             const std::optional<EvalResult>& test);

}  // namespace engine::tfevents
