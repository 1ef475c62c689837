// The CLI end to end on a small subset, and its one-line errors on bad input.
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "run_dir_util.h"
#include "engine/checkpoint.h"
#include "engine/device.h"

using namespace test_util;
namespace fs = std::filesystem;

namespace {

// Exactly one line of output, mentioning every needle, and a non-zero exit.
void expect_one_line_error(const RunResult& r, const std::vector<std::string>& needles) {
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.signal == 0);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  for (const auto& n : needles) {
    CAPTURE(n);
    CHECK(r.output.find(n) != std::string::npos);
  }
}

std::string config() { return "\"" + source_dir() + "/configs/mnist.json\""; }

}  // namespace

TEST_CASE("help texts explain every option") {
  RunResult r = run("--help");
  CHECK(r.exit_code == 0);
  for (const char* cmd : {"train", "resume", "eval", "inspect", "verify", "diff", "report"})
    CHECK(r.output.find(cmd) != std::string::npos);
  r = run("train --help");
  CHECK(r.exit_code == 0);
  for (const char* opt : {"--device", "--run-dir", "--set", "--fresh", "--stop-after-epochs", "--time-limit", "SIGUSR1"})
    CHECK(r.output.find(opt) != std::string::npos);
  CHECK(run("resume --help").output.find("--non-strict") != std::string::npos);
  CHECK(run("eval --help").output.find("--dump-logits") != std::string::npos);
  r = run("report --help");
  CHECK(r.exit_code == 0);
  for (const char* opt : {"--output", "--device", "--data-dir"}) CHECK(r.output.find(opt) != std::string::npos);
}

TEST_CASE("bad input: one-line errors naming the file or key, non-zero exit") {
  const std::string dir = fresh_dir("cli_errors");
  expect_one_line_error(run("train " + config() + " --device cpu --set data.dir=/nonexistent/fm"),
                        {"/nonexistent/fm", "data.dir", "apt install dataset-fashion-mnist"});
  expect_one_line_error(run("train " + config() + " --set optimizer.lrr=0.1"),
                        {"optimizer.lrr", "optimizer.lr"});
  expect_one_line_error(run("train " + config() + " --set optimizer.lr=-0.001"), {"optimizer.lr"});
  expect_one_line_error(run("train " + config() + " --set data.batch_size=0"), {"data.batch_size"});
  expect_one_line_error(run("train " + config() + " --set data.batch_size=\\\"x\\\""), {"data.batch_size"});
  expect_one_line_error(run("train " + config() + " --set train.epoch=3"), {"train.epoch", "train.epochs"});
  expect_one_line_error(run("train " + dir + "/missing.json"), {"missing.json"});
  {
    std::ofstream(dir + "/bad.json") << "{\"seed\": 0,, }";
    expect_one_line_error(run("train " + dir + "/bad.json"), {"bad.json"});
    std::ofstream(dir + "/unknown.json") << "{\"optimizer\": {\"nmae\": \"adamw\"}}";
    expect_one_line_error(run("train " + dir + "/unknown.json"), {"unknown.json", "optimizer.nmae", "optimizer.name"});
  }
  expect_one_line_error(run("train " + config() + " --bogus"), {"--bogus"});
  expect_one_line_error(run("frobnicate"), {"frobnicate"});
  if (engine::cuda_device_count() == 0)
    expect_one_line_error(run("train " + config() + " --device cuda --run-dir " + dir + "/r"), {"cuda"});
  // Corrupt and foreign checkpoints.
  std::ofstream(dir + "/garbage.h5") << "this is not a checkpoint at all";
  for (const char* cmd : {"verify", "inspect", "eval", "resume"})
    expect_one_line_error(run(std::string(cmd) + " " + dir + "/garbage.h5"), {"garbage.h5"});
  expect_one_line_error(run("verify " + dir + "/absent.h5"), {"absent.h5"});
}

TEST_CASE("IDX data errors are one line and name the file") {
  const std::string dir = fresh_dir("cli_idx");
  // A data dir whose training images have the wrong magic.
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"})
    std::ofstream(dir + "/" + f) << std::string(64, '\x07');
  expect_one_line_error(run("train " + config() + " --device cpu --set data.dir=" + dir + " --run-dir " + dir + "/r"),
                        {"ubyte", "magic"});
}

