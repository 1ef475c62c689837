// Private to engine/core: a host-to-GPU copy that does not wait for the GPU, for the
// per-step values (engine/core/step_values.cpp). device_copy waits for a host-to-GPU
// copy, since its source is the caller's ordinary memory; this one reads page-locked
// memory that the caller leaves unchanged until the returned mark has passed.
#pragma once
#include <cstddef>

#include "engine/core/device.h"
#include "kernels/cuda_runtime.h"

namespace engine::detail {

// Page-locked host memory, on the CPU ordinary memory.
void* alloc_upload_staging(Device d, std::size_t bytes);
void free_upload_staging(Device d, void* p);
// Queues the copy (counted in device_activity().host_to_device) and returns a mark after
// it; on the CPU a memcpy, and a null mark.
kernels::cuda::StreamMark upload_async(Device d, void* dst, const void* staging, std::size_t bytes);
// Waits until a mark from upload_async has passed (null: returns at once).
void wait_for_upload(const kernels::cuda::StreamMark& mark);

}  // namespace engine::detail
