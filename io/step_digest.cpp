// Step digests from a checkpoint's contents (docs/checkpoint-format.md, "Step digests").
// The per-word arithmetic is kernels/step_digest.h, shared with the optimizer that
// computes the same tensor digests while it trains.
#include "engine/io/step_digest.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "kernels/step_digest.h"

namespace engine {
namespace {

namespace k = engine::kernels;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw CheckpointError(path + ": " + why);
}

const StateDict& group_of(const Checkpoint& ckpt, const std::string& path, const std::string& name) {
  auto it = ckpt.groups.find(name);
  if (it == ckpt.groups.end()) fail(path, "no group " + name + " (a step digest needs it)");
  return it->second;
}

// The int64 scalar `group`/`key`; a step digest cannot be computed without it.
int64_t int_of(const StateDict& g, const std::string& path, const std::string& group, const std::string& key) {
  auto it = g.scalars.find(key);
  if (it == g.scalars.end()) fail(path, group + "/" + key + " is missing (a step digest needs it)");
  if (!std::holds_alternative<int64_t>(it->second))
    fail(path, group + "/" + key + " is " + scalar_kind(it->second) + ", not int64");
  return std::get<int64_t>(it->second);
}

// The digest of a tensor: its little-endian 32-bit words (a float32 element is one);
// other dtypes' bytes are read as such words, the last one padded with zero bytes.
uint64_t tensor_digest(const Tensor& tensor) {
  const Tensor t = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  const std::size_t bytes = t.nbytes();
  if (bytes == 0) return 0;
  const auto* p = static_cast<const unsigned char*>(t.raw());
  if (t.dtype() == DType::F32) return k::digest_floats(t.f32(), t.numel(), 0);
  uint64_t sum = 0;
  for (std::size_t i = 0, word = 0; i < bytes; i += 4, ++word) {
    uint32_t w = 0;
    for (std::size_t b = 0; b < 4 && i + b < bytes; ++b) w |= static_cast<uint32_t>(p[i + b]) << (8 * b);
    sum += k::digest_term(word, w);
  }
  return sum;
}

int64_t batch_size_of(const Checkpoint& ckpt, const std::string& path) {
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(ckpt.config_json);
  } catch (const nlohmann::json::exception&) {
    fail(path, "the stored config is not JSON (a step digest needs data.batch_size)");
  }
  if (!cfg.is_object() || !cfg.contains("data") || !cfg["data"].is_object() || !cfg["data"].contains("batch_size") ||
      !cfg["data"]["batch_size"].is_number_integer())
    fail(path, "the stored config has no integer data.batch_size (a step digest needs it)");
  const int64_t batch = cfg["data"]["batch_size"].is_number_unsigned()
                            ? static_cast<int64_t>(std::min<uint64_t>(cfg["data"]["batch_size"].get<uint64_t>(), INT64_MAX))
                            : cfg["data"]["batch_size"].get<int64_t>();
  if (batch <= 0) fail(path, "the stored config's data.batch_size is " + std::to_string(batch));
  return batch;
}

bool is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

}  // namespace

uint64_t StepDigest::combined() const {
  uint64_t h = k::kFoldStart;
  h = k::fold(h, static_cast<uint64_t>(global_step));
  h = k::fold(h, shuffle_offset);
  for (const auto& r : rng) h = k::fold(h, r.second);
  h = k::fold(h, loss);
  for (const auto& t : tensors) h = k::fold(h, t.second);
  return h;
}

