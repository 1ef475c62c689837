// Replay (docs/replay.md): `engine bisect`, `engine replay`, `engine audit` on real runs
// of 1024 Fashion-MNIST images (16 steps an epoch), and the step digests they rest on.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/io/step_digest.h"

using namespace test_util;
namespace fs = std::filesystem;

namespace {

// Three epochs of 16 steps, a save every 5 steps, a milestone every epoch.
std::string run_args(const std::string& dir, const std::string& data, const std::string& extra = "") {
  return "train \"" + source_dir() + "/configs/mnist.json\" --device cpu --run-dir \"" + dir + "\" --set data.dir=\"" +
         data + "\" --set data.train_limit=1024 --set data.val_split=256 --set data.test_limit=256"
         " --set data.batch_size=64 --set train.epochs=3 --set checkpoint.every_n_epochs=1"
         " --set checkpoint.every_n_steps=5 " + extra;
}

RunResult train(const std::string& dir, const std::string& env = "", const std::string& data = data_dir()) {
  RunResult r = run_with_env(env, run_args(dir, data));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return r;
}

// A copy of the data set whose training image `image` has one pixel changed.
std::string planted_data(int64_t image) {
  const std::string dir = fresh_dir("replay_planted_data");
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(data_dir() + "/" + f, dir + "/" + f);
  gzFile in = gzopen((data_dir() + "/train-images-idx3-ubyte.gz").c_str(), "rb");
  REQUIRE(in != nullptr);
  std::vector<unsigned char> bytes;
  unsigned char buf[1 << 16];
  for (int n; (n = gzread(in, buf, sizeof buf)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
  gzclose(in);
  REQUIRE(bytes.size() > static_cast<std::size_t>(16 + (image + 1) * 784));
  bytes[16 + image * 784 + 400] ^= 0x40;
  std::ofstream out(dir + "/train-images-idx3-ubyte", std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return dir;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// The number after `key` in `text` ("parted at global step 9 ...").
int64_t number_after(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(key);
  REQUIRE_MESSAGE(at != std::string::npos, key << " not in: " << text);
  return std::stoll(text.substr(at + key.size()));
}

}  // namespace

TEST_CASE("bisect names the first step whose batch holds a changed image; replays to it and to the step before agree") {
  if (!dataset_available()) return;
  const std::string a = fresh_dir("replay_bisect_a"), b = fresh_dir("replay_bisect_b");
  train(a);
  train(b, "", planted_data(100));
  RunResult r = run("bisect \"" + a + "\" \"" + b + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "from the recorded step digests"));
  CHECK(contains(r.output, "data.dir"));  // what differs between the configs
  CHECK(contains(r.output, "loss: differs"));
  CHECK(contains(r.output, "rng: same"));
  const int64_t step = number_after(r.output, "parted at global step ");
  CHECK(step >= 1);
  CHECK(step <= 16);  // image 100 is in every epoch's batches: the first epoch's
  // The replays agree: the same state at the step before, another at the step.
  const std::string out = fresh_dir("replay_bisect_out");
  const auto file = [&](const std::string& side, int64_t s) {
    return out + "/" + fs::path(side).filename().string() + "_" + std::to_string(s) + ".h5";
  };
  for (const int64_t s : {step - 1, step}) {
    for (const std::string& side : {a, b}) {
      r = run("replay \"" + side + "\" --to " + std::to_string(s) + " -o \"" + file(side, s) + "\" --check \"" +
              side + "\"");
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      CHECK(contains(r.output, "every one matches"));
    }
  }
  const auto diff = [&](int64_t s) { return run("diff \"" + file(a, s) + "\" \"" + file(b, s) + "\"").exit_code; };
  CHECK(diff(step - 1) == 0);
  CHECK(diff(step) == 1);

  // Without the records (one missing, the other cut short), bisect replays and finds it too.
  fs::remove(a + "/step_digests.jsonl");
  r = run("bisect \"" + a + "\" \"" + b + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "by replaying both"));
  CHECK(number_after(r.output, "parted at global step ") == step);
}

TEST_CASE("bisect says identical for runs that differ in thread count, kernel path, and a kill and resume") {
  if (!dataset_available()) return;
  const std::string straight = fresh_dir("replay_straight");
  train(straight);
  const std::string one_thread = fresh_dir("replay_one_thread");
  train(one_thread, "OMP_NUM_THREADS=1");
  const std::string portable = fresh_dir("replay_portable");
  train(portable, "ENGINE_CPU_KERNELS=portable");
  // Killed after step 23 (last.h5 at step 20, records to 23), then resumed: the records
  // after 20 are cut and written again by the resumed run.
  const std::string resumed = fresh_dir("replay_resumed");
  RunResult k = run_killed_after_step(23, run_args(resumed, data_dir()));
  CHECK(k.exit_code != 0);
  {
    // A torn last line as a kill during the write leaves it.
    std::ofstream log(resumed + "/step_digests.jsonl", std::ios::app);
    log << "0badc0de {\"step\":24,\"epo";
  }
  RunResult r = run(run_args(resumed, data_dir()));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "no end of line (a torn write)"));
  for (const std::string& other : {one_thread, portable, resumed}) {
    r = run("bisect \"" + straight + "\" \"" + other + "\"");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "identical through step 48 (from the recorded step digests)"));
  }
  // Every record of the straight run, as an independent reader parses it.
  const engine::step_digest_log::Contents c = engine::step_digest_log::read(straight + "/step_digests.jsonl");
  CHECK(c.cut_reason.empty());
  REQUIRE(c.steps.size() == 48);
  for (std::size_t i = 0; i < c.steps.size(); ++i) CHECK(c.steps[i].global_step == static_cast<int64_t>(i + 1));
  // Each checkpoint carries its step's digest: the record's, and what its tensors give.
  for (const char* f : {"last.h5", "epoch_0001.h5", "epoch_0002.h5"}) {
    const std::string path = straight + "/" + f;
    const engine::Checkpoint ck = engine::load_checkpoint(path);
    const int64_t step = ck.group("trainer").get_int("global_step");
    CHECK(engine::stored_step_digest(ck, path) == c.steps.at(static_cast<std::size_t>(step - 1)).combined());
    CHECK(engine::step_digest_of(ck, path).combined() == engine::stored_step_digest(ck, path));
  }
}

