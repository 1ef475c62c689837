#include "core/step_values.h"

#include <cstring>
#include <stdexcept>

#include "core/device_upload.h"

namespace engine {

namespace {

// The Adam factors follow the scalars, aligned.
constexpr std::size_t adam_offset() {
  constexpr std::size_t a = alignof(kernels::AdamStepFactors);
  return (sizeof(StepValues::Scalars) + a - 1) / a * a;
}

}  // namespace

StepValues::~StepValues() {
  // At exit (a thread_local one) the CUDA runtime may be gone: nothing to report then.
  try {
    release_staging();
  } catch (...) {
  }
}

void StepValues::release_staging() {
  if (!block_.defined()) return;
  for (Staging& s : staging_) {
    detail::wait_for_upload(s.copied);  // the copy reads the buffer: let it finish
    if (s.host) detail::free_upload_staging(block_.device(), s.host);
    s = Staging{};
  }
}

void StepValues::upload(Device device) {
  const std::size_t bytes = adam_offset() + adam.size() * sizeof(kernels::AdamStepFactors);
  if (!block_.defined() || block_.device() != device || adam.size() > adam_capacity_) {
    release_staging();
    adam_capacity_ = adam.size();
    block_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device);
    staging_bytes_ = bytes;
  }
  Staging& s = staging_[next_++ % kStaging];
  // Each buffer is made on its first use: an object that uploads once (an evaluation's)
  // holds one.
  if (!s.host) s.host = detail::alloc_upload_staging(device, staging_bytes_);
  detail::wait_for_upload(s.copied);
  auto* host = static_cast<unsigned char*>(s.host);
  std::memcpy(host, &scalars, sizeof scalars);
  if (!adam.empty()) std::memcpy(host + adam_offset(), adam.data(), adam.size() * sizeof(kernels::AdamStepFactors));
  sent_.assign(host, host + bytes);
  s.copied = detail::upload_async(device, block_.raw(), host, bytes);
}

template <class T>
DeviceValue<T> StepValues::at(std::size_t offset) const {
  if (!block_.defined()) throw std::logic_error("StepValues: a value was asked for before the first upload");
  if (offset + sizeof(T) > sent_.size()) throw std::logic_error("StepValues: no such value in the last upload");
  T value;
  std::memcpy(&value, sent_.data() + offset, sizeof value);
  return {reinterpret_cast<const T*>(static_cast<const unsigned char*>(block_.raw()) + offset), block_.device(), value};
}

DeviceValue<kernels::AdamStepFactors> StepValues::adam_factors(std::size_t i) const {
  if (adam_offset() + (i + 1) * sizeof(kernels::AdamStepFactors) > sent_.size()) throw std::logic_error("StepValues: no Adam factors for tensor " + std::to_string(i));
  return at<kernels::AdamStepFactors>(adam_offset() + i * sizeof(kernels::AdamStepFactors));
}

template DeviceValue<int64_t> StepValues::at<int64_t>(std::size_t) const;
template DeviceValue<uint64_t> StepValues::at<uint64_t>(std::size_t) const;
template DeviceValue<float> StepValues::at<float>(std::size_t) const;
template DeviceValue<double> StepValues::at<double>(std::size_t) const;
template DeviceValue<kernels::AdamStepFactors> StepValues::at<kernels::AdamStepFactors>(std::size_t) const;

}  // namespace engine
