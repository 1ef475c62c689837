// `engine train CONFIG.json`.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/training_session.h"

namespace fs = std::filesystem;

namespace engine::cli {
namespace {

const char* kTrainFooter = R"(If the run directory or a replica (checkpoint.replicas) holds a checkpoint of this run,
training resumes from the newest sound one ("resuming from epoch N", naming any newer
copy skipped as damaged and the copies repaired; docs/recovery.md); a run that is already
complete says so and exits 0. --fresh starts over: the
previous run's files (last.h5, best.h5, epoch_NNNN.h5, metrics.jsonl, tensorboard/,
report.html) are moved aside to <run-dir>.replaced-<UTC time>, which it names.
Ctrl-C or SIGTERM stops after the current step (or evaluation batch) and writes last.h5
first (exit 130); a second Ctrl-C exits at once. SIGUSR1 writes last.h5 and training
goes on (Slurm: --signal=USR1@90). One run at a time per run directory: a second
`train` or `resume` on it is refused, naming the process that holds it.
Exit status: 0 done (or already complete, or stopped by --stop-after-epochs), 130
stopped by a signal, 75 stopped by --time-limit, 3 a save failed (disk full, I/O error;
checkpoint.on_error = stop) with the previous checkpoint intact, 1 error, 2 usage.)";

}  // namespace

void train_options(CLI::App* train, Commands& c) {
  train->add_option("CONFIG.json", c.train.config_path, "the training config")->required()->type_name("");
  add_run_options(train, c.train.run, "where to train (overrides the config's `device`)",
                  "where checkpoints and metrics.jsonl go (overrides checkpoint.dir)");
  train->add_flag("--fresh", c.train.fresh,
                  "ignore an existing last.h5 and start from scratch, moving the previous run's files aside");
  train->footer(kTrainFooter);
}

int cmd_train(const TrainOptions& a) {
  const std::string& path = a.config_path;
  std::ifstream in(path);
  if (!in || fs::is_directory(path)) load_config(path);  // words the error (missing, a directory)
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    load_config(path);  // words the error with line and column
  }
  TrainingSession session(resolve_config(j, path, a.run), a.run);
  session.start();
  // --fresh moves the previous run's files aside (nothing is destroyed); otherwise the
  // newest sound checkpoint of every tier is resumed from (docs/recovery.md).
  session.begin(a.fresh ? StartFrom::Scratch : StartFrom::Newest);
  return session.run();
}

}  // namespace engine::cli
