// Helpers shared by the per-area binding files (csrc/bindings/<area>.cpp): every op takes the address of its
// parameter struct (filled by name on the Python side from the exported layout), whether it runs on CUDA,
// and the stream; it returns a status (CPU kernels) or a cudaError_t as int (CUDA launchers).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "adaptive_verify/common.h"
#include "adaptive_verify/fields.h"

namespace adaptive_verify {
namespace bindings {

namespace py = pybind11;

constexpr int kNoCuda = -1;  // status when a CUDA call reaches a CPU-only build

#ifdef AV_WITH_CUDA
#define AV_CUDA_FN(fn) fn
#else
#define AV_CUDA_FN(fn) nullptr
#endif

template <typename P>
const P& params_at(uintptr_t address) {
  if (address == 0) throw py::value_error("adaptive_verify._C: null parameter struct");
  return *reinterpret_cast<const P*>(address);
}

// The CPU kernel, or on CUDA the launcher (kNoCuda in a CPU-only build).
template <typename P, typename Cpu, typename Cuda>
int run_on(uintptr_t address, bool on_cuda, uintptr_t stream, Cpu cpu, Cuda cuda) {
  const P& p = params_at<P>(address);
  if (!on_cuda) return cpu(p);
#ifdef AV_WITH_CUDA
  return cuda(p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  (void)cuda;
  return kNoCuda;
#endif
}

// Registers _C.<name>(params_address, on_cuda, stream) for parameter struct P.
template <typename P, typename Cpu, typename Cuda>
void def_op(py::module_& m, const char* name, Cpu cpu, Cuda cuda) {
  m.def(name, [cpu, cuda](uintptr_t params, bool on_cuda, uintptr_t stream) {
    return run_on<P>(params, on_cuda, stream, cpu, cuda);
  });
}

// ([(name, offset, size, kind), ...], sizeof(S)): what python/adaptive_verify/_binding.py turns into a
// ctypes.Structure (and checks against these offsets, so a field missing here fails at import).
template <typename S>
py::tuple struct_layout(std::initializer_list<FieldInfo> fields) {
  py::list out;
  for (const FieldInfo& f : fields) out.append(py::make_tuple(f.name, f.offset, f.size, std::string(1, f.kind)));
  return py::make_tuple(out, sizeof(S));
}

void register_planner(py::module_& m);
void register_confidence(py::module_& m);
void register_sampling(py::module_& m);
void register_attention(py::module_& m);
void register_verifier(py::module_& m);

}  // namespace bindings
}  // namespace adaptive_verify
