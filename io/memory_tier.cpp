// The memory tier's slot file (engine/io/memory_tier.h; layout: docs/recovery.md).
#include "engine/io/memory_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "engine/io/step_digest.h"
#include "io/fnv1a.h"
#include "io/memory_tier_slots.h"
#include "kernels/cpu/bulk_copy.h"

namespace engine::memory_tier {

using namespace slots;  // the file's layout (io/memory_tier_slots.h)

namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

// Opens an existing slot file for reading or writing, refusing what is not this user's own.
int open_own(const std::string& path, int flags, std::string& problem, struct stat& st) {
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    problem = err == ENOENT ? "no slot file" : err == ELOOP ? "a symbolic link, not a slot file" : errno_text(err);
    return -1;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) problem = "not a regular file";
  else if (st.st_uid != ::geteuid())
    problem = "owned by uid " + std::to_string(st.st_uid) + ", not this user (uid " + std::to_string(::geteuid()) + ")";
  else if (st.st_mode & (S_IWGRP | S_IWOTH)) problem = "writable by other users";
  if (!problem.empty()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool read_exact(int fd, void* dst, std::size_t n, off_t at) {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    at += r;
  }
  return true;
}

// The header of an open slot file, checked against its size; why not, or "".
std::string read_header(int fd, uint64_t file_bytes, FileHeader& h) {
  if (file_bytes < kHeaderBytes || !read_exact(fd, &h, sizeof h, 0))
    return "truncated: " + std::to_string(file_bytes) + " bytes, not even a header";
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return "not a memory-tier slot file";
  if (h.crc != header_crc(h)) return "header checksum mismatch";
  if (h.layout_version != kLayoutVersion)
    return "layout version " + std::to_string(h.layout_version) + " (this engine reads " +
           std::to_string(kLayoutVersion) + ")";
  if (h.header_bytes != kHeaderBytes || h.slot_bytes < kSealBytes || h.run_dir_bytes >= sizeof h.run_dir)
    return "an inconsistent header";
  for (const uint64_t off : h.slot_offset)
    if (off < kHeaderBytes || off > file_bytes || file_bytes - off < h.slot_bytes)
      return "truncated: " + std::to_string(file_bytes) + " bytes, the header describes slots up to " +
             std::to_string(std::max(h.slot_offset[0], h.slot_offset[1]) + h.slot_bytes);
  return "";
}

}  // namespace

std::string canonical_run_dir(const std::string& run_dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(run_dir, ec), ec);
  if (ec) p = fs::absolute(run_dir).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string file_for(const std::string& dir, const std::string& run_dir) {
  return (fs::path(dir) / ("engine-" + std::to_string(::geteuid()) + "-" + digest_hex(fnv1a(canonical_run_dir(run_dir))) +
                           ".slots"))
      .string();
}

const Slot* Contents::newest() const {
  const Slot* best = nullptr;
  for (const Slot& s : slots)
    if (s.problem.empty() && (!best || s.sequence > best->sequence)) best = &s;
  return best;
}

