// TensorBoard event files: CRC-32C against published vectors, TFRecord framing, the
// hand-encoded protobuf Event messages read back field by field, and the rewrite that
// keeps one file per run across resumes. (tests/test_tensorboard.py reads the files
// with the tensorboard package itself.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/crc32c.h"
#include "run/tfevents.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;
using namespace engine;

namespace {

uint32_t crc32c(const std::string& s) {
  return crc32c_update(0, reinterpret_cast<const unsigned char*>(s.data()), s.size());
}

// Bit by bit, straight from the polynomial: an independent check of the table.
uint32_t crc32c_bitwise(const std::vector<unsigned char>& d) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : d) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

template <typename T>
T read_le(const std::string& s, std::size_t at) {
  REQUIRE(at + sizeof(T) <= s.size());
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

uint32_t masked(const std::string& s) {
  const uint32_t c = crc32c(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Splits a TFRecord stream into payloads, checking both CRCs of every record.
std::vector<std::string> unframe(const std::string& stream) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < stream.size()) {
    const uint64_t n = read_le<uint64_t>(stream, at);
    CHECK(read_le<uint32_t>(stream, at + 8) == masked(stream.substr(at, 8)));
    REQUIRE(at + 12 + n + 4 <= stream.size());
    const std::string payload = stream.substr(at + 12, n);
    CHECK(read_le<uint32_t>(stream, at + 12 + n) == masked(payload));
    out.push_back(payload);
    at += 12 + n + 4;
  }
  CHECK(at == stream.size());
  return out;
}

uint64_t varint(const std::string& s, std::size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < s.size());
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

struct Field {
  int number = 0, wire = 0;
  uint64_t integer = 0;  // varint, fixed32, fixed64
  std::string bytes;     // length-delimited
};

std::vector<Field> fields(const std::string& msg) {
  std::vector<Field> out;
  std::size_t at = 0;
  while (at < msg.size()) {
    Field f;
    const uint64_t tag = varint(msg, at);
    f.number = static_cast<int>(tag >> 3);
    f.wire = static_cast<int>(tag & 7);
    switch (f.wire) {
      case 0: f.integer = varint(msg, at); break;
      case 1: f.integer = read_le<uint64_t>(msg, at); at += 8; break;
      case 5: f.integer = read_le<uint32_t>(msg, at); at += 4; break;
      case 2: {
        const uint64_t n = varint(msg, at);
        REQUIRE(at + n <= msg.size());
        f.bytes = msg.substr(at, n);
        at += n;
        break;
      }
      default: FAIL("unexpected wire type " << f.wire);
    }
    out.push_back(f);
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> values;
};

Event decode_event(const std::string& payload) {
  Event e;
  for (const Field& f : fields(payload)) {
    if (f.number == 1) {
      CHECK(f.wire == 1);
      std::memcpy(&e.wall_time, &f.integer, 8);
    } else if (f.number == 2) {
      CHECK(f.wire == 0);
      e.step = static_cast<int64_t>(f.integer);
    } else if (f.number == 3) {
      e.file_version = f.bytes;
    } else if (f.number == 5) {
      for (const Field& v : fields(f.bytes)) {
        REQUIRE(v.number == 1);
        std::string tag;
        float value = NAN;
        for (const Field& x : fields(v.bytes)) {
          if (x.number == 1) tag = x.bytes;
          if (x.number == 2) {
            CHECK(x.wire == 5);
            const auto bits = static_cast<uint32_t>(x.integer);
            std::memcpy(&value, &bits, 4);
          }
        }
        e.values[tag] = value;
      }
    } else {
      FAIL("unexpected Event field " << f.number);
    }
  }
  return e;
}

std::vector<EpochMetrics> history(int n) {
  std::vector<EpochMetrics> h;
  for (int i = 1; i <= n; ++i) {
    EpochMetrics m;
    m.epoch = i;
    m.train_loss = 1.0 / i;
    m.val_loss = 1.5 / i;
    m.val_acc = 0.5 + 0.01 * i;
    m.lr = 1e-3 * (n - i + 1) / n;
    m.loss_scale = 65536.0 / (1 << (i % 3));
    m.epoch_seconds = 2.0 + 0.25 * i;
    h.push_back(m);
  }
  return h;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("CRC-32C matches the published check values") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  // RFC 3720 (iSCSI), appendix B.4.
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string inc, dec;
  for (int i = 0; i < 32; ++i) inc += static_cast<char>(i), dec += static_cast<char>(31 - i);
  CHECK(crc32c(inc) == 0x46DD794Eu);
  CHECK(crc32c(dec) == 0x113FDB5Cu);
  // Continuing a CRC over pieces equals one pass.
  const std::string a = "12345", b = "6789";
  CHECK(crc32c_update(crc32c(a), reinterpret_cast<const unsigned char*>(b.data()), b.size()) == 0xE3069283u);
}

TEST_CASE("CRC-32C equals the bitwise definition on random data") {
  std::mt19937 g(11);
  for (int len : {1, 7, 8, 9, 63, 64, 65, 1000, 4097}) {
    std::vector<unsigned char> d(len);
    for (auto& c : d) c = static_cast<unsigned char>(g());
    CAPTURE(len);
    CHECK(crc32c_update(0, d.data(), d.size()) == crc32c_bitwise(d));
  }
}

TEST_CASE("TFRecord framing: length, masked CRCs, payload") {
  const std::string payload = "hello, tensorboard";
  const std::string rec = tfevents::frame_record(payload);
  REQUIRE(rec.size() == 8 + 4 + payload.size() + 4);
  CHECK(read_le<uint64_t>(rec, 0) == payload.size());
  CHECK(rec.substr(12, payload.size()) == payload);
  // The mask, written out: rotate right by 15, add the constant.
  const uint32_t c = crc32c(payload);
  CHECK(read_le<uint32_t>(rec, 12 + payload.size()) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
  CHECK(read_le<uint32_t>(rec, 8) == masked(rec.substr(0, 8)));
  CHECK(tfevents::frame_record("").size() == 16);
}

TEST_CASE("the first event carries the file version; scalar events their tags, step and values") {
  const std::string v = tfevents::file_version_event(1234.5);
  // 0x09 + 8-byte double, then 0x1A, length 13, "brain.Event:2".
  REQUIRE(v.size() == 1 + 8 + 2 + 13);
  CHECK(static_cast<unsigned char>(v[0]) == 0x09);
  CHECK(static_cast<unsigned char>(v[9]) == 0x1A);
  const Event fv = decode_event(v);
  CHECK(fv.wall_time == 1234.5);
  CHECK(fv.step == 0);
  CHECK(fv.file_version == "brain.Event:2");

  Event e = decode_event(tfevents::scalars_event(99.25, 300, {{"a", 1.5f}, {"bb", -2e-7f}}));
  CHECK(e.wall_time == 99.25);
  CHECK(e.step == 300);  // two varint bytes
  REQUIRE(e.values.size() == 2);
  CHECK(e.values["a"] == 1.5f);
  CHECK(e.values["bb"] == -2e-7f);
}

TEST_CASE("run_events: one event per epoch, the test at the last step, wall times that never change") {
  const auto h = history(4);
  EvalResult test;
  test.loss = 0.33;
  test.accuracy = 0.875;
  const std::vector<std::string> recs = unframe(tfevents::run_events(1000.0, h, test));
  REQUIRE(recs.size() == 1 + 4 + 1);
  CHECK(decode_event(recs[0]).file_version == "brain.Event:2");
  double t = 1000.0;
  for (int i = 0; i < 4; ++i) {
    Event e = decode_event(recs[1 + i]);
    t += h[i].epoch_seconds;
    CHECK(e.step == i + 1);
    CHECK(e.wall_time == doctest::Approx(t));
    REQUIRE(e.values.size() == 6);
    CHECK(e.values["train_loss"] == static_cast<float>(h[i].train_loss));
    CHECK(e.values["val_loss"] == static_cast<float>(h[i].val_loss));
    CHECK(e.values["val_acc"] == static_cast<float>(h[i].val_acc));
    CHECK(e.values["lr"] == static_cast<float>(h[i].lr));
    CHECK(e.values["loss_scale"] == static_cast<float>(h[i].loss_scale));
    CHECK(e.values["epoch_seconds"] == static_cast<float>(h[i].epoch_seconds));
  }
  Event te = decode_event(recs[5]);
  CHECK(te.step == 4);
  CHECK(te.values.size() == 2);
  CHECK(te.values["test_loss"] == 0.33f);
  CHECK(te.values["test_acc"] == 0.875f);
  // A longer history only appends: what a live TensorBoard has read stays valid.
  std::vector<EpochMetrics> first3(h.begin(), h.begin() + 3);
  const std::string s3 = tfevents::run_events(1000.0, first3, std::nullopt);
  const std::string s4 = tfevents::run_events(1000.0, h, std::nullopt);
  CHECK(s4.compare(0, s3.size(), s3) == 0);
}

TEST_CASE("write_run_events keeps one file per run and rewrites it whole (resume neither duplicates nor loses)") {
  const fs::path dir = test_util::scratch_root("test_tfevents") / "run";
  fs::create_directories(dir);
  const auto h = history(5);
  const std::string p1 = tfevents::write_run_events(Env::posix(), dir.string(), {h.begin(), h.begin() + 2}, std::nullopt);
  CHECK(fs::path(p1).parent_path() == dir / "tensorboard");
  CHECK(fs::path(p1).filename().string().rfind("events.out.tfevents.", 0) == 0);
  // Later epochs and a "resume" from an earlier checkpoint (a shorter history) rewrite
  // the same file; no temporary file is left behind.
  const std::string p2 = tfevents::write_run_events(Env::posix(), dir.string(), h, std::nullopt);
  CHECK(p2 == p1);
  CHECK(unframe(read_file(p2)).size() == 1 + 5);
  const std::string p3 = tfevents::write_run_events(Env::posix(), dir.string(), {h.begin(), h.begin() + 3}, std::nullopt);
  CHECK(p3 == p1);
  const std::vector<std::string> recs = unframe(read_file(p3));
  REQUIRE(recs.size() == 1 + 3);
  for (int i = 0; i < 3; ++i) CHECK(decode_event(recs[1 + i]).step == i + 1);
  CHECK(event_files(dir / "tensorboard").size() == 1);
  // The start time in the name is the base of every wall time.
  const double start = std::strtod(fs::path(p1).filename().string().c_str() + 20, nullptr);
  CHECK(decode_event(recs[0]).wall_time == start);
  CHECK(decode_event(recs[1]).wall_time == doctest::Approx(start + h[0].epoch_seconds));
}

TEST_CASE("an unwritable run directory is a one-line error naming the path") {
  const fs::path dir = test_util::scratch_root("test_tfevents") / "blocked";
  fs::create_directories(dir);
  std::ofstream(dir / "tensorboard") << "a file where the directory should be";
  try {
    tfevents::write_run_events(Env::posix(), dir.string(), history(1), std::nullopt);
    FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.find((dir / "tensorboard").string()) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
}