TEST_CASE("train, inspect, verify, eval, diff and a corrupted byte, end to end") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("cli_e2e");
  RunResult r = run(small_run(dir) + " --set train.epochs=2 --set checkpoint.every_n_epochs=1 --set checkpoint.keep_last=1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Non-terminal output: one line per epoch, then the test result.
  CHECK(r.output.find("epoch 1/2") != std::string::npos);
  CHECK(r.output.find("epoch 2/2") != std::string::npos);
  CHECK(r.output.find("test: loss") != std::string::npos);
  CHECK(r.output.find("\r") == std::string::npos);
  // Run directory: last, best, rotated milestones, metrics.
  CHECK(fs::exists(dir + "/last.h5"));
  CHECK(fs::exists(dir + "/best.h5"));
  CHECK(fs::exists(dir + "/epoch_0002.h5"));
  CHECK_FALSE(fs::exists(dir + "/epoch_0001.h5"));  // keep_last=1
  const auto lines = read_lines(dir + "/metrics.jsonl");
  REQUIRE(lines.size() == 3);
  for (int i = 0; i < 2; ++i) {
    auto j = nlohmann::json::parse(lines[i]);
    for (const char* k : {"epoch", "train_loss", "val_loss", "val_acc", "lr", "loss_scale", "epoch_seconds"})
      CHECK(j.contains(k));
    CHECK(j["epoch"] == i + 1);
  }
  CHECK(nlohmann::json::parse(lines[2]).contains("test_acc"));

  r = run("inspect " + dir + "/last.h5");
  CHECK(r.exit_code == 0);
  for (const char* k : {"format_version", "saved_on", "conv1.weight", "exp_avg/fc1.weight", "last_epoch", "scale", "shuffle"})
    CHECK(r.output.find(k) != std::string::npos);
  CHECK(run("verify " + dir + "/last.h5").exit_code == 0);
  r = run("eval " + dir + "/best.h5 --device cpu --limit 300");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("confusion matrix") != std::string::npos);
  CHECK(r.output.find("(300 images)") != std::string::npos);
  CHECK(run("diff " + dir + "/last.h5 " + dir + "/epoch_0002.h5").exit_code == 0);

  // Flip one byte in the middle: verify, eval and resume refuse it by name.
  fs::copy_file(dir + "/last.h5", dir + "/flipped.h5");
  {
    std::fstream f(dir + "/flipped.h5", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(dir + "/flipped.h5") / 2));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(fs::file_size(dir + "/flipped.h5") / 2));
    f.put(static_cast<char>(c ^ 0x10));
  }
  for (const char* cmd : {"verify", "eval", "resume"})
    expect_one_line_error(run(std::string(cmd) + " " + dir + "/flipped.h5"), {"flipped.h5"});
  // Truncated.
  fs::copy_file(dir + "/last.h5", dir + "/short.h5");
  fs::resize_file(dir + "/short.h5", fs::file_size(dir + "/short.h5") - 1000);
  expect_one_line_error(run("verify " + dir + "/short.h5"), {"short.h5"});

  // A finished run restarted with the same command has nothing left to do.
  r = run(small_run(dir) + " --set train.epochs=2 --set checkpoint.every_n_epochs=1 --set checkpoint.keep_last=1");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 2") != std::string::npos);
  // --fresh starts over.
  r = run(small_run(dir) + " --set train.epochs=1 --fresh");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming") == std::string::npos);
}

TEST_CASE("resume with another training-set size: accepted at an epoch boundary, refused mid-epoch saying why") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("cli_strict");
  REQUIRE(run(small_run(dir) + " --set train.epochs=1").exit_code == 0);
  // After epoch 1 the partial-epoch loss buffer holds nothing: 512 images instead of 1024.
  RunResult r = run("resume " + dir + "/last.h5 --set data.train_limit=512 --set train.epochs=2 --run-dir " + dir + "/b");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 1") != std::string::npos);
  CHECK(engine::load_checkpoint(dir + "/b/last.h5").groups.at("trainer").get_int("global_step") == 16 + 8);
  // Mid-epoch (the fixture stopped at step 4 of epoch 2, 1024 images): refused, with the reason.
  const std::string mid = source_dir() + "/tests/data/checkpoint_v2_cpu_mid_epoch.h5";
  const std::string data = " --set data.dir=\"" + data_dir() + "\"";
  r = run("resume \"" + mid + "\" --set data.train_limit=512 --run-dir " + dir + "/c" + data);
  expect_one_line_error(r, {"epoch_sample_loss", "mid-epoch", "training set's size", "epoch boundary"});
  r = run("resume \"" + mid + "\" --non-strict --set data.train_limit=512 --stop-after-epochs 2 --run-dir " + dir + "/d" + data);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("non-strict load") != std::string::npos);
  CHECK(r.output.find("mismatched") != std::string::npos);
}

TEST_CASE("one writer per run directory: a second train or resume is refused at once; a killed holder's lock is taken over") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("cli_lock");
  Background holder(small_run(dir));
  REQUIRE(holder.pid() > 0);
  REQUIRE(holder.wait_for("epoch 1/4"));
  REQUIRE(wait_for_checkpoint(dir + "/best.h5", 16));  // last.h5 and best.h5 exist (checkpoint.async)
  REQUIRE(wait_for_checkpoint(dir + "/last.h5", 16));
  const std::string pid = "pid " + std::to_string(holder.pid());
  for (const std::string& cmd : {small_run(dir), "resume " + dir + "/last.h5"}) {
    CAPTURE(cmd);
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult r = run(cmd);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
    expect_one_line_error(r, {dir, "in use", pid, "host", "since"});
  }
  // Readers take no lock.
  CHECK(run("verify " + dir + "/last.h5").exit_code == 0);
  CHECK(run("inspect " + dir + "/best.h5").exit_code == 0);
  CHECK(run("diff " + dir + "/best.h5 " + dir + "/best.h5").exit_code == 0);
  // SIGKILL leaves a lock file naming a dead process; it does not block.
  ::kill(holder.pid(), SIGKILL);
  CHECK(holder.finish().signal == SIGKILL);
  CHECK(read_lines(dir + "/.lock").at(0).find(pid + " ") == 0);
  const RunResult r = run(small_run(dir) + " --stop-after-epochs 1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch") != std::string::npos);
  CHECK(fs::file_size(dir + "/.lock") == 0);  // released cleanly
}
