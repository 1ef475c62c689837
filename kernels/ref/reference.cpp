// The reference backend: the definition of every op, written to be read, not to be
// fast. Sums accumulate in double; loops follow the formulas one to one. The fast CPU
// path and the CUDA path are tested against these functions.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/batchnorm_math.h"
#include "kernels/chunk_tree.h"
#include "kernels/op_table.h"
#include "kernels/ops.h"
#include "kernels/ref/reference_fp32.h"
#include "kernels/step_digest.h"

namespace engine::kernels::ref {

void conv2d_forward_fp32(const ConvShape& s, const float* x, const float* w, const float* b, float* y) {
  const int oh_n = s.out_h(), ow_n = s.out_w();
  for (int n = 0; n < s.n; ++n)
    for (int k = 0; k < s.k; ++k)
      for (int oh = 0; oh < oh_n; ++oh)
        for (int ow = 0; ow < ow_n; ++ow) {
          double acc = b ? b[k] : 0.0;
          for (int c = 0; c < s.c; ++c)
            for (int r = 0; r < s.r; ++r)
              for (int q = 0; q < s.s; ++q) {
                const int ih = oh + r - s.pad, iw = ow + q - s.pad;
                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
                acc += static_cast<double>(x[((n * s.c + c) * s.h + ih) * s.w + iw]) *
                       w[((k * s.c + c) * s.r + r) * s.s + q];
              }
          y[((n * s.k + k) * oh_n + oh) * ow_n + ow] = static_cast<float>(acc);
        }
}

void conv2d_backward_fp32(const ConvShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
  const int oh_n = s.out_h(), ow_n = s.out_w();
  auto dy_at = [&](int n, int k, int oh, int ow) {
    return static_cast<double>(dy[((n * s.k + k) * oh_n + oh) * ow_n + ow]);
  };
  if (dx) {
    // dx[n,c,ih,iw] = sum over k,r,q of dy[n,k,ih-r+pad,iw-q+pad] * w[k,c,r,q]
    for (int n = 0; n < s.n; ++n)
      for (int c = 0; c < s.c; ++c)
        for (int ih = 0; ih < s.h; ++ih)
          for (int iw = 0; iw < s.w; ++iw) {
            double acc = 0.0;
            for (int k = 0; k < s.k; ++k)
              for (int r = 0; r < s.r; ++r)
                for (int q = 0; q < s.s; ++q) {
                  const int oh = ih - r + s.pad, ow = iw - q + s.pad;
                  if (oh < 0 || oh >= oh_n || ow < 0 || ow >= ow_n) continue;
                  acc += dy_at(n, k, oh, ow) * w[((k * s.c + c) * s.r + r) * s.s + q];
                }
            dx[((n * s.c + c) * s.h + ih) * s.w + iw] = static_cast<float>(acc);
          }
  }
  // dw[k,c,r,q] = sum over n,oh,ow of dy[n,k,oh,ow] * x[n,c,oh+r-pad,ow+q-pad]
  for (int k = 0; k < s.k; ++k)
    for (int c = 0; c < s.c; ++c)
      for (int r = 0; r < s.r; ++r)
        for (int q = 0; q < s.s; ++q) {
          double acc = 0.0;
          for (int n = 0; n < s.n; ++n)
            for (int oh = 0; oh < oh_n; ++oh)
              for (int ow = 0; ow < ow_n; ++ow) {
                const int ih = oh + r - s.pad, iw = ow + q - s.pad;
                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
                acc += dy_at(n, k, oh, ow) * x[((n * s.c + c) * s.h + ih) * s.w + iw];
              }
          dw[((k * s.c + c) * s.r + r) * s.s + q] = static_cast<float>(acc);
        }
  if (db)
    for (int k = 0; k < s.k; ++k) {
      double acc = 0.0;
      for (int n = 0; n < s.n; ++n)
        for (int oh = 0; oh < oh_n; ++oh)
          for (int ow = 0; ow < ow_n; ++ow) acc += dy_at(n, k, oh, ow);
      db[k] = static_cast<float>(acc);
    }
}

void linear_forward_fp32(const LinearShape& s, const float* x, const float* w, const float* b, float* y) {
  for (int n = 0; n < s.n; ++n)
    for (int o = 0; o < s.out; ++o) {
      double acc = b ? b[o] : 0.0;
      for (int i = 0; i < s.in; ++i) acc += static_cast<double>(x[n * s.in + i]) * w[o * s.in + i];
      y[n * s.out + o] = static_cast<float>(acc);
    }
}

void linear_backward_fp32(const LinearShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
  if (dx)
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.in; ++i) {
        double acc = 0.0;
        for (int o = 0; o < s.out; ++o)
          acc += static_cast<double>(dy[n * s.out + o]) * w[o * s.in + i];
        dx[n * s.in + i] = static_cast<float>(acc);
      }
  for (int o = 0; o < s.out; ++o)
    for (int i = 0; i < s.in; ++i) {
      double acc = 0.0;
      for (int n = 0; n < s.n; ++n) acc += static_cast<double>(dy[n * s.out + o]) * x[n * s.in + i];
      dw[o * s.in + i] = static_cast<float>(acc);
    }
  if (db)
    for (int o = 0; o < s.out; ++o) {
      double acc = 0.0;
      for (int n = 0; n < s.n; ++n) acc += dy[n * s.out + o];
      db[o] = static_cast<float>(acc);
    }
}

