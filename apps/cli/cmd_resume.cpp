// `engine resume CKPT.h5` and `engine resume RUN_DIR`.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/exit.h"
#include "cli/training_session.h"
#include "engine/run/recovery.h"

namespace fs = std::filesystem;

namespace engine::cli {
namespace {

const char* kResumeFooter = R"(Continues the run recorded in CKPT.h5 with the config stored inside it, writing into
the run directory recorded there unless --run-dir names another. A CKPT.h5 that does not
load is refused, naming the sound checkpoints beside it. Given a run directory instead,
it resumes, as train does, from the newest sound checkpoint of the run in that directory
and in every replica (checkpoint.replicas), writing into that directory (docs/recovery.md).
A checkpoint saved on a GPU resumes on a CPU and the reverse. Signals, the run-directory
lock, "already complete" and exit statuses as for train.)";

// `engine resume RUN_DIR`: the run of the newest sound checkpoint in RUN_DIR, with every
// tier its config names, as `engine train` resumes it.
int resume_run_dir(const ResumeOptions& a) {
  const std::string& dir = a.checkpoint;
  const std::vector<CheckpointCopy> copies = survey_directory(dir);
  if (copies.empty() || copies.front().verdict != CopyVerdict::Sound) {
    std::string tried;
    for (const CheckpointCopy& c : copies) tried += (tried.empty() ? "" : ", ") + c.path + " (" + c.reason + ")";
    fail(dir + ": no sound checkpoint to resume from" + (tried.empty() ? " (the directory holds none)" : "; tried " + tried));
  }
  const std::string& newest = copies.front().path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(load_checkpoint(newest).config_json);
  } catch (const nlohmann::json::exception&) {
    fail(newest + ": the stored config is not valid JSON");
  }
  RunOptions run = a.run;
  if (run.run_dir.empty()) run.run_dir = dir;  // the directory named, wherever the run was first
  TrainingSession session(resolve_config(j, newest + " (stored config)", run), run);
  session.start();
  session.begin(StartFrom::Newest);
  return session.run();
}

}  // namespace

void resume_options(CLI::App* resume, Commands& c) {
  resume->add_option("CKPT.h5", c.resume.checkpoint,
                     "the checkpoint to continue from, or a run directory: its newest sound checkpoint")
      ->required()
      ->type_name("");
  add_run_options(resume, c.resume.run, "where to continue (default: the config's device)",
                  "where to write from now on (default: the stored checkpoint.dir)");
  resume->add_flag("--non-strict", c.resume.non_strict, "apply what matches; print missing/unexpected keys");
  resume->footer(kResumeFooter);
}

int cmd_resume(const ResumeOptions& a) {
  const std::string& path = a.checkpoint;
  if (fs::is_directory(path)) return resume_run_dir(a);
  Checkpoint ckpt;
  try {
    ckpt = load_checkpoint(path);
  } catch (const CheckpointError& e) {
    // The user asked for this file: refused, but the sound ones beside it are named.
    fail(std::string(e.what()) + sound_alternatives(path));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ckpt.config_json);
  } catch (const std::exception&) {
    fail(path + ": the stored config is not valid JSON");
  }
  TrainingSession session(resolve_config(j, path + " (stored config)", a.run), a.run);
  Trainer& trainer = session.start();
  session.require_same_start(path);
  StateReport r;
  try {
    r = trainer.restore(ckpt, a.non_strict ? LoadMode::NonStrict : LoadMode::Strict);
  } catch (const std::exception& e) {
    fail(path + ": " + e.what());
  }
  TrainingSession::print_load_report(r);
  std::cout << "resuming from epoch " << trainer.epochs_done() << " (saved on " << ckpt.meta.saved_on
            << ", now on " << session.device().str() << "), run dir " << session.config().checkpoint.dir << "\n";
  session.continue_from_restored();
  return session.run();
}

}  // namespace engine::cli
