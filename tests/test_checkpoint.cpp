// The checkpoint file layer: bit-exact round trips, atomic writes, and clear refusal of
// every kind of bad file (docs/checkpoint-format.md).
#include <doctest/doctest.h>

#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <regex>
#include <thread>

#include <zlib.h>

#include "engine/io/checkpoint.h"
#include "io/checkpoint_reader.h"
#include "io/deferred_remove.h"
#include "support/checkpoint_testing.h"
#include "scratch_dir.h"
#include "support/child_process.h"

using namespace engine;
namespace fs = std::filesystem;

namespace {

std::string test_dir() { return test_util::scratch_root("test_checkpoint").string(); }

std::string tmp_path(const std::string& name) { return test_dir() + "/" + name; }

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

float f32_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double f64_bits(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

Tensor f32(const Shape& shape, const std::vector<float>& v) { return Tensor::from_vector(shape, v); }

Tensor f32_fill(const Shape& shape, float start) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + 0.001f * static_cast<float>(i);
  return f32(shape, v);
}

Tensor f16(const Shape& shape, const std::vector<uint16_t>& bits) {
  Tensor t = Tensor::empty(shape, DType::F16);
  std::memcpy(t.raw(), bits.data(), bits.size() * 2);
  return t;
}

Tensor i32(const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::I32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

Tensor u8(const Shape& shape, const std::vector<uint8_t>& v) {
  Tensor t = Tensor::empty(shape, DType::U8);
  std::memcpy(t.raw(), v.data(), v.size());
  return t;
}

// A small checkpoint with every group, every scalar kind and every tensor dtype.
Checkpoint sample() {
  Checkpoint c;
  c.meta.saved_on = "cpu";
  c.config_json = R"({"seed": 0, "optimizer": {"name": "adamw", "lr": 0.001}})";
  StateDict& model = c.groups["model"];
  model.tensors["conv1.weight"] = f32_fill({4, 1, 3, 3}, -0.5f);
  model.tensors["conv1.bias"] = f32_fill({4}, 0.25f);
  model.tensors["bn1.running_var"] = f32_fill({4}, 1.0f);
  model.scalars["bn1.num_batches_tracked"] = int64_t{938};

  StateDict& opt = c.groups["optimizer"];
  opt.scalars["name"] = std::string("adamw");
  opt.scalars["lr"] = 1e-3;
  opt.scalars["beta1"] = 0.9;
  opt.scalars["beta2"] = 0.999;
  opt.scalars["eps"] = 1e-8;
  opt.scalars["weight_decay"] = 0.01;
  for (const char* p : {"conv1.weight", "conv1.bias", "bn1.running_var"}) {
    const Shape& s = model.tensors[p].shape();
    opt.tensors[std::string("exp_avg/") + p] = f32_fill(s, 0.125f);
    opt.tensors[std::string("exp_avg_sq/") + p] = f32_fill(s, 0.0625f);
    opt.scalars[std::string("step/") + p] = int64_t{1234};
  }

  StateDict& sched = c.groups["scheduler"];
  sched.scalars["name"] = std::string("cosine");
  sched.scalars["base_lr"] = 1e-3;
  sched.scalars["eta_min"] = 0.0;
  sched.scalars["t_max"] = int64_t{15};
  sched.scalars["last_epoch"] = int64_t{3};

  StateDict& scaler = c.groups["scaler"];
  scaler.scalars["enabled"] = int64_t{0};
  scaler.scalars["scale"] = 65536.0;
  scaler.scalars["growth_interval"] = int64_t{2000};

  StateDict& rng = c.groups["rng"];
  rng.scalars["algorithm"] = std::string("philox4x32-10");
  rng.scalars["seed"] = int64_t{0};
  rng.scalars["init"] = int64_t{4096};
  rng.scalars["shuffle"] = int64_t{60000};
  rng.scalars["dropout"] = int64_t{123456789};

  StateDict& trainer = c.groups["trainer"];
  trainer.scalars["epoch"] = int64_t{3};
  trainer.scalars["global_step"] = int64_t{1290};
  trainer.scalars["best_metric"] = 0.3125;
  trainer.scalars["monitor"] = std::string("val_loss");

  StateDict& metrics = c.groups["metrics"];
  metrics.scalars["epoch"] = std::vector<double>{1, 2, 3};
  metrics.scalars["train_loss"] = std::vector<double>{0.9, 0.5, 0.4};
  metrics.scalars["val_acc"] = std::vector<double>{0.8, 0.85, 0.875};
  return c;
}

bool same_bits(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// Bitwise equality of two state dicts, with a message naming the first difference.
std::string state_difference(const StateDict& a, const StateDict& b) {
  if (a.tensors.size() != b.tensors.size()) return "tensor count differs";
  if (a.scalars.size() != b.scalars.size()) return "scalar count differs";
  for (const auto& [key, t] : a.tensors) {
    auto it = b.tensors.find(key);
    if (it == b.tensors.end()) return "missing tensor " + key;
    const Tensor& u = it->second;
    if (t.dtype() != u.dtype() || t.shape() != u.shape()) return "dtype/shape of " + key;
    if (!u.device().is_cpu()) return key + " not on the CPU";
    if (!same_bits(t.raw(), u.raw(), t.nbytes())) return "bits of " + key;
  }
  for (const auto& [key, s] : a.scalars) {
    auto it = b.scalars.find(key);
    if (it == b.scalars.end()) return "missing scalar " + key;
    if (s.index() != it->second.index()) return "kind of " + key;
    if (auto d = std::get_if<double>(&s)) {
      if (!same_bits(d, &std::get<double>(it->second), 8)) return "bits of " + key;
    } else if (auto v = std::get_if<std::vector<double>>(&s)) {
      const auto& w = std::get<std::vector<double>>(it->second);
      if (v->size() != w.size() || !same_bits(v->data(), w.data(), v->size() * 8)) return "series " + key;
    } else if (s != it->second) {
      return "value of " + key;
    }
  }
  return "";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG EXCEPTION TYPE: ") + e.what();
  }
  return "NO ERROR";
}

// Both load and verify refuse the file with one line that names it and contains `needle`.
void check_refused(const std::string& path, const std::string& needle) {
  for (int pass = 0; pass < 2; ++pass) {
    const std::string msg = error_of([&] {
      if (pass == 0) load_checkpoint(path);
      else verify_checkpoint_file(path);
    });
    INFO("message: " << msg);
    CHECK(msg.rfind(path + ": ", 0) == 0);
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find(needle) != std::string::npos);
  }
}

std::vector<std::string> temp_files_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) found.push_back(e.path().string());
  return found;
}

