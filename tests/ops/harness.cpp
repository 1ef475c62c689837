// The harness's backends, memory, registry and shape tables (tests/ops/harness.h).
#include "ops/harness.h"

#include <cstdio>

#include "kernels/cuda_runtime.h"

namespace ops_test {

namespace cuda_rt = engine::kernels::cuda;

const std::string& cuda_absent_reason() {
  static const std::string reason = [] {
    if (!cuda_rt::built()) return std::string("built without CUDA");
    if (cuda_rt::device_count() <= 0) return std::string("no CUDA device");
    return std::string();
  }();
  return reason;
}

const std::vector<Backend>& backends() {
  static const std::vector<Backend> list = [] {
    std::vector<Backend> v{{"cpu", false, &engine::kernels::cpu_ops()}};
    if (cuda_absent_reason().empty()) {
      cuda_rt::set_device(0);
      v.push_back({"cuda", true, &engine::kernels::cuda_ops()});
    }
    return v;
  }();
  return list;
}

Mem::~Mem() {
  for (const Block& blk : blocks_) {
    if (b_.cuda)
      cuda_rt::free(blk.p);
    else
      ::operator delete(blk.p);
  }
}

void* Mem::alloc(std::size_t bytes) {
  const std::size_t n = bytes ? bytes : 1;
  void* p = b_.cuda ? cuda_rt::alloc(n) : ::operator new(n);
  blocks_.push_back({p, bytes});
  return p;
}

std::size_t Mem::size_of(const void* p) const {
  for (const Block& blk : blocks_)
    if (blk.p == p) return blk.bytes;
  FAIL("ops_test::Mem: not an allocation of this case");
  return 0;
}

void Mem::write(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (b_.cuda)
    cuda_rt::copy(dst, src, bytes, cuda_rt::CopyKind::HostToDevice);
  else
    std::memcpy(dst, src, bytes);
}

void Mem::read(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return;
  if (b_.cuda)
    cuda_rt::copy(dst, src, bytes, cuda_rt::CopyKind::DeviceToHost);
  else
    std::memcpy(dst, src, bytes);
}

std::vector<OpCase>& registry() {
  static std::vector<OpCase> cases;
  return cases;
}

bool register_case(const char* ops, const char* what, Where where, Precision precision, void (*fn)(const Backend&)) {
  registry().push_back({ops, what, where, precision, fn});
  return true;
}

int& checks_run() {
  static int n = 0;
  return n;
}

namespace {
std::vector<std::string> split_ops(const std::string& list) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t comma = list.find(',', at);
    std::string name = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!name.empty()) out.push_back(name);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}
// Whether backend b has `op` and runs it in `precision`.
bool runs_op(const Backend& b, const std::string& op, Precision precision) {
  for (std::size_t i = 0; i < engine::kernels::kOpCount; ++i) {
    const auto& info = engine::kernels::kOps[i];
    if (op != info.name) continue;
    if (b.is_cpu() && info.backends != engine::kernels::OpBackends::Every) return false;
    return engine::kernels::supports_op(*b.ops, static_cast<engine::kernels::OpId>(i), precision);
  }
  return false;
}
}  // namespace

bool runs_ops(const Backend& b, const char* ops, Precision precision) {
  for (const std::string& n : split_ops(ops))
    if (!runs_op(b, n, precision)) return false;
  return true;
}

void run_case(const char* ops, Where where, Precision precision, void (*fn)(const Backend&)) {
  const std::vector<std::string> names = split_ops(ops);
  bool ran_cuda = false;
  for (const Backend& b : backends()) {
    if (!runs_ops(b, ops, precision)) continue;
    if (b.is_cpu() && where == Where::CudaOnly) continue;
    if (b.cuda && where == Where::CpuOnly) continue;
    INFO("backend " << std::string(b.name));
    fn(b);
    checks_run() += static_cast<int>(names.size());
    ran_cuda = ran_cuda || b.cuda;
  }
  if (where != Where::CpuOnly && !ran_cuda)
    MESSAGE("cuda: not present (" << cuda_absent_reason() << "): " << std::string(ops) << " not checked on cuda");
}

