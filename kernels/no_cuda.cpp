// CPU-only builds: the CUDA runtime and ops exist as stubs that explain themselves.
#include <stdexcept>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/settings.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

[[noreturn]] static void unavailable() {
  throw std::runtime_error("this engine was built without CUDA (reconfigure with nvcc available)");
}

bool built() { return false; }
int device_count() { return 0; }
std::string device_name(int) { return ""; }
void set_device(int) { unavailable(); }
void* alloc(std::size_t) { unavailable(); }
void free(void*) {}
void copy(void*, const void*, std::size_t, CopyKind) { unavailable(); }
void memset_zero(void*, std::size_t) { unavailable(); }
void synchronize() {}
BackendVersions backend_versions() { return {}; }

// The deterministic setting is recorded even without CUDA so configs behave the same.
static bool g_deterministic = true;
void set_deterministic(bool on) { g_deterministic = on; }
bool deterministic() { return g_deterministic; }
void cast_f32_to_f16(int64_t, const float*, void*) { unavailable(); }
void cast_f16_to_f32(int64_t, const void*, float*) { unavailable(); }

void conv2d_forward(const ConvShape&, const float*, const float*, const float*, float*) { unavailable(); }
void conv2d_backward(const ConvShape&, const float*, const float*, const float*, float*, float*, float*) { unavailable(); }
void linear_forward(const LinearShape&, const float*, const float*, const float*, float*) { unavailable(); }
void linear_backward(const LinearShape&, const float*, const float*, const float*, float*, float*, float*) { unavailable(); }
void conv2d_forward_f16(const ConvShape&, const float*, const float*, const float*, float*) { unavailable(); }
void conv2d_backward_f16(const ConvShape&, const float*, const float*, const float*, float*, float*, float*) { unavailable(); }
void linear_forward_f16(const LinearShape&, const float*, const float*, const float*, float*) { unavailable(); }
void linear_backward_f16(const LinearShape&, const float*, const float*, const float*, float*, float*, float*) { unavailable(); }
void batchnorm_forward_train(const BatchNormShape&, const float*, const float*, const float*, float, float, float*, float*, float*, float*, float*) { unavailable(); }
void batchnorm_forward_eval(const BatchNormShape&, const float*, const float*, const float*, const float*, const float*, float, float*) { unavailable(); }
void batchnorm_backward(const BatchNormShape&, const float*, const float*, const float*, const float*, const float*, float*, float*, float*) { unavailable(); }
void relu_forward(int64_t, const float*, float*) { unavailable(); }
void relu_backward(int64_t, const float*, const float*, float*) { unavailable(); }
void maxpool2x2_forward(const PoolShape&, const float*, float*, int32_t*) { unavailable(); }
void maxpool2x2_backward(const PoolShape&, const float*, const int32_t*, float*) { unavailable(); }
void dropout_forward(int64_t, const float*, float, PhiloxStream, uint64_t, float*, uint8_t*) { unavailable(); }
void dropout_backward(int64_t, const float*, const uint8_t*, float, float*) { unavailable(); }
void cross_entropy(int, int, const float*, const int32_t*, float, float*, float*, float*) { unavailable(); }
double reduce_sum(int64_t, const float*) { unavailable(); }
void gather_batch(int, int, const uint8_t*, const uint8_t*, const int32_t*, float, float, float*, int32_t*) { unavailable(); }
void adam_update(int64_t, float*, const float*, float*, float*, const AdamHyper&, AdamStepFactors) { unavailable(); }
void unscale_check(int64_t, float*, float, int32_t*) { unavailable(); }

}  // namespace engine::kernels::cuda
