// Step digests (engine/io/step_digest.h; docs/checkpoint-format.md, "Step digests"): the
// digest of a checkpoint's step against a hand computation, what changes it, the loss
// slice rule, the comparison a bisect prints, step_digests.jsonl (round trip, torn and
// damaged tails, resume, failed writes), and the upgrade of a version-3 file checked by
// the stranger's reader tools/check_step_digest.py (h5py + numpy): that test runs the
// tool itself on files it writes, so there is no second test to keep in step with it.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/io/step_digest.h"
#include "io/crc32.h"
#include "support/file_faults.h"

using namespace engine;
using namespace test_util;
namespace fs = std::filesystem;

namespace {

// The definition written out again, independently of kernels/step_digest.h.
uint64_t term(uint64_t i, uint32_t w) {
  const uint32_t a = w ^ static_cast<uint32_t>(0x6A09E667u + static_cast<uint32_t>(i) * 0x9E3779B1u);
  return static_cast<uint64_t>(a) * (a | 1u);
}
uint64_t words_digest(const std::vector<float>& x, std::size_t begin, std::size_t end) {
  uint64_t sum = 0;
  for (std::size_t i = begin; i < end; ++i) {
    uint32_t w;
    std::memcpy(&w, &x[i], 4);
    sum += term(i, w);
  }
  return sum;
}
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const std::vector<float> kW = {1.0f, -2.0f, 0.5f};
const std::vector<float> kB = {0.25f};
const std::vector<float> kM = {1e-3f, -1e-3f, 0.0f};
const std::vector<float> kLoss = {2.0f, 2.25f, 1.5f, 1.75f, 1.0f};  // 5 samples, batches of 2: 3 steps

// A tiny checkpoint: 5 training samples in batches of 2, after step 2 of epoch 2.
Checkpoint tiny() {
  Checkpoint c;
  c.config_json = R"({"seed": 5, "data": {"batch_size": 2}})";
  c.groups["model"].tensors["w"] = Tensor::from_vector({3}, kW);
  c.groups["model"].tensors["b"] = Tensor::from_vector({1}, kB);
  c.groups["model"].scalars["bn.num_batches_tracked"] = int64_t{5};  // a scalar: not digested
  c.groups["optimizer"].tensors["exp_avg/w"] = Tensor::from_vector({3}, kM);
  c.groups["optimizer"].scalars["step/w"] = int64_t{5};
  StateDict& rng = c.groups["rng"];
  rng.scalars["algorithm"] = std::string("philox4x32-10");
  rng.scalars["seed"] = int64_t{5};
  rng.scalars["shuffle"] = int64_t{20};
  rng.scalars["init"] = int64_t{10};
  rng.scalars["dropout"] = int64_t{-1};  // stored as int64: the uint64 2^64 - 1
  StateDict& t = c.groups["trainer"];
  t.scalars["global_step"] = int64_t{5};
  t.scalars["epoch"] = int64_t{1};
  t.scalars["step_in_epoch"] = int64_t{2};
  t.scalars["epoch_shuffle_offset"] = int64_t{77};
  t.tensors["epoch_sample_loss"] = Tensor::from_vector({5}, kLoss);
  return c;
}

void set_element(Checkpoint& c, const std::string& group, const std::string& key, int64_t i, float v) {
  Tensor t = c.groups[group].tensors[key].clone();
  t.f32()[i] = v;
  c.groups[group].tensors[key] = t;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool same(const StepDigest& a, const StepDigest& b) {
  return a.global_step == b.global_step && a.epoch == b.epoch && a.step_in_epoch == b.step_in_epoch &&
         a.shuffle_offset == b.shuffle_offset && a.rng == b.rng && a.loss == b.loss && a.tensors == b.tensors;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Record `step` of a made-up run.
StepDigest record(int64_t step) {
  StepDigest d;
  d.global_step = step;
  d.epoch = 1 + (step - 1) / 3;
  d.step_in_epoch = 1 + (step - 1) % 3;
  d.shuffle_offset = 1000 + static_cast<uint64_t>(d.epoch);
  d.rng = {{"dropout", 18446744073709551615ull}, {"init", 4096}, {"shuffle", 60000 + static_cast<uint64_t>(step)}};
  d.loss = 0x0123456789abcdefull * static_cast<uint64_t>(step);
  d.tensors = {{"model/fc.bias", 0xfedcba9876543210ull + static_cast<uint64_t>(step)},
               {"model/fc.weight", static_cast<uint64_t>(step)},
               {"optimizer/exp_avg/fc.bias", 42}};
  return d;
}

}  // namespace

TEST_CASE("step_digest_of a tiny checkpoint equals the definition computed by hand") {
  const StepDigest d = step_digest_of(tiny(), "tiny.h5");
  CHECK(d.global_step == 5);
  CHECK(d.epoch == 2);
  CHECK(d.step_in_epoch == 2);
  CHECK(d.shuffle_offset == 77);
  using Named = std::vector<std::pair<std::string, uint64_t>>;
  CHECK(d.rng == Named{{"dropout", 18446744073709551615ull}, {"init", 10}, {"shuffle", 20}});
  // Step 2 of the epoch: samples [2, 4), at their places in the epoch.
  CHECK(d.loss == words_digest(kLoss, 2, 4));
  CHECK(d.tensors == Named{{"model/b", words_digest(kB, 0, 1)},
                           {"model/w", words_digest(kW, 0, 3)},
                           {"optimizer/exp_avg/w", words_digest(kM, 0, 3)}});
  uint64_t h = 0x6A09E667F3BCC908ull;
  for (uint64_t part : std::vector<uint64_t>{5, 77, 18446744073709551615ull, uint64_t{10}, uint64_t{20},
                        words_digest(kLoss, 2, 4), words_digest(kB, 0, 1), words_digest(kW, 0, 3),
                        words_digest(kM, 0, 3)})
    h = mix(h ^ part);
  CHECK(d.combined() == h);
  // epoch and step_in_epoch are not folded in; every other field is.
  StepDigest e = d;
  e.epoch = 9;
  e.step_in_epoch = 9;
  CHECK(e.combined() == h);
  e = d;
  e.shuffle_offset = 78;
  CHECK(e.combined() != h);
}

TEST_CASE("one flipped bit changes exactly that tensor's digest and the combined digest") {
  const StepDigest before = step_digest_of(tiny(), "a.h5");
  Checkpoint c = tiny();
  float v = kW[1];
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits ^= 1u;  // the lowest mantissa bit
  std::memcpy(&v, &bits, 4);
  set_element(c, "model", "w", 1, v);
  const StepDigest after = step_digest_of(c, "b.h5");
  CHECK(after.combined() != before.combined());
  const StepDigestDifference diff = compare_step_digests(before, after);
  CHECK(diff.tensors == std::vector<std::string>{"model/w"});
  CHECK(diff.rng.empty());
  CHECK_FALSE(diff.loss);
  CHECK_FALSE(diff.data_position);
  CHECK(compare_step_digests(before, before).any() == false);
}

TEST_CASE("two elements swapped change the digest: each word is keyed by its index") {
  Checkpoint c = tiny();
  set_element(c, "model", "w", 0, kW[2]);
  set_element(c, "model", "w", 2, kW[0]);
  const StepDigest swapped = step_digest_of(c, "s.h5");
  const StepDigest before = step_digest_of(tiny(), "t.h5");
  CHECK(swapped.tensors[1].second != before.tensors[1].second);
  CHECK(swapped.combined() != before.combined());
}

TEST_CASE("the loss is the digest of the last step's slice of epoch_sample_loss") {
  SUBCASE("mid-epoch: step_in_epoch's batch; the samples outside it do not count") {
    Checkpoint c = tiny();
    const uint64_t loss = step_digest_of(c, "m.h5").loss;
    CHECK(loss == words_digest(kLoss, 2, 4));
    set_element(c, "trainer", "epoch_sample_loss", 0, 9.0f);
    set_element(c, "trainer", "epoch_sample_loss", 4, 9.0f);
    CHECK(step_digest_of(c, "m.h5").loss == loss);
    set_element(c, "trainer", "epoch_sample_loss", 3, 9.0f);
    CHECK(step_digest_of(c, "m.h5").loss != loss);
  }
  SUBCASE("an epoch-end save: the finished epoch's last, short batch") {
    Checkpoint c = tiny();
    c.groups["trainer"].scalars["global_step"] = int64_t{6};
    c.groups["trainer"].scalars["epoch"] = int64_t{2};
    c.groups["trainer"].scalars["step_in_epoch"] = int64_t{0};
    const StepDigest d = step_digest_of(c, "e.h5");
    CHECK(d.loss == words_digest(kLoss, 4, 5));
    CHECK(d.epoch == 2);
    CHECK(d.step_in_epoch == 3);
  }
  SUBCASE("step 0: no step yet, no loss (epoch_sample_loss and the batch size are not needed)") {
    Checkpoint c = tiny();
    c.groups["trainer"].scalars["global_step"] = int64_t{0};
    c.groups["trainer"].scalars["epoch"] = int64_t{0};
    c.groups["trainer"].scalars["step_in_epoch"] = int64_t{0};
    c.groups["trainer"].tensors.clear();
    c.config_json = "{}";
    const StepDigest d = step_digest_of(c, "z.h5");
    CHECK(d.loss == 0);
    CHECK(d.epoch == 0);
    CHECK(d.step_in_epoch == 0);
  }
}

TEST_CASE("a checkpoint without what the digest needs is refused with one line naming it") {
  auto refusal = [](const std::function<void(Checkpoint&)>& edit) {
    Checkpoint c = tiny();
    edit(c);
    try {
      step_digest_of(c, "run/x.h5");
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal([](Checkpoint& c) { c.groups["trainer"].scalars.erase("global_step"); }) ==
        "run/x.h5: trainer/global_step is missing (a step digest needs it)");
  CHECK(refusal([](Checkpoint& c) { c.groups["trainer"].scalars["epoch"] = 1.5; }) ==
        "run/x.h5: trainer/epoch is float64, not int64");
  CHECK(refusal([](Checkpoint& c) { c.groups.erase("rng"); }) == "run/x.h5: no group rng (a step digest needs it)");
  CHECK(refusal([](Checkpoint& c) { c.config_json = "{\"data\": {}}"; }).rfind("run/x.h5: the stored config has no", 0) == 0);
  CHECK(refusal([](Checkpoint& c) { c.config_json = "not json"; }).rfind("run/x.h5: the stored config is not JSON", 0) == 0);
  CHECK(refusal([](Checkpoint& c) { c.groups["trainer"].tensors.clear(); }) ==
        "run/x.h5: trainer/epoch_sample_loss is missing (a step digest needs it)");
  CHECK(refusal([](Checkpoint& c) { c.groups["trainer"].scalars["step_in_epoch"] = int64_t{4}; })
            .rfind("run/x.h5: trainer/step_in_epoch 4 is beyond the epoch's 3 steps", 0) == 0);
  CHECK(refusal([](Checkpoint& c) { c.config_json = "not json"; }).find('\n') == std::string::npos);
}

TEST_CASE("digests as 16 hex digits, and the stored trainer/step_digest") {
  CHECK(digest_hex(0x0123456789abcdefull) == "0123456789abcdef");
  CHECK(digest_hex(0) == "0000000000000000");
  CHECK(digest_hex(~0ull) == "ffffffffffffffff");
  CHECK(parse_digest_hex("0123456789ABCDEF") == 0x0123456789abcdefull);
  CHECK(parse_digest_hex("ffffffffffffffff") == ~0ull);
  for (const char* bad : {"", "0123456789abcde", "0123456789abcdef0", "0123456789abcdeg", "+123456789abcdef",
                          " 123456789abcdef", "0x23456789abcdef"})
    CHECK_MESSAGE(!parse_digest_hex(bad), bad);

  Checkpoint c = tiny();
  CHECK(error_of([&] { stored_step_digest(c, "p.h5"); }) == "p.h5: trainer/step_digest is missing");
  c.groups["trainer"].scalars["step_digest"] = std::string("00000000000000zz");
  CHECK(error_of([&] { stored_step_digest(c, "p.h5"); }) == "p.h5: trainer/step_digest is not 16 hex digits");
  c.groups["trainer"].scalars["step_digest"] = int64_t{5};
  CHECK(error_of([&] { stored_step_digest(c, "p.h5"); }) == "p.h5: trainer/step_digest is int64, not a string");
  c.groups["trainer"].scalars["step_digest"] = digest_hex(0xdeadbeef00c0ffeeull);
  CHECK(stored_step_digest(c, "p.h5") == 0xdeadbeef00c0ffeeull);
}

TEST_CASE("compare_step_digests names the streams and tensors that differ, and those only one has") {
  const StepDigest a = record(4);
  StepDigest b = a;
  CHECK_FALSE(compare_step_digests(a, b).any());
  b.rng[1].second += 1;                                      // init
  b.rng.erase(b.rng.begin());                                // dropout only in a
  b.rng.emplace_back("zeta", 1);                             // zeta only in b
  b.tensors[0].second ^= 1;                                  // model/fc.bias
  b.tensors.erase(b.tensors.begin() + 2);                    // optimizer/exp_avg/fc.bias only in a
  b.tensors.insert(b.tensors.begin(), {"model/a.weight", 3});  // only in b
  b.loss += 1;
  const StepDigestDifference d = compare_step_digests(a, b);
  CHECK(d.rng == std::vector<std::string>{"dropout", "init", "zeta"});
  CHECK(d.tensors == std::vector<std::string>{"model/a.weight", "model/fc.bias", "optimizer/exp_avg/fc.bias"});
  CHECK(d.loss);
  CHECK_FALSE(d.data_position);
  for (auto edit : {+[](StepDigest& x) { x.shuffle_offset++; }, +[](StepDigest& x) { x.epoch++; },
                    +[](StepDigest& x) { x.step_in_epoch++; }}) {
    StepDigest c = a;
    edit(c);
    const StepDigestDifference e = compare_step_digests(a, c);
    CHECK(e.data_position);
    CHECK(e.rng.empty());
    CHECK(e.tensors.empty());
    CHECK_FALSE(e.loss);
  }
}

namespace {
std::string log_path(const std::string& test) { return fresh_dir("step_digest_" + test) + "/step_digests.jsonl"; }
}  // namespace

TEST_CASE("step_digests.jsonl: a CRC-framed JSON line per record, read back as written") {
  const std::string path = log_path("roundtrip");
  CHECK(step_digest_log::read(path).steps.empty());  // no file yet
  {
    step_digest_log::Writer w;
    w.open(path, 0);
    CHECK(w.is_open());
    CHECK(w.cut_reason().empty());
    w.append({record(1), record(2)});
    w.append({record(3)});
    w.sync();
    w.close();
    w.close();  // idempotent
    CHECK_FALSE(w.is_open());
  }
  const std::string text = file_text(path);
  const std::string line = step_digest_log::line_of(record(1));
  CHECK(text == line + step_digest_log::line_of(record(2)) + step_digest_log::line_of(record(3)));
  // "<crc32 of the text> <text>\n", the text one JSON object.
  REQUIRE(line.size() > 10);
  CHECK(line[8] == ' ');
  CHECK(line.back() == '\n');
  const nlohmann::json j = nlohmann::json::parse(line.substr(9));
  CHECK(j["step"] == 1);
  CHECK(j["shuffle_offset"] == 1001);
  CHECK(j["rng"]["dropout"].get<uint64_t>() == 18446744073709551615ull);
  CHECK(j["loss"] == digest_hex(record(1).loss));
  CHECK(j["tensors"]["model/fc.bias"] == digest_hex(record(1).tensors[0].second));
  CHECK(j["digest"] == digest_hex(record(1).combined()));
  CHECK(line.substr(9, 18) == "{\"step\":1,\"epoch\":");  // the step first, for a reader scanning by eye

  const step_digest_log::Contents c = step_digest_log::read(path);
  REQUIRE(c.steps.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(same(c.steps[i], record(i + 1)));
  CHECK(c.sound_bytes == text.size());
  CHECK(c.cut_reason.empty());
}

TEST_CASE("step_digests.jsonl: a torn or damaged tail is cut, with the line and the reason") {
  const std::string path = log_path("damage");
  const std::string l1 = step_digest_log::line_of(record(1)), l2 = step_digest_log::line_of(record(2)),
                    l3 = step_digest_log::line_of(record(3));
  SUBCASE("a last line without its newline (a kill during the write)") {
    write_text(path, l1 + l2 + l3.substr(0, l3.size() - 1));
    const auto c = step_digest_log::read(path);
    CHECK(c.steps.size() == 2);
    CHECK(c.sound_bytes == l1.size() + l2.size());
    CHECK(c.cut_reason == "line 3: no end of line (a torn write)");
  }
  SUBCASE("a flipped byte in line 2 cuts lines 2 and 3") {
    std::string l2bad = l2;
    l2bad[20] ^= 0x01;
    write_text(path, l1 + l2bad + l3);
    const auto c = step_digest_log::read(path);
    CHECK(c.steps.size() == 1);
    CHECK(c.sound_bytes == l1.size());
    CHECK(c.cut_reason.rfind("line 2: CRC mismatch", 0) == 0);
  }
  SUBCASE("a step that does not follow the one before") {
    write_text(path, l1 + l3 + l2);
    const auto c = step_digest_log::read(path);
    CHECK(c.steps.size() == 2);
    CHECK(c.cut_reason == "line 3: step 2 does not follow step 3");
  }
  SUBCASE("a digest that its fields do not give, or a field missing, under a valid CRC") {
    auto reframed = [](nlohmann::ordered_json j) {
      const std::string text = j.dump();
      char crc[9];
      std::snprintf(crc, sizeof crc, "%08x",
                    static_cast<unsigned>(crc32_update(0, reinterpret_cast<const unsigned char*>(text.data()), text.size())));
      return std::string(crc) + " " + text + "\n";
    };
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(l2.substr(9));
    j["tensors"]["model/fc.weight"] = digest_hex(7);
    write_text(path, l1 + reframed(j) + l3);
    auto c = step_digest_log::read(path);
    CHECK(c.steps.size() == 1);
    CHECK(c.cut_reason.rfind("line 2: \"digest\" " + digest_hex(record(2).combined()) + " does not match", 0) == 0);
    j = nlohmann::ordered_json::parse(l2.substr(9));
    j.erase("loss");
    write_text(path, l1 + reframed(j));
    c = step_digest_log::read(path);
    CHECK(c.steps.size() == 1);
    CHECK(c.cut_reason == "line 2: no \"loss\"");
    j = nlohmann::ordered_json::parse(l2.substr(9));
    j["shuffle_offset"] = -1;
    write_text(path, l1 + reframed(j));
    CHECK(step_digest_log::read(path).cut_reason == "line 2: \"shuffle_offset\" is not a uint64");
    write_text(path, l1 + reframed(nlohmann::ordered_json::array()) + l3);
    CHECK(step_digest_log::read(path).cut_reason == "line 2: not a JSON object");
  }
  SUBCASE("Writer::open cuts the damage, says why, and appends after the sound records") {
    write_text(path, l1 + l2 + "garbage\n" + l3);
    step_digest_log::Writer w;
    w.open(path, 100);
    CHECK(w.cut_reason() == "line 3: not \"<crc32> <json>\"");
    CHECK(file_text(path) == l1 + l2);
    w.append({record(3)});
    w.close();
    CHECK(step_digest_log::read(path).steps.size() == 3);
    CHECK(step_digest_log::read(path).cut_reason.empty());
  }
}

TEST_CASE("Writer::open(keep_through_step) drops the steps a resumed run trains again") {
  const std::string path = log_path("resume");
  {
    step_digest_log::Writer w;
    w.open(path, 0);
    w.append({record(1), record(2), record(3), record(4)});
  }  // the destructor closes
  StepDigest again = record(3);
  again.loss ^= 0xff;  // the resumed run's step 3
  step_digest_log::Writer w;
  w.open(path, 2);
  CHECK(w.cut_reason().empty());  // cutting later steps on resume is no damage
  CHECK(file_text(path) == step_digest_log::line_of(record(1)) + step_digest_log::line_of(record(2)));
  w.append({again});
  w.close();
  const auto c = step_digest_log::read(path);
  REQUIRE(c.steps.size() == 3);
  CHECK(same(c.steps[2], again));
  // Keeping through a step beyond the last keeps everything; through 0, nothing.
  w.open(path, 99);
  w.close();
  CHECK(step_digest_log::read(path).steps.size() == 3);
  w.open(path, 0);
  w.close();
  CHECK(file_text(path).empty());
}

TEST_CASE("step_digests.jsonl: failed calls throw one line naming the file, and leave no torn record") {
  using namespace engine::file_faults;
  const std::string path = log_path("faults");
  FaultyEnv env;
  step_digest_log::Writer w;
  w.open(path, 0, &env);
  w.append({record(1)});
  {
    ScopedFault fault(env, {Step::Write, ENOSPC, 0, 1, "step_digests"});
    const std::string msg = error_of([&] { w.append({record(2), record(3)}); });
    CHECK(msg == path + ": cannot append step digests: " + std::strerror(ENOSPC));
    CHECK(fault.injected() == 1);
  }
  w.append({record(2)});  // the next append goes where the failed one would have
  {
    ScopedFault fault(env, {Step::Fsync, EIO, 0, 1, "step_digests"});
    CHECK(error_of([&] { w.sync(); }) == path + ": cannot fsync: " + std::strerror(EIO));
  }
  w.close();
  auto c = step_digest_log::read(path, &env);
  CHECK(c.steps.size() == 2);
  CHECK(c.cut_reason.empty());
  {
    ScopedFault fault(env, {Step::OpenForAppending, EACCES, 0, 1, "step_digests"});
    CHECK(error_of([&] { w.open(path, 9, &env); }) == path + ": cannot open for appending: " + std::strerror(EACCES));
    CHECK_FALSE(w.is_open());
  }
  {
    ScopedFault fault(env, {Step::Read, EIO, 0, 1, "step_digests"});
    CHECK(error_of([&] { step_digest_log::read(path, &env); }) == path + ": cannot read: " + std::strerror(EIO));
  }
  {
    ScopedFault fault(env, {Step::Truncate, EIO, 0, 1, "step_digests"});
    CHECK(error_of([&] { w.open(path, 1, &env); }).rfind(path + ": cannot cut the log to ", 0) == 0);
  }
}

namespace {
bool have_h5py() { return std::system("/usr/bin/python3 -c 'import h5py, numpy' >/dev/null 2>&1") == 0; }
RunResult check_tool(const std::string& args) {
  return run_program("", "/usr/bin/python3", "\"" + source_dir() + "/tools/check_step_digest.py\" " + args);
}
}  // namespace

// The C++ digest and the stranger's reader (h5py + numpy) agree on the version-3 fixture,
// which the upgrade gives its trainer/step_digest; saved again as version 4, the tool
// finds the stored digest matching, and a changed tensor under the old digest mismatching.
TEST_CASE("a version-3 checkpoint upgraded to version 4 carries its step digest, and tools/check_step_digest.py agrees") {
  const std::string fixture = source_dir() + "/tests/data/checkpoint_v3_cpu_mid_epoch.h5";
  Checkpoint ck = load_checkpoint(fixture);
  CHECK(ck.meta.format_version == 3);
  const std::string stored = ck.groups.at("trainer").get_string("step_digest");
  const StepDigest d = step_digest_of(ck, fixture);
  CHECK(stored == digest_hex(d.combined()));
  CHECK(stored == "d0cc685ac2ce4ada");  // what tools/check_step_digest.py --compute printed for it
  CHECK(d.global_step == 20);
  CHECK(d.epoch == 2);
  CHECK(d.step_in_epoch == 4);
  CHECK(d.rng.size() == 3);
  CHECK(d.tensors.size() == ck.groups.at("model").tensors.size() + ck.groups.at("optimizer").tensors.size());

  const std::string dir = fresh_dir("step_digest_v4");
  save_checkpoint(dir + "/v4.h5", ck);
  const Checkpoint v4 = load_checkpoint(dir + "/v4.h5");
  CHECK(v4.meta.format_version == kCheckpointFormatVersion);
  CHECK(stored_step_digest(v4, dir + "/v4.h5") == d.combined());
  CHECK(step_digest_of(v4, dir + "/v4.h5").combined() == d.combined());
  Checkpoint changed = ck;  // a tensor changed under the old digest
  set_element(changed, "model", "fc2.bias", 3, 0.5f);
  save_checkpoint(dir + "/changed.h5", changed);

  if (!have_h5py()) {
    MESSAGE("skipped the tools/check_step_digest.py part: /usr/bin/python3 with h5py and numpy not available");
    return;
  }
  RunResult r = check_tool("--compute \"" + fixture + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output == stored + "\n");
  r = check_tool("\"" + dir + "/v4.h5\"");
  CHECK(r.exit_code == 0);
  CHECK(r.output == dir + "/v4.h5: step 20 digest " + stored + " ok\n");
  r = check_tool("\"" + dir + "/changed.h5\"");
  CHECK(r.exit_code == 1);
  CHECK(r.output == dir + "/changed.h5: step 20 stored " + stored + " but the tensors give " +
                        digest_hex(step_digest_of(changed, "changed").combined()) + "\n");
  r = check_tool("\"" + fixture + "\"");  // version 3: nothing stored
  CHECK(r.exit_code == 1);
  r = check_tool("\"" + dir + "/missing.h5\"");
  CHECK(r.exit_code == 2);
  CHECK(r.output.rfind(dir + "/missing.h5: cannot compute its step digest: ", 0) == 0);
}
