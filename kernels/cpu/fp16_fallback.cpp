// The mixed-precision ops (kernels/op_signatures.inc) on the backends without fp16
// arithmetic: the reference and the CPU path compute them in fp32, with the bits of
// their fp32 ops, so a model set to fp16 precision trains on the CPU exactly as in fp32.
#include "kernels/ops.h"

namespace engine::kernels {

namespace ref {
void conv2d_forward_f16(const ConvShape& s, const float* x, const float* w, const float* b,
                        float* y) {
  conv2d_forward(s, x, w, b, y);
}
void conv2d_backward_f16(const ConvShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  conv2d_backward(s, x, w, dy, dx, dw, db);
}
void linear_forward_f16(const LinearShape& s, const float* x, const float* w, const float* b,
                        float* y) {
  linear_forward(s, x, w, b, y);
}
void linear_backward_f16(const LinearShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  linear_backward(s, x, w, dy, dx, dw, db);
}
}  // namespace ref

namespace cpu {
void conv2d_forward_f16(const ConvShape& s, const float* x, const float* w, const float* b,
                        float* y) {
  conv2d_forward(s, x, w, b, y);
}
void conv2d_backward_f16(const ConvShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  conv2d_backward(s, x, w, dy, dx, dw, db);
}
void linear_forward_f16(const LinearShape& s, const float* x, const float* w, const float* b,
                        float* y) {
  linear_forward(s, x, w, b, y);
}
void linear_backward_f16(const LinearShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  linear_backward(s, x, w, dy, dx, dw, db);
}
}  // namespace cpu

}  // namespace engine::kernels
