// The memory tier's slot file (engine/io/memory_tier.h; docs/recovery.md, "The memory
// tier"): a state written and read back bit for bit, the two slots in turn, and every
// way a slot or file is refused: torn, damaged, another run directory's, truncated,
// another user's, writable by others, a symbolic link; growth; abandoned files.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>
#include <zlib.h>

#include "engine/io/memory_tier.h"
#include "kernels/ops.h"
#include "scratch_dir.h"

using namespace engine;
namespace fs = std::filesystem;
namespace mt = engine::memory_tier;

namespace {

std::string scratch(const std::string& name) {
  const fs::path p = test_util::scratch_root("memory_tier") / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A state with every kind of scalar and tensor dtype, odd sizes included.
Checkpoint sample_state(float seed) {
  Checkpoint c;
  c.meta.saved_on = "cpu";
  c.meta.engine_version = "test";
  c.config_json = R"({"seed": 7})";
  std::vector<float> w(1000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = seed + static_cast<float>(i) * 0.25f;
  c.groups["model"].tensors["w"] = Tensor::from_vector({10, 100}, w);
  Tensor odd = Tensor::empty({3}, DType::U8);  // 3 bytes: a partial last word
  odd.u8()[0] = 1;
  odd.u8()[1] = 2;
  odd.u8()[2] = static_cast<uint8_t>(seed);
  c.groups["model"].tensors["odd"] = odd;
  Tensor d = Tensor::empty({2}, DType::F64);
  d.f64()[0] = -0.0;
  d.f64()[1] = std::numeric_limits<double>::quiet_NaN();
  c.groups["optimizer"].tensors["d"] = d;
  c.groups["trainer"].scalars["global_step"] = int64_t{42};
  c.groups["trainer"].scalars["best"] = std::numeric_limits<double>::infinity();
  c.groups["trainer"].scalars["name"] = std::string("x\ny");
  c.groups["metrics"].scalars["loss"] = std::vector<double>{0.5, 1e-300, -2.0};
  return c;
}

void check_same(const Checkpoint& a, const Checkpoint& b) {
  CHECK(a.config_json == b.config_json);
  CHECK(a.meta.saved_on == b.meta.saved_on);
  REQUIRE(a.groups.size() == b.groups.size());
  for (const auto& [name, g] : a.groups) {
    const StateDict& h = b.groups.at(name);
    REQUIRE(g.tensors.size() == h.tensors.size());
    for (const auto& [k, t] : g.tensors) {
      const Tensor& u = h.tensors.at(k);
      CHECK(t.shape() == u.shape());
      CHECK(t.dtype() == u.dtype());
      CHECK(std::memcmp(t.raw(), u.raw(), t.nbytes()) == 0);
    }
    REQUIRE(g.scalars.size() == h.scalars.size());
    for (const auto& [k, s] : g.scalars) {
      const Scalar& v = h.scalars.at(k);
      REQUIRE(s.index() == v.index());
      if (const auto* x = std::get_if<double>(&s)) CHECK(std::memcmp(x, &std::get<double>(v), 8) == 0);
      else CHECK(s == v);
    }
  }
}

// Flips one byte of the file at `offset`.
void flip(const std::string& path, off_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char b = 0;
  REQUIRE(::pread(fd, &b, 1, offset) == 1);
  b ^= 0x10;
  REQUIRE(::pwrite(fd, &b, 1, offset) == 1);
  ::close(fd);
}

}  // namespace

TEST_CASE("a state written to the memory tier reads back bit for bit, the slots taking turns") {
  const std::string dir = scratch("roundtrip"), run = scratch("roundtrip_run");
  mt::Writer w(dir, run);
  CHECK(w.path() == mt::file_for(dir, run));
  CHECK(fs::path(w.path()).filename().string().rfind("engine-" + std::to_string(::geteuid()) + "-", 0) == 0);
  w.write(sample_state(1), 10);
  mt::Contents c = mt::read(w.path(), mt::canonical_run_dir(run), mt::Read::States);
  REQUIRE(c.problem.empty());
  CHECK(c.run_dir == mt::canonical_run_dir(run));
  REQUIRE(c.newest());
  CHECK(c.newest()->index == 0);
  CHECK(c.newest()->global_step == 10);
  CHECK(c.slots[1].problem == "never written");
  check_same(sample_state(1), *c.newest()->state);
  w.write(sample_state(2), 11);
  w.write(sample_state(3), 12);
  c = mt::read(w.path(), "", mt::Read::States);
  REQUIRE(c.newest());
  CHECK(c.newest()->index == 0);  // 0, 1, 0
  CHECK(c.newest()->global_step == 12);
  CHECK(c.slots[1].global_step == 11);
  CHECK(c.slots[1].problem.empty());
  check_same(sample_state(3), *c.newest()->state);
  check_same(sample_state(2), *c.slots[1].state);
  // A second writer (a relaunch) keeps the newest slot: it writes the other one first.
  mt::Writer again(dir, run);
  again.write(sample_state(4), 13);
  c = mt::read(w.path(), "", mt::Read::States);
  CHECK(c.newest()->index == 1);
  CHECK(c.newest()->global_step == 13);
  CHECK(c.slots[0].global_step == 12);
  CHECK(c.slots[0].problem.empty());
  again.remove();
  CHECK_FALSE(fs::exists(w.path()));
  CHECK(mt::read(w.path(), "", mt::Read::Seals).problem == "no slot file");
}

TEST_CASE("a torn or damaged slot is never trusted; the other one is") {
  const std::string dir = scratch("damage"), run = scratch("damage_run");
  mt::Writer w(dir, run);
  w.write(sample_state(1), 1);
  w.write(sample_state(2), 2);  // slot 1, the newest
  const std::string path = w.path();
  const mt::Contents before = mt::read(path, "", mt::Read::Seals);
  const off_t slot1 = static_cast<off_t>(4096 + before.slot_bytes);

  SUBCASE("a kill during the write: the seal never set") {
    const int fd = ::open(path.c_str(), O_RDWR);
    const uint64_t zero = 0;
    REQUIRE(::pwrite(fd, &zero, sizeof zero, slot1) == sizeof zero);
    ::close(fd);
    const mt::Contents c = mt::read(path, "", mt::Read::States);
    CHECK(c.slots[1].problem == "torn: its write did not complete (a kill during it)");
    REQUIRE(c.newest());
    CHECK(c.newest()->global_step == 1);
    check_same(sample_state(1), *c.newest()->state);
  }
  SUBCASE("one bit of the payload") {
    flip(path, slot1 + 4096 + 1000);
    const mt::Contents c = mt::read(path, "", mt::Read::States);
    CHECK(c.slots[1].problem.find("checksum mismatch: the payload's digest is") == 0);
    CHECK_FALSE(c.slots[1].state);
    REQUIRE(c.newest());
    CHECK(c.newest()->global_step == 1);
  }
  SUBCASE("one bit of the seal") {
    flip(path, slot1 + 16);  // its global step
    const mt::Contents c = mt::read(path, "", mt::Read::States);
    CHECK(c.slots[1].problem == "seal checksum mismatch");
    CHECK(c.newest()->global_step == 1);
  }
  SUBCASE("the header") {
    flip(path, 40);
    CHECK(mt::read(path, "", mt::Read::States).problem == "header checksum mismatch");
  }
  SUBCASE("truncated") {
    fs::resize_file(path, 4096 + before.slot_bytes + 100);
    CHECK(mt::read(path, "", mt::Read::States).problem.rfind("truncated: ", 0) == 0);
    fs::resize_file(path, 10);
    CHECK(mt::read(path, "", mt::Read::States).problem == "truncated: 10 bytes, not even a header");
  }
  SUBCASE("another run directory's") {
    const mt::Contents c = mt::read(path, mt::canonical_run_dir(run + "_other"), mt::Read::States);
    CHECK(c.problem == "the slot file of another run directory (" + mt::canonical_run_dir(run) + ")");
    CHECK(c.slots.empty());
  }
  SUBCASE("writable by others, another user's, a symbolic link, not a slot file") {
    ::chmod(path.c_str(), 0666);
    CHECK(mt::read(path, "", mt::Read::States).problem == "writable by other users");
    ::chmod(path.c_str(), 0600);
    if (::geteuid() == 0) {  // only root can give a file away
      REQUIRE(::chown(path.c_str(), 65534, 65534) == 0);
      CHECK(mt::read(path, "", mt::Read::States).problem.rfind("owned by uid 65534, not this user", 0) == 0);
      REQUIRE(::chown(path.c_str(), 0, 0) == 0);
    }
    const std::string link = dir + "/link.slots";
    fs::create_symlink(path, link);
    CHECK(mt::read(link, "", mt::Read::States).problem == "a symbolic link, not a slot file");
    const std::string text = dir + "/text.slots";
    { std::FILE* f = std::fopen(text.c_str(), "w"); std::fputs(std::string(5000, 'x').c_str(), f); std::fclose(f); }
    ::chmod(text.c_str(), 0600);
    CHECK(mt::read(text, "", mt::Read::States).problem == "not a memory-tier slot file");
  }
}

TEST_CASE("a state that outgrows its slot makes a larger file; abandoned files are removed") {
  const std::string dir = scratch("grow"), run = scratch("grow_run");
  mt::Writer w(dir, run);
  w.write(sample_state(1), 1);
  const uint64_t small = mt::read(w.path(), "", mt::Read::Seals).slot_bytes;
  Checkpoint big = sample_state(2);
  big.groups["model"].tensors["big"] = Tensor::zeros({static_cast<int64_t>(small / 4)});
  w.write(big, 2);
  const mt::Contents c = mt::read(w.path(), "", mt::Read::States);
  CHECK(c.slot_bytes > small);
  REQUIRE(c.newest());
  CHECK(c.newest()->global_step == 2);
  check_same(big, *c.newest()->state);
  CHECK(c.slots[1].problem == "never written");

  // The run directory deleted: its slot file goes at the next sweep; a live run's stays.
  const std::string live = scratch("grow_live");
  mt::Writer other(dir, live);
  other.write(sample_state(3), 3);
  fs::remove_all(run);
  const std::vector<std::string> removed = mt::remove_abandoned(dir);
  REQUIRE(removed.size() == 1);
  CHECK(removed[0] == w.path());
  CHECK_FALSE(fs::exists(w.path()));
  CHECK(fs::exists(other.path()));
  other.remove();
}

TEST_CASE("an index that asks for more memory than its slot holds is refused, checksums sound or not") {
  const std::string dir = scratch("crafted"), run = scratch("crafted_run");
  mt::Writer w(dir, run);
  w.write(sample_state(1), 1);  // no step digest: the seal hashes every byte
  const mt::Contents before = mt::read(w.path(), "", mt::Read::Seals);
  const off_t slot = 4096, payload_at = slot + 4096;
  const int fd = ::open(w.path().c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  // The seal's fields (docs/recovery.md): sealed, sequence, step, index bytes, payload bytes, digest, crc.
  uint64_t seal[6];
  REQUIRE(::pread(fd, seal, sizeof seal, slot) == sizeof seal);
  std::vector<unsigned char> payload(seal[4]);
  REQUIRE(::pread(fd, payload.data(), payload.size(), payload_at) == static_cast<ssize_t>(payload.size()));
  nlohmann::json index = nlohmann::json::parse(payload.begin(), payload.begin() + static_cast<long>(seal[3]));
  index["groups"]["model"]["tensors"]["w"]["shape"] = std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 20};
  const std::string text = index.dump();
  REQUIRE(text.size() <= index["groups"]["model"]["tensors"]["odd"]["offset"].get<std::size_t>());
  std::fill(payload.begin(), payload.begin() + static_cast<long>(std::max<std::size_t>(text.size(), seal[3])), 0);
  std::copy(text.begin(), text.end(), payload.begin());
  // Sealed again as a writer would: the digest of every word, then the seal's CRC.
  uint64_t digest = 0;
  engine::kernels::cpu::digest_words(static_cast<int64_t>(payload.size() / 4),
                                     reinterpret_cast<const uint32_t*>(payload.data()), 0, &digest);
  seal[3] = text.size();
  seal[5] = digest;
  const uint32_t crc = static_cast<uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(&seal[1]), 5 * sizeof(uint64_t)));
  REQUIRE(::pwrite(fd, payload.data(), payload.size(), payload_at) == static_cast<ssize_t>(payload.size()));
  REQUIRE(::pwrite(fd, seal, sizeof seal, slot) == sizeof seal);
  REQUIRE(::pwrite(fd, &crc, sizeof crc, slot + static_cast<off_t>(sizeof seal)) == sizeof crc);
  ::close(fd);
  const mt::Contents c = mt::read(w.path(), "", mt::Read::States);
  CHECK(c.slots[0].problem == "its index does not parse: model/w: its bytes do not lie in the payload as its shape says");
  CHECK_FALSE(c.newest());
  CHECK(before.slot_bytes == c.slot_bytes);
  w.remove();
}
