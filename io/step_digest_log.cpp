// step_digests.jsonl: one CRC-framed JSON line per optimizer step (engine/io/step_digest.h;
// docs/checkpoint-format.md, "Step digests").
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/io/step_digest.h"
#include "io/crc32.h"

namespace engine::step_digest_log {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": " + why);
}
std::string errno_text(int err) { return std::strerror(err); }

std::string crc_hex(uint32_t crc) {
  static const char digits[] = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, crc >>= 4) s[static_cast<std::size_t>(i)] = digits[crc & 15];
  return s;
}

uint32_t crc_of(const std::string& text) {
  return crc32_update(0, reinterpret_cast<const unsigned char*>(text.data()), text.size());
}

// The whole file, or nullopt when there is none.
std::optional<std::string> read_whole(const std::string& path, Env& env) {
  const int fd = env.open_for_reading(path);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    fail(path, "cannot open: " + errno_text(errno));
  }
  std::string text;
  FileInfo info;
  int err = 0;
  bool regular = true;
  if (env.fstat(fd, info) != 0) err = errno;
  else regular = info.kind == FileKind::Regular;
  if (err == 0 && regular) {
    // Read to the end, not to the measured size: the file is ours, but a size taken a
    // moment earlier may be stale.
    text.resize(info.size);
    std::size_t pos = 0;
    for (;;) {
      if (pos == text.size()) text.resize(text.size() + 4096);
      const ssize_t n = env.pread(fd, &text[pos], text.size() - pos, static_cast<off_t>(pos));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) err = errno;
      if (n <= 0) break;
      pos += static_cast<std::size_t>(n);
    }
    text.resize(pos);
  }
  env.close(fd);
  if (!regular) fail(path, "not a regular file");
  if (err != 0) fail(path, "cannot read: " + errno_text(err));
  return text;
}

// Why `j` is not a record (empty when it is one); fills `d`.
std::string parse_record(const nlohmann::json& j, StepDigest& d) {
  if (!j.is_object()) return "not a JSON object";
  auto int_field = [&](const char* key, int64_t& out) -> std::string {
    auto it = j.find(key);
    if (it == j.end()) return std::string("no \"") + key + "\"";
    if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX))
      return std::string("\"") + key + "\" is not an int64";
    out = it->get<int64_t>();
    return "";
  };
  auto digest_field = [](const nlohmann::json& v, const std::string& what, uint64_t& out) -> std::string {
    if (!v.is_string()) return what + " is not a string";
    const std::optional<uint64_t> x = parse_digest_hex(v.get<std::string>());
    if (!x) return what + " is not 16 hex digits";
    out = *x;
    return "";
  };
  std::string why;
  if (!(why = int_field("step", d.global_step)).empty()) return why;
  if (!(why = int_field("epoch", d.epoch)).empty()) return why;
  if (!(why = int_field("step_in_epoch", d.step_in_epoch)).empty()) return why;
  auto off = j.find("shuffle_offset");
  if (off == j.end()) return "no \"shuffle_offset\"";
  if (!off->is_number_unsigned()) return "\"shuffle_offset\" is not a uint64";
  d.shuffle_offset = off->get<uint64_t>();
  auto rng = j.find("rng");
  if (rng == j.end() || !rng->is_object()) return "no \"rng\" object";
  for (auto it = rng->begin(); it != rng->end(); ++it) {  // nlohmann::json's objects iterate by name
    if (!it->is_number_unsigned()) return "rng \"" + it.key() + "\" is not a uint64";
    d.rng.emplace_back(it.key(), it->get<uint64_t>());
  }
  auto loss = j.find("loss");
  if (loss == j.end()) return "no \"loss\"";
  if (!(why = digest_field(*loss, "\"loss\"", d.loss)).empty()) return why;
  auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_object()) return "no \"tensors\" object";
  for (auto it = tensors->begin(); it != tensors->end(); ++it) {
    uint64_t v = 0;
    if (!(why = digest_field(*it, "tensor \"" + it.key() + "\"", v)).empty()) return why;
    d.tensors.emplace_back(it.key(), v);
  }
  auto digest = j.find("digest");
  if (digest == j.end()) return "no \"digest\"";
  uint64_t stored = 0;
  if (!(why = digest_field(*digest, "\"digest\"", stored)).empty()) return why;
  const uint64_t computed = d.combined();
  if (stored != computed)
    return "\"digest\" " + digest_hex(stored) + " does not match its fields (" + digest_hex(computed) + ")";
  return "";
}

// read(), plus where each sound record's line ends and how long the file is.
struct Parsed {
  Contents contents;
  std::vector<uint64_t> ends;
  uint64_t file_bytes = 0;
};

// How much of each record to read: all of it (read()), or, for a writer that only cuts
// the log, the CRC and the step ("{\"step\":N," leads every line, line_of): a relaunch
// opens a log of many thousand lines, and parsing them all would cost it a second.
enum class Depth { Full, StepsOnly };

// The step of a record's JSON text, read from its leading "{"step":N,"; why not, or "".
std::string leading_step(const std::string& json_text, StepDigest& d) {
  static const std::string kLead = "{\"step\":";
  if (json_text.compare(0, kLead.size(), kLead) != 0) return "no leading \"step\"";
  std::size_t i = kLead.size();
  int64_t step = 0;
  const std::size_t first_digit = i;
  while (i < json_text.size() && json_text[i] >= '0' && json_text[i] <= '9' && i - first_digit < 18)
    step = step * 10 + (json_text[i++] - '0');
  if (i == first_digit || i >= json_text.size() || json_text[i] != ',') return "\"step\" is not a count";
  d.global_step = step;
  return "";
}

