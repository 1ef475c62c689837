// Every released checkpoint format_version has a fixture in tests/data/ that this
// engine must keep reading (docs/checkpoint-format.md, "Versions and compatibility").
// The three CPU fixtures are the same kind of run: CPU, 1024 training images in batches
// of 64, killed mid-epoch after the step-20 save (epoch 1 complete, 4 steps into epoch
// 2). The two CUDA fixtures were written on an H200 (saved_on cuda:0): fp16 at the end
// of epoch 1, and fp32 at step 5 of epoch 2 by a per-step save just before a SIGKILL.
//
// Storage: checkpoint_v2_cpu_mid_epoch.h5 is a plain file (test_cli, test_crafted, the
// fuzz seeds and patched fuzz regressions, tools/crafted_checkpoints.py read it in
// place), and so is checkpoint_v3_cpu_mid_epoch.h5 (test_step_digest reads it with
// tools/check_step_digest.py). The other three are read by this test alone and are stored in one
// reproducible archive, tests/data/fixtures.tar.xz (everything tracked travels to the
// lent GPU machine, 64 MiB in all: docs/gpu-check.md), unpacked here once per run.
// To change them: unpack, edit, then from tests/data/
//   tar --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - checkpoint_v1_cpu_mid_epoch.h5 \
//     checkpoint_v2_cuda_fp16_epoch1.h5 checkpoint_v2_cuda_fp32_mid_epoch.h5 | xz -9e -T1 >fixtures.tar.xz
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/io/step_digest.h"

using namespace test_util;