TEST_CASE("a replay to a mid-epoch step gives the bits of the run's own every_n_steps save there") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("replay_mid_epoch");
  // Killed after step 23: last.h5 is the step-20 save (epoch 2, step 4).
  RunResult k = run_killed_after_step(23, run_args(dir, data_dir()));
  CHECK(k.exit_code != 0);
  const engine::Checkpoint ck = engine::load_checkpoint(dir + "/last.h5");
  REQUIRE(ck.group("trainer").get_int("global_step") == 20);
  const std::string out = fresh_dir("replay_mid_epoch_out");
  // From the run's start, and from the epoch-1 milestone.
  for (const std::string& source : {dir, dir + "/epoch_0001.h5"}) {
    RunResult r = run("replay \"" + source + "\" --to 20 -o \"" + out + "/at20.h5\" --check \"" + dir + "\"");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(contains(r.output, "every one matches"));
    r = run("diff \"" + out + "/at20.h5\" \"" + dir + "/last.h5\"");
    INFO(r.output);
    CHECK(r.exit_code == 0);
  }
  // Bad arguments: one line, a non-zero exit.
  RunResult r = run("replay \"" + dir + "\" --to 100000 -o \"" + out + "/x.h5\"");
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "beyond the run's last step (48"));
  r = run("replay \"" + dir + "/epoch_0001.h5\" --to 3 -o \"" + out + "/x.h5\"");
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "behind the replay's start (step 16)"));
  r = run("replay \"" + dir + "\" --to 5");
  CHECK(r.exit_code == 2);
  r = run("replay \"" + out + "/none.h5\" --to 5 -o \"" + out + "/x.h5\"");
  CHECK(r.exit_code == 1);
  r = run("bisect \"" + dir + "\" \"" + out + "/none\"");
  CHECK(r.exit_code == 2);
  CHECK(!fs::exists(out + "/x.h5"));
}

TEST_CASE("audit reproduces every checkpoint of a run, and names one altered and re-sealed") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("replay_audit");
  train(dir);
  RunResult r = run("audit \"" + dir + "\" --jobs 2");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "reproduced       " + dir + "/epoch_0002.h5 (step 32, replayed from " + dir +
                               "/epoch_0001.h5)"));
  CHECK(contains(r.output, "reproduced       " + dir + "/last.h5 (step 48"));
  CHECK(contains(r.output, "0 not reproduced, 0 not compared"));
  MESSAGE(r.output);

  // One weight of the epoch-2 milestone changed, the file sealed again with sound
  // checksums: first with the digest it carried, then with one made to match.
  const std::string milestone = dir + "/epoch_0002.h5";
  engine::Checkpoint ck = engine::load_checkpoint(milestone);
  engine::Tensor& w = ck.groups.at("model").tensors.at("fc2.weight");
  w.f32()[3] = w.f32()[3] * 1.5f + 0.25f;
  engine::save_checkpoint(milestone, ck);
  CHECK(run("verify \"" + milestone + "\"").exit_code != 0);  // its own digest no longer matches
  r = run("audit \"" + dir + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "not reproduced   " + milestone + " (step 32"));
  CHECK(contains(r.output, "tensors: 1 of 40 differ: model/fc2.weight"));
  CHECK(contains(r.output, "do not give the step digest it carries"));
  MESSAGE(r.output);

  ck.groups.at("trainer").scalars["step_digest"] =
      engine::digest_hex(engine::step_digest_of(ck, milestone).combined());
  engine::save_checkpoint(milestone, ck);
  CHECK(run("verify \"" + milestone + "\"").exit_code == 0);
  r = run("audit \"" + dir + "\" --jobs 2");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "not reproduced   " + milestone));
  CHECK(contains(r.output, "a silent corruption before it was sealed, or a forged file"));
  MESSAGE(r.output);  // what a user reads
  // The checkpoints after it are replayed from the newest state that is reproduced.
  CHECK(contains(r.output, "reproduced       " + dir + "/last.h5 (step 48, replayed from " + dir + "/epoch_0001.h5)"));
  CHECK(contains(r.output, "1 not reproduced"));
}