Parsed parse_log(const std::string& text, Depth depth = Depth::Full) {
  Parsed p;
  p.file_bytes = text.size();
  std::size_t pos = 0;
  for (int64_t line = 1; pos < text.size(); ++line) {
    const std::string at = "line " + std::to_string(line) + ": ";
    const std::size_t nl = text.find('\n', pos);
    std::string why;
    StepDigest d;
    if (nl == std::string::npos) {
      why = "no end of line (a torn write)";
    } else if (nl - pos < 10 || text[pos + 8] != ' ') {
      why = "not \"<crc32> <json>\"";
    } else {
      const std::string crc_text = text.substr(pos, 8);
      const std::string json_text = text.substr(pos + 9, nl - pos - 9);
      const std::string actual = crc_hex(crc_of(json_text));
      if (crc_text != actual) {
        why = "CRC mismatch (the text's crc32 is " + actual + ", the line records " + crc_text + ")";
      } else {
        if (depth == Depth::StepsOnly) {
          why = leading_step(json_text, d);
        } else {
          try {
            why = parse_record(nlohmann::json::parse(json_text), d);
          } catch (const nlohmann::json::exception& e) {
            why = std::string("not JSON (") + e.what() + ")";
          }
        }
        if (why.empty() && !p.contents.steps.empty() && d.global_step <= p.contents.steps.back().global_step)
          why = "step " + std::to_string(d.global_step) + " does not follow step " +
                std::to_string(p.contents.steps.back().global_step);
      }
    }
    if (!why.empty()) {
      p.contents.cut_reason = at + why;
      break;
    }
    p.contents.steps.push_back(std::move(d));
    pos = nl + 1;
    p.ends.push_back(pos);
  }
  p.contents.sound_bytes = pos;
  return p;
}

}  // namespace

Contents read(const std::string& path, Env* env) {
  const std::optional<std::string> text = read_whole(path, env_or_posix(env));
  if (!text) return {};
  return parse_log(*text).contents;
}

std::string line_of(const StepDigest& d) {
  // Written in the order a reader scans for: the step first, the digest last.
  nlohmann::ordered_json j;
  j["step"] = d.global_step;
  j["epoch"] = d.epoch;
  j["step_in_epoch"] = d.step_in_epoch;
  j["shuffle_offset"] = d.shuffle_offset;
  nlohmann::ordered_json rng = nlohmann::ordered_json::object();
  for (const auto& [name, counter] : d.rng) rng[name] = counter;
  j["rng"] = rng;
  j["loss"] = digest_hex(d.loss);
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const auto& [name, digest] : d.tensors) tensors[name] = digest_hex(digest);
  j["tensors"] = tensors;
  j["digest"] = digest_hex(d.combined());
  const std::string text = j.dump();
  return crc_hex(crc_of(text)) + " " + text + "\n";
}

Writer::~Writer() { close(); }

void Writer::open(const std::string& path, int64_t keep_through_step, Env* env) {
  close();
  Env& e = env_or_posix(env);
  const std::optional<std::string> text = read_whole(path, e);
  Parsed p = text ? parse_log(*text, Depth::StepsOnly) : Parsed{};
  // Records after keep_through_step are steps the resumed run trains again: cut them as
  // a matter of course, without calling that damage.
  uint64_t keep = p.contents.sound_bytes;
  for (std::size_t i = 0; i < p.contents.steps.size(); ++i)
    if (p.contents.steps[i].global_step > keep_through_step) {
      keep = i == 0 ? 0 : p.ends[i - 1];
      break;
    }
  const int fd = e.open_for_appending(path);
  if (fd < 0) fail(path, "cannot open for appending: " + errno_text(errno));
  if (keep != p.file_bytes && e.truncate(fd, static_cast<off_t>(keep)) != 0) {
    const int err = errno;
    e.close(fd);
    fail(path, "cannot cut the log to " + std::to_string(keep) + " bytes: " + errno_text(err));
  }
  env_ = &e;
  path_ = path;
  fd_ = fd;
  size_ = keep;
  cut_reason_ = p.contents.cut_reason;
}

void Writer::append(const std::vector<StepDigest>& records) {
  if (fd_ < 0) throw std::logic_error("step_digest_log::Writer::append: not open");
  if (records.empty()) return;
  std::string text;
  for (const StepDigest& d : records) text += line_of(d);
  ssize_t n;
  do n = env_->pwrite(fd_, text.data(), text.size(), static_cast<off_t>(size_));
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(text.size())) {
    size_ += text.size();
    return;
  }
  const std::string why = n < 0 ? errno_text(errno)
                                 : "wrote " + std::to_string(n) + " of " + std::to_string(text.size()) + " bytes";
  // A partial line would be a torn tail; the next append writes at size_ again anyway.
  env_->truncate(fd_, static_cast<off_t>(size_));
  fail(path_, "cannot append step digests: " + why);
}

void Writer::sync() {
  if (fd_ < 0) throw std::logic_error("step_digest_log::Writer::sync: not open");
  if (env_->fsync(fd_) != 0) fail(path_, "cannot fsync: " + errno_text(errno));
}

void Writer::close() {
  if (fd_ < 0) return;
  env_->close(fd_);
  fd_ = -1;
}

}  // namespace engine::step_digest_log
