#include "train/save_verification.h"

#include <cstring>
#include <memory>

#include "engine/io/step_digest.h"

namespace engine {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw CheckpointError(path + ": verification failed: " + why);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.nbytes() == 0) return true;
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  return std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// Doubles compare by their bits, so a NaN loss reads back as itself.
bool same_scalar(const Scalar& a, const Scalar& b) {
  if (a.index() != b.index()) return false;
  if (const auto* x = std::get_if<double>(&a)) return std::memcmp(x, &std::get<double>(b), sizeof(double)) == 0;
  if (const auto* x = std::get_if<std::vector<double>>(&a)) {
    const auto& y = std::get<std::vector<double>>(b);
    return x->size() == y.size() && (x->empty() || std::memcmp(x->data(), y.data(), x->size() * sizeof(double)) == 0);
  }
  return a == b;
}

// `written` as the loader names its keys (wrapper prefixes stripped in every group).
const Tensor* find_tensor(const StateDict& d, const std::string& key) {
  auto it = d.tensors.find(key);
  return it == d.tensors.end() ? nullptr : &it->second;
}

void compare_group(const std::string& path, const std::string& group, const StateDict& written,
                   const StateDict& reloaded) {
  std::size_t tensors_seen = 0;
  for (const auto& [key, t] : written.tensors) {
    const Tensor* back = find_tensor(reloaded, key);
    if (!back) back = find_tensor(reloaded, strip_wrapper_prefixes(key));
    if (!back) fail(path, group + "/" + key + " is missing from the file");
    if (!same_bits(t, *back)) fail(path, group + "/" + key + " differs from the saved state");
    ++tensors_seen;
  }
  if (tensors_seen != reloaded.tensors.size()) fail(path, "group " + group + " holds tensors that were not saved");
  for (const auto& [key, v] : written.scalars) {
    auto it = reloaded.scalars.find(key);
    if (it == reloaded.scalars.end()) fail(path, group + "/" + key + " is missing from the file");
    if (!same_scalar(v, it->second)) fail(path, group + "/" + key + " differs from the saved state");
  }
  if (written.scalars.size() != reloaded.scalars.size())
    fail(path, "group " + group + " holds scalars that were not saved");
}

}  // namespace

void verify_saved_checkpoint(const std::string& path, const Checkpoint& written, const Model& prototype, Env& env) {
  const Checkpoint reloaded = load_checkpoint(path, &env);
  for (const auto& [name, group] : written.groups) {
    auto it = reloaded.groups.find(name);
    if (it == reloaded.groups.end()) fail(path, "group " + name + " is missing from the file");
    compare_group(path, name, group, it->second);
  }
  if (reloaded.groups.size() != written.groups.size()) fail(path, "the file holds groups that were not saved");
  if (reloaded.config_json != written.config_json) fail(path, "the stored config differs from the saved one");
  // The file's tensors against the digest the step recorded as it computed them: catches a
  // state changed between the update and the snapshot, which a round trip cannot see.
  const uint64_t stored = stored_step_digest(reloaded, path), computed = step_digest_of(reloaded, path).combined();
  if (stored != computed)
    fail(path, "its tensors give step digest " + digest_hex(computed) + ", not the " + digest_hex(stored) +
                   " the step recorded");

  // The model group as a model: it must load into a fresh instance and read back as saved.
  const std::unique_ptr<Model> fresh = prototype.new_instance();
  const StateDict& model_state = reloaded.groups.at("model");
  const StateReport r = compare_state(fresh->state(), model_state);
  if (!r.clean()) fail(path, "model state differs (" + r.summary() + ")");
  fresh->load_state(model_state);
  const StateDict back = fresh->state();
  for (const auto& [key, t] : back.tensors) {
    const Tensor* saved = find_tensor(model_state, key);
    if (!saved || !same_bits(t, *saved)) fail(path, "model/" + key + " does not load back as saved");
  }
}

}  // namespace engine
