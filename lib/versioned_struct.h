// The one rule for every public struct that starts with `struct_size` (stated in
// ssa.h, "Versioned structs"). A caller's struct_size is accepted when it is at
// least the end of the struct's core fields, at most SSA_MAX_STRUCT_SIZE (one
// bound for every struct, inputs and outputs), does not end inside a field, and,
// when larger than this header's struct, leaves the unknown bytes zero (inputs;
// for outputs they are written as zero). Inputs are read only up to the caller's
// size (later fields keep their defaults); outputs are written only up to it.
//
// Appending a field to a released struct: add it to the struct's table in
// versioned_struct.cc and to tests/c_struct_rules_test.c, label it with the
// version in ssa.h, and keep the exported *_init symbol of the older version
// writing only the older size (a new symbol version in lib/ssa.map): a program
// built against the older header calls *_init on its smaller struct.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "absl/status/status.h"
#include "ssa.h"

namespace ssa {

struct FieldSpan {
  size_t begin, end;  // bytes [begin, end) of one field
};

struct StructLayout {
  const char* name;         // "ssa_decode_stats"
  const char* init;         // "ssa_decode_stats_init"
  size_t core_size;         // end of the core fields: the smallest struct_size
  size_t full_size;         // sizeof in this header
  const FieldSpan* fields;  // every field, in order
  size_t n_fields;
};

template <typename T>
const StructLayout& layout_of();
// One per versioned struct (versioned_struct.cc).
template <>
const StructLayout& layout_of<ssa_runtime_options>();
template <>
const StructLayout& layout_of<ssa_session_config>();
template <>
const StructLayout& layout_of<ssa_decode_params>();
template <>
const StructLayout& layout_of<ssa_decode_stats>();
template <>
const StructLayout& layout_of<ssa_snapshot_info>();
template <>
const StructLayout& layout_of<ssa_collective>();

// Whether the caller's size fits `l`; `in`, when not NULL, is an input struct of
// that size whose bytes beyond this header's struct must then be zero.
absl::Status check_struct_size(const StructLayout& l, uint32_t size, const void* in);

// The caller's struct_size, read without assuming anything else of the struct.
inline uint32_t struct_size_of(const void* p) {
  uint32_t size;
  memcpy(&size, p, sizeof size);
  return size;
}

// *out holds the defaults (from the *_init function); overlays the caller's
// first struct_size bytes of *in. *out's struct_size stays this header's size.
template <typename T>
absl::Status read_struct(const T* in, T* out) {
  const StructLayout& l = layout_of<T>();
  const uint32_t size = struct_size_of(in);
  absl::Status st = check_struct_size(l, size, in);
  if (!st.ok()) return st;
  const size_t n = size < sizeof(T) ? size : sizeof(T);
  memcpy(reinterpret_cast<char*>(out) + sizeof(uint32_t), reinterpret_cast<const char*>(in) + sizeof(uint32_t),
         n - sizeof(uint32_t));
  return absl::OkStatus();
}

// Checks an output struct's size before anything is computed for it.
template <typename T>
absl::Status check_output_struct(const T* out) {
  return check_struct_size(layout_of<T>(), struct_size_of(out), nullptr);
}

// Writes `full` into the caller's struct up to its struct_size (already checked):
// the fields it has, zeros for bytes beyond this header's struct; struct_size kept.
template <typename T>
void write_struct(const T& full, T* out) {
  const uint32_t size = struct_size_of(out);
  const size_t n = size < sizeof(T) ? size : sizeof(T);
  char* dst = reinterpret_cast<char*>(out);
  memcpy(dst + sizeof(uint32_t), reinterpret_cast<const char*>(&full) + sizeof(uint32_t), n - sizeof(uint32_t));
  if (size > sizeof(T)) memset(dst + sizeof(T), 0, size - sizeof(T));
}

// The value of a 32-bit enum field as stored, read as an integer: a caller's
// out-of-range value is then a number to reject, not undefined behaviour.
template <typename E>
uint32_t enum_value(const E& e) {
  static_assert(sizeof(E) == sizeof(uint32_t), "public enums are 32 bits");
  uint32_t v;
  memcpy(&v, &e, sizeof v);
  return v;
}

}  // namespace ssa
