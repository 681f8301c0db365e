#include "versioned_struct.h"

#include <iterator>

#include "status.h"

namespace ssa {
namespace {

#define SSA_FIELD(T, f) FieldSpan{offsetof(T, f), offsetof(T, f) + sizeof(T::f)}
#define SSA_CORE_END(T, f) (offsetof(T, f) + sizeof(T::f))

constexpr FieldSpan kRuntimeOptions[] = {
    SSA_FIELD(ssa_runtime_options, struct_size), SSA_FIELD(ssa_runtime_options, backend),
    SSA_FIELD(ssa_runtime_options, device),      SSA_FIELD(ssa_runtime_options, num_threads),
    SSA_FIELD(ssa_runtime_options, seed),        SSA_FIELD(ssa_runtime_options, device_kv_budget),
    SSA_FIELD(ssa_runtime_options, host_cache_bytes), SSA_FIELD(ssa_runtime_options, devices),
    SSA_FIELD(ssa_runtime_options, n_devices),   SSA_FIELD(ssa_runtime_options, shard_tokens),
    SSA_FIELD(ssa_runtime_options, communicator), SSA_FIELD(ssa_runtime_options, collective),
    SSA_FIELD(ssa_runtime_options, host_pool_bytes),
};

constexpr FieldSpan kCollective[] = {
    SSA_FIELD(ssa_collective, struct_size),        SSA_FIELD(ssa_collective, rank),
    SSA_FIELD(ssa_collective, size),               SSA_FIELD(ssa_collective, timeout_ms),
    SSA_FIELD(ssa_collective, user),               SSA_FIELD(ssa_collective, all_reduce_sum_u64),
    SSA_FIELD(ssa_collective, all_reduce_max_f32), SSA_FIELD(ssa_collective, all_gather),
};

constexpr FieldSpan kSessionConfig[] = {
    SSA_FIELD(ssa_session_config, struct_size),        SSA_FIELD(ssa_session_config, n_layers),
    SSA_FIELD(ssa_session_config, n_q_heads),          SSA_FIELD(ssa_session_config, n_kv_heads),
    SSA_FIELD(ssa_session_config, head_dim),           SSA_FIELD(ssa_session_config, kv_dtype),
    SSA_FIELD(ssa_session_config, pq_subspaces),       SSA_FIELD(ssa_session_config, pq_centroids),
    SSA_FIELD(ssa_session_config, model_fingerprint),  SSA_FIELD(ssa_session_config, page_tokens),
    SSA_FIELD(ssa_session_config, flags),              SSA_FIELD(ssa_session_config, index_min_tokens),
    SSA_FIELD(ssa_session_config, index_regrow_factor), SSA_FIELD(ssa_session_config, index_train_sample),
    SSA_FIELD(ssa_session_config, index_iterations),   SSA_FIELD(ssa_session_config, proxy),
    SSA_FIELD(ssa_session_config, pq_parallel_weight),
};

constexpr FieldSpan kDecodeParams[] = {
    SSA_FIELD(ssa_decode_params, struct_size),  SSA_FIELD(ssa_decode_params, method),
    SSA_FIELD(ssa_decode_params, budget),       SSA_FIELD(ssa_decode_params, sparsity),
    SSA_FIELD(ssa_decode_params, heavy_fraction), SSA_FIELD(ssa_decode_params, n_sink),
    SSA_FIELD(ssa_decode_params, n_local),      SSA_FIELD(ssa_decode_params, pi_min),
    SSA_FIELD(ssa_decode_params, seed),         SSA_FIELD(ssa_decode_params, step),
    SSA_FIELD(ssa_decode_params, stream),       SSA_FIELD(ssa_decode_params, target_error),
    SSA_FIELD(ssa_decode_params, target_delta), SSA_FIELD(ssa_decode_params, max_budget),
    SSA_FIELD(ssa_decode_params, group_selection),
};

constexpr FieldSpan kDecodeStats[] = {
    SSA_FIELD(ssa_decode_stats, struct_size),     SSA_FIELD(ssa_decode_stats, context_tokens),
    SSA_FIELD(ssa_decode_stats, tokens_read),     SSA_FIELD(ssa_decode_stats, heavy_tokens),
    SSA_FIELD(ssa_decode_stats, draws),           SSA_FIELD(ssa_decode_stats, unique_samples),
    SSA_FIELD(ssa_decode_stats, residual_proxy_mass), SSA_FIELD(ssa_decode_stats, scored_tokens),
    SSA_FIELD(ssa_decode_stats, target_budget),   SSA_FIELD(ssa_decode_stats, capped_heads),
    SSA_FIELD(ssa_decode_stats, predicted_error), SSA_FIELD(ssa_decode_stats, window_only_heads),
    SSA_FIELD(ssa_decode_stats, rows_from_host),  SSA_FIELD(ssa_decode_stats, host_cache_hits),
};

constexpr FieldSpan kSnapshotInfo[] = {
    SSA_FIELD(ssa_snapshot_info, struct_size),     SSA_FIELD(ssa_snapshot_info, format_version),
    SSA_FIELD(ssa_snapshot_info, generation),      SSA_FIELD(ssa_snapshot_info, file_bytes),
    SSA_FIELD(ssa_snapshot_info, live_bytes),      SSA_FIELD(ssa_snapshot_info, n_sections),
    SSA_FIELD(ssa_snapshot_info, n_layers),        SSA_FIELD(ssa_snapshot_info, n_q_heads),
    SSA_FIELD(ssa_snapshot_info, n_kv_heads),      SSA_FIELD(ssa_snapshot_info, head_dim),
    SSA_FIELD(ssa_snapshot_info, kv_dtype),        SSA_FIELD(ssa_snapshot_info, pq_subspaces),
    SSA_FIELD(ssa_snapshot_info, pq_centroids),    SSA_FIELD(ssa_snapshot_info, page_tokens),
    SSA_FIELD(ssa_snapshot_info, indexed_layers),  SSA_FIELD(ssa_snapshot_info, model_fingerprint),
    SSA_FIELD(ssa_snapshot_info, length),          SSA_FIELD(ssa_snapshot_info, max_layer_length),
    SSA_FIELD(ssa_snapshot_info, metadata_bytes),  SSA_FIELD(ssa_snapshot_info, proxy),
    SSA_FIELD(ssa_snapshot_info, pq_parallel_weight),
};

template <size_t N>
constexpr bool ordered(const FieldSpan (&f)[N], size_t full) {
  for (size_t i = 1; i < N; ++i) {
    if (f[i].begin < f[i - 1].end) return false;
  }
  return f[0].begin == 0 && f[N - 1].end <= full;
}
static_assert(ordered(kRuntimeOptions, sizeof(ssa_runtime_options)));
static_assert(ordered(kSessionConfig, sizeof(ssa_session_config)));
static_assert(ordered(kDecodeParams, sizeof(ssa_decode_params)));
static_assert(ordered(kDecodeStats, sizeof(ssa_decode_stats)));
static_assert(ordered(kSnapshotInfo, sizeof(ssa_snapshot_info)));
static_assert(ordered(kCollective, sizeof(ssa_collective)));
// Every field is listed: the last one ends where the struct does, up to padding.
static_assert(sizeof(ssa_decode_stats) - kDecodeStats[std::size(kDecodeStats) - 1].end < 8);
static_assert(sizeof(ssa_decode_params) - kDecodeParams[std::size(kDecodeParams) - 1].end < 8);
static_assert(sizeof(ssa_session_config) - kSessionConfig[std::size(kSessionConfig) - 1].end < 8);
static_assert(sizeof(ssa_runtime_options) - kRuntimeOptions[std::size(kRuntimeOptions) - 1].end < 8);
static_assert(sizeof(ssa_snapshot_info) - kSnapshotInfo[std::size(kSnapshotInfo) - 1].end < 8);
static_assert(sizeof(ssa_collective) - kCollective[std::size(kCollective) - 1].end < 8);

#define SSA_LAYOUT(T, core_field, table)                                                              \
  template <>                                                                                         \
  const StructLayout& layout_of<T>() {                                                                \
    static constexpr StructLayout l{#T, #T "_init", SSA_CORE_END(T, core_field), sizeof(T), table,    \
                                    std::size(table)};                                                \
    return l;                                                                                         \
  }

}  // namespace

// The core fields are those of the first published API; later fields may be cut off.
SSA_LAYOUT(ssa_runtime_options, seed, kRuntimeOptions)
SSA_LAYOUT(ssa_session_config, model_fingerprint, kSessionConfig)
SSA_LAYOUT(ssa_decode_params, stream, kDecodeParams)
SSA_LAYOUT(ssa_decode_stats, unique_samples, kDecodeStats)
SSA_LAYOUT(ssa_snapshot_info, format_version, kSnapshotInfo)
SSA_LAYOUT(ssa_collective, all_gather, kCollective)

static_assert(sizeof(ssa_runtime_options) <= SSA_MAX_STRUCT_SIZE && sizeof(ssa_session_config) <= SSA_MAX_STRUCT_SIZE &&
              sizeof(ssa_decode_params) <= SSA_MAX_STRUCT_SIZE && sizeof(ssa_decode_stats) <= SSA_MAX_STRUCT_SIZE &&
              sizeof(ssa_snapshot_info) <= SSA_MAX_STRUCT_SIZE);

absl::Status check_struct_size(const StructLayout& l, uint32_t size, const void* in) {
  // First: a size no header could produce is never used to read or write.
  if (size > SSA_MAX_STRUCT_SIZE) {
    return invalid_argument(l.name, " struct_size ", size, " is larger than SSA_MAX_STRUCT_SIZE ",
                            SSA_MAX_STRUCT_SIZE, " (call ", l.init, ")");
  }
  if (size < l.core_size) {
    return invalid_argument(l.name, " struct_size ", size, " < ", l.core_size,
                            ", the smallest size accepted (call ", l.init, ")");
  }
  if (size > l.full_size) {
    if (in == nullptr) return absl::OkStatus();
    const unsigned char* bytes = static_cast<const unsigned char*>(in);
    for (size_t i = l.full_size; i < size; ++i) {
      if (bytes[i] != 0) {
        return unsupported(l.name, " struct_size ", size, " is larger than this libssa's ", l.full_size,
                           " and byte ", i, " is not zero: a field this version (", SSA_VERSION_MAJOR, ".",
                           SSA_VERSION_MINOR, ".", SSA_VERSION_PATCH, ") does not know is set");
      }
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < l.n_fields; ++i) {
    if (size > l.fields[i].begin && size < l.fields[i].end) {
      return invalid_argument(l.name, " struct_size ", size, " ends inside a field (bytes ", l.fields[i].begin,
                              "..", l.fields[i].end, ")");
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa
