// Named fields of the kernels' parameter structs, for the Python layer: (name, offset, size, kind) of every
// field, exported by the bindings (csrc/bindings/). Python builds a ctypes.Structure with the same layout
// from them, checks that the offsets and the size agree, and fills it by field name: no positional
// argument list exists to keep in sync, and the emulator (tests/emu) receives the very same struct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace adaptive_verify {

struct FieldInfo {
  const char* name;
  size_t offset, size;
  char kind;  // 'p' pointer, 'i' signed integer, 'u' unsigned integer, 'b' bool, 'f' floating point, 'F' / 'I' /
             // 'B' an array of float32 / int64 / uint8
};

// Scalars: 'p', 'b', 'f', 'i', 'u' (kind above). Fixed-size arrays, passed by value: 'F' of float32 elements, 'I' of
// int64 elements, 'B' of uint8 elements (the size is the whole array's; Python reads the element type from the kind).
template <typename T>
constexpr char field_kind() {
  if constexpr (std::is_array<T>::value) {
    using E = std::remove_extent_t<T>;
    static_assert(std::is_same<E, float>::value || std::is_same<E, int64_t>::value || std::is_same<E, uint8_t>::value,
                  "array fields hold float32, int64 or uint8 elements");
    return std::is_same<E, float>::value ? 'F' : std::is_same<E, int64_t>::value ? 'I' : 'B';
  } else {
    return std::is_pointer<T>::value         ? 'p'
           : std::is_same<T, bool>::value     ? 'b'
           : std::is_floating_point<T>::value ? 'f'
           : std::is_signed<T>::value         ? 'i'
                                              : 'u';
  }
}

// The name string and the member come from one token, so a field cannot be exported under another's name.
#define AV_FIELD(S, f) \
  ::adaptive_verify::FieldInfo { #f, offsetof(S, f), sizeof(S::f), ::adaptive_verify::field_kind<decltype(S::f)>() }

}  // namespace adaptive_verify
