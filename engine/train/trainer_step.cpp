#include "engine/train/trainer.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "engine/core/batch_chunks.h"
#include "core/graph_capture.h"
#include "core/step_values.h"
#include "engine/core/device.h"
#include "kernels/cuda/settings.h"
#include "train/step_graphs.h"
#include "core/tensor_ops.h"
#include "train/run_protocol.h"
#include "train/time_budget.h"
#include "train/trainer_common.h"

// One training step, a step or epoch taken alone (train_step, train_epoch), and
// evaluation: what the Trainer computes, whether in one process or on several ranks.

namespace engine {

int64_t Trainer::steps_per_epoch() {
  const int64_t n = data_->get(Split::Train).count;
  const int batch = cfg_.data.batch_size;
  return (n + batch - 1) / batch;
}

void Trainer::prepare_epoch() {
  const int64_t n = data_->get(Split::Train).count;
  if (epoch_sample_loss_.numel() != n)
    throw std::logic_error("this Trainer was built to evaluate only (SplitsNeeded::TestOnly): it cannot train");
  if (step_in_epoch_ == 0) {
    epoch_shuffle_offset_ = rng_.take(RngStream::Shuffle, Rng::permutation_draws(static_cast<int32_t>(n)));
    epoch_sample_loss_.zero();
  }
  optimizer_->set_lr(scheduler_->lr());
  if (permutation_offset_ == epoch_shuffle_offset_) return;
  // The permutation is re-derived from its saved offset, so a mid-epoch resume sees
  // the same order.
  const std::vector<int32_t> perm = rng_.permutation(RngStream::Shuffle, epoch_shuffle_offset_,
                                                     static_cast<int32_t>(n));
  Tensor perm_host = Tensor::empty({n}, DType::I32);
  std::copy(perm.begin(), perm.end(), perm_host.i32());
  // Into the same buffer when it has one (a CUDA graph of the step reads it there).
  if (permutation_.defined() && permutation_.numel() == n && permutation_.device() == device_)
    permutation_.copy_from(perm_host);
  else
    permutation_ = device_.is_cpu() ? perm_host : perm_host.to(device_);
  permutation_offset_ = epoch_shuffle_offset_;
  epoch_clock_ = env_.monotonic_now();
}


bool Trainer::step_graphs_apply() const {
  return cfg_.cuda.graphs && device_.is_cuda() && !kernels::cuda::batch_chunks() && !shards_ &&
         collective_->size() == 1 && model_->supports_step_graphs();
}

void Trainer::drop_step_graphs() {
  if (step_graphs_) step_graphs_->drop();
}

void Trainer::run_step() {
  const SplitData& train = data_->get(Split::Train);
  const int64_t n = train.count;
  const int batch = cfg_.data.batch_size;
  const int classes = model_->num_classes();
  const int64_t start = step_in_epoch_ * batch;
  const int b = static_cast<int>(std::min<int64_t>(batch, n - start));
  const bool graphs = step_graphs_apply();
  if (!step_graphs_) step_graphs_ = std::make_unique<StepGraphs>();
  // This thread's GPU allocations: a step that makes a buffer is not captured yet.
  const uint64_t allocations_before = thread_device_allocations();
  // This rank's chunks of the batch (all of it in one process, docs/distributed.md).
  BatchChunks plan(b, collective_, cfg_.dist.chunks);
  if (shards_) {
    // The layers leave their weight and bias block sums for the one pass after backward;
    // on several ranks this rank keeps and updates its shard of the moments only.
    if (shards_->world_size() > 1) optimizer_->shard(*shards_);
    grad_parts_.clear();
    plan.defer_gradients(&grad_parts_);
  }
  const int local = plan.local_count();
  const int64_t first = start + plan.local_begin();
  reuse_buffer(batch_x_, batch_shape(local), DType::F32, device_);
  reuse_buffer(batch_labels_, {local}, DType::I32, device_);
  reuse_buffer(dlogits_, {local, classes}, DType::F32, device_);
  reuse_buffer(sample_correct_, {n}, DType::F32, device_);
  // Step digests: the optimizer adds its tensors' digests to the sums as it updates; the
  // step's last launch moves them to the ring (finish_step_digests).
  const bool digests = step_digests_on();
  if (digests) prepare_step_digests();
  optimizer_->set_digest_sums(digests ? &digest_sums_ : nullptr);
  digest_loss_first_ = start;
  // Every value of this step that its kernels read and that differs from the last
  // step's, in one upload: the launches below are then the same every step.
  if (!step_values_) step_values_ = std::make_unique<StepValues>();
  StepValues& values = *step_values_;
  values.scalars.sample_first = first;
  values.scalars.dropout_counter = rng_.counter(RngStream::Dropout);
  values.scalars.lr = optimizer_->lr();
  // With a loss scaler the step counts and Adam's factors are kept on the device (the
  // step may be skipped there); without one the host makes the factors.
  if (!scaler_->active()) optimizer_->prepare_step(values);
  values.upload(device_);
  plan.use_step_values(&values);
  struct PlanScope {
    Model& m;
    ~PlanScope() { m.set_batch_chunks(nullptr); }
  } plan_scope{*model_};
  model_->set_batch_chunks(&plan);

  // A graph reads its buffers where they were when it was captured: a GPU buffer alive
  // then and freed since (a buffer made again, here or between steps) drops every graph.
  // An evaluation's or a save's buffers, made after the capture, do not.
  if (marked_device_buffer_frees() != step_graphs_->frees_seen) drop_step_graphs();
  const bool allocated = thread_device_allocations() != allocations_before;
  if (graphs && allocated) drop_step_graphs();
  if (const StepGraphs::Graph* g = graphs && !allocated ? step_graphs_->find(local) : nullptr) {
    // The host's part of the step, as the capture did it; then the device's, replayed.
    for (int s = 0; s < kRngStreamCount; ++s)
      if (g->draws[s]) rng_.take(static_cast<RngStream>(s), g->draws[s]);
    model_->replayed_train_step();
    optimizer_->replayed_step(g->counts);
    if (g->counts == AdamOptimizer::StepCounts::OnDevice) scaler_->replayed_step();
    kernels::cuda::launch(g->graph);
    note_graph_launched();
  } else if (graphs && !allocated && step_graphs_->ready(local)) {
    std::array<uint64_t, kRngStreamCount> before{};
    for (int s = 0; s < kRngStreamCount; ++s) before[s] = rng_.counter(static_cast<RngStream>(s));
    // No other thread's GPU work while the step is recorded (core/graph_capture.h).
    std::unique_lock<std::mutex> capture_lock(graph_capture_mutex());
    mark_live_device_buffers();
    kernels::cuda::begin_capture();
    try {
      step_device_work(plan, b, local);
    } catch (...) {
      kernels::cuda::abandon_capture();
      capture_lock.unlock();
      drop_step_graphs();
      throw;
    }
    kernels::cuda::Graph captured = kernels::cuda::end_capture();
    capture_lock.unlock();
    StepGraphs::Graph g{std::move(captured), {},
                        scaler_->active() ? AdamOptimizer::StepCounts::OnDevice : AdamOptimizer::StepCounts::OnHost};
    for (int s = 0; s < kRngStreamCount; ++s) g.draws[s] = rng_.counter(static_cast<RngStream>(s)) - before[s];
    // The capture ran the step's host part and recorded its device part: run that now.
    note_graph_captured();
    kernels::cuda::launch(g.graph);
    note_graph_launched();
    step_graphs_->add(local, std::move(g));
  } else {
    step_device_work(plan, b, local);
    if (graphs) step_graphs_->eager_step_done(local, thread_device_allocations() != allocations_before);
  }
  step_graphs_->frees_seen = marked_device_buffer_frees();
  ++step_in_epoch_;
  ++global_step_;
  if (digests) record_step_digest();
}

void Trainer::step_device_work(const BatchChunks& plan, int batch_total, int local) {
  const SplitData& train = data_->get(Split::Train);
  const StepValues& values = *step_values_;
  const int64_t start = step_in_epoch_ * cfg_.data.batch_size;
  tt::gather_batch(train.images, train.labels, permutation_, values.sample_first(), local,
                   static_cast<float>(cfg_.data.mean), static_cast<float>(cfg_.data.std), batch_x_, batch_labels_);
  Tensor logits = model_->forward(batch_x_, Mode::Train, rng_);
  // This rank's samples' losses, and the gradient of the mean over the global batch
  // (times the loss scale, which a loss scaler keeps on the device).
  const bool scaled = scaler_->active();
  tt::cross_entropy(logits, batch_labels_, batch_total, scaled ? scaler_->device_loss_scale(device_) : values.loss_scale(),
                    &dlogits_, epoch_sample_loss_, sample_correct_, values.sample_first());
  model_->backward(dlogits_);
  // Every rank holds every sample's loss (the state is the same on all ranks).
  gather_samples(plan, epoch_sample_loss_.f32() + start);
  // Every deferred gradient complete in this rank's shard (several ranks: one alltoall;
  // the tree order either way), the shard updated, every rank's shard back to every rank
  // (one allgather). The loss scaler only runs on CUDA, which completes its gradients in
  // the layers and holds no shards: it sees whole gradients, the same on every rank.
  if (shards_) shards_->reduce_scatter(plan, grad_parts_, param_grads_);
  if (scaled) {
    // The overflow check, the skip and the scale's update all on the device: nothing is
    // read back, so the host queues the next step at once.
    scaler_->unscale_on_device(model_->parameters());
    optimizer_->step_on_device(values, scaler_->device_found_inf());
    scaler_->update_on_device();
    finish_step_digests(batch_total);
    return;
  }
  optimizer_->step(values);
  if (shards_) shards_->allgather(param_values_);
  finish_step_digests(batch_total);
}

double Trainer::epoch_elapsed_seconds() const {
  // The clock runs from the epoch's first step in this session (prepare_epoch); before
  // that step, only the earlier sessions' part counts.
  const bool running = step_in_epoch_ > 0 && permutation_offset_.has_value();
  return epoch_elapsed_before_ + (running ? seconds_since(env_, epoch_clock_) : 0.0);
}


StepResult Trainer::train_step() {
  require_epochs_left();
  const bool begins = step_in_epoch_ == 0;
  prepare_epoch();
  const int64_t steps = steps_per_epoch();
  if (begins) observer_->on_epoch_begin(epoch_ + 1, cfg_.train.epochs, steps);
  const int64_t n = data_->get(Split::Train).count;
  const int64_t start = step_in_epoch_ * cfg_.data.batch_size;
  run_step();
  observer_->on_step_end(global_step_);
  StepResult r;
  r.epoch = epoch_ + 1;
  r.step_in_epoch = step_in_epoch_;
  r.global_step = global_step_;
  gather_optimizer_shards();  // a step taken alone leaves the whole state (a collective)
  const int64_t b = std::min<int64_t>(cfg_.data.batch_size, n - start);
  r.loss = tt::reduce_sum(epoch_sample_loss_, start, b) / static_cast<double>(b);
  if (step_in_epoch_ == steps) {
    EpochMetrics m;
    finish_epoch(seconds_since(env_, epoch_clock_), m, Interruptible::No);
    observer_->on_epoch_end(m);
    r.epoch_end = m;
  }
  return r;
}

EpochMetrics Trainer::train_epoch() {
  require_epochs_left();
  for (;;) {
    StepResult r = train_step();
    if (r.epoch_end) return *r.epoch_end;
  }
}

void Trainer::gather_samples(const BatchChunks& plan, float* values) const {
  if (device_.is_cpu()) plan.gather_samples(values);
  else plan.gather_samples_device(values);
}

void Trainer::gather_optimizer_shards() {
  if (shards_ && optimizer_->sharded()) optimizer_->unshard(*shards_);
}


// ---- evaluation ----------------------------------------------------------------------

EvalResult Trainer::evaluate(Split split) { return *evaluate_impl(split, nullptr); }

std::optional<EvalResult> Trainer::evaluate_unless_stopped(Split split) {
  const auto t0 = env_.monotonic_now();
  std::optional<EvalResult> r = evaluate_impl(split, &control_);
  if (r && time_budget_) time_budget_->record_eval(seconds_since(env_, t0), r->count);
  return r;
}

std::optional<EvalResult> Trainer::evaluate_impl(Split split, const RunControl* stop) {
  const SplitData& d = data_->get(split);
  const int classes = model_->num_classes();
  EvalResult r;
  r.count = d.count;
  r.confusion.assign(classes, std::vector<int64_t>(classes, 0));
  if (d.count == 0) return r;
  const int batch = cfg_.data.batch_size;
  Tensor idx_host = Tensor::empty({d.count}, DType::I32);
  std::iota(idx_host.i32(), idx_host.i32() + d.count, 0);
  Tensor idx = device_.is_cpu() ? idx_host : idx_host.to(device_);
  Tensor losses = Tensor::empty({d.count}, DType::F32, device_);
  Tensor correct = Tensor::empty({d.count}, DType::F32, device_);
  Tensor predictions = Tensor::empty({d.count}, DType::I32);  // host
  Tensor x, labels;
  StepValues values;  // each batch's first sample
  struct PlanScope {
    Model& m;
    ~PlanScope() { m.set_batch_chunks(nullptr); }
  } plan_scope{*model_};
  for (int64_t start = 0; start < d.count; start += batch) {
    // Several ranks: a stop requested on any of them ends every rank's evaluation here.
    if (stop && protocol_->agree(stop->stop_requested(), false, {}, {}).stop) return std::nullopt;
    const int b = static_cast<int>(std::min<int64_t>(batch, d.count - start));
    // Each rank evaluates its chunks of the batch; the per-sample results are gathered.
    const BatchChunks plan(b, collective_, cfg_.dist.chunks);
    const int local = plan.local_count();
    const int64_t first = start + plan.local_begin();
    if (!x.defined() || x.dim(0) != local) {
      x = Tensor::empty(batch_shape(local), DType::F32, device_);
      labels = Tensor::empty({local}, DType::I32, device_);
    }
    values.scalars.sample_first = first;
    values.upload(device_);
    tt::gather_batch(d.images, d.labels, idx, values.sample_first(), local, static_cast<float>(cfg_.data.mean),
                     static_cast<float>(cfg_.data.std), x, labels);
    model_->set_batch_chunks(&plan);
    Tensor logits = model_->forward(x, Mode::Eval, rng_);
    tt::cross_entropy(logits, labels, local, values.loss_scale(), nullptr, losses, correct, values.sample_first());
    const std::vector<float> z = logits.to_vector();
    for (int i = 0; i < local; ++i) predictions.i32()[first + i] = kernels::argmax_first(z.data() + i * classes, classes);
    gather_samples(plan, losses.f32() + start);
    gather_samples(plan, correct.f32() + start);
    plan.gather_samples(predictions.i32() + start);
  }
  r.loss = tt::reduce_sum(losses, 0, d.count) / static_cast<double>(d.count);
  r.accuracy = tt::reduce_sum(correct, 0, d.count) / static_cast<double>(d.count);
  Tensor labels_host = d.labels.to(Device::cpu());
  for (int64_t i = 0; i < d.count; ++i) ++r.confusion[labels_host.u8()[i]][predictions.i32()[i]];
  return r;
}

Tensor Trainer::first_images(Split split, int64_t n) {
  const SplitData& d = data_->get(split);
  n = std::min(n, d.count);
  Tensor idx_host = Tensor::empty({n}, DType::I32);
  std::iota(idx_host.i32(), idx_host.i32() + n, 0);
  Tensor idx = device_.is_cpu() ? idx_host : idx_host.to(device_);
  Tensor x = Tensor::empty(batch_shape(n), DType::F32, device_);
  Tensor labels = Tensor::empty({n}, DType::I32, device_);
  StepValues values;  // sample_first 0
  values.upload(device_);
  tt::gather_batch(d.images, d.labels, idx, values.sample_first(), static_cast<int>(n),
                   static_cast<float>(cfg_.data.mean), static_cast<float>(cfg_.data.std), x, labels);
  return x;
}

Tensor Trainer::logits(Split split, int64_t n) {
  return model_->forward(first_images(split, n), Mode::Eval, rng_).to(Device::cpu());
}

}  // namespace engine