bool command_ok(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

}  // namespace

TEST_CASE("round trip keeps every tensor and scalar bit for bit") {
  Checkpoint c = sample();
  StateDict& extra = c.groups["trainer"];
  extra.scalars["int_min"] = std::numeric_limits<int64_t>::min();
  extra.scalars["int_max"] = std::numeric_limits<int64_t>::max();
  extra.scalars["minus_one"] = int64_t{-1};
  extra.scalars["nan"] = f64_bits(0x7ff8000000000123ull);  // NaN with a payload
  extra.scalars["inf"] = std::numeric_limits<double>::infinity();
  extra.scalars["neg_inf"] = -std::numeric_limits<double>::infinity();
  extra.scalars["denormal"] = std::numeric_limits<double>::denorm_min();
  extra.scalars["neg_zero"] = -0.0;
  extra.scalars["huge"] = std::numeric_limits<double>::max();
  extra.scalars["empty_text"] = std::string();
  extra.scalars["utf8_text"] = std::string("na\xc3\xafve \xe2\x80\x94 \xc3\xbc");
  extra.scalars["long_text"] = std::string(100000, 'x');
  extra.scalars["empty_series"] = std::vector<double>{};
  extra.scalars["odd_series"] = std::vector<double>{std::nan(""), -0.0, 5e-324, 1e308};
  extra.scalars["nested/deeper/series"] = std::vector<double>{1.5};
  extra.scalars["nested/count"] = int64_t{7};

  StateDict& t = c.groups["model"];
  t.tensors["rank0"] = f32({}, {3.5f});
  t.tensors["rank1_specials"] = f32({8}, {f32_bits(0x7fc00001), f32_bits(0xffc00000), INFINITY, -INFINITY,
                                          f32_bits(0x00000001), -0.0f, std::numeric_limits<float>::max(),
                                          std::numeric_limits<float>::lowest()});
  t.tensors["rank2"] = f32_fill({3, 5}, 1.0f);
  t.tensors["rank3"] = f32_fill({2, 3, 4}, -2.0f);
  t.tensors["rank4"] = f32_fill({2, 1, 3, 3}, 7.0f);
  t.tensors["empty"] = f32({0}, {});
  t.tensors["empty2"] = Tensor::empty({3, 0, 2});
  t.tensors["half"] = f16({2, 4}, {0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e01, 0x0001, 0x8000, 0x7bff});
  t.tensors["half0"] = f16({}, {0x3555});
  t.tensors["ints"] = i32({5}, {std::numeric_limits<int32_t>::min(), -1, 0, 1, std::numeric_limits<int32_t>::max()});
  std::vector<uint8_t> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<uint8_t>(i);
  t.tensors["bytes"] = u8({16, 16}, bytes);
  c.groups["ema"].tensors["shadow/conv1.weight"] = f32_fill({4, 1, 3, 3}, 0.0f);  // groups beyond the required ones

  const std::string path = tmp_path("roundtrip.h5");
  save_checkpoint(path, c);
  const Checkpoint back = load_checkpoint(path);

  CHECK(back.meta.format_version == kCheckpointFormatVersion);
  CHECK(!back.meta.engine_version.empty());
  CHECK(std::regex_match(back.meta.created_utc, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  CHECK(back.meta.saved_on == "cpu");
  CHECK(back.config_json == c.config_json);
  REQUIRE(back.groups.size() == c.groups.size());
  for (const auto& [name, d] : c.groups) {
    INFO("group " << name);
    REQUIRE(back.groups.count(name));
    CHECK(state_difference(d, back.groups.at(name)) == "");
  }
  verify_checkpoint_file(path);
}

TEST_CASE("the documented model and optimizer layout round trips") {
  Checkpoint c = sample();
  StateDict& model = c.groups["model"];
  model = StateDict{};
  const std::vector<std::pair<std::string, Shape>> params = {
      {"conv1.weight", {32, 1, 3, 3}}, {"conv1.bias", {32}},   {"bn1.weight", {32}},      {"bn1.bias", {32}},
      {"conv2.weight", {64, 32, 3, 3}}, {"conv2.bias", {64}},  {"bn2.weight", {64}},      {"bn2.bias", {64}},
      {"fc1.weight", {128, 3136}},      {"fc1.bias", {128}},   {"fc2.weight", {10, 128}}, {"fc2.bias", {10}}};
  StateDict& opt = c.groups["optimizer"];
  opt.tensors.clear();
  for (auto it = opt.scalars.begin(); it != opt.scalars.end();)
    it = it->first.find('/') != std::string::npos ? opt.scalars.erase(it) : std::next(it);
  for (const auto& [name, shape] : params) {
    model.tensors[name] = f32_fill(shape, 0.01f);
    opt.tensors["exp_avg/" + name] = f32_fill(shape, 0.02f);
    opt.tensors["exp_avg_sq/" + name] = f32_fill(shape, 0.03f);
    opt.scalars["step/" + name] = int64_t{4300};
  }
  for (const char* bn : {"bn1", "bn2"}) {
    const Shape s = {std::string(bn) == "bn1" ? 32 : 64};
    model.tensors[std::string(bn) + ".running_mean"] = f32_fill(s, 0.0f);
    model.tensors[std::string(bn) + ".running_var"] = f32_fill(s, 1.0f);
    model.scalars[std::string(bn) + ".num_batches_tracked"] = int64_t{4300};
  }
  const std::string path = tmp_path("layout.h5");
  save_checkpoint(path, c);
  const Checkpoint back = load_checkpoint(path);
  CHECK(state_difference(c.groups["model"], back.groups.at("model")) == "");
  CHECK(state_difference(c.groups["optimizer"], back.groups.at("optimizer")) == "");
  CHECK(back.groups.at("optimizer").get_tensor("exp_avg/fc1.weight").shape() == Shape{128, 3136});
  CHECK(back.groups.at("optimizer").get_int("step/fc2.bias") == 4300);
}

TEST_CASE("saving is atomic and replaces an existing file") {
  const std::string dir = test_dir() + "/atomic";
  fs::create_directories(dir);
  const std::string path = dir + "/last.h5";
  Checkpoint first = sample();
  save_checkpoint(path, first);
  CHECK(temp_files_in(dir).empty());

  Checkpoint second = sample();
  second.groups["trainer"].scalars["epoch"] = int64_t{4};
  second.groups["model"].tensors["conv1.bias"] = f32({4}, {9, 8, 7, 6});
  save_checkpoint(path, second);
  CHECK(temp_files_in(dir).empty());
  const Checkpoint back = load_checkpoint(path);
  CHECK(back.groups.at("trainer").get_int("epoch") == 4);
  CHECK(back.groups.at("model").get_tensor("conv1.bias").to_vector() == std::vector<float>{9, 8, 7, 6});

  // Relative paths work too (the temporary file goes into the current directory).
  const fs::path old_cwd = fs::current_path();
  fs::current_path(dir);
  save_checkpoint("relative.h5", first);
  fs::current_path(old_cwd);
  CHECK(load_checkpoint(dir + "/relative.h5").groups.at("trainer").get_int("epoch") == 3);
  CHECK(temp_files_in(dir).empty());
}

namespace {
std::vector<std::string> hidden_files_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string()[0] == '.') found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  return found;
}
}  // namespace

