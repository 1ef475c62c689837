// The CLI end to end on a small subset, and its one-line errors on bad input.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <chrono>
#include <set>
#include <thread>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "cli_util.h"
#include "run_dir_util.h"
#include "engine/core/build_info.h"
#include "engine/io/checkpoint.h"
#include "engine/core/device.h"
#include "engine/train/model_factory.h"
#include "engine/core/tensor.h"
#include "engine/train/trainer.h"

using namespace test_util;
namespace fs = std::filesystem;

namespace {

std::string config() { return "\"" + source_dir() + "/configs/mnist.json\""; }

// The directories --fresh moved earlier runs of `dir` to (<dir>.replaced-<UTC time>).
std::vector<fs::path> replaced_dirs(const std::string& dir) {
  std::vector<fs::path> out;
  const std::string prefix = fs::path(dir).filename().string() + ".replaced-";
  for (const auto& e : fs::directory_iterator(fs::path(dir).parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  return out;
}

// The option names (--xyz) a help text or a line of docs mentions.
std::set<std::string> option_names(const std::string& text) {
  std::set<std::string> out;
  for (size_t i = text.find("--"); i != std::string::npos; i = text.find("--", i + 2)) {
    size_t j = i + 2;
    while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '-')) ++j;
    if (j > i + 2) out.insert(text.substr(i, j - i));
  }
  return out;
}

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
                        {"/nonexistent/fm", "data.dir", "apt-get install dataset-fashion-mnist (as root, or with sudo)"});
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
  for (const fs::path& p : replaced_dirs(dir)) fs::remove_all(p);
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

  // A finished run restarted with the same command has nothing left to do: it says so and
  // does not evaluate the test set again (metrics.jsonl untouched) unless asked.
  const auto metrics_time = fs::last_write_time(dir + "/metrics.jsonl");
  r = run(small_run(dir) + " --set train.epochs=2 --set checkpoint.every_n_epochs=1 --set checkpoint.keep_last=1");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 2") != std::string::npos);
  CHECK(r.output.find("already complete") != std::string::npos);
  CHECK(r.output.find("test: loss") == std::string::npos);
  CHECK(fs::last_write_time(dir + "/metrics.jsonl") == metrics_time);
  r = run("resume " + dir + "/last.h5");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("already complete") != std::string::npos);
  r = run(small_run(dir) + " --set train.epochs=2 --set checkpoint.every_n_epochs=1 --set checkpoint.keep_last=1 --reevaluate");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("already complete") == std::string::npos);
  CHECK(r.output.find("test: loss") != std::string::npos);
  // --fresh starts over, and the previous run's files go aside: the run directory holds
  // only the new run's (epoch_0002.h5 of the old run was listed by the report).
  r = run(small_run(dir) + " --set train.epochs=1 --fresh");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming") == std::string::npos);
  CHECK(r.output.find("--fresh: moved the previous run's") != std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/epoch_0002.h5"));
  CHECK(read_lines(dir + "/metrics.jsonl").size() == 2);  // epoch 1 and the test result
  CHECK(engine::load_checkpoint(dir + "/last.h5").groups.at("trainer").get_int("epoch") == 1);
  const std::vector<fs::path> aside = replaced_dirs(dir);
  REQUIRE(aside.size() == 1);
  CHECK(r.output.find(aside[0].string()) != std::string::npos);
  CHECK(fs::exists(aside[0] / "epoch_0002.h5"));
  CHECK(fs::exists(aside[0] / "last.h5"));
  CHECK(read_lines((aside[0] / "metrics.jsonl").string()).size() == 3);
  fs::remove_all(aside[0]);
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
  // The holder is held after step 20, in epoch 2, for as long as the test needs it
  // (tests/tools/engine_paused.cpp): on a fast machine it would otherwise end first.
  Background holder = Background::command(paused_at(20, small_run(dir)));
  REQUIRE(holder.pid() > 0);
  REQUIRE(holder.wait_for("paused after step 20"));
  REQUIRE(wait_for_checkpoint(dir + "/best.h5", 16));  // last.h5 and best.h5 exist (checkpoint.async)
  REQUIRE(wait_for_checkpoint(dir + "/last.h5", 16));
  const std::string pid = "pid " + std::to_string(holder.pid());
  for (const std::string& cmd : {small_run(dir), "resume " + dir + "/last.h5"}) {
    CAPTURE(cmd);
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult r = run(cmd);
    // At once: the holder keeps the lock for minutes, so a second writer that waited
    // for it would take that long. The bound tells the two apart; it asks no speed.
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 60.0);
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
  const RunResult r = run(small_run(dir) + " --stop-after-epochs 2");  // one epoch more
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch") != std::string::npos);
  // The relaunch's time to its first trained step, and where it went (no bound: it asks no speed).
  const std::size_t said = r.output.find("resumed in ");
  REQUIRE(said != std::string::npos);
  const std::string line = r.output.substr(said, r.output.find('\n', said) - said);
  for (const char* part : {" s: exec and libraries ", ", config ", ", job, data and model ", ", survey ",
                           " in 1 tier), restore ", ", first step "})
    CHECK_MESSAGE(line.find(part) != std::string::npos, line);
  CHECK(fs::file_size(dir + "/.lock") == 0);  // released cleanly
}