namespace {
// Index of element (n, c, i) in an [N, C, HW] tensor.
inline int64_t bn_index(const BatchNormShape& s, int n, int c, int i) {
  return (static_cast<int64_t>(n) * s.c + c) * s.hw + i;
}
}  // namespace

// Training-mode batch norm over the whole batch: each channel's sums in one pass.
static void batchnorm_forward_train_whole(const BatchNormShape& s, const float* x, const float* gamma,
                                          const float* beta, float eps, float momentum, float* running_mean,
                                          float* running_var, float* save_mean, float* save_invstd, float* y) {
  const double m = static_cast<double>(s.n) * s.hw;
  for (int c = 0; c < s.c; ++c) {
    double sum = 0.0;
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) sum += x[bn_index(s, n, c, i)];
    const double mean = sum / m;
    double sq = 0.0;
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) {
        const double d = x[bn_index(s, n, c, i)] - mean;
        sq += d * d;
      }
    const double var = sq / m;  // biased: used to normalise
    const double invstd = 1.0 / std::sqrt(var + eps);
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) {
        const int64_t j = bn_index(s, n, c, i);
        y[j] = static_cast<float>((x[j] - mean) * invstd * gamma[c] + beta[c]);
      }
    const double unbiased = m > 1 ? sq / (m - 1) : var;
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(invstd);
  }
}

void batchnorm_forward_eval(const BatchNormShape& s, const float* x, const float* gamma,
                            const float* beta, const float* running_mean,
                            const float* running_var, float eps, float* y) {
  for (int c = 0; c < s.c; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) {
        const int64_t j = bn_index(s, n, c, i);
        y[j] = static_cast<float>((x[j] - running_mean[c]) * invstd * gamma[c] + beta[c]);
      }
  }
}

static void batchnorm_backward_whole(const BatchNormShape& s, const float* x, const float* dy,
                                     const float* gamma, const float* save_mean, const float* save_invstd,
                                     float* dx, float* dgamma, float* dbeta) {
  const double m = static_cast<double>(s.n) * s.hw;
  for (int c = 0; c < s.c; ++c) {
    const double mean = save_mean[c], invstd = save_invstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) {
        const int64_t j = bn_index(s, n, c, i);
        sum_dy += dy[j];
        sum_dy_xhat += dy[j] * (x[j] - mean) * invstd;
      }
    // dx = gamma * invstd / m * (m*dy - sum(dy) - xhat * sum(dy*xhat))
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) {
        const int64_t j = bn_index(s, n, c, i);
        const double xhat = (x[j] - mean) * invstd;
        dx[j] = static_cast<float>(gamma[c] * invstd / m * (m * dy[j] - sum_dy - xhat * sum_dy_xhat));
      }
    dgamma[c] = static_cast<float>(sum_dy_xhat);
    dbeta[c] = static_cast<float>(sum_dy);
  }
}

void relu_forward(int64_t n, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = relu(x[i]);
}

void relu_backward(int64_t n, const float* y, const float* dy, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = relu_grad(y[i], dy[i]);
}