TEST_CASE("replacing a checkpoint leaves no hidden files once the background removals are done") {
  const std::string dir = tmp_path("replace_dir");
  fs::create_directories(dir);
  const std::string path = dir + "/last.h5";
  for (int i = 0; i < 3; ++i) save_checkpoint(path, sample());
  finish_pending_removals();
  CHECK(hidden_files_in(dir).empty());
  verify_checkpoint_file(path);
}

TEST_CASE("a process forked after a save saves, drains and exits without waiting for its parent's remover") {
  const std::string dir = tmp_path("fork_dir");
  fs::create_directories(dir);
  const std::string path = dir + "/last.h5";
  save_checkpoint(path, sample());
  save_checkpoint(path, sample());  // a replacement: the background remover runs now
  test_util::ChildProcess child = test_util::ChildProcess::fork_running([&] {
    alarm(20);  // a hang ends the child with SIGALRM, which the parent sees
    save_checkpoint(path, sample());
    finish_pending_removals();
    std::exit(0);  // runs the exit handlers, as a normal child would
  });
  REQUIRE(child.pid() > 0);
  const int status = child.wait();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  finish_pending_removals();
  CHECK(hidden_files_in(dir).empty());
  verify_checkpoint_file(path);
}

TEST_CASE("a reader holding the replaced file open keeps reading the old version") {
  const std::string path = tmp_path("held_open.h5");
  Checkpoint first = sample();
  save_checkpoint(path, first);
  const std::vector<unsigned char> old_bytes = read_bytes(path);
  std::ifstream held(path, std::ios::binary);
  REQUIRE(held.good());
  Checkpoint second = sample();
  second.groups["model"].tensors["conv1.bias"] = f32_fill({4}, 9.0f);
  save_checkpoint(path, second);
  save_checkpoint(path, second);
  finish_pending_removals();
  const std::vector<unsigned char> seen((std::istreambuf_iterator<char>(held)), {});
  CHECK(seen == old_bytes);
  CHECK(read_bytes(path) != old_bytes);
}

TEST_CASE("hidden leftovers of a process that died are swept by the next save in that directory") {
  const std::string dir = tmp_path("sweep_dir");
  fs::create_directories(dir);
  test_util::ChildProcess exited = test_util::ChildProcess::fork_running([] { _exit(0); });
  const pid_t child = exited.pid();
  REQUIRE(child > 0);
  exited.wait();  // its pid now belongs to no process
  const std::string dead = std::to_string(child), alive = std::to_string(getppid());
  // Temporary files go only once an hour old: in a directory shared between machines a
  // young one may be another machine's save in progress.
  const std::vector<std::string> swept = {".last.h5.old." + dead + ".0", ".epoch_0003.h5.tmp." + dead};
  const std::vector<std::string> kept = {".best.h5.tmp." + alive, ".notes.txt.tmp." + dead,
                                         ".last.h5.old." + dead + ".x", ".last.h5.tmp." + dead};
  for (const auto& name : swept) write_bytes(dir + "/" + name, {1, 2, 3});
  for (const auto& name : kept) write_bytes(dir + "/" + name, {1, 2, 3});
  for (const std::string name : {".epoch_0003.h5.tmp." + dead, ".best.h5.tmp." + alive})
    fs::last_write_time(dir + "/" + name, fs::file_time_type::clock::now() - std::chrono::hours(2));
  save_checkpoint(dir + "/last.h5", sample());
  finish_pending_removals();
  std::vector<std::string> expected = kept;
  std::sort(expected.begin(), expected.end());
  CHECK(hidden_files_in(dir) == expected);
}

TEST_CASE("a failed save keeps the previous file and leaves no temporary file") {
  const std::string dir = test_dir() + "/failed";
  fs::create_directories(dir);
  const std::string path = dir + "/last.h5";
  save_checkpoint(path, sample());
  const auto before = read_bytes(path);

  Checkpoint bad = sample();
  bad.groups.erase("rng");
  std::string msg = error_of([&] { save_checkpoint(path, bad); });
  CHECK(msg == path + ": checkpoint has no 'rng' group");
  CHECK(read_bytes(path) == before);

  // A directory is refused before anything is written (rename would fail on it anyway).
  const std::string target_dir = dir + "/is_a_dir";
  fs::create_directories(target_dir);
  msg = error_of([&] { save_checkpoint(target_dir, sample()); });
  CHECK(msg == target_dir + ": is a directory, not a file");
  CHECK(temp_files_in(dir).empty());

  msg = error_of([&] { save_checkpoint(dir + "/no/such/dir/x.h5", sample()); });
  CHECK(msg.rfind(dir + "/no/such/dir/x.h5: cannot create temporary file", 0) == 0);

  Checkpoint no_device = sample();
  no_device.meta.saved_on.clear();
  CHECK(error_of([&] { save_checkpoint(path, no_device); }).find("saved_on is empty") != std::string::npos);
  CHECK(read_bytes(path) == before);
}

TEST_CASE("a flipped bit anywhere is a checksum mismatch") {
  const std::string path = tmp_path("flip_source.h5");
  save_checkpoint(path, sample());
  const auto good = read_bytes(path);
  REQUIRE(good.size() > 2048);

  std::vector<std::size_t> offsets;
  for (std::size_t i = 0; i < 512; ++i) offsets.push_back(i);  // the whole header, magic included
  for (std::size_t i = 512; i < good.size(); i += 997) offsets.push_back(i);
  offsets.push_back(good.size() / 2);
  offsets.push_back(good.size() - 1);

  const std::string damaged = tmp_path("flipped.h5");
  for (std::size_t off : offsets) {
    for (int bit : {static_cast<int>(off % 8), 7}) {
      auto bytes = good;
      bytes[off] ^= static_cast<unsigned char>(1u << bit);
      write_bytes(damaged, bytes);
      const std::string msg = error_of([&] { load_checkpoint(damaged); });
      INFO("offset " << off << " bit " << bit << ": " << msg);
      CHECK(msg.rfind(damaged + ": checksum mismatch (file is corrupt)", 0) == 0);
    }
  }
  write_bytes(damaged, good);
  verify_checkpoint_file(damaged);
}

