#include "engine/models/fashion_cnn.h"

#include <stdexcept>

namespace engine {

FashionCnn::FashionCnn(float dropout)
    : conv1_("conv1", 1, 32, 3, 1), bn1_("bn1", 32), conv2_("conv2", 32, 64, 3, 1), bn2_("bn2", 64),
      fc1_("fc1", 64 * 7 * 7, 128), dropout_("dropout", dropout), fc2_("fc2", 128, kClasses) {
  layers_ = {&conv1_, &bn1_, &relu1_, &pool1_, &conv2_, &bn2_, &relu2_, &pool2_,
             &flatten_, &fc1_, &relu3_, &dropout_, &fc2_};
}

void FashionCnn::reset_parameters(Rng& rng) {
  // Module order, as PyTorch constructs them; BatchNorm starts at weight 1, bias 0.
  conv1_.reset_parameters(rng);
  conv2_.reset_parameters(rng);
  fc1_.reset_parameters(rng);
  fc2_.reset_parameters(rng);
}

void FashionCnn::to(Device device) {
  for (Layer* l : layers_) l->to(device);
  device_ = device;
}

void FashionCnn::set_precision(Precision p) {
  // Only convolutions and linear layers have an fp16 path (see engine/layers.h).
  conv1_.set_precision(p);
  conv2_.set_precision(p);
  fc1_.set_precision(p);
  fc2_.set_precision(p);
}

void FashionCnn::release_workspaces() {
  for (Layer* l : layers_) l->release_workspaces();
}

Tensor FashionCnn::forward(const Tensor& x, Mode mode, Rng& rng) {
  Tensor h = x;
  for (Layer* l : layers_) h = l->forward(h, mode, rng);
  return h;
}

void FashionCnn::backward(const Tensor& dlogits) {
  Tensor g = dlogits;
  for (std::size_t i = layers_.size(); i-- > 0;)
    g = layers_[i]->backward(g, i == 0 ? InputGrad::NotNeeded : InputGrad::Needed);
}

std::vector<Parameter*> FashionCnn::parameters() {
  std::vector<Parameter*> out;
  for (Layer* l : layers_)
    for (Parameter* p : l->parameters()) out.push_back(p);
  return out;
}

int64_t FashionCnn::parameter_count() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

StateDict FashionCnn::state() const {
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

void FashionCnn::load_state(const StateDict& in) {
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

std::vector<std::string> model_names() { return {"fashion_cnn"}; }

std::unique_ptr<FashionCnn> make_model(const std::string& name, float dropout) {
  if (name == "fashion_cnn") return std::make_unique<FashionCnn>(dropout);
  throw std::invalid_argument("unknown model '" + name + "' (known: fashion_cnn)");
}

}  // namespace engine