void maxpool2x2_forward(const PoolShape& s, const float* x, float* y, int32_t* argmax) {
  const int oh_n = s.h / 2, ow_n = s.w / 2;
  for (int nc = 0; nc < s.n * s.c; ++nc)
    for (int oh = 0; oh < oh_n; ++oh)
      for (int ow = 0; ow < ow_n; ++ow) {
        // PyTorch's rule: start from the window's first element, move on when a later
        // one is strictly greater or is NaN (so ties keep the first, NaN propagates).
        int32_t best = (nc * s.h + 2 * oh) * s.w + 2 * ow;
        float best_v = x[best];
        for (int d = 1; d < 4; ++d) {
          const int32_t j = (nc * s.h + 2 * oh + d / 2) * s.w + 2 * ow + d % 2;
          if (x[j] > best_v || std::isnan(x[j])) {
            best = j;
            best_v = x[j];
          }
        }
        const int o = (nc * oh_n + oh) * ow_n + ow;
        y[o] = best_v;
        argmax[o] = best;
      }
}

void maxpool2x2_backward(const PoolShape& s, const float* dy, const int32_t* argmax, float* dx) {
  const int64_t in_n = static_cast<int64_t>(s.n) * s.c * s.h * s.w;
  const int64_t out_n = static_cast<int64_t>(s.n) * s.c * (s.h / 2) * (s.w / 2);  // odd: the last row/column unread
  for (int64_t i = 0; i < in_n; ++i) dx[i] = 0.0f;
  for (int64_t o = 0; o < out_n; ++o) dx[argmax[o]] += dy[o];
}

void dropout_forward(int64_t n, const float* x, float p, PhiloxStream stream, const uint64_t* counter,
                     uint64_t offset, float* y, uint8_t* keep) {
  const float scale = dropout_scale(p);
  for (int64_t i = 0; i < n; ++i) {
    keep[i] = dropout_keep(stream, *counter + offset, static_cast<uint64_t>(i), p) ? 1 : 0;
    y[i] = keep[i] ? x[i] * scale : 0.0f;
  }
}

void dropout_backward(int64_t n, const float* dy, const uint8_t* keep, float p, float* dx) {
  const float scale = dropout_scale(p);
  for (int64_t i = 0; i < n; ++i) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}

void cross_entropy(int n, int batch_total, int classes, const float* logits, const int32_t* labels,
                   const float* grad_scale, const int64_t* first, float* dlogits, float* sample_loss,
                   float* sample_correct) {
  sample_loss += *first;
  sample_correct += *first;
  for (int i = 0; i < n; ++i) {
    const float* z = logits + static_cast<int64_t>(i) * classes;
    int arg = 0;
    for (int k = 1; k < classes; ++k)
      if (z[k] > z[arg]) arg = k;
    const double zmax = z[arg];
    double sum = 0.0;
    for (int k = 0; k < classes; ++k) sum += std::exp(z[k] - zmax);
    const double lse = zmax + std::log(sum);
    sample_loss[i] = static_cast<float>(lse - z[labels[i]]);
    sample_correct[i] = arg == labels[i] ? 1.0f : 0.0f;
    if (dlogits)
      for (int k = 0; k < classes; ++k) {
        const double softmax = std::exp(z[k] - lse);
        dlogits[static_cast<int64_t>(i) * classes + k] =
            static_cast<float>((softmax - (k == labels[i] ? 1.0 : 0.0)) * *grad_scale / batch_total);
      }
  }
}

void softmax(int n, int classes, const float* logits, float* probs) {
  for (int i = 0; i < n; ++i) {
    const float* z = logits + static_cast<int64_t>(i) * classes;
    int arg = 0;
    for (int k = 1; k < classes; ++k)
      if (z[k] > z[arg]) arg = k;
    double sum = 0.0;
    for (int k = 0; k < classes; ++k) sum += std::exp(static_cast<double>(z[k]) - z[arg]);
    for (int k = 0; k < classes; ++k)
      probs[static_cast<int64_t>(i) * classes + k] = static_cast<float>(std::exp(static_cast<double>(z[k]) - z[arg]) / sum);
  }
}

void round_to_float(int64_t n, const double* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]);
}

double reduce_sum(int64_t n, const float* x) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += x[i];
  return acc;
}

void gather_batch(int n, int pixels, const uint8_t* images, const uint8_t* labels,
                  const int32_t* indices, const int64_t* first, float mean, float std, float* out,
                  int32_t* labels_out) {
  const float inv_std = 1.0f / std;
  indices += *first;
  for (int i = 0; i < n; ++i) {
    const uint8_t* img = images + static_cast<int64_t>(indices[i]) * pixels;
    for (int p = 0; p < pixels; ++p)
      out[static_cast<int64_t>(i) * pixels + p] = normalize_pixel(img[p], mean, inv_std);
    labels_out[i] = labels[indices[i]];
  }
}