TEST_CASE("loading from bytes in memory checks and returns what loading the file does") {
  const std::string path = tmp_path("from_bytes.h5");
  save_checkpoint(path, sample());
  const auto good = read_bytes(path);
  const Checkpoint from_file = load_checkpoint(path);
  const Checkpoint from_bytes = checkpoint_internal::load_checkpoint_from_bytes("buffer", good.data(), good.size());
  CHECK(from_bytes.meta.created_utc == from_file.meta.created_utc);
  CHECK(from_bytes.config_json == from_file.config_json);
  REQUIRE(from_bytes.groups.size() == from_file.groups.size());
  for (const auto& [group, d] : from_file.groups) {
    INFO("group " << group);
    REQUIRE(from_bytes.groups.count(group));
    CHECK(state_difference(d, from_bytes.groups.at(group)) == "");
  }

  auto damaged = good;
  damaged[good.size() / 2] ^= 1;
  CHECK(error_of([&] { checkpoint_internal::load_checkpoint_from_bytes("buffer", damaged.data(), damaged.size()); })
            .rfind("buffer: checksum mismatch (file is corrupt)", 0) == 0);
  CHECK(error_of([&] { checkpoint_internal::load_checkpoint_from_bytes("buffer", good.data(), good.size() - 1); })
            .rfind("buffer: truncated", 0) == 0);
  CHECK(error_of([&] { checkpoint_internal::load_checkpoint_from_bytes("buffer", good.data(), 0); }) ==
        "buffer: truncated: the file is empty");
}

namespace {
uint64_t header_number(const std::vector<unsigned char>& file, const std::string& key) {
  const std::string text(file.begin(), file.begin() + 512);
  const std::size_t at = text.find("\n" + key + " ");
  REQUIRE(at != std::string::npos);
  return std::stoull(text.substr(at + key.size() + 2));
}

// Replaces one header line and recomputes header_crc32, as a writer bug would leave it.
void rewrite_header_line(std::vector<unsigned char>& file, const std::string& key, const std::string& value) {
  std::string text(reinterpret_cast<const char*>(file.data()));
  const std::size_t at = text.find("\n" + key + " ") + 1;
  const std::size_t end = text.find('\n', at);
  text.replace(at, end - at, key + " " + value);
  const std::size_t crc_line = text.rfind("header_crc32 ");
  text.resize(crc_line);
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08lx", crc32(0, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
  text += std::string("header_crc32 ") + crc + "\n";
  REQUIRE(text.size() < 512);
  std::fill(file.begin(), file.begin() + 512, 0);
  std::copy(text.begin(), text.end(), file.begin());
}
}  // namespace

TEST_CASE("a flipped bit in a large file is a checksum mismatch, with one thread or two") {
  // Files of 1 MiB and more are checksummed on a second thread while they are read.
  Checkpoint c = sample();
  c.groups["model"].tensors["big.weight"] = f32_fill({1024, 1024}, 0.5f);  // 4 MiB
  const std::string path = tmp_path("big_source.h5");
  save_checkpoint(path, c);
  const auto good = read_bytes(path);
  REQUIRE(good.size() > (std::size_t(4) << 20));
  const std::string damaged = tmp_path("big_flipped.h5");
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const std::size_t metadata_end = 512 + header_number(good, "metadata_bytes");
    for (std::size_t off : {std::size_t(600), metadata_end + 100, std::size_t(300) << 10, good.size() / 2,
                            good.size() - 1}) {
      auto bytes = good;
      bytes[off] ^= 0x10;
      write_bytes(damaged, bytes);
      const std::string msg = error_of([&] { load_checkpoint(damaged); });
      INFO(threads << " threads, offset " << off << ": " << msg);
      CHECK(msg.rfind(damaged + ": checksum mismatch (file is corrupt)", 0) == 0);
    }
    write_bytes(damaged, good);
    const Checkpoint back = load_checkpoint(damaged);
    for (const auto& [group, d] : c.groups) {
      INFO(threads << " threads, group " << group);
      CHECK(state_difference(d, back.groups.at(group)).empty());
    }
  }
  omp_set_num_threads(threads_before);
}


TEST_CASE("a file whose header understates metadata_bytes still loads right") {
  // A writer that got metadata_bytes wrong (too small) makes the walk meet metadata that
  // the second thread is still reading; the loader then walks again once everything is
  // read and checked. Many small tensors (metadata far past the 64 KiB margin) and one
  // large one (a long read) make that overlap likely.
  Checkpoint c = sample();
  for (int i = 0; i < 2000; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "t%04d.weight", i);
    c.groups["model"].tensors[name] = f32_fill({64}, static_cast<float>(i));
  }
  c.groups["model"].tensors["big.weight"] = f32_fill({16 * 1024 * 1024}, 0.5f);  // 64 MiB
  const std::string path = tmp_path("understated.h5");
  save_checkpoint(path, c);
  auto bytes = read_bytes(path);
  const uint64_t metadata = header_number(bytes, "metadata_bytes");
  REQUIRE(metadata > 256 * 1024);
  const uint64_t claimed = 4096;
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08lx", crc32(0, bytes.data() + 512, static_cast<uInt>(claimed)));
  rewrite_header_line(bytes, "metadata_crc32", crc);
  rewrite_header_line(bytes, "metadata_bytes", std::to_string(claimed));
  write_bytes(path, bytes);
  for (int attempt = 0; attempt < 3; ++attempt) {
    INFO("attempt " << attempt);
    const Checkpoint back = load_checkpoint(path);
    CHECK(state_difference(c.groups.at("model"), back.groups.at("model")).empty());
  }
}

