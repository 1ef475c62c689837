#include "run/tfevents.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "engine/io/checkpoint.h"
#include "engine/run/run_files.h"
#include "io/atomic_file.h"
#include "io/crc32c.h"

namespace engine::tfevents {

namespace fs = std::filesystem;

namespace {

const char kFilePrefix[] = "events.out.tfevents.";

// Protobuf wire format: tag = field << 3 | wire type (0 varint, 1 fixed64,
// 2 length-delimited, 5 fixed32).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_le(std::string& out, T v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format is
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_varint(e, 1 << 3 | 1);  // wall_time: double
  put_le(e, wall_time);
  if (step != 0) {  // proto3 omits the default
    put_varint(e, 2 << 3 | 0);  // step: int64
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

// A disk's refusal, like a checkpoint's: checkpoint.on_error decides what follows.
[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointWriteError(path + ": cannot write TensorBoard events (" + what + ")");
}

void write_file_synced(Env& env, const std::string& path, const std::string& bytes) {
  const ScopedSigxfszBlock no_sigxfsz;  // EFBIG, not death, past `ulimit -f`
  const int fd = env.create(path, 0644);
  if (fd < 0) fail(path, std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = env.pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string err = std::strerror(n < 0 ? errno : EIO);
      env.close(fd);
      env.remove(path);
      fail(path, err);
    }
    done += static_cast<std::size_t>(n);
  }
  if (env.fsync(fd) != 0) {
    const std::string err = std::strerror(errno);
    env.close(fd);
    env.remove(path);
    fail(path, err);
  }
  if (env.close(fd) != 0) {
    const std::string err = std::strerror(errno);
    env.remove(path);
    fail(path, err);
  }
}

}  // namespace

std::string frame_record(const std::string& payload) {
  std::string header;
  put_le(header, static_cast<uint64_t>(payload.size()));
  std::string out = header;
  put_le(out, crc32c_masked(reinterpret_cast<const unsigned char*>(header.data()), header.size()));
  out += payload;
  put_le(out, crc32c_masked(reinterpret_cast<const unsigned char*>(payload.data()), payload.size()));
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& values) {
  std::string summary;
  for (const Scalar& s : values) {
    std::string value;
    put_bytes_field(value, 1, s.tag);
    put_varint(value, 2 << 3 | 5);  // simple_value: float
    put_le(value, s.value);
    put_bytes_field(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes_field(e, 5, summary);
  return e;
}

std::string run_events(double start_time, const std::vector<EpochMetrics>& history,
                       const std::optional<EvalResult>& test) {
  std::string out = frame_record(file_version_event(start_time));
  double t = start_time;
  for (const EpochMetrics& m : history) {
    t += m.epoch_seconds;
    std::vector<Scalar> values;
    for (const EpochMetricField& f : epoch_metric_fields()) values.push_back({f.name, static_cast<float>(m.*f.member)});
    out += frame_record(scalars_event(t, m.epoch, values));
  }
  if (test) {
    const int64_t step = history.empty() ? 0 : history.back().epoch;
    out += frame_record(scalars_event(t, step,
                                      {{"test_loss", static_cast<float>(test->loss)},
                                       {"test_acc", static_cast<float>(test->accuracy)}}));
  }
  return out;
}

std::string write_run_events(Env& env, const std::string& run_dir, const std::vector<EpochMetrics>& history,
                             const std::optional<EvalResult>& test) {
  const fs::path dir = fs::path(run_dir) / run_files::kTensorBoard;
  if (env.make_dirs(dir.string()) != 0) {
    const int err = errno;
    fail(dir.string(), std::strerror(err));
  }
  // Keep the name of the file an earlier session of this run wrote (the first, should
  // there be several); its <start> field is the start_time of every wall time. A
  // directory that cannot be listed starts a new file.
  std::string name;
  std::vector<std::string> names;
  if (env.list_dir(dir.string(), names) != 0) names.clear();
  for (const std::string& f : names) {
    FileInfo info;
    if (f.rfind(kFilePrefix, 0) == 0 && env.stat((dir / f).string(), info) == 0 && info.kind == FileKind::Regular &&
        (name.empty() || f < name))
      name = f;
  }
  double start_time = 0;
  if (!name.empty()) {
    start_time = std::strtod(name.c_str() + std::strlen(kFilePrefix), nullptr);
  } else {
    const auto now = env.wall_now().time_since_epoch();
    const long long secs = std::chrono::duration_cast<std::chrono::seconds>(now).count();
    name = kFilePrefix + std::to_string(secs) + "." + host_name();
    start_time = static_cast<double>(secs);
  }
  const fs::path path = dir / name;
  // The temporary name lacks "tfevents", so TensorBoard never reads a half-written file.
  const fs::path tmp = dir / run_files::kEventsRewrite;
  write_file_synced(env, tmp.string(), run_events(start_time, history, test));
  if (env.rename(tmp.string(), path.string()) != 0) {
    const int err = errno;
    fail(path.string(), std::strerror(err));
  }
  (void)env.fsync_dir(dir.string());  // best effort: the rename itself is atomic
  return path.string();
}

}  // namespace engine::tfevents
