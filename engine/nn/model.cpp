#include "engine/nn/model.h"

#include <stdexcept>

namespace engine {

int64_t Model::parameter_count() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

void SequentialModel::to(Device device) {
  for (Layer* l : layers_) l->to(device);
  device_ = device;
}

void SequentialModel::release_workspaces() {
  for (Layer* l : layers_) l->release_workspaces();
}

Tensor SequentialModel::forward(const Tensor& x, Mode mode, Rng& rng) {
  Tensor h = x;
  for (Layer* l : layers_) h = l->forward(h, mode, rng);
  return h;
}

void SequentialModel::backward(const Tensor& dlogits) {
  Tensor g = dlogits;
  for (std::size_t i = layers_.size(); i-- > 0;)
    g = layers_[i]->backward(g, i == 0 ? InputGrad::NotNeeded : InputGrad::Needed);
}

void SequentialModel::replayed_train_step() {
  for (Layer* l : layers_) l->replayed_train_forward();
}

bool SequentialModel::set_batch_chunks(const BatchChunks* chunks) {
  for (Layer* l : layers_) l->set_batch_chunks(chunks);
  return true;
}

std::vector<Parameter*> SequentialModel::parameters() {
  std::vector<Parameter*> out;
  for (Layer* l : layers_)
    for (Parameter* p : l->parameters()) out.push_back(p);
  return out;
}

StateDict SequentialModel::state() const {
  StateDict d;
  for (Layer* l : layers_) {
    for (Parameter* p : l->parameters()) d.tensors[p->name] = p->value;
    StateDict b;
    l->buffers(b);
    for (auto& [k, t] : b.tensors) d.tensors[l->name() + "." + k] = t;
    for (auto& [k, s] : b.scalars) d.scalars[l->name() + "." + k] = s;
  }
  return d;
}

void SequentialModel::load_state(const StateDict& in) {
  for (Layer* l : layers_) {
    for (Parameter* p : l->parameters()) p->value.copy_from(in.get_tensor(p->name));
    StateDict mine;
    l->buffers(mine);
    if (mine.empty()) continue;
    StateDict b;
    for (auto& [k, t] : mine.tensors) b.tensors[k] = in.get_tensor(l->name() + "." + k);
    for (auto& [k, s] : mine.scalars) {
      auto it = in.scalars.find(l->name() + "." + k);
      if (it == in.scalars.end()) throw std::runtime_error("model state: missing " + l->name() + "." + k);
      b.scalars[k] = it->second;
    }
    l->load_buffers(b);
  }
}

}  // namespace engine