Contents read(const std::string& path, const std::string& expected_run_dir, Read what) {
  Contents c;
  c.path = path;
  struct stat st {};
  const int fd = open_own(path, O_RDONLY, c.problem, st);
  if (fd < 0) return c;
  FileHeader h{};
  c.problem = read_header(fd, static_cast<uint64_t>(st.st_size), h);
  if (c.problem.empty()) {
    c.run_dir.assign(h.run_dir, h.run_dir_bytes);
    c.slot_bytes = h.slot_bytes;
    if (!expected_run_dir.empty() && c.run_dir != expected_run_dir)
      c.problem = "the slot file of another run directory (" + c.run_dir + ")";
  }
  if (!c.problem.empty()) {
    ::close(fd);
    return c;
  }
  std::vector<unsigned char> payload;
  for (int i = 0; i < 2; ++i) {
    Slot s;
    s.index = i;
    SlotSeal seal{};
    if (!read_exact(fd, &seal, sizeof seal, static_cast<off_t>(h.slot_offset[i]))) {
      s.problem = "cannot read its seal";
      c.slots.push_back(std::move(s));
      continue;
    }
    s.problem = check_seal(seal, h.slot_bytes);
    s.sealed = seal.sealed == kSealed;
    s.sequence = seal.sequence;
    s.global_step = seal.global_step;
    s.payload_bytes = seal.payload_bytes;
    s.digest = seal.digest;
    if (s.problem.empty() && what == Read::States) {
      payload.resize(seal.payload_bytes);
      if (!read_exact(fd, payload.data(), payload.size(), static_cast<off_t>(h.slot_offset[i] + kSealBytes))) {
        s.problem = "cannot read its payload";
      } else {
        try {
          bool by_step_digest = false;
          const uint64_t d = seal_digest_of(payload.data(), seal, by_step_digest);
          if (d != seal.digest) {
            s.problem = "checksum mismatch: the payload's digest is " + digest_hex(d) + ", its seal records " + digest_hex(seal.digest);
          } else {
            Checkpoint state = state_of(payload.data(), seal);
            const uint64_t stored = by_step_digest ? stored_step_digest(state, path) : 0;
            const uint64_t computed = by_step_digest ? step_digest_of(state, path).combined() : 0;
            if (stored != computed)
              s.problem = "checksum mismatch: its tensors give the step digest " + digest_hex(computed) + ", it records " +
                          digest_hex(stored);
            else
              s.state = std::move(state);
          }
        } catch (const std::exception& e) {
          s.problem = std::string("its index does not parse: ") + e.what();
        }
      }
    }
    c.slots.push_back(std::move(s));
  }
  ::close(fd);
  return c;
}

