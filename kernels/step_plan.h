// Host entry points of kernels/step_plan.cu: the device half of a decode step
// (lib/cuda/graph_step.h), which a CUDA graph captures once and replays for
// every token. What changes from token to token is read from device memory and
// advanced there: each item's layer length (the write position of the new
// token), its decode plan (the CPU planner's arithmetic on that length:
// lib/decode/decode_plan.cc, lib/cuda/method_plan.cc, plan_workspace), and its
// RNG step. The host plans the launches once for the reservation's capacity.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "decode_types.h"

namespace ssa::cuda {

// A reservation's guard word in a table that lives as long as the process
// (graph_step.cc): a captured step checks it before touching the session, so a
// replay after the reservation ended (truncate, append, destroy...) finds a
// newer generation and does nothing. The counters tell the host what was
// dropped (read and cleared by ssa_session_sync).
struct StepGuard {
  unsigned long long generation;
  unsigned int dropped_ended;  // replays of steps whose reservation had ended
  unsigned int dropped_full;   // steps of a layer already at its reserved capacity
};

// The planner's share of ssa_decode_params (every item of a step shares it).
struct StepRequest {
  uint32_t method = 0;  // ssa_method
  uint32_t budget = 0, n_sink = 0, n_local = 0;
  float sparsity = 1.0f, heavy_fraction = 0.0f;
  uint32_t group_size = 1;  // q heads per KV head
  bool grouped = false;     // group selection (one selection per KV head)
  uint64_t step = 0;        // the RNG step is step + the new token's position
};

// One item of a step: a layer of a session with a reservation.
struct StepItem {
  uint32_t* length = nullptr;  // device: the layer's token count (advanced by the step)
  StepGuard* guard = nullptr;  // device: the reservation's guard
  unsigned long long generation = 0;  // the reservation's generation when the step was queued
  uint32_t capacity = 0;       // tokens the layer may hold in the reservation
  const uint8_t* k = nullptr;  // device: the new token's K and V, [n_kv_heads][head_dim]
  const uint8_t* v = nullptr;
  uint8_t* const* kv_pages = nullptr;  // device tables over the reservation's pages
};

struct StepBatch {
  StepRequest req;
  uint32_t n_items = 0;
  StepItem items[kMaxBatchItems];
};

// What the plan kernel writes (device, n_items entries each): the items the
// stages read (DecodeBatch::items_dev), the new token's position in its layer
// (~0u: the step does nothing) and the RNG step (DecodeBatch::step_dev).
struct StepPlanOut {
  DecodeItem* items = nullptr;
  uint32_t* position = nullptr;
  uint64_t* step = nullptr;
};
inline constexpr uint32_t kNoPosition = 0xFFFFFFFFu;

// Queues on st the plan kernel: for each item, checks its guard and capacity,
// reads and advances its length, and writes its plan from b.items[i] (the
// host's template: pointers and workspace bases, planned at capacity).
cudaError_t launch_step_plan(const DecodeBatch& b, const StepBatch& sb, StepPlanOut out, cudaStream_t st);

// Queues on st the copy of each item's new K and V rows into its pages at the
// planned position (nothing for an item whose position is kNoPosition).
cudaError_t launch_step_rows(const DecodeShape& shape, const StepBatch& sb, const uint32_t* position,
                             cudaStream_t st);

}  // namespace ssa::cuda