void adam_update(int64_t n, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 const AdamHyper& h, const AdamStepFactors* f, const int32_t* skip, int64_t index_first,
                 uint64_t* digests) {
  if (!(skip && *skip))
    for (int64_t i = 0; i < n; ++i) adam_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], h, *f);
  if (!digests) return;
  // One term per element, in index order (the definition; any order gives the same sum).
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t at = static_cast<uint64_t>(index_first + i);
    digests[0] += digest_term(at, digest_word(param[i]));
    digests[1] += digest_term(at, digest_word(exp_avg[i]));
    digests[2] += digest_term(at, digest_word(exp_avg_sq[i]));
  }
}

void digest_words(int64_t n, const uint32_t* words, int64_t index_first, uint64_t* sum) {
  *sum += kernels::digest_words(words, n, static_cast<uint64_t>(index_first));
}

void step_digest_finish(int n_sums, uint64_t* sums, int n_ranges, const DigestRange* ranges, const float* loss,
                        const int64_t* loss_first, int loss_count, uint64_t* ring, int64_t* next, int capacity) {
  uint64_t* row = ring + (*next % capacity) * (n_sums + n_ranges + 1);
  for (int i = 0; i < n_sums; ++i) {
    row[i] = sums[i];
    sums[i] = 0;
  }
  for (int r = 0; r < n_ranges; ++r) row[n_sums + r] = digest_floats(ranges[r].data, ranges[r].n, 0);
  row[n_sums + n_ranges] = digest_floats(loss + *loss_first, loss_count, static_cast<uint64_t>(*loss_first));
  ++*next;
}

void adam_prepare_step(int count, const double* lr, AdamFactorInputs in, const int32_t* skip, int64_t* steps,
                       AdamStepFactors* out) {
  if (*skip) return;
  for (int i = 0; i < count; ++i) out[i] = adam_factors_at(*lr, in, ++steps[i]);
}

void loss_scale_update(LossScaleState* state, LossScaleRule rule) { loss_scale_update_rule(*state, rule);
}

void unscale_check(int64_t n, float* grad, const float* inv_scale, int32_t* found_inf) {
  for (int64_t i = 0; i < n; ++i)
    if (unscale_element(grad[i], *inv_scale)) *found_inf = 1;
}

// ---- chunked ops: the unchunked reference op per chunk, the chunk partials summed in
// double over the fixed tree ----------------------------------------------------------

namespace {
// The tree sum (double) of `chunks` partial vectors of `len` floats each.
void tree_of_partials(const std::vector<float>& parts, int chunks, int64_t len, float* out_f,
                      double* out_d) {
  std::vector<double> acc(parts.begin(), parts.end());
  tree_sum_in_place(acc.data(), chunks, len, len);
  for (int64_t j = 0; j < len; ++j) {
    if (out_f) out_f[j] = static_cast<float>(acc[j]);
    if (out_d) out_d[j] = acc[j];
  }
}
}  // namespace

// The backward ops' chunked forms, in fp32 (ref_op_supports): the CUDA ops' 16-bit
// chunked forms are tested against the whole-batch 16-bit reference chunk by chunk.
void conv2d_backward_chunks(const ConvShape& s, Precision p, int chunks, const int* bounds, const float* x,
                            const float* w, const float* dy, float* dx, float* dw_tree,
                            double* db_tree) {
  require_supported(ref_op_supports, "ref", OpId::conv2d_backward_chunks, p);
  const int64_t in_size = static_cast<int64_t>(s.c) * s.h * s.w;
  const int64_t out_size = static_cast<int64_t>(s.k) * s.out_h() * s.out_w();
  const int64_t wsize = static_cast<int64_t>(s.k) * s.c * s.r * s.s;
  std::vector<float> dw_parts(static_cast<std::size_t>(chunks * wsize), 0.0f);
  std::vector<float> db_parts(static_cast<std::size_t>(chunks) * s.k, 0.0f);
  for (int c = 0; c < chunks; ++c) {
    ConvShape sc = s;
    sc.n = bounds[c + 1] - bounds[c];
    if (sc.n == 0) continue;
    conv2d_backward_fp32(sc, x + bounds[c] * in_size, w, dy + bounds[c] * out_size,
                    dx ? dx + bounds[c] * in_size : nullptr, dw_parts.data() + c * wsize,
                    db_parts.data() + static_cast<int64_t>(c) * s.k);
  }
  tree_of_partials(dw_parts, chunks, wsize, dw_tree, nullptr);
  if (db_tree) tree_of_partials(db_parts, chunks, s.k, nullptr, db_tree);
}

