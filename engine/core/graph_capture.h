// Private to the engine: what a CUDA graph of the training step (engine/train/
// step_graphs.h) must know of the GPU memory and of the other threads.
//
// Memory. A graph reads and writes its buffers at the
// addresses they had in its capture, so it stays valid while no GPU buffer that was alive
// at the capture has been freed (the allocator may hand that address out again).
// Buffers made after the capture (an evaluation's, another thread's) cannot be in it, and
// freeing them does not matter; nor do host allocations.
#pragma once
#include <cstdint>
#include <mutex>

namespace engine {

// Marks every GPU buffer alive now: a capture is about to record some of them. (With
// several graph owners in one process the mark is the newest one's: an older owner may
// then drop its graphs for a buffer it did not use, never keep them past one it did.)
void mark_live_device_buffers();
// How many marked GPU buffers have been freed since the process started.
uint64_t marked_device_buffer_frees();
// GPU allocations made by the calling thread since it started (device_alloc).
uint64_t thread_device_allocations();

// Counted in device_activity(): a step captured as a graph, a graph launched.
void note_graph_captured();
void note_graph_launched();

// Threads. All GPU work goes to one stream (kernels/cuda/context.h): work that another
// thread queues while a step is being captured would be recorded into the graph (and run
// at every replay), and a wait for it would end the capture with an error. The capture
// holds this lock from its begin to its end; GPU work of another thread (a Classifier's
// call, docs/embedding.md) holds it for its length, so it waits for a capture to end,
// and a capture for it.
std::mutex& graph_capture_mutex();

}  // namespace engine
