// Reading a checkpoint: the file into one buffer, checked against its header; the HDF5
// structure walked by the sandboxed parser process (io/hdf5_sandbox.h), never in this
// process; the checkpoint assembled from the parser's manifest, checked against the
// buffer (io/checkpoint_assemble.h). docs/security.md gives the trust model.
#include "io/aligned_bytes.h"
#include "io/checkpoint_format.h"
#include "io/checkpoint_hdf5.h"
#include "io/checkpoint_header.h"
#include "io/checkpoint_reader.h"
#include "io/side_by_side.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>

#include "io/checkpoint_assemble.h"
#include "io/crc32.h"
#include "io/hdf5_sandbox.h"
#include "engine/io/step_digest.h"

namespace engine {
namespace checkpoint_internal {
namespace {

// ---------------------------------------------------------------------------------
// Reading.

// Reads [begin, end) of `fd` into data + begin, in pieces small enough to stay in cache
// while their checksum is taken; pieces before `split` go to crc_before, the rest to
// crc_after. Returns the offset reached (short of `end` at end of file); `err` is set to
// the errno of a failed read.
std::size_t read_range_with_crc(Env& env, int fd, unsigned char* data, std::size_t begin, std::size_t end,
                                std::size_t split, uint32_t& crc_before, uint32_t& crc_after, int& err) {
  constexpr std::size_t kPiece = std::size_t(256) << 10;
  std::size_t pos = begin;
  crc_before = crc_after = 0;
  while (pos < end) {
    const std::size_t limit = pos < split ? std::min(end, split) : end;
    const ssize_t n = env.pread(fd, data + pos, std::min(limit - pos, kPiece), static_cast<off_t>(pos));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    uint32_t& crc = pos < split ? crc_before : crc_after;
    crc = crc32_update(crc, data + pos, static_cast<std::size_t>(n));
    pos += static_cast<std::size_t>(n);
  }
  return pos;
}

// An open checkpoint file being read into one buffer; every refusal names the file.
class FileReader {
 public:
  // Opened without blocking (a FIFO with no writer would wait forever) and refused
  // unless it is a regular file; a refusal closes what it opened.
  FileReader(Env& env, const std::string& path) : env_(env), path_(path) {
    fd_ = env_.open_for_reading(path);
    if (fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    FileInfo info;
    std::string refusal;
    if (env_.fstat(fd_, info) != 0) refusal = std::string("cannot stat: ") + std::strerror(errno);
    else if (info.kind == FileKind::Directory) refusal = "is a directory, not a file";
    else if (info.kind != FileKind::Regular) refusal = "not a regular file (a FIFO, socket or device)";
    if (!refusal.empty()) {
      env_.close(fd_);
      fail(path, refusal);
    }
    size_ = info.size;
  }
  ~FileReader() { env_.close(fd_); }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  std::size_t size() const { return size_; }
  const std::shared_ptr<Bytes>& bytes() const { return bytes_; }

  // The first min(size, 512) bytes, read into `header` before any buffer exists, so that
  // a file that is not a checkpoint (of any size) is refused without allocating it.
  std::size_t read_header(unsigned char (&header)[kUserBlockBytes]) {
    const std::size_t want = std::min(size_, kUserBlockBytes);
    std::size_t got = 0;
    while (got < want) {
      const ssize_t n = env_.pread(fd_, header + got, want - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path_, std::string("cannot read: ") + std::strerror(errno));
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    check_read(got, want, 0);
    return got;
  }

  // The buffer for the whole file, starting with the header bytes already read.
  void allocate(const unsigned char* header, std::size_t header_bytes) {
    bytes_ = std::make_shared<Bytes>(size_);
    std::memcpy(bytes_->data(), header, header_bytes);
  }

  // Reads [begin, end), checksummed as two parts split at `split`; fails if the file
  // ends early.
  void read(std::size_t begin, std::size_t end, std::size_t split, uint32_t& crc_before, uint32_t& crc_after) {
    int err = 0;
    const std::size_t reached =
        read_range_with_crc(env_, fd_, bytes_->data(), begin, end, split, crc_before, crc_after, err);
    check_read(reached, end, err);
  }

  // Reads [begin, end) with two threads, one half each, and returns the checksum of it.
  uint32_t read_in_halves(std::size_t begin, std::size_t end) {
    const std::size_t mid = std::max(begin, (begin + (end - begin) / 2) / 4096 * 4096);
    uint32_t crcs[2][2] = {{0, 0}, {0, 0}};
    std::size_t reached[2] = {0, 0};
    int errs[2] = {0, 0};
    auto read_half = [&](int half) {
      reached[half] = read_range_with_crc(env_, fd_, bytes_->data(), half == 0 ? begin : mid, half == 0 ? mid : end,
                                          end, crcs[half][0], crcs[half][1], errs[half]);
    };
    side_by_side([&] { read_half(0); }, [&] { read_half(1); });
    check_read(reached[0], mid, errs[0]);
    check_read(reached[1], end, errs[1]);
    return static_cast<uint32_t>(crc32_combine(crcs[0][0], crcs[1][0], static_cast<z_off_t>(end - mid)));
  }

  // A file that grew since it was measured is not the file whose header was checked.
  void check_not_grown() {
    unsigned char probe = 0;
    ssize_t n;
    do n = env_.pread(fd_, &probe, 1, static_cast<off_t>(size_));
    while (n < 0 && errno == EINTR);
    if (n > 0) fail(path_, "length mismatch: the file grew while it was being read");
  }

 private:
  void check_read(std::size_t reached, std::size_t end, int err) {
    if (err != 0) fail(path_, std::string("cannot read: ") + std::strerror(err));
    if (reached < end)
      fail(path_, "truncated: the file shrank to " + std::to_string(reached) + " bytes while it was being read");
  }

  Env& env_;
  std::string path_;
  int fd_ = -1;
  std::size_t size_ = 0;
  std::shared_ptr<Bytes> bytes_;
};


// Upgrades from older layouts, keyed by the version they upgrade from; a layout change
// adds one here (see the format doc).
// `path` names the file in an upgrade's refusal.
using Upgrade = void (*)(Checkpoint&, const std::string& path);
const std::map<int64_t, Upgrade>& upgrades() {
  static const std::map<int64_t, Upgrade> table = {
      // Version 2 changed only the user-block header (metadata_bytes, metadata_crc32).
      {1, [](Checkpoint&, const std::string&) {}},
      // Version 3 added trainer/epoch_elapsed_seconds: an older file's partial epoch
      // counts as having taken no time so far (its epoch_seconds then counts the resumed
      // part only, as version 2 did).
      {2, [](Checkpoint& c, const std::string&) {
         auto g = c.groups.find("trainer");
         if (g != c.groups.end() && !g->second.empty() && !g->second.scalars.count("epoch_elapsed_seconds"))
           g->second.scalars["epoch_elapsed_seconds"] = 0.0;
       }},
      // Version 4 added trainer/step_digest: everything it digests is in every older
      // file, so the upgrade computes it from the stored tensors and counters.
      {3, [](Checkpoint& c, const std::string& path) {
         auto g = c.groups.find("trainer");
         if (g != c.groups.end() && !g->second.empty() && !g->second.scalars.count("step_digest"))
           g->second.scalars["step_digest"] = digest_hex(step_digest_of(c, path).combined());
       }},
  };
  return table;
}

// The checkpoint from the parser's answer about the verified buffer `bytes`.
Checkpoint finish_load(const std::string& path, const hdf5_sandbox::Reply& reply, const std::shared_ptr<Bytes>& bytes,
                       const Header& header) {
  using hdf5_sandbox::Outcome;
  if (reply.outcome != Outcome::Parsed)
    fail(path, reply.outcome == Outcome::NeedsData ? "the HDF5 parser asked for data it already has" : reply.message);
  Checkpoint ckpt = assemble_checkpoint(path, reply.manifest, bytes, bytes->data(), bytes->size(), header.format_version);
  normalise_keys(path, ckpt.groups);
  for (int64_t v = ckpt.meta.format_version; v < kCheckpointFormatVersion; ++v) {
    auto it = upgrades().find(v);
    if (it == upgrades().end()) fail(path, "no upgrade from format_version " + std::to_string(v));
    it->second(ckpt, path);
  }
  return ckpt;
}

}  // namespace

// The same checks as load_checkpoint, on bytes already in memory: the checksums are
// taken first and the whole image handed to the parser after.
Checkpoint load_checkpoint_from_bytes(const std::string& name, const unsigned char* data, std::size_t size) {
  const Header header = parse_header(name, data, size);
  auto bytes = std::make_shared<Bytes>(size);
  std::memcpy(bytes->data(), data, size);
  const std::size_t metadata_end = kUserBlockBytes + header.metadata_bytes;
  const uint32_t metadata_crc = crc32_update(0, bytes->data() + kUserBlockBytes, header.metadata_bytes);
  const uint32_t data_crc = crc32_update(0, bytes->data() + metadata_end, size - metadata_end);
  check_checksum(name, "metadata", metadata_crc, header.metadata_crc);
  check_checksum(name, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
  const hdf5_sandbox::Reply reply =
      hdf5_sandbox::parse(bytes->data(), size, size, hdf5_sandbox::ImageContent::Complete);
  return finish_load(name, reply, bytes, header);
}

}  // namespace checkpoint_internal

using namespace checkpoint_internal;

void start_checkpoint_parser() { hdf5_sandbox::prepare(); }

CheckpointParserConfinement checkpoint_parser_confinement() {
  const hdf5_sandbox::Confinement c = hdf5_sandbox::confinement();
  CheckpointParserConfinement out;
  if (!c.known) {
    out.reason = c.start_error;
    out.summary = "not started (" + c.start_error + ")";
  } else if (c.seccomp_errno == 0) {
    out.seccomp_filter = true;
    out.summary = "seccomp filter";
  } else {
    out.reason = "prctl(PR_SET_SECCOMP): " + std::string(std::strerror(c.seccomp_errno));
    out.summary = "no seccomp filter (" + out.reason + "): " +
                  (c.required ? "ENGINE_PARSER_SECCOMP=require refuses every checkpoint"
                              : "files are parsed without it (ENGINE_PARSER_SECCOMP=require refuses them)");
  }
  if (!c.policy_error.empty()) out.summary += "; " + c.policy_error + ": every checkpoint is refused";
  return out;
}

// Reading a checkpoint: the header, then the HDF5 metadata (metadata_bytes after the
// header) and its checksum. libhdf5 never parses the file in this process: the parser
// process (io/hdf5_sandbox.h) walks the metadata into a manifest while this thread
// reads and checks the dataset bytes, and the checkpoint is assembled from the
// manifest with every shape, offset and length checked against the verified buffer
// (docs/security.md). Loaded tensors point into the buffer.
Checkpoint load_checkpoint(const std::string& path, Env* env) {
  // HDF5 reads some structures 512 bytes at a time from where they start; the parser is
  // given the bytes just past the metadata too, as it would read them from the file.
  constexpr std::size_t kMetadataMargin = std::size_t(64) << 10;
  constexpr std::size_t kHalvesFrom = std::size_t(1) << 20;
  FileReader reader(env_or_posix(env), path);
  const std::size_t size = reader.size();
  unsigned char header_bytes[kUserBlockBytes];
  const std::size_t header_read = reader.read_header(header_bytes);
  const Header header = parse_header(path, header_bytes, size);
  reader.allocate(header_bytes, header_read);
  const std::size_t metadata_end = kUserBlockBytes + header.metadata_bytes;
  const std::size_t margin_end = std::min(size, metadata_end + kMetadataMargin);
  unsigned char* const file = reader.bytes()->data();
  using hdf5_sandbox::ImageContent;
  using hdf5_sandbox::Outcome;

  hdf5_sandbox::Reply reply;
  if (margin_end == size) {  // nothing to overlap: read and check everything first
    uint32_t metadata_crc = 0, data_crc = 0;
    if (metadata_end == size && size >= kHalvesFrom)
      metadata_crc = reader.read_in_halves(kUserBlockBytes, size);
    else
      reader.read(kUserBlockBytes, size, metadata_end, metadata_crc, data_crc);
    reader.check_not_grown();
    check_checksum(path, "metadata", metadata_crc, header.metadata_crc);
    check_checksum(path, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
    reply = hdf5_sandbox::parse(file, size, size, ImageContent::Complete);
  } else {
    uint32_t metadata_crc = 0, margin_crc = 0, rest_crc = 0;
    reader.read(kUserBlockBytes, margin_end, metadata_end, metadata_crc, margin_crc);
    check_checksum(path, "metadata", metadata_crc, header.metadata_crc);
    hdf5_sandbox::start(file, margin_end, size, ImageContent::MetadataOnly);
    try {
      uint32_t none = 0;
      reader.read(margin_end, size, margin_end, none, rest_crc);
      reader.check_not_grown();
      const uint32_t data_crc = crc_join(margin_crc, rest_crc, size - margin_end);
      check_checksum(path, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
    } catch (...) {
      (void)hdf5_sandbox::finish();
      throw;
    }
    reply = hdf5_sandbox::finish();
    // Chunked data is read through HDF5, so the parser needs the whole file; and a
    // writer that understated metadata_bytes gets the file's real answer from a walk of
    // all of it.
    if (reply.outcome == Outcome::NeedsData || reply.outcome == Outcome::Refused)
      reply = hdf5_sandbox::parse(file, size, size, ImageContent::Complete);
  }
  return finish_load(path, reply, reader.bytes(), header);
}

}  // namespace engine