TEST_CASE("each command takes only its own options: any other is a one-line usage error, exit 2") {
  const std::string dir = fresh_dir("cli_usage");
  const std::string ckpt = source_dir() + "/tests/data/checkpoint_v2_cpu_mid_epoch.h5";
  struct Case {
    std::string args;
    std::vector<std::string> needles;
  };
  const Case cases[] = {
      {"train " + config() + " --non-strict", {"train", "--non-strict"}},
      {"train " + config() + " --dump-logits x", {"train", "--dump-logits"}},
      {"resume \"" + ckpt + "\" --fresh", {"resume", "--fresh"}},
      {"eval --set train.epochs=99 --run-dir /nonexistent \"" + ckpt + "\"", {"eval", "--set"}},
      {"verify --dump-logits " + dir + "/zz \"" + ckpt + "\"", {"verify", "--dump-logits"}},
      {"inspect \"" + ckpt + "\" --device cpu", {"inspect", "--device"}},
      {"diff \"" + ckpt + "\"", {"diff"}},
      {"inspect a.h5 b.h5", {"inspect", "b.h5"}},
      {"report " + dir + " --set x=1", {"report", "--set"}},
      {"version --fresh", {"version", "--fresh"}},
      {"train", {"train", "CONFIG.json"}},
      {"train " + config() + " --stop-after-epochs 0", {"--stop-after-epochs", ">= 1", "'0'"}},
      {"train " + config() + " --stop-after-epochs two", {"--stop-after-epochs", "'two'"}},
      {"train " + config() + " --time-limit 2x", {"--time-limit", "2d", "'2x'"}},
      {"eval \"" + ckpt + "\" --limit 0", {"eval", "--limit"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args);
    const RunResult r = run(c.args);
    expect_one_line_error(r, c.needles);
    CHECK(r.exit_code == 2);
    CHECK(r.output.rfind("engine: ", 0) == 0);
  }
  CHECK_FALSE(fs::exists(dir + "/zz"));
}

TEST_CASE("--help of each command lists its own options, the same as docs/cli.md's table row") {
  std::ifstream in(source_dir() + "/docs/cli.md");
  std::vector<std::string> doc;
  for (std::string l; std::getline(in, l);) doc.push_back(l);
  const std::set<std::string> generic = {"--help"};
  for (const char* cmd :
       {"train", "resume", "eval", "inspect", "verify", "diff", "bisect", "replay", "audit", "report", "export",
        "verify-export", "version", "keys"}) {
    CAPTURE(cmd);
    const RunResult r = run(std::string(cmd) + " --help");
    CHECK(r.exit_code == 0);
    CHECK(r.output.rfind(std::string("usage: engine ") + cmd, 0) == 0);
    std::set<std::string> help = option_names(r.output);
    // The footers mention --set train.epochs=N and the like; the options are what the
    // option list declares: lines that start with "  -".
    std::set<std::string> declared;
    std::istringstream lines(r.output);
    for (std::string l; std::getline(lines, l);)
      if (l.rfind("  -", 0) == 0) {
        const auto names = option_names(l.substr(0, l.find(' ', 2) == std::string::npos ? l.size() : l.find(' ', 3)));
        declared.insert(names.begin(), names.end());
      }
    for (const std::string& g : generic) declared.erase(g);
    std::string row;
    for (const std::string& l : doc)
      if (l.rfind(std::string("| `engine ") + cmd + " ", 0) == 0 || l.rfind(std::string("| `engine ") + cmd + "`", 0) == 0)
        row = l;
    REQUIRE_MESSAGE(!row.empty(), "docs/cli.md has no table row for engine " << cmd);
    const std::string synopsis = row.substr(3, row.find('`', 3) - 3);  // | `engine ...` |
    CHECK(declared == option_names(synopsis));
  }
  const RunResult train = run("train --help");
  for (const char* text : {"2d", "D-HH:MM:SS", "SIGUSR1", "--reevaluate", "already complete", ">= 1"})
    CHECK(train.output.find(text) != std::string::npos);
  CHECK(run("eval --help").output.find("--fresh") == std::string::npos);
}

TEST_CASE("engine keys prints every key's row of docs/config.md, under its section's heading") {
  const RunResult r = run("keys");
  CHECK(r.exit_code == 0);
  std::vector<std::string> rows;
  std::istringstream lines(r.output);
  for (std::string l; std::getline(lines, l);)
    if (l.rfind("| `", 0) == 0) rows.push_back(l);
  std::vector<std::string> want;
  for (const engine::ConfigKeyInfo& k : engine::config_keys()) want.push_back(engine::to_markdown_row(k));
  CHECK(rows == want);
  for (const char* heading : {"### Top level\n", "### `data`\n", "### `precision`\n", "### `dist`\n"})
    CHECK(r.output.find(heading) != std::string::npos);
}

TEST_CASE("a bad --set value is blamed on --set, not on the config file") {
  RunResult r = run("train " + config() + " --set train.epochs=3.0");
  expect_one_line_error(r, {"--set: key 'train.epochs' must be an integer, got number 3.0"});
  CHECK(r.output.find("mnist.json") == std::string::npos);
  r = run("train " + config() + " --set model.name=resnet");
  expect_one_line_error(r, {"--set: key 'model.name' must be one of fashion_cnn, mlp, got \"resnet\""});
  r = run("train " + config() + " --device gpu");
  expect_one_line_error(r, {"--device/--run-dir: key 'device'", "gpu"});
  // The file's own mistakes still name the file.
  const std::string dir = fresh_dir("cli_blame");
  std::ofstream(dir + "/c.json") << R"({"train": {"epochs": 2.5}})";
  r = run("train " + dir + "/c.json --set optimizer.lr=0.01");
  expect_one_line_error(r, {dir + "/c.json: key 'train.epochs' must be an integer, got number 2.5"});
}

TEST_CASE("Device::cuda() without a usable GPU gives resolve_device's plain reason, no source path") {
  if (engine::cuda_device_count() > 0) return;
  std::string expected, got;
  try {
    engine::resolve_device("cuda:0");
  } catch (const std::exception& e) {
    expected = e.what();
  }
  REQUIRE(!expected.empty());
  try {
    engine::Tensor t = engine::Tensor::zeros({4}, engine::DType::F32, engine::Device::cuda());
  } catch (const std::exception& e) {
    got = e.what();
  }
  CHECK(got == expected);
  CHECK(got.find(".cpp") == std::string::npos);
  CHECK(got.find("cudaError") == std::string::npos);
}

TEST_CASE("output to a file reaches it line by line: a second Ctrl-C loses no line already printed") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("cli_double_int");
  const std::string log = dir + "/log.txt";
  // The engine in a child of ours, stdout and stderr redirected to a file, held after
  // step 2 (in epoch 1) until two signals have reached it (tests/tools/engine_paused.cpp):
  // the first asks for a stop, the second ends the process at once.
  test_util::ChildProcess engine = test_util::ChildProcess::shell(
      "exec " + paused_at(2, small_run(dir + "/r"), "--release-after-signals 2") + " > " + log + " 2>&1",
      test_util::ChildProcess::Output::Inherit);
  REQUIRE(engine.pid() > 0);
  auto log_has = [&](const std::string& needle) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return text.find(needle) != std::string::npos;
  };
  auto wait_for_log = [&](const std::string& needle) {
    for (int i = 0; i < 30000 && engine.running(); ++i) {
      if (log_has(needle)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return log_has(needle);
  };
  REQUIRE(wait_for_log("paused after step 2"));
  // The header is printed before the first step; it must reach the file then, not when
  // the first epoch's line flushes stdout (metrics.jsonl is written just before that).
  CHECK(log_has("training fashion_cnn"));
  CHECK_FALSE(fs::exists(dir + "/r/metrics.jsonl"));
  ::kill(engine.pid(), SIGINT);
  REQUIRE(wait_for_log("saw signal 1"));  // two pending SIGINTs would merge into one
  ::kill(engine.pid(), SIGINT);
  const int status = engine.wait();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(log_has("training fashion_cnn"));
  CHECK(log_has("interrupted again, exiting now"));
}

TEST_CASE("engine::DataError comes with the documented headers (engine/train/trainer.h) and names data.dir") {
  engine::Config cfg;
  cfg.data.dir = fresh_dir("cli_data_error") + "/none";
  std::string msg;
  try {
    engine::Trainer t(cfg, engine::Device::cpu(), engine::make_model(cfg));
  } catch (const engine::DataError& e) {  // declared in engine/core/errors.h, which trainer.h brings
    msg = e.what();
  }
  CHECK(msg.find("data.dir") != std::string::npos);
  CHECK(msg.find("apt-get install dataset-fashion-mnist") != std::string::npos);
  CHECK(msg.find("sudo apt install") == std::string::npos);
}

TEST_CASE("a CUDA build trains on the CPU without cuBLAS: the library is opened on first CUDA use only") {
  if (!dataset_available()) return;
  // A file that cannot be opened: any attempt to load cuBLAS fails, so the run's success
  // says that none was made (and the process never maps libcublasLt's ~210 MB).
  const std::string no_cublas = "ENGINE_CUBLAS_LIBRARY=/nonexistent/libcublas.so.13";
  const std::string dir = fresh_dir("cli_no_cublas");
  RunResult r = run_with_env(no_cublas, small_run(dir) + " --set train.epochs=1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("test: loss") != std::string::npos);
  RunResult v = run_with_env(no_cublas, "--version");
  INFO(v.output);
  CHECK(v.exit_code == 0);
  if (engine::build_info().cuda == engine::CudaBackend::On)
    CHECK(v.output.find("cuBLAS: /nonexistent/libcublas.so.13 not loadable") != std::string::npos);
}

// Nothing a command starts outlives it: the checkpoint parser (a process forked on the
// first load, io/hdf5_sandbox.cpp) is ended and reaped when the program exits, not left
// to notice the closed socket after the program is gone. The engine runs as the leader
// of a process group of its own; once it is reaped, no member may remain (signal 0 finds
// an unreaped zombie too).
TEST_CASE("engine verify leaves no process of its own behind when it exits") {
  const std::string checkpoint = source_dir() + "/tests/data/checkpoint_v2_cpu_mid_epoch.h5";
  const std::string program = engine_bin();
  for (int round = 0; round < 5; ++round) {
    ChildProcess engine = ChildProcess::fork_running([&] {
      ::setpgid(0, 0);
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, STDOUT_FILENO);
      ::dup2(devnull, STDERR_FILENO);
      ::execl(program.c_str(), "engine", "verify", checkpoint.c_str(), static_cast<char*>(nullptr));
    });
    const pid_t group = engine.pid();
    REQUIRE(group > 0);
    const int status = engine.wait();
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    errno = 0;
    const int found = ::kill(-group, 0);
    INFO("round " << round);
    CHECK(found == -1);
    CHECK(errno == ESRCH);
  }
}