TEST_CASE("a large file loads inside a parallel region that can give it only one thread") {
  // Nested in an active region, the loader's two-thread region gets one thread, which
  // then walks the metadata and reads the data itself.
  Checkpoint c = sample();
  c.groups["model"].tensors["big.weight"] = f32_fill({1024, 1024}, 0.5f);
  const std::string path = tmp_path("nested.h5");
  save_checkpoint(path, c);
  const int levels_before = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  int max_threads_inside = 0, team_inside = 0;
  std::string error;
  Checkpoint back;
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 0) {
      max_threads_inside = omp_get_max_threads();
#pragma omp parallel num_threads(2)
      {
        if (omp_get_thread_num() == 0) team_inside = omp_get_num_threads();
      }
      try {
        back = load_checkpoint(path);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  omp_set_max_active_levels(levels_before);
  REQUIRE(max_threads_inside >= 2);  // so the loader takes its two-thread path
  CHECK(team_inside == 1);
  CHECK(error.empty());
  for (const auto& [group, d] : c.groups) {
    INFO("group " << group);
    CHECK(state_difference(d, back.groups.at(group)).empty());
  }
}

TEST_CASE("a large file keeps its metadata first, checked on its own before the data") {
  Checkpoint c = sample();
  c.groups["model"].tensors["big.weight"] = f32_fill({1024, 1024}, 0.5f);
  const std::string path = tmp_path("split.h5");
  save_checkpoint(path, c);
  const auto good = read_bytes(path);
  const uint64_t metadata = header_number(good, "metadata_bytes"), payload = header_number(good, "payload_bytes");
  CHECK(metadata > 0);
  CHECK(metadata < 64 * 1024);  // the walk can start after reading a few pages
  CHECK(payload == good.size() - 512);

  auto bytes = good;
  bytes[512 + metadata / 2] ^= 0x01;
  write_bytes(tmp_path("split_bad.h5"), bytes);
  check_refused(tmp_path("split_bad.h5"), "crc32 of the HDF5 metadata is");
  bytes = good;
  bytes[512 + metadata + (payload - metadata) / 2] ^= 0x01;
  write_bytes(tmp_path("split_bad.h5"), bytes);
  check_refused(tmp_path("split_bad.h5"), "crc32 of the HDF5 payload is");

  bytes = good;
  rewrite_header_line(bytes, "metadata_bytes", std::to_string(payload + 1));
  write_bytes(tmp_path("split_bad.h5"), bytes);
  check_refused(tmp_path("split_bad.h5"), "header lacks a valid metadata_bytes or metadata_crc32");
  bytes = good;
  rewrite_header_line(bytes, "metadata_bytes", std::to_string(metadata + 8));
  write_bytes(tmp_path("split_bad.h5"), bytes);
  check_refused(tmp_path("split_bad.h5"), "crc32 of the HDF5 metadata is");
}

TEST_CASE("truncated and extended files are refused") {
  const std::string path = tmp_path("trunc_source.h5");
  save_checkpoint(path, sample());
  const auto good = read_bytes(path);
  const std::string cut = tmp_path("truncated.h5");
  for (std::size_t size : {std::size_t{0}, std::size_t{10}, std::size_t{100}, std::size_t{511}, std::size_t{512},
                           std::size_t{1000}, good.size() / 2, good.size() - 1}) {
    INFO("size " << size);
    write_bytes(cut, std::vector<unsigned char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(size)));
    check_refused(cut, "truncated");
  }
  auto longer = good;
  longer.push_back(0);
  write_bytes(cut, longer);
  check_refused(cut, "length mismatch (file is corrupt)");
}

TEST_CASE("files that are not engine checkpoints are refused") {
  std::mt19937 gen(1234);
  std::vector<unsigned char> noise(4096);
  for (auto& b : noise) b = static_cast<unsigned char>(gen());
  const std::string random_path = tmp_path("random.bin");
  write_bytes(random_path, noise);
  check_refused(random_path, "not an engine checkpoint");

  const std::string text_path = tmp_path("config.json");
  const std::string text = "{\"seed\": 0}\n";
  write_bytes(text_path, std::vector<unsigned char>(text.begin(), text.end()));
  check_refused(text_path, "not an engine checkpoint");

  const std::string plain = tmp_path("plain.h5");
  checkpoint_testing::Tamper tamper;
  tamper.plain_hdf5 = true;
  checkpoint_testing::save_tampered(plain, sample(), tamper);
  check_refused(plain, "not an engine checkpoint: a plain HDF5 file");

  check_refused(tmp_path("does_not_exist.h5"), "cannot open");
  check_refused(test_dir(), "is a directory, not a file");

  // A huge file (sparse: it costs no disk) is refused from its first bytes, without
  // being read or allocated.
  const std::string huge = tmp_path("huge.bin");
  write_bytes(huge, noise);
  fs::resize_file(huge, std::uintmax_t(1) << 40);
  check_refused(huge, "not an engine checkpoint");
  fs::remove(huge);
}

TEST_CASE("a newer format_version is refused, naming both versions") {
  const std::string path = tmp_path("v7.h5");
  checkpoint_testing::Tamper tamper;
  tamper.format_version = 7;
  checkpoint_testing::save_tampered(path, sample(), tamper);
  const std::string msg = error_of([&] { load_checkpoint(path); });
  CHECK(msg == path + ": format_version 7 is newer than this engine supports (" + std::to_string(kCheckpointFormatVersion) + "); upgrade the engine");

  tamper.format_version = 0;
  checkpoint_testing::save_tampered(path, sample(), tamper);
  check_refused(path, "format_version 0 is not a valid version");
}

TEST_CASE("missing groups and root attributes are refused") {
  const std::string path = tmp_path("missing.h5");
  for (const std::string& group : checkpoint_required_groups()) {
    checkpoint_testing::Tamper tamper;
    tamper.omit_groups = {group};
    checkpoint_testing::save_tampered(path, sample(), tamper);
    check_refused(path, "missing group /" + group);
  }
  for (const char* attr : {"format", "format_version", "engine_version", "created_utc", "saved_on", "config"}) {
    checkpoint_testing::Tamper tamper;
    tamper.omit_root_attributes = {attr};
    checkpoint_testing::save_tampered(path, sample(), tamper);
    check_refused(path, std::string("missing root attribute '") + attr + "'");
  }
}