namespace {

// The archive unpacked into a fresh directory (tar with xz, else Python's tarfile).
std::string unpack_fixture_archive() {
  const std::string archive = source_dir() + "/tests/data/fixtures.tar.xz";
  const std::string dir = fresh_dir("fixtures");
  const std::string tar = "tar -C \"" + dir + "\" -xJf \"" + archive + "\" 2>/dev/null";
  const std::string py = "python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \"" +
                         archive + "\" \"" + dir + "\"";
  if (std::system(tar.c_str()) != 0 && std::system(py.c_str()) != 0)
    FAIL("cannot unpack " << archive << " (needs tar and xz, or python3)");
  return dir;
}

std::string fixture(const char* name) {
  const std::string plain = source_dir() + "/tests/data/" + name;
  if (std::filesystem::exists(plain)) return plain;
  static const std::string unpacked = unpack_fixture_archive();
  const std::string path = unpacked + "/" + name;
  REQUIRE_MESSAGE(std::filesystem::exists(path), name << " is neither in tests/data/ nor in fixtures.tar.xz");
  return path;
}

// Every file older than version 4 gets trainer/step_digest from the upgrade: the digest
// of its stored step (engine/io/step_digest.h).
void check_upgraded_step_digest(const std::string& path, const engine::Checkpoint& ck) {
  CHECK(ck.groups.at("trainer").get_string("step_digest") ==
        engine::digest_hex(engine::step_digest_of(ck, path).combined()));
  CHECK(engine::stored_step_digest(ck, path) == engine::step_digest_of(ck, path).combined());
}

// Loads the fixture, checks what it holds (fc2.bias: the exact values h5py printed when
// it was made; epoch_elapsed_seconds: 0 before version 3, which added it), verifies it
// with the CLI, evaluates it and resumes it for one epoch.
void check_mid_epoch_fixture(const char* name, int64_t format_version, const std::vector<float>& fc2_bias,
                             double epoch_elapsed_seconds = 0.0) {
  const std::string path = fixture(name);
  const engine::Checkpoint ck = engine::load_checkpoint(path);
  CHECK(ck.meta.format_version == format_version);
  CHECK(ck.meta.saved_on == "cpu");
  CHECK(ck.groups.at("trainer").get_int("global_step") == 20);
  CHECK(ck.groups.at("trainer").get_int("step_in_epoch") == 4);
  CHECK(ck.groups.at("trainer").get_int("epoch") == 1);
  CHECK(ck.groups.at("optimizer").get_int("step/fc1.weight") == 20);
  CHECK(ck.groups.at("rng").get_string("algorithm") == "philox4x32-10");
  CHECK(ck.groups.at("model").get_tensor("fc2.bias").to_vector() == fc2_bias);
  CHECK(ck.groups.at("trainer").get_real("epoch_elapsed_seconds") == epoch_elapsed_seconds);
  check_upgraded_step_digest(path, ck);
  CHECK(run("verify \"" + path + "\"").exit_code == 0);

  if (!dataset_available()) return;
  RunResult r = run("eval \"" + path + "\" --device cpu --limit 256 --data-dir \"" + data_dir() + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  const std::string dir = fresh_dir(std::string("fixture_v") + std::to_string(format_version) + "_resume");
  r = run("resume \"" + path + "\" --device cpu --run-dir \"" + dir + "\" --set data.dir=\"" + data_dir() +
          "\" --stop-after-epochs 2");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 1") != std::string::npos);
  const engine::Checkpoint after = engine::load_checkpoint(dir + "/last.h5");
  CHECK(after.groups.at("trainer").get_int("epoch") == 2);
  CHECK(after.groups.at("trainer").get_int("global_step") == 32);
}

}  // namespace

TEST_CASE("format_version 1 fixture (written by engine 0.1.0) loads, evaluates and resumes") {
  check_mid_epoch_fixture("checkpoint_v1_cpu_mid_epoch.h5", 1,
                          {0.037644170224666595f, 0.011919811367988586f, -0.042249903082847595f, 0.0060997623950243f,
                           0.01485252846032381f, 0.04219144955277443f, 0.0059394133277237415f, 0.01663343608379364f,
                           0.07136961817741394f, -0.05508960410952568f});
}

TEST_CASE("format_version 2 fixture (metadata first) loads, evaluates and resumes") {
  check_mid_epoch_fixture("checkpoint_v2_cpu_mid_epoch.h5", 2,
                          {0.03764328360557556f, 0.011920550838112831f, -0.04224953055381775f, 0.006099761929363012f,
                           0.014852643944323063f, 0.04219064116477966f, 0.005939582362771034f, 0.016634324565529823f,
                           0.07136920839548111f, -0.05509006977081299f});
}

TEST_CASE("format_version 3 fixture (epoch_elapsed_seconds) loads, evaluates and resumes") {
  check_mid_epoch_fixture("checkpoint_v3_cpu_mid_epoch.h5", 3,
                          {0.03764338418841362f, 0.011919653974473476f, -0.0422491654753685f, 0.006099380552768707f,
                           0.014852521009743214f, 0.04219058156013489f, 0.005939937196671963f, 0.016633955761790276f,
                           0.07137010246515274f, -0.05508998781442642f},
                          0.080832942);
}

namespace {

// A checkpoint written on the GPU verifies, loads, evaluates and resumes to the end of
// its run on the CPU. What to expect is read from the config stored in it.
void check_cuda_fixture(const char* name, const std::string& precision, int64_t epoch, int64_t step_in_epoch) {
  const std::string path = fixture(name);
  CHECK(run("verify \"" + path + "\"").exit_code == 0);
  const engine::Checkpoint ck = engine::load_checkpoint(path);
  CHECK(ck.meta.format_version == 2);
  CHECK(ck.meta.saved_on == "cuda:0");
  check_upgraded_step_digest(path, ck);
  const nlohmann::json cfg = nlohmann::json::parse(ck.config_json);
  CHECK(cfg["precision"]["mode"] == precision);
  const int64_t images = cfg["data"]["train_limit"].get<int64_t>();
  const int64_t batch = cfg["data"]["batch_size"].get<int64_t>();
  const int64_t epochs = cfg["train"]["epochs"].get<int64_t>();
  const int64_t steps = (images + batch - 1) / batch;
  const engine::StateDict& trainer = ck.groups.at("trainer");
  CHECK(trainer.get_int("epoch") == epoch);
  CHECK(trainer.get_int("step_in_epoch") == step_in_epoch);
  CHECK(trainer.get_int("global_step") == epoch * steps + step_in_epoch);
  CHECK(trainer.get_tensor("epoch_sample_loss").numel() == images);
  RunResult r = run("inspect \"" + path + "\"");
  CHECK(r.output.find("cuda:0") != std::string::npos);

  if (!dataset_available()) return;
  r = run("eval \"" + path + "\" --device cpu --data-dir \"" + data_dir() + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("saved on cuda:0), evaluated on cpu") != std::string::npos);

  const std::string dir = fresh_dir(std::string("fixture_") + precision + "_cuda_resume");
  r = run("resume \"" + path + "\" --device cpu --run-dir \"" + dir + "\" --set data.dir=\"" + data_dir() + "\"");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("(saved on cuda:0, now on cpu)") != std::string::npos);
  CHECK(r.output.find("test: loss") != std::string::npos);
  const engine::Checkpoint after = engine::load_checkpoint(dir + "/last.h5");
  CHECK(after.meta.saved_on == "cpu");
  CHECK(after.groups.at("trainer").get_int("epoch") == epochs);
  CHECK(after.groups.at("trainer").get_int("global_step") == epochs * steps);
  // The CPU computes in fp32; an fp16 run's scaler state passes through unchanged.
  const engine::StateDict& scaler = ck.groups.at("scaler");
  CHECK(after.groups.at("scaler").get_int("enabled") == scaler.get_int("enabled"));
  CHECK(after.groups.at("scaler").get_real("scale") == scaler.get_real("scale"));
  CHECK(after.groups.at("scaler").get_int("growth_tracker") == scaler.get_int("growth_tracker"));
  // Sane metrics: every epoch's losses finite and falling, and a trained model's accuracy.
  const auto lines = read_lines(dir + "/metrics.jsonl");
  REQUIRE(lines.size() == static_cast<std::size_t>(epochs + 1));
  double previous = INFINITY;
  for (int64_t e = 0; e < epochs; ++e) {
    const auto j = nlohmann::json::parse(lines[e]);
    CHECK(j["epoch"] == e + 1);
    CHECK(std::isfinite(j["val_loss"].get<double>()));
    CHECK(j["train_loss"].get<double>() < previous);
    previous = j["train_loss"].get<double>();
  }
  const auto test = nlohmann::json::parse(lines.back());
  CHECK(test["test_acc"].get<double>() > 0.7);  // about 0.78 after 2 epochs of 1024 images
  CHECK(test["test_loss"].get<double>() < 0.9);
}

}  // namespace

TEST_CASE("a CUDA fp16 checkpoint (end of epoch 1, H200) verifies, evaluates and resumes to the end on the CPU") {
  check_cuda_fixture("checkpoint_v2_cuda_fp16_epoch1.h5", "fp16", 1, 0);
}

TEST_CASE("a CUDA fp32 checkpoint (step 5 of epoch 2, SIGKILL after a per-step save) resumes to the end on the CPU") {
  check_cuda_fixture("checkpoint_v2_cuda_fp32_mid_epoch.h5", "fp32", 1, 5);
}
