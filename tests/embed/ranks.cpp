// A host program that trains through engine::RunSession (engine/run/run_session.h), as one
// process or as every rank of `mpirun -np N ./embed_ranks ...`: rank 0 alone prints and
// writes RUN_DIR (its lock, last.h5, metrics.jsonl), the other ranks train silently and
// write nothing; a rank that fails alone ends the whole job; ranks that would start
// differently are refused on every rank. tests/embed/run.sh compares RUN_DIR/last.h5 of
// one process and of two ranks with `engine diff` (bit for bit).
//
//   embed_ranks RUN_DIR [--device cpu|cuda|auto] [--data DIR]
//                       [--fail-on-rank R]    rank R's data.dir does not exist (a rank that fails alone)
//                       [--differ-on-rank R]  rank R's optimizer.lr differs (refused by every rank)
//
// Exit status 0 when every check passes, 1 on a failure or error (every rank, through
// RunSession::abort_job), 2 when the ranks do not agree on the start.
#include <engine/core/collective.h>
#include <engine/train/config.h>
#include <engine/train/model_factory.h>
#include <engine/run/run_directory.h>
#include <engine/run/run_files.h>
#include <engine/run/run_session.h>
#include <engine/train/trainer.h>
#include <nlohmann/json.hpp>  // config_to_json returns a json by value

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

namespace fs = std::filesystem;
using namespace engine;

namespace {

struct Args {
  std::string run_dir, device = "cpu", data;
  std::optional<int> fail_on_rank, differ_on_rank;
};

class EpochPrinter : public TrainerObserver {
 public:
  void on_epoch_end(const EpochMetrics& m) override {
    ++epochs;
    std::printf("epoch %lld: train_loss %.6f  val_loss %.6f  val_acc %.4f\n", static_cast<long long>(m.epoch),
                m.train_loss, m.val_loss, m.val_acc);
  }
  int epochs = 0;
};

Config make_config(const Args& a) {
  Config cfg;
  cfg.seed = 20240502;
  cfg.device = a.device;
  if (!a.data.empty()) cfg.data.dir = a.data;
  cfg.data.train_limit = 384;
  cfg.data.val_split = 128;
  cfg.data.test_limit = 256;
  cfg.data.batch_size = 48;  // 8 steps of 48 images, cut into dist.chunks = 8 chunks
  cfg.train.epochs = 2;
  cfg.checkpoint.dir = a.run_dir;
  cfg.checkpoint.every_n_epochs.reset();
  cfg.logging.tensorboard = false;
  // What a host's per-rank mistake looks like (from the launcher's environment, before
  // any session: the config must be known to join the job).
  const int launch_rank = detect_launch().rank;
  if (a.fail_on_rank && *a.fail_on_rank == launch_rank) cfg.data.dir = "/nonexistent";
  if (a.differ_on_rank && *a.differ_on_rank == launch_rank) cfg.optimizer.lr *= 2;
  return config_from_json(config_to_json(cfg), "embed_ranks (config built in code)");
}

int run(const Args& a) {
  const Config cfg = make_config(a);
  EpochPrinter printer;  // outlives the session: the trainer reports to it
  // The job: one process, or every rank of mpirun/srun. Rank 0 takes RUN_DIR's lock now;
  // the other ranks' stdout goes to /dev/null.
  RunSession session(cfg, RunSessionOptions{/*quiet_other_ranks=*/true});
  std::cout << "embed_ranks: " << session.size() << " rank(s) (" << session.collective().name()
            << "), MPI " << (mpi_built() ? "built" : "not built") << ", training on " << session.device().str()
            << "\n";
  Trainer& trainer = session.start(make_model(cfg), &printer);  // a missing data.dir throws here
  const StartAgreement agreed = session.agree_on_start("");     // StartMismatchError on every rank
  if (session.size() > 1)
    std::cout << "embed_ranks: the ranks agree (" << agreed.data_bytes << " bytes of data hashed)\n";
  const FitResult r = session.fit();

  int failures = 0;
  const auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::cerr << "embed_ranks: " + RunSession::rank_tag() + "FAIL: " + what + "\n";
    } else {
      std::cout << "ok:   " << what << "\n";
    }
  };
  check(r.ending == FitResult::Ending::Completed && trainer.epochs_done() == 2 && printer.epochs == 2,
        "two epochs trained and observed");
  check(r.test.has_value() && r.test->count == 256, "the test set evaluated (256 images)");
  if (session.writes_run_dir()) {
    check(session.run_directory() != nullptr && fs::exists(fs::path(a.run_dir) / run_files::kLast) &&
              fs::exists(fs::path(a.run_dir) / run_files::kMetrics),
          "rank 0 owns the run directory: last.h5 and metrics.jsonl written");
  } else {
    check(session.run_directory() == nullptr, "rank " + std::to_string(session.rank()) + " has no run directory");
  }
  if (r.test)
    std::printf("test: loss %.6f  accuracy %.4f (%lld images)\n", r.test->loss, r.test->accuracy,
                static_cast<long long>(r.test->count));
  // Every rank's verdict, so that rank 0's last line speaks for the job.
  const std::vector<int64_t> worst = session.collective().agree_max({failures});
  check(worst[0] == 0, "every rank passed its checks");
  if (failures == 0) std::cout << "embed_ranks: all checks passed on " << session.size() << " rank(s)\n";
  return failures == 0 ? 0 : 1;
}

int usage() {
  std::cerr << "usage: embed_ranks RUN_DIR [--device cpu|cuda|auto] [--data DIR] [--fail-on-rank R] "
               "[--differ-on-rank R]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if ((s == "--device" || s == "--data" || s == "--fail-on-rank" || s == "--differ-on-rank") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (s == "--device") a.device = v;
      else if (s == "--data") a.data = v;
      else if (s == "--fail-on-rank") a.fail_on_rank = std::stoi(v);
      else a.differ_on_rank = std::stoi(v);
    } else if (a.run_dir.empty() && !s.empty() && s[0] != '-') {
      a.run_dir = s;
    } else {
      return usage();
    }
  }
  if (a.run_dir.empty()) return usage();
  try {
    return run(a);
  } catch (const StartMismatchError& e) {
    // Every rank throws it with the same message: each says so and exits, no abort needed.
    std::cerr << "embed_ranks: " + RunSession::rank_tag() + e.what() + "\n";
    return 2;
  } catch (const std::exception& e) {
    // This rank alone may have failed (the session is gone by now, the job is not): end
    // every rank, or the others would wait for it in their next collective.
    std::cerr << "embed_ranks: " + RunSession::rank_tag() + "error: " + e.what() + "\n";
    RunSession::abort_job(1);
  }
}
