// Reading a loaded checkpoint without a Trainer: groups by name, tensors on a device.
#include "engine/io/checkpoint.h"

namespace engine {

const StateDict& Checkpoint::group(const std::string& name) const {
  auto it = groups.find(name);
  if (it != groups.end()) return it->second;
  std::string present;
  for (const auto& [g, d] : groups) present += (present.empty() ? "" : ", ") + g;
  throw CheckpointError("checkpoint has no group '" + name + "' (groups: " + present + ")");
}

Checkpoint Checkpoint::to(Device device) const {
  Checkpoint out;
  out.meta = meta;
  out.config_json = config_json;
  for (const auto& [name, d] : groups) {
    StateDict& moved = out.groups[name];
    moved.scalars = d.scalars;
    for (const auto& [key, t] : d.tensors) moved.tensors[key] = t.to(device);
  }
  return out;
}

Checkpoint load_checkpoint(const std::string& path, Device device, Env* env) {
  return load_checkpoint(path, env).to(device);
}

}  // namespace engine
