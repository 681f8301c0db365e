// Decode steps on the device (ssa_decode_step after ssa_session_reserve): what
// a reservation holds, so that a step captured into a CUDA graph can be replayed
// for every token without the host. Per layer: the pages of the coming tokens
// (gathered as an append gathers its tail, lib/store/layer_tail.h), device page
// tables over the layer's pages and those, the codebooks the steps encode with
// (tiered sessions: the tables as a decode's tier_view gives them, frozen for
// the reservation, and the per-page read counts its steps add up);
// per session: the layers' lengths in device memory, which the steps read and
// advance (kernels/step_plan.h), and a guard generation the steps check first.
//
// The host side of the session learns what the steps appended when it settles
// (settle_steps: after waiting for the session's last step, the tokens up to
// the device lengths are committed to the layers, their pages taken from the
// tails). A reservation ends at any call that changes the layers otherwise, at
// a fork or save, and at destroy: the guard's generation moves on, so replays of
// steps captured under it find a newer one and do nothing.
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

#include "device_mem.h"
#include "device_state.h"
#include "store/layer_tail.h"

namespace ssa::cuda {

struct StepReservation {
  unsigned long long generation = 0;  // the guard's value while the reservation lasts
  DeviceMem lengths;                  // uint32_t per layer: tokens present (device)
  struct Layer {
    uint64_t capacity = 0;      // tokens the layer may hold
    uint64_t first_tokens = 0;  // the layer's length when the reservation began (its steps counted since)
    LayerTail tail;         // pages [tail.first_page, pages_for(capacity))
    DeviceMem kv_table, code_table;  // every page of the layer up to the capacity
    std::shared_ptr<SessionState::Books> books;
    // Tiered sessions (device_kv_budget): the pages' tier codes and the rows per
    // page the steps read (kernels/tier_accounting.h), summed over the
    // reservation's steps and read back when it ends;
    // `memory` keeps the cached copies the table points at.
    bool tiered = false;
    size_t n_pages = 0;
    DeviceMem tier_table, page_rows;
    std::vector<std::shared_ptr<void>> memory;
  };
  std::vector<std::unique_ptr<Layer>> layers;  // one per layer of the session
};

}  // namespace ssa::cuda