StepDigest step_digest_of(const Checkpoint& ckpt, const std::string& path) {
  StepDigest d;
  const StateDict& trainer = group_of(ckpt, path, "trainer");
  d.global_step = int_of(trainer, path, "trainer", "global_step");
  const int64_t epochs_done = int_of(trainer, path, "trainer", "epoch");
  const int64_t step_in_epoch = int_of(trainer, path, "trainer", "step_in_epoch");
  d.shuffle_offset = static_cast<uint64_t>(int_of(trainer, path, "trainer", "epoch_shuffle_offset"));
  if (d.global_step < 0 || epochs_done < 0 || step_in_epoch < 0)
    fail(path, "negative trainer counters (global_step " + std::to_string(d.global_step) + ", epoch " +
                   std::to_string(epochs_done) + ", step_in_epoch " + std::to_string(step_in_epoch) + ")");

  // Every integer of /rng but the seed is a stream's counter ("algorithm" is a string).
  for (const auto& [name, value] : group_of(ckpt, path, "rng").scalars)
    if (name != "seed" && std::holds_alternative<int64_t>(value))
      d.rng.emplace_back(name, static_cast<uint64_t>(std::get<int64_t>(value)));

  for (const char* group : {"model", "optimizer"})
    for (const auto& [key, tensor] : group_of(ckpt, path, group).tensors)
      d.tensors.emplace_back(std::string(group) + "/" + key, tensor_digest(tensor));
  std::sort(d.rng.begin(), d.rng.end());
  std::sort(d.tensors.begin(), d.tensors.end());

  if (d.global_step == 0) {  // nothing trained yet: no step, no loss
    d.epoch = epochs_done;
    return d;
  }
  auto loss_it = trainer.tensors.find("epoch_sample_loss");
  if (loss_it == trainer.tensors.end()) fail(path, "trainer/epoch_sample_loss is missing (a step digest needs it)");
  const Tensor losses = loss_it->second.device().is_cpu() ? loss_it->second : loss_it->second.to(Device::cpu());
  if (losses.dtype() != DType::F32)
    fail(path, std::string("trainer/epoch_sample_loss is ") + dtype_name(losses.dtype()) + ", not float32");
  const int64_t n = losses.numel();
  if (n <= 0) fail(path, "trainer/epoch_sample_loss is empty");
  const int64_t batch = batch_size_of(ckpt, path);
  const int64_t steps_per_epoch = n / batch + (n % batch != 0);
  // An epoch-end save: the counters have moved to step 0 of the next epoch, but
  // epoch_sample_loss still holds the finished epoch, whose last step this was.
  const int64_t s = step_in_epoch > 0 ? step_in_epoch : steps_per_epoch;
  if (s > steps_per_epoch)
    fail(path, "trainer/step_in_epoch " + std::to_string(s) + " is beyond the epoch's " +
                   std::to_string(steps_per_epoch) + " steps (" + std::to_string(n) + " samples in batches of " +
                   std::to_string(batch) + ")");
  const int64_t start = (s - 1) * batch;
  const int64_t b = std::min(batch, n - start);
  d.loss = k::digest_floats(losses.f32() + start, b, static_cast<uint64_t>(start));
  d.epoch = step_in_epoch > 0 ? epochs_done + 1 : epochs_done;
  d.step_in_epoch = s;
  return d;
}

uint64_t stored_step_digest(const Checkpoint& ckpt, const std::string& path) {
  const StateDict& trainer = group_of(ckpt, path, "trainer");
  auto it = trainer.scalars.find("step_digest");
  if (it == trainer.scalars.end()) fail(path, "trainer/step_digest is missing");
  if (!std::holds_alternative<std::string>(it->second))
    fail(path, std::string("trainer/step_digest is ") + scalar_kind(it->second) + ", not a string");
  const std::optional<uint64_t> d = parse_digest_hex(std::get<std::string>(it->second));
  if (!d) fail(path, "trainer/step_digest is not 16 hex digits");
  return *d;
}

std::string digest_hex(uint64_t d) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, d >>= 4) s[static_cast<std::size_t>(i)] = digits[d & 15];
  return s;
}

std::optional<uint64_t> parse_digest_hex(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t d = 0;
  for (char c : text) {
    const char lower = (c >= 'A' && c <= 'F') ? static_cast<char>(c - 'A' + 'a') : c;
    if (!is_lower_hex(lower)) return std::nullopt;
    d = (d << 4) | static_cast<uint64_t>(lower <= '9' ? lower - '0' : lower - 'a' + 10);
  }
  return d;
}

namespace {

// The names on which two sorted (name, value) lists differ: a different value, or a
// name only one of them has.
std::vector<std::string> differing_names(const std::vector<std::pair<std::string, uint64_t>>& a,
                                         const std::vector<std::pair<std::string, uint64_t>>& b) {
  std::vector<std::pair<std::string, uint64_t>> sa = a, sb = b;
  std::sort(sa.begin(), sa.end());
  std::sort(sb.begin(), sb.end());
  std::vector<std::string> out;
  std::size_t i = 0, j = 0;
  while (i < sa.size() || j < sb.size()) {
    if (j == sb.size() || (i < sa.size() && sa[i].first < sb[j].first)) {
      out.push_back(sa[i++].first);
    } else if (i == sa.size() || sb[j].first < sa[i].first) {
      out.push_back(sb[j++].first);
    } else {
      if (sa[i].second != sb[j].second) out.push_back(sa[i].first);
      ++i, ++j;
    }
  }
  return out;
}

}  // namespace

StepDigestDifference compare_step_digests(const StepDigest& a, const StepDigest& b) {
  StepDigestDifference diff;
  diff.data_position =
      a.shuffle_offset != b.shuffle_offset || a.epoch != b.epoch || a.step_in_epoch != b.step_in_epoch;
  diff.rng = differing_names(a.rng, b.rng);
  diff.loss = a.loss != b.loss;
  diff.tensors = differing_names(a.tensors, b.tensors);
  return diff;
}

}  // namespace engine
