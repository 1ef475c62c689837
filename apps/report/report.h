// A run you can look at: one self-contained HTML file (inline SVG charts, no scripts,
// fonts or styles from elsewhere) with the loss, accuracy, learning-rate and
// loss-scale curves per epoch, the confusion matrix of best.h5 on the test set, the
// run's config and the checkpoints present with their epoch, size and integrity.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/train/trainer.h"

namespace engine {

struct ReportOptions {
  std::string output;            // empty: RUN_DIR/report.html
  std::string device = "auto";   // where best.h5 is evaluated
  std::string data_dir;          // empty: the data.dir stored in best.h5
  // Builds the model a checkpoint's config names (the CLI passes engine::make_model from
  // engine/nn/models/registry.h; the library's engine/ layer knows no concrete model).
  // Without it the confusion matrix is left out with a note.
  std::function<std::unique_ptr<Model>(const Config&)> make_model;
};

struct ReportSummary {
  std::string path;                       // the HTML file written
  int64_t epochs = 0;                     // epochs with metrics
  std::string metrics_source;             // the file the metrics came from
  std::optional<EvalResult> best_test;    // best.h5 on the test set, when evaluated
  std::vector<std::string> notes;         // what the report had to leave out, one line each
};

// Reads RUN_DIR/metrics.jsonl (or, without it, the metrics group of RUN_DIR/last.h5),
// verifies every checkpoint in RUN_DIR, evaluates best.h5 on the test set and writes
// the report. Throws std::runtime_error with one line naming the path when RUN_DIR is
// not a directory, holds no metrics, or the report cannot be written. A missing or
// unusable best.h5 (or dataset) leaves the confusion matrix out with a note instead.
ReportSummary write_run_report(const std::string& run_dir, const ReportOptions& options = {});

}  // namespace engine