TEST_CASE("absurd shapes are refused before anything is allocated") {
  const std::string path = tmp_path("absurd.h5");
  auto refuse = [&](const std::vector<uint64_t>& dims, const std::string& needle) {
    checkpoint_testing::Tamper tamper;
    tamper.raw_datasets = {{"/model/huge", "float32", dims, false}};
    checkpoint_testing::save_tampered(path, sample(), tamper);
    // A bad_alloc here would mean the loader tried to allocate first.
    check_refused(path, needle);
  };
  refuse({1u << 20, 1u << 20, 1u << 20}, "/model/huge has shape [1048576, 1048576, 1048576], more than 2^31 elements");
  refuse({65536, 32769}, "more than 2^31 elements");
  refuse({uint64_t{1} << 40}, "more than 2^31 elements");
  refuse({1, 1, 1, 1, 1, 1, 1, 1, 1}, "/model/huge has rank 9 (at most 8)");
  refuse({4}, "/model/huge has no stored data");
}

TEST_CASE("datasets of unsupported dtypes are refused") {
  const std::string path = tmp_path("dtype.h5");
  auto refuse = [&](const checkpoint_testing::RawDataset& raw, const std::string& needle) {
    checkpoint_testing::Tamper tamper;
    tamper.raw_datasets = {raw};
    checkpoint_testing::save_tampered(path, sample(), tamper);
    check_refused(path, needle);
  };
  refuse({"/model/w", "float64", {2, 2}, false}, "/model/w has unsupported dtype float64");
  refuse({"/optimizer/x", "int64", {3}, false}, "/optimizer/x has unsupported dtype int64");
  refuse({"/model/w", "int16", {3}, false}, "has unsupported dtype int16");
  refuse({"/model/w", "string", {}, false}, "has unsupported dtype string");
  refuse({"/metrics/loss2d", "float64", {2, 3}, true}, "/metrics/loss2d is a series of rank 2");
  refuse({"/metrics/f32", "float32", {3}, true}, "/metrics/f32 is a series of float32");
}

TEST_CASE("data kept in external files is refused") {
  const std::string path = tmp_path("external.h5");
  checkpoint_testing::Tamper tamper;
  checkpoint_testing::RawDataset raw{"/model/ext", "float32", {64}, false};
  raw.external_file = tmp_path("external.bin");
  tamper.raw_datasets = {raw};
  checkpoint_testing::save_tampered(path, sample(), tamper);
  check_refused(path, "/model/ext keeps its data in external files");
}

TEST_CASE("loaded tensors live in the verified file buffer and outlive the checkpoint") {
  const std::string path = tmp_path("views.h5");
  const Checkpoint saved = sample();
  save_checkpoint(path, saved);
  // Where the two tensors' bytes are in the file (each pattern occurs once).
  const std::vector<unsigned char> file = read_bytes(path);
  auto offset_in_file = [&](const Tensor& t) {
    const auto* p = static_cast<const unsigned char*>(t.raw());
    const auto it = std::search(file.begin(), file.end(), p, p + t.nbytes());
    REQUIRE(it != file.end());
    REQUIRE(std::search(it + 1, file.end(), p, p + t.nbytes()) == file.end());
    return static_cast<std::ptrdiff_t>(it - file.begin());
  };
  const std::ptrdiff_t apart_in_file = offset_in_file(saved.groups.at("optimizer").tensors.at("exp_avg/conv1.weight")) -
                                       offset_in_file(saved.groups.at("model").tensors.at("conv1.weight"));
  Tensor weight, moment;
  {
    Checkpoint back = load_checkpoint(path);
    CHECK(state_difference(saved.groups.at("model"), back.groups.at("model")).empty());
    weight = back.groups.at("model").tensors.at("conv1.weight");
    moment = back.groups.at("optimizer").tensors.at("exp_avg/conv1.weight");
    // Views into one copy of the file: as far apart in memory as in the file.
    CHECK(static_cast<const unsigned char*>(moment.raw()) - static_cast<const unsigned char*>(weight.raw()) ==
          apart_in_file);
    for (const auto& [group, d] : back.groups)
      for (const auto& [key, t] : d.tensors) {
        INFO(group << "/" << key);
        CHECK(reinterpret_cast<std::uintptr_t>(t.raw()) % 64 == 0);
      }
  }
  // The checkpoint is gone; the tensors keep the buffer alive and stay independent.
  const Tensor& expected_weight = saved.groups.at("model").tensors.at("conv1.weight");
  const Tensor& expected_moment = saved.groups.at("optimizer").tensors.at("exp_avg/conv1.weight");
  CHECK(same_bits(weight.raw(), expected_weight.raw(), weight.nbytes()));
  weight.f32()[0] = 42.0f;
  CHECK(same_bits(moment.raw(), expected_moment.raw(), moment.nbytes()));
  const Checkpoint again = load_checkpoint(path);  // a new buffer: the file is untouched
  CHECK(again.groups.at("model").tensors.at("conv1.weight").f32()[0] == expected_weight.f32()[0]);
}

TEST_CASE("two tensors stored in the same bytes are refused") {
  // Points the layout of one tensor at the data of another of the same size, as only a
  // hand-crafted file can, then reseals the header so the structure check sees it.
  const std::string path = tmp_path("shared.h5");
  const Checkpoint c = sample();
  save_checkpoint(path, c);
  std::vector<unsigned char> bytes = read_bytes(path);
  auto find = [&](const void* needle, std::size_t n) {
    std::vector<std::size_t> at;
    const auto* p = static_cast<const unsigned char*>(needle);
    for (auto it = bytes.begin(); (it = std::search(it, bytes.end(), p, p + n)) != bytes.end(); ++it)
      at.push_back(static_cast<std::size_t>(it - bytes.begin()));
    return at;
  };
  const Tensor& a = c.groups.at("model").tensors.at("conv1.weight");
  const Tensor& b = c.groups.at("optimizer").tensors.at("exp_avg/conv1.weight");
  const std::vector<std::size_t> data_a = find(a.raw(), a.nbytes()), data_b = find(b.raw(), b.nbytes());
  REQUIRE(data_a.size() == 1);
  REQUIRE(data_b.size() == 1);
  // Addresses in the HDF5 metadata are relative to the end of the 512-byte user block.
  const uint64_t address_a = data_a[0] - 512, address_b = data_b[0] - 512;
  const std::vector<std::size_t> refs = find(&address_b, 8);
  REQUIRE(refs.size() == 1);
  std::memcpy(bytes.data() + refs[0], &address_a, 8);
  write_bytes(path, bytes);
  checkpoint_testing::reseal(path);
  check_refused(path, "share stored bytes");
}