void linear_backward_chunks(const LinearShape& s, Precision p, int chunks, const int* bounds, const float* x,
                            const float* w, const float* dy, float* dx, float* dw_tree,
                            double* db_tree) {
  require_supported(ref_op_supports, "ref", OpId::linear_backward_chunks, p);
  const int64_t wsize = static_cast<int64_t>(s.out) * s.in;
  std::vector<float> dw_parts(static_cast<std::size_t>(chunks * wsize), 0.0f);
  std::vector<float> db_parts(static_cast<std::size_t>(chunks) * s.out, 0.0f);
  for (int c = 0; c < chunks; ++c) {
    LinearShape sc = s;
    sc.n = bounds[c + 1] - bounds[c];
    if (sc.n == 0) continue;
    linear_backward_fp32(sc, x + static_cast<int64_t>(bounds[c]) * s.in, w,
                    dy + static_cast<int64_t>(bounds[c]) * s.out,
                    dx ? dx + static_cast<int64_t>(bounds[c]) * s.in : nullptr,
                    dw_parts.data() + c * wsize, db_parts.data() + static_cast<int64_t>(c) * s.out);
  }
  tree_of_partials(dw_parts, chunks, wsize, dw_tree, nullptr);
  if (db_tree) tree_of_partials(db_parts, chunks, s.out, nullptr, db_tree);
}

void batchnorm_chunk_sums(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                          double* sum_tree) {
  std::vector<double> parts(static_cast<std::size_t>(chunks) * s.c, 0.0);
  for (int k = 0; k < chunks; ++k)
    for (int c = s.c_begin; c < s.channel_end(); ++c)
      for (int n = bounds[k]; n < bounds[k + 1]; ++n)
        for (int i = 0; i < s.hw; ++i) parts[k * s.c + c] += x[bn_index(s, n, c, i)];
  for (int c = s.c_begin; c < s.channel_end(); ++c) sum_tree[c] = tree_sum(parts.data() + c, chunks, s.c);
}

void batchnorm_chunk_centered_squares(const BatchNormShape& s, int chunks, const int* bounds,
                                      const float* x, const float* mean, double* sq_tree) {
  std::vector<double> parts(static_cast<std::size_t>(chunks) * s.c, 0.0);
  for (int k = 0; k < chunks; ++k)
    for (int c = s.c_begin; c < s.channel_end(); ++c)
      for (int n = bounds[k]; n < bounds[k + 1]; ++n)
        for (int i = 0; i < s.hw; ++i) {
          const double d = static_cast<double>(x[bn_index(s, n, c, i)]) - mean[c];
          parts[k * s.c + c] += d * d;
        }
  for (int c = s.c_begin; c < s.channel_end(); ++c) sq_tree[c] = tree_sum(parts.data() + c, chunks, s.c);
}

void batchnorm_scale_shift(const BatchNormShape& s, const float* x, const float* scale,
                           const float* shift, float* y) {
  for (int n = 0; n < s.n; ++n)
    for (int c = s.c_begin; c < s.channel_end(); ++c)
      for (int i = 0; i < s.hw; ++i) {
        const int64_t j = bn_index(s, n, c, i);
        y[j] = static_cast<float>(static_cast<double>(x[j]) * scale[c] + shift[c]);
      }
}

void batchnorm_backward_chunk_sums(const BatchNormShape& s, int chunks, const int* bounds,
                                   const float* x, const float* dy, const float* mean,
                                   double* sum_dy_tree, double* sum_dy_xc_tree) {
  std::vector<double> p_dy(static_cast<std::size_t>(chunks) * s.c, 0.0), p_xc(p_dy);
  for (int k = 0; k < chunks; ++k)
    for (int c = s.c_begin; c < s.channel_end(); ++c)
      for (int n = bounds[k]; n < bounds[k + 1]; ++n)
        for (int i = 0; i < s.hw; ++i) {
          const int64_t j = bn_index(s, n, c, i);
          p_dy[k * s.c + c] += dy[j];
          p_xc[k * s.c + c] += static_cast<double>(dy[j]) * (static_cast<double>(x[j]) - mean[c]);
        }
  for (int c = s.c_begin; c < s.channel_end(); ++c) {
    sum_dy_tree[c] = tree_sum(p_dy.data() + c, chunks, s.c);
    sum_dy_xc_tree[c] = tree_sum(p_xc.data() + c, chunks, s.c);
  }
}

