// Test support (not part of libengine.a; tests/CMakeLists.txt builds it into
// gpu_test_cuda_behaviour in CUDA builds): Philox values computed on the GPU, by our shared philox_at
// and by cuRAND itself, to check that the engine's random streams are cuRAND's streams
// and that host and device agree. Plain C++ (no CUDA headers); host arrays in and out
// (the functions copy to and from the device and wait).
#pragma once
#include <cstdint>

namespace gpu_test {

// out[i] = philox_at({seeds[i], subsequences[i]}, offsets[i]) evaluated on the device.
void philox_device_values(int count, const uint64_t* seeds, const uint64_t* subsequences,
                          const uint64_t* offsets, uint32_t* out);

// out[i] = the first curand() after curand_init(seeds[i], subsequences[i], offsets[i])
// with a curandStatePhilox4_32_10_t state.
void curand_reference_values(int count, const uint64_t* seeds, const uint64_t* subsequences,
                             const uint64_t* offsets, uint32_t* out);

}  // namespace gpu_test