TEST_CASE("wrapper prefixes are stripped from model and optimizer keys") {
  Checkpoint c = sample();
  StateDict& model = c.groups["model"];
  model = StateDict{};
  model.tensors["module.conv1.weight"] = f32_fill({2, 1, 3, 3}, 0.5f);
  model.tensors["_orig_mod.fc.bias"] = f32_fill({3}, 0.5f);
  model.tensors["module._orig_mod.bn.running_mean"] = f32_fill({2}, 0.5f);
  model.scalars["module.bn.num_batches_tracked"] = int64_t{5};
  StateDict& opt = c.groups["optimizer"];
  opt = StateDict{};
  opt.scalars["lr"] = 0.1;
  opt.tensors["exp_avg/module.conv1.weight"] = f32_fill({2, 1, 3, 3}, 0.5f);
  opt.scalars["step/_orig_mod.conv1.weight"] = int64_t{9};
  c.groups["trainer"].scalars["module.note"] = std::string("other groups keep their keys");

  const std::string path = tmp_path("prefixes.h5");
  save_checkpoint(path, c);
  const Checkpoint back = load_checkpoint(path);
  const StateDict& m = back.groups.at("model");
  CHECK(m.tensors.count("conv1.weight"));
  CHECK(m.tensors.count("fc.bias"));
  CHECK(m.tensors.count("bn.running_mean"));
  CHECK(m.get_int("bn.num_batches_tracked") == 5);
  CHECK(m.tensors.size() == 3);
  const StateDict& o = back.groups.at("optimizer");
  CHECK(o.tensors.count("exp_avg/conv1.weight"));
  CHECK(o.get_int("step/conv1.weight") == 9);
  CHECK(o.get_real("lr") == 0.1);
  CHECK(back.groups.at("trainer").scalars.count("module.note"));
  CHECK(strip_wrapper_prefixes("module._orig_mod.x") == "x");
  CHECK(strip_wrapper_prefixes("module.") == "module.");
  CHECK(strip_wrapper_prefixes("modulex.y") == "modulex.y");

  model.tensors["conv1.weight"] = f32_fill({2, 1, 3, 3}, 0.5f);
  const std::string msg = error_of([&] { save_checkpoint(path, c); });
  CHECK(msg == path + ": model keys 'conv1.weight' and 'module.conv1.weight' both become 'conv1.weight' once wrapper "
                      "prefixes are stripped");
}

TEST_CASE("keys that cannot be stored are refused on save") {
  const std::string path = tmp_path("keys.h5");
  auto refuse = [&](const std::function<void(Checkpoint&)>& edit, const std::string& needle) {
    Checkpoint c = sample();
    edit(c);
    const std::string msg = error_of([&] { save_checkpoint(path, c); });
    INFO(msg);
    CHECK(msg.rfind(path + ": ", 0) == 0);
    CHECK(msg.find(needle) != std::string::npos);
  };
  refuse([](Checkpoint& c) { c.groups["model"].tensors["a//b"] = f32({}, {1}); }, "'a//b' is not a valid key");
  refuse([](Checkpoint& c) { c.groups["model"].tensors["/a"] = f32({}, {1}); }, "'/a' is not a valid key");
  refuse([](Checkpoint& c) { c.groups["model"].scalars["a/"] = int64_t{1}; }, "'a/' is not a valid key");
  refuse([](Checkpoint& c) { c.groups["model"].scalars["."] = int64_t{1}; }, "'.' is not a valid key");
  refuse([](Checkpoint& c) { c.groups["model"].scalars["conv1.bias"] = 1.0; }, "is both a tensor and a scalar");
  refuse([](Checkpoint& c) { c.groups["model"].tensors["conv1.bias/x"] = f32({}, {1}); },
         "'conv1.bias' is a dataset and also the group");
  refuse([](Checkpoint& c) { c.groups["a/b"] = StateDict{}; }, "group name 'a/b' is not valid");
  refuse([](Checkpoint& c) { c.groups["model"].tensors["undefined"] = Tensor(); }, "tensor model/undefined is undefined");
  refuse([](Checkpoint& c) { c.groups["trainer"].scalars["t"] = std::string("a\0b", 3); }, "contains a NUL");
}

TEST_CASE("diff reports identical files and the largest difference") {
  const std::string a = tmp_path("diff_a.h5"), b = tmp_path("diff_b.h5");
  save_checkpoint(a, sample());
  save_checkpoint(b, sample());
  CheckpointDiff d = diff_checkpoints(a, b);
  INFO(d.report);
  CHECK(d.identical);
  CHECK(d.report.find("model/conv1.weight: identical") != std::string::npos);
  CHECK(d.report.find("optimizer/lr: identical") != std::string::npos);
  CHECK(d.report.find("metrics/train_loss: identical") != std::string::npos);
  CHECK(d.report.find("verdict: identical") != std::string::npos);

  Checkpoint changed = sample();
  std::vector<float> w = changed.groups["model"].tensors["conv1.weight"].to_vector();
  w[3] += 0.5f;
  w[7] -= 0.25f;
  changed.groups["model"].tensors["conv1.weight"] = f32({4, 1, 3, 3}, w);
  changed.groups["model"].tensors["conv1.bias"] = f32_fill({5}, 0.0f);
  changed.groups["optimizer"].scalars["lr"] = 2e-3;
  changed.groups["optimizer"].tensors.erase("exp_avg/conv1.bias");
  changed.groups["metrics"].scalars["train_loss"] = std::vector<double>{0.9, 0.5};
  changed.groups["trainer"].scalars["monitor"] = std::string("val_acc");
  save_checkpoint(b, changed);
  d = diff_checkpoints(a, b);
  INFO(d.report);
  CHECK(!d.identical);
  CHECK(d.report.find("model/conv1.weight: max abs diff 0.5 (2 of 36 elements differ)") != std::string::npos);
  CHECK(d.report.find("model/conv1.bias: mismatch: float32[4] vs float32[5]") != std::string::npos);
  CHECK(d.report.find("optimizer/lr: 0.001 vs 0.002") != std::string::npos);
  CHECK(d.report.find("optimizer/exp_avg/conv1.bias: only in a") != std::string::npos);
  CHECK(d.report.find("metrics/train_loss: series length 3 vs 2") != std::string::npos);
  CHECK(d.report.find("trainer/monitor: \"val_loss\" vs \"val_acc\"") != std::string::npos);
  CHECK(d.report.find("model/conv1.weight") != std::string::npos);
  CHECK(d.report.find("verdict: different") != std::string::npos);
}