void batchnorm_backward_apply(const BatchNormShape& s, const float* x, const float* dy,
                              const float* mean, const float* k, const float* mean_dy,
                              const float* proj, float* dx) {
  for (int n = 0; n < s.n; ++n)
    for (int c = s.c_begin; c < s.channel_end(); ++c)
      for (int i = 0; i < s.hw; ++i) {
        const int64_t j = bn_index(s, n, c, i);
        const double xc = static_cast<double>(x[j]) - mean[c];
        dx[j] = static_cast<float>(static_cast<double>(k[c]) * (dy[j] - static_cast<double>(mean_dy[c]) -
                                                                xc * proj[c]));
      }
}

// By chunks: the separate steps, with nothing exchanged between them.
static void batchnorm_forward_train_by_chunks(const BatchNormShape& s, int chunks, const int* bounds,
                                              const float* x, const float* gamma, const float* beta, float eps,
                                              float momentum, float* running_mean, float* running_var,
                                              float* save_mean, float* save_invstd, float* y) {
  const double m = static_cast<double>(s.n) * s.hw;
  std::vector<double> sum(s.c), sq(s.c);
  std::vector<float> mean(s.c), scale(s.c), shift(s.c);
  batchnorm_chunk_sums(s, chunks, bounds, x, sum.data());
  for (int c = 0; c < s.c; ++c) mean[c] = static_cast<float>(bn_mean(sum[c], m));
  batchnorm_chunk_centered_squares(s, chunks, bounds, x, mean.data(), sq.data());
  for (int c = 0; c < s.c; ++c) {
    const BnForwardFactors f =
        bn_forward_finish(sum[c], sq[c], m, gamma[c], beta[c], eps, momentum, running_mean[c], running_var[c]);
    scale[c] = f.scale;
    shift[c] = f.shift;
    save_mean[c] = f.save_mean;
    save_invstd[c] = f.save_invstd;
  }
  batchnorm_scale_shift(s, x, scale.data(), shift.data(), y);
}

static void batchnorm_backward_by_chunks(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                         const float* dy, const float* gamma, const float* save_mean,
                                         const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  const double m = static_cast<double>(s.n) * s.hw;
  std::vector<double> sum_dy(s.c), sum_dy_xc(s.c);
  std::vector<float> k(s.c), mean_dy(s.c), proj(s.c);
  batchnorm_backward_chunk_sums(s, chunks, bounds, x, dy, save_mean, sum_dy.data(), sum_dy_xc.data());
  for (int c = 0; c < s.c; ++c) {
    const BnBackwardFactors f = bn_backward_finish(sum_dy[c], sum_dy_xc[c], m, gamma[c], save_invstd[c]);
    k[c] = f.k;
    mean_dy[c] = f.mean_dy;
    proj[c] = f.proj;
    dgamma[c] = f.dgamma;
    dbeta[c] = f.dbeta;
  }
  batchnorm_backward_apply(s, x, dy, save_mean, k.data(), mean_dy.data(), proj.data(), dx);
}

void batchnorm_forward_train(const BatchNormShape& s, BatchSplit split, const float* x, const float* gamma,
                             const float* beta, float eps, float momentum, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, float* y) {
  if (split.whole())
    return batchnorm_forward_train_whole(s, x, gamma, beta, eps, momentum, running_mean, running_var, save_mean,
                                         save_invstd, y);
  batchnorm_forward_train_by_chunks(s, split.chunks, split.bounds, x, gamma, beta, eps, momentum, running_mean,
                                    running_var, save_mean, save_invstd, y);
}

void batchnorm_backward(const BatchNormShape& s, BatchSplit split, const float* x, const float* dy,
                        const float* gamma, const float* save_mean, const float* save_invstd, float* dx,
                        float* dgamma, float* dbeta) {
  if (split.whole()) return batchnorm_backward_whole(s, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  batchnorm_backward_by_chunks(s, split.chunks, split.bounds, x, dy, gamma, save_mean, save_invstd, dx, dgamma,
                               dbeta);
}

}  // namespace engine::kernels::ref
