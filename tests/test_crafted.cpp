// Crafted checkpoints: files whose HDF5 structure was made to crash, hang or exhaust
// libhdf5 or the loader, with valid checksums. Each must be refused with one line
// naming the file (or load cleanly), quickly and in little memory, and never take the
// loading process down (docs/security.md).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "io/hdf5_sandbox.h"
#include "scratch_dir.h"

using namespace engine;
namespace fs = std::filesystem;
namespace sandbox_testing = engine::hdf5_sandbox::testing;

namespace {

std::string tmp_path(const std::string& name) { return (test_util::scratch_root("test_crafted") / name).string(); }

std::string fixture() {
  const char* root = std::getenv("ENGINE_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/data/checkpoint_v2_cpu_mid_epoch.h5";
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// metadata_bytes from the header of a version-2 file.
std::size_t metadata_bytes_of(const std::vector<unsigned char>& file) {
  const std::string header(file.begin(), file.begin() + 512);
  const std::size_t at = header.find("metadata_bytes ");
  REQUIRE(at != std::string::npos);
  return std::stoull(header.substr(at + 15));
}

long peak_rss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The message of a refusal, "" when the file loads.
std::string outcome_of(const std::string& path) {
  try {
    (void)load_checkpoint(path);
    return "";
  } catch (const CheckpointError& e) {
    return e.what();
  }
}

void check_one_line_naming(const std::string& path, const std::string& msg) {
  CHECK(msg.rfind(path + ": ", 0) == 0);
  CHECK(msg.find('\n') == std::string::npos);
}

}  // namespace

TEST_CASE("the fixture loads through the sandboxed parser, which is reused") {
  const Checkpoint c = load_checkpoint(fixture());
  CHECK(c.groups.count("model"));
  const int pid = sandbox_testing::parser_pid();
  CHECK(pid > 0);
  (void)load_checkpoint(fixture());
  CHECK(sandbox_testing::parser_pid() == pid);
}

TEST_CASE("a parser that crashes is a one-line refusal, and the next load gets a new parser") {
  const std::string path = fixture();
  sandbox_testing::inject_next(sandbox_testing::Fault::Crash);
  const std::string msg = outcome_of(path);
  check_one_line_naming(path, msg);
  CHECK(msg.find("could not be parsed safely (parser crashed: signal 11") != std::string::npos);
  CHECK(outcome_of(path).empty());
}

TEST_CASE("a parser that spins is stopped by its CPU limit") {
  const std::string path = fixture();
  const auto t0 = std::chrono::steady_clock::now();
  sandbox_testing::inject_next(sandbox_testing::Fault::Spin);
  const std::string msg = outcome_of(path);
  check_one_line_naming(path, msg);
  CHECK(msg.find("parser exceeded its CPU time limit") != std::string::npos);
  CHECK(seconds_since(t0) < 30);  // 2-3 s of CPU; wall time depends on the machine's load
  CHECK(outcome_of(path).empty());
}

TEST_CASE("a parser that blocks is killed by the watchdog") {
  const std::string path = fixture();
  sandbox_testing::set_wall_limit(1.0);
  const auto t0 = std::chrono::steady_clock::now();
  sandbox_testing::inject_next(sandbox_testing::Fault::Stall);
  const std::string msg = outcome_of(path);
  sandbox_testing::set_wall_limit(0);
  check_one_line_naming(path, msg);
  CHECK(msg.find("parser killed after 1 s without an answer") != std::string::npos);
  CHECK(seconds_since(t0) < 5);
  CHECK(outcome_of(path).empty());
}

TEST_CASE("a malformed reply or a parser out of memory is a refusal") {
  const std::string path = fixture();
  sandbox_testing::inject_next(sandbox_testing::Fault::Garbage);
  std::string msg = outcome_of(path);
  check_one_line_naming(path, msg);
  CHECK(msg.find("parser sent a malformed reply") != std::string::npos);

  sandbox_testing::inject_next(sandbox_testing::Fault::Allocate);
  msg = outcome_of(path);
  check_one_line_naming(path, msg);
  CHECK(msg.find("parser out of memory") != std::string::npos);
  CHECK(outcome_of(path).empty());
}

TEST_CASE("a parser killed from outside between loads is replaced") {
  (void)load_checkpoint(fixture());
  const int pid = sandbox_testing::parser_pid();
  REQUIRE(pid > 0);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  CHECK(outcome_of(fixture()).empty());
  CHECK(sandbox_testing::parser_pid() != pid);
}

// The experiment, as a test: random changes to the HDF5 metadata bytes of a real
// checkpoint, the header checksums recomputed. libhdf5 1.10 crashes or loops on some of
// these; the loader must survive every one.
TEST_CASE("300 resealed random metadata mutations: no crash, no hang, one-line refusals") {
  const std::vector<unsigned char> original = read_bytes(fixture());
  const std::size_t metadata_end = 512 + metadata_bytes_of(original);
  REQUIRE(metadata_end <= original.size());
  std::mt19937_64 rng(20261130);
  const std::string path = tmp_path("mutated.h5");
  int loaded = 0, refused = 0, parser_failures = 0;
  double slowest = 0;
  const long rss_before = peak_rss_kib();
  for (int i = 0; i < 300; ++i) {
    std::vector<unsigned char> bytes = original;
    const int changes = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < changes; ++k) {
      const std::size_t at = 512 + rng() % (metadata_end - 512);
      switch (rng() % 3) {
        case 0: bytes[at] ^= static_cast<unsigned char>(1u << (rng() % 8)); break;
        case 1: bytes[at] = static_cast<unsigned char>(rng()); break;
        default: bytes[at] = (rng() % 2) ? 0xff : 0x00; break;
      }
    }
    write_bytes(path, bytes);
    checkpoint_testing::reseal(path);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = outcome_of(path);
    slowest = std::max(slowest, seconds_since(t0));
    if (std::getenv("CRAFTED_VERBOSE")) MESSAGE(i << " " << seconds_since(t0) << " " << msg);
    if (msg.empty()) {
      ++loaded;
      continue;
    }
    ++refused;
    INFO("mutation " << i << ": " << msg);
    check_one_line_naming(path, msg);
    if (msg.find("could not be parsed safely") != std::string::npos) ++parser_failures;
  }
  MESSAGE("mutations: " << loaded << " loaded, " << refused << " refused (" << parser_failures
                        << " by a parser crash or limit); slowest load " << slowest << " s");
  CHECK(loaded + refused == 300);
  CHECK(slowest < 60);
  CHECK(peak_rss_kib() - rss_before < 256 * 1024);
  CHECK(outcome_of(fixture()).empty());
}