TEST_CASE("diff lists metadata and config differences without counting them") {
  const std::string a = tmp_path("time_a.h5"), b = tmp_path("time_b.h5");
  save_checkpoint(a, sample());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  save_checkpoint(b, sample());
  const CheckpointDiff d = diff_checkpoints(a, b);
  INFO(d.report);
  CHECK(d.identical);
  CHECK(d.report.find("meta created_utc:") != std::string::npos);
  CHECK(d.report.find("(ignored)") != std::string::npos);

  // Metadata and config are listed, but the verdict is about the state.
  Checkpoint other = sample();
  other.meta.saved_on = "cuda:0";
  other.config_json = R"({"seed": 0, "optimizer": {"name": "adamw", "lr": 0.002}, "extra": true})";
  save_checkpoint(b, other);
  const CheckpointDiff m = diff_checkpoints(a, b);
  INFO(m.report);
  CHECK(m.identical);
  CHECK(m.report.find("meta saved_on: \"cpu\" vs \"cuda:0\" (ignored)") != std::string::npos);
  CHECK(m.report.find("config: differs at extra (absent vs true), optimizer.lr (0.001 vs 0.002) (ignored)") !=
        std::string::npos);

  // So are wall-clock timings.
  other = sample();
  other.groups["metrics"].scalars["epoch_seconds"] = std::vector<double>{3.5, 3.7};
  save_checkpoint(b, other);
  Checkpoint timed = sample();
  timed.groups["metrics"].scalars["epoch_seconds"] = std::vector<double>{3.5, 3.9};
  save_checkpoint(a, timed);
  const CheckpointDiff t = diff_checkpoints(a, b);
  INFO(t.report);
  CHECK(t.identical);
  CHECK(t.report.find("metrics/epoch_seconds: series max abs diff 0.2 (ignored: wall-clock time)") != std::string::npos);

  // A state scalar does count.
  save_checkpoint(a, sample());
  other = sample();
  other.groups["rng"].scalars["dropout"] = int64_t{1};
  save_checkpoint(b, other);
  const CheckpointDiff r = diff_checkpoints(a, b);
  INFO(r.report);
  CHECK(!r.identical);
  CHECK(r.report.find("rng/dropout: 123456789 vs 1\n") != std::string::npos);
  CHECK(r.report.find("verdict: different (1 entry differs)") != std::string::npos);
}

TEST_CASE("inspect lists metadata, scalars and every tensor") {
  Checkpoint c = sample();
  c.groups["model"].tensors["norm5"] = f32({2, 2}, {3, 4, 0, 0});
  const std::string path = tmp_path("inspect.h5");
  save_checkpoint(path, c);
  const std::string text = inspect_checkpoint(path);
  INFO(text);
  CHECK(text.find("format_version  " + std::to_string(kCheckpointFormatVersion)) != std::string::npos);
  CHECK(text.find("saved_on        cpu") != std::string::npos);
  CHECK(text.find("created_utc") != std::string::npos);
  CHECK(text.find("engine_version") != std::string::npos);
  for (const auto& [group, d] : c.groups) {
    CHECK(text.find("[" + group + "]") != std::string::npos);
    for (const auto& [key, t] : d.tensors) {
      INFO(key);
      CHECK(std::regex_search(text, std::regex("\\n  " + std::regex_replace(key, std::regex("\\."), "\\.") +
                                               " +float32 +" + std::regex_replace(shape_str(t.shape()), std::regex("[\\[\\]]"), "\\$&"))));
    }
  }
  CHECK(std::regex_search(text, std::regex(R"(norm5 +float32 +\[2, 2\]  norm 5\n)")));
  CHECK(std::regex_search(text, std::regex(R"(bn1\.num_batches_tracked +int64 +938\n)")));
  CHECK(std::regex_search(text, std::regex(R"(train_loss +series +3 values, last 0\.4\n)")));
  CHECK(std::regex_search(text, std::regex(R"(name +string +"adamw"\n)")));
}

TEST_CASE("h5dump reads a saved checkpoint") {
  if (!fs::exists("/usr/bin/h5dump")) {
    MESSAGE("skipped: /usr/bin/h5dump not installed");
    return;
  }
  const std::string path = tmp_path("h5dump.h5");
  save_checkpoint(path, sample());
  const std::string out = tmp_path("h5dump.txt");
  CHECK(std::system(("/usr/bin/h5dump -H '" + path + "' > '" + out + "' 2>&1").c_str()) == 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  INFO(text);
  CHECK(text.find("DATASET \"conv1.weight\"") != std::string::npos);
  CHECK(text.find("GROUP \"exp_avg\"") != std::string::npos);
  CHECK(text.find("H5T_STD_I64LE") != std::string::npos);
  CHECK(text.find("H5T_CSET_UTF8") != std::string::npos);
  CHECK(command_ok("/usr/bin/h5dump -a /format_version '" + path + "'"));
}

TEST_CASE("h5py reads strings as str and datasets as saved") {
  if (!fs::exists("/usr/bin/python3") || !command_ok("/usr/bin/python3 -c 'import h5py, numpy'")) {
    MESSAGE("skipped: /usr/bin/python3 with h5py not available");
    return;
  }
  Checkpoint c = sample();
  c.groups["model"].tensors["conv1.bias"] = f32({4}, {0.5f, -1.25f, 3.0f, 1e-3f});
  c.groups["model"].tensors["half"] = f16({2}, {0x3c00, 0xc000});
  const std::string path = tmp_path("h5py.h5");
  save_checkpoint(path, c);
  const std::string script = tmp_path("check_h5py.py");
  std::ofstream(script) << R"(import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
assert isinstance(f.attrs["saved_on"], str), type(f.attrs["saved_on"])
assert f.attrs["format"] == "engine-checkpoint"
assert f.attrs["format_version"] == 4 and f.attrs["format_version"].dtype == np.int64
assert isinstance(f["optimizer"].attrs["name"], str) and f["optimizer"].attrs["name"] == "adamw"
b = f["model/conv1.bias"]
assert b.dtype == np.float32 and b.shape == (4,)
assert np.array_equal(b[()], np.array([0.5, -1.25, 3.0, 1e-3], dtype=np.float32))
h = f["model/half"]
assert h.dtype == np.float16 and list(h[()]) == [1.0, -2.0]
assert f["optimizer/exp_avg/conv1.weight"].shape == (4, 1, 3, 3)
assert f["optimizer/step"].attrs["conv1.weight"] == 1234
s = f["metrics/train_loss"]
assert s.attrs["kind"] == "series" and list(s[()]) == [0.9, 0.5, 0.4]
)";
  CHECK(std::system(("/usr/bin/python3 '" + script + "' '" + path + "'").c_str()) == 0);
}