std::string conv_name(const ConvShape& s) {
  std::ostringstream o;
  o << "conv N" << s.n << " C" << s.c << " " << s.h << "x" << s.w << " K" << s.k << " kernel " << s.r << "x" << s.s
    << " pad " << s.pad;
  return o.str();
}

const ConvCase kConvShapes[] = {
    {{4, 1, 28, 28, 32, 3, 3, 1}, false},   // conv1 of the model
    {{4, 32, 14, 14, 64, 3, 3, 1}, false},  // conv2 of the model
    {{8, 1, 28, 28, 32, 3, 3, 1}, false},   // conv1, batch 8
    {{8, 32, 14, 14, 64, 3, 3, 1}, false},  // conv2, batch 8
    {{2, 1, 28, 28, 8, 3, 3, 1}, false},    // first layer, fewer channels
    {{4, 16, 14, 14, 32, 3, 3, 1}, false},  // a later layer
    {{1, 3, 7, 9, 5, 2, 3, 0}, true},       // batch 1, pad 0, non-square kernel (7 empty chunks)
    {{3, 2, 5, 6, 4, 3, 1, 2}, false},      // batch 3, non-square kernel, pad wider than the kernel
    {{13, 3, 6, 5, 7, 3, 3, 1}, true},      // batch 13 (> the 8 batch chunks), odd sizes
    {{9, 4, 1, 1, 2, 1, 1, 0}, false},      // 1x1 image, 1x1 kernel
    {{3, 5, 7, 9, 4, 5, 3, 1}, false},      // non-square kernel and image
    {{2, 3, 6, 6, 2, 1, 1, 0}, false},      // 1x1 kernel
    {{1, 2, 5, 5, 3, 5, 5, 2}, false},      // kernel as large as the image
    {{16, 32, 14, 14, 8, 3, 3, 1}, true},   // conv2-like, sub-batches of 2
    {{5, 2, 4, 4, 3, 3, 3, 0}, true},       // fewer samples than chunks: empty chunks
    {{24, 1, 28, 28, 4, 3, 3, 1}, true},    // conv1-like, 3 samples per chunk
    {{13, 3, 8, 8, 4, 3, 3, 1}, true},      // ragged chunks
    {{5, 3, 8, 8, 4, 3, 3, 1}, true},       // three empty chunks
};
const std::size_t kConvShapeCount = sizeof(kConvShapes) / sizeof(kConvShapes[0]);

const LinearCase kLinearShapes[] = {
    {{4, 3136, 128}, false},   // fc1
    {{4, 128, 10}, false},     // fc2
    {{1, 7, 3}, false},        // batch 1
    {{3, 5, 13}, false},       // batch 3
    {{13, 17, 9}, true},       // batch 13
    {{64, 128, 10}, true},     // a training batch
    {{5, 7, 3}, true},         // fewer samples than chunks
    {{64, 3136, 128}, false},  // fc1 at a training batch
    {{32, 3136, 128}, false},  // fc1 at batch 32
    {{128, 128, 10}, false},   // fc2 at batch 128
    {{1, 1, 1}, false},        // the smallest
    {{33, 65, 17}, false},     // odd sizes
    {{24, 3136, 16}, true},    // 3 samples per chunk, long rows
    {{13, 20, 7}, true},       // ragged chunks
    {{5, 20, 7}, true},        // three empty chunks
};
const std::size_t kLinearShapeCount = sizeof(kLinearShapes) / sizeof(kLinearShapes[0]);

Share share(int n, int rank, int world) {
  Share s;
  s.chunks = kTreeChunks / world;
  const int c0 = kTreeChunks * rank / world;
  s.first = engine::kernels::tree_chunk_begin(n, c0);
  for (int c = 0; c <= s.chunks; ++c) s.bounds.push_back(engine::kernels::tree_chunk_begin(n, c0 + c) - s.first);
  s.count = s.bounds.back();
  return s;
}

}  // namespace ops_test