struct Writer::Impl {
  std::string dir, path, run_dir;
  int fd = -1;
  unsigned char* map = nullptr;
  uint64_t map_bytes = 0;
  uint64_t slot_bytes = 0, slot_offset[2] = {0, 0};
  uint64_t sequence = 0;  // of the newest sealed slot
  int newest = -1;        // its index; -1 none
  uint64_t last_bytes = 0;

  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(path + ": " + what); }

  void unmap() {
    if (map) ::munmap(map, map_bytes);
    if (fd >= 0) ::close(fd);
    map = nullptr;
    fd = -1;
  }

  SlotSeal* seal(int i) { return reinterpret_cast<SlotSeal*>(map + slot_offset[i]); }

  // Adopts an existing file of this run directory: its slots stay as they are.
  bool adopt() {
    std::string problem;
    struct stat st {};
    const int f = open_own(path, O_RDWR, problem, st);
    if (f < 0) return false;
    FileHeader h{};
    if (!read_header(f, static_cast<uint64_t>(st.st_size), h).empty() ||
        std::string(h.run_dir, h.run_dir_bytes) != run_dir) {
      ::close(f);
      return false;
    }
    void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (m == MAP_FAILED) {
      ::close(f);
      return false;
    }
    fd = f;
    map = static_cast<unsigned char*>(m);
    map_bytes = static_cast<uint64_t>(st.st_size);
    slot_bytes = h.slot_bytes;
    slot_offset[0] = h.slot_offset[0];
    slot_offset[1] = h.slot_offset[1];
    for (int i = 0; i < 2; ++i) {
      const SlotSeal s = *seal(i);
      if (check_seal(s, slot_bytes).empty() && (newest < 0 || s.sequence > sequence)) {
        newest = i;
        sequence = s.sequence;
      }
    }
    return true;
  }

  // A new file with slots of `bytes` each, written whole under a temporary name and
  // renamed over `path`, so that a reader never sees it half made.
  void create(uint64_t bytes) {
    const std::string part = path + ".part." + std::to_string(::getpid());
    const int f = ::open(part.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (f < 0) fail("cannot create " + part + ": " + errno_text(errno));
    auto give_up = [&](const std::string& why) {
      const int err = errno;
      ::close(f);
      ::unlink(part.c_str());
      fail(why + ": " + errno_text(err));
    };
    const uint64_t total = kHeaderBytes + 2 * bytes;
    // posix_fallocate reserves the pages now: a full /dev/shm fails here, not as a
    // SIGBUS in the middle of a step.
    if (const int err = ::posix_fallocate(f, 0, static_cast<off_t>(total)); err != 0) {
      errno = err;
      give_up("cannot reserve " + std::to_string(total) + " bytes");
    }
    FileHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.layout_version = kLayoutVersion;
    h.header_bytes = kHeaderBytes;
    h.slot_bytes = bytes;
    h.slot_offset[0] = kHeaderBytes;
    h.slot_offset[1] = kHeaderBytes + bytes;
    h.owner_uid = static_cast<uint32_t>(::geteuid());
    if (run_dir.size() >= sizeof h.run_dir) give_up("the run directory's path is too long for the header");
    h.run_dir_bytes = static_cast<uint32_t>(run_dir.size());
    std::memcpy(h.run_dir, run_dir.data(), run_dir.size());
    h.crc = header_crc(h);
    if (::pwrite(f, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) give_up("cannot write the header");
    void* m = ::mmap(nullptr, static_cast<std::size_t>(total), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (m == MAP_FAILED) give_up("cannot map it");
    if (::rename(part.c_str(), path.c_str()) != 0) {
      ::munmap(m, static_cast<std::size_t>(total));
      give_up("cannot rename " + part + " to it");
    }
    unmap();
    fd = f;
    map = static_cast<unsigned char*>(m);
    map_bytes = total;
    slot_bytes = bytes;
    slot_offset[0] = h.slot_offset[0];
    slot_offset[1] = h.slot_offset[1];
    newest = -1;  // the new file's slots are empty; `sequence` goes on
  }
};

Writer::Writer(const std::string& dir, const std::string& run_dir) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = dir;
  m.run_dir = canonical_run_dir(run_dir);
  m.path = file_for(dir, run_dir);
  // Otherwise the first write() makes the file, sized for the state: what is at that
  // name now (another run directory's file, a damaged one) is replaced then, and another
  // user's cannot be (/dev/shm is sticky), which that write reports.
  m.adopt();
}

Writer::~Writer() { impl_->unmap(); }

void Writer::write(const Checkpoint& state, int64_t global_step) {
  Impl& m = *impl_;
  const Layout l = layout_of(state);
  if (!m.map || l.payload_bytes > m.slot_bytes - kSealBytes) {
    // A quarter more than this state, in whole MiB: the metrics grow a little each epoch.
    const uint64_t need = kSealBytes + l.payload_bytes + l.payload_bytes / 4;
    m.create((need + (1u << 20) - 1) / (1u << 20) * (1u << 20));
  }
  const int target = m.newest < 0 ? 0 : 1 - m.newest;
  SlotSeal* s = m.seal(target);
  // Unsealed first: a kill from here until the seal leaves this slot torn, the other sound.
  reinterpret_cast<std::atomic<uint64_t>*>(&s->sealed)->store(0, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  unsigned char* payload = m.map + m.slot_offset[target] + kSealBytes;
  // The digest is of the payload's words from word 0, as a reader hashes it: each piece
  // starts at a word boundary, the bytes after a piece's last partial word are zero, and
  // so are the gaps. The pieces the seal covers are small (the index, the trainer's
  // buffers): copied, then hashed where they landed, still in cache.
  uint64_t digest = 0, done = 0;  // `done`: bytes written (and hashed), a multiple of 4
  auto zeros_to = [&](uint64_t end) {
    if (end <= done) return;
    std::memset(payload + done, 0, end - done);
    digest += digest_at(payload, done, end - done);
    done = end;
  };
  auto piece = [&](const void* src, uint64_t bytes, uint64_t offset, bool hashed) {
    zeros_to(offset);
    const uint64_t whole_words = (bytes + 3) / 4 * 4;
    if (hashed) std::memcpy(payload + offset, src, bytes);
    else kernels::cpu::copy_bypassing_cache(payload + offset, src, bytes);
    std::memset(payload + offset + bytes, 0, whole_words - bytes);
    if (hashed) digest += digest_at(payload, offset, whole_words);
    done = offset + whole_words;
  };
  piece(l.index.data(), l.index.size(), 0, true);
  for (const Placed& p : l.tensors) piece(p.tensor->raw(), p.tensor->nbytes(), p.offset, !p.by_step_digest);
  zeros_to(l.payload_bytes);
  SlotSeal seal{};
  seal.sequence = m.sequence + 1;
  seal.global_step = global_step;
  seal.index_bytes = l.index.size();
  seal.payload_bytes = l.payload_bytes;
  seal.digest = digest;
  seal.crc = seal_crc(seal);
  std::memcpy(reinterpret_cast<unsigned char*>(s) + sizeof(uint64_t),
              reinterpret_cast<const unsigned char*>(&seal) + sizeof(uint64_t), sizeof seal - sizeof(uint64_t));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<std::atomic<uint64_t>*>(&s->sealed)->store(kSealed, std::memory_order_release);
  m.sequence = seal.sequence;
  m.newest = target;
  m.last_bytes = l.payload_bytes;
}

void Writer::remove() {
  Impl& m = *impl_;
  m.unmap();
  ::unlink(m.path.c_str());
}

const std::string& Writer::path() const { return impl_->path; }
uint64_t Writer::last_bytes() const { return impl_->last_bytes; }

bool is_slot_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  char magic[sizeof kMagic] = {};
  const bool yes = read_exact(fd, magic, sizeof magic, 0) && std::memcmp(magic, kMagic, sizeof kMagic) == 0;
  ::close(fd);
  return yes;
}

std::string describe(const Contents& c) {
  std::string out = "memory tier slot file " + c.path + "\n";
  if (!c.problem.empty()) return out + "  not used: " + c.problem + "\n";
  out += "  run directory: " + c.run_dir + "\n  slot size: " + std::to_string(c.slot_bytes) + " bytes\n";
  for (const Slot& s : c.slots) {
    out += "  slot " + std::to_string(s.index) + ": ";
    if (s.problem == "never written") {
      out += "never written\n";
      continue;
    }
    out += "write " + std::to_string(s.sequence) + ", global step " + std::to_string(s.global_step);
    if (s.state) {
      try {
        const StateDict& t = s.state->group("trainer");
        out += " (epoch " + std::to_string(t.get_int("epoch")) + " done, step " + std::to_string(t.get_int("step_in_epoch")) +
               " of the next)";
      } catch (const std::exception&) {
      }
    }
    char size[64];
    std::snprintf(size, sizeof size, ", %.2f MB", static_cast<double>(s.payload_bytes) / 1e6);
    out += size;
    out += s.problem.empty() ? ": sound\n" : ": " + s.problem + "\n";
  }
  const Slot* n = c.newest();
  out += n ? "  newest sound: slot " + std::to_string(n->index) + " (global step " + std::to_string(n->global_step) + ")\n"
           : std::string("  no sound slot\n");
  return out;
}

std::vector<std::string> remove_abandoned(const std::string& dir) {
  std::vector<std::string> removed;
  const std::string prefix = "engine-" + std::to_string(::geteuid()) + "-";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string path = (fs::path(dir) / name).string();
    // A writer's file under construction that its process left behind.
    const std::size_t part = name.find(".slots.part.");
    if (part != std::string::npos) {
      const std::string pid = name.substr(part + 12);
      if (!pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos &&
          ::kill(static_cast<pid_t>(std::stoll(pid)), 0) != 0 && errno == ESRCH && ::unlink(path.c_str()) == 0)
        removed.push_back(path);
      continue;
    }
    if (name.size() < 6 || name.compare(name.size() - 6, 6, ".slots") != 0) continue;
    const Contents c = read(path, "", Read::Seals);
    if (!c.problem.empty() || c.run_dir.empty()) continue;  // not ours to judge
    std::error_code ec;
    if (!fs::exists(c.run_dir, ec) && !ec && ::unlink(path.c_str()) == 0) removed.push_back(path);
  }
  ::closedir(d);
  return removed;
}

}  // namespace engine::memory_tier