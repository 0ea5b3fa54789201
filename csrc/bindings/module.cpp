// The module adaptive_verify._C: build information, status codes and error counters here; each area's ops
// in csrc/bindings/<area>.cpp (register_<area>). csrc/bindings/ is the only place that knows Python; it never
// links libtorch (kernels take raw pointers inside named parameter structs).
#include <pybind11/pybind11.h>

#include <string>

#include "adaptive_verify/cuda_api.h"
#include "bindings/common.h"

namespace py = pybind11;
using namespace adaptive_verify;
using bindings::kNoCuda;

#ifndef AV_CUDA_ARCHS
#define AV_CUDA_ARCHS ""
#endif
#ifndef AV_CUDA_COMPILER_VERSION
#define AV_CUDA_COMPILER_VERSION ""
#endif
#ifndef AV_CPU_ONLY_REASON
#define AV_CPU_ONLY_REASON ""
#endif

namespace {

py::dict build_info() {
  py::dict d;
#ifdef AV_WITH_CUDA
  d["with_cuda"] = true;
  d["cuda_archs"] = std::string(AV_CUDA_ARCHS);
  d["cuda_compiler_version"] = std::string(AV_CUDA_COMPILER_VERSION);
  d["cuda_runtime_version"] = cuda_runtime_version();
#else
  d["with_cuda"] = false;
  d["cuda_archs"] = std::string();
  d["cuda_compiler_version"] = std::string();
  d["cuda_runtime_version"] = 0;
#endif
  d["cpu_only_reason"] = std::string(AV_CPU_ONLY_REASON);
  d["compiler"] = std::string(__VERSION__);
  d["sanitizers"] = std::string(AV_SANITIZED);  // "" or "address,undefined" (AV_SANITIZE=1 builds)
  return d;
}

py::tuple device_count() {
#ifdef AV_WITH_CUDA
  int err = 0;
  const int n = cuda_device_count(&err);
  return py::make_tuple(n, err == 0 ? std::string() : std::string(cuda_error_string(err)));
#else
  return py::make_tuple(0, std::string("built without CUDA"));
#endif
}

std::string error_string(int status) {
#ifdef AV_WITH_CUDA
  return cuda_error_string(status);
#else
  return status == kNoCuda ? "adaptive_verify was built without CUDA" : "unknown error";
#endif
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "adaptive_verify kernels (torch-free; a named parameter struct in, a status code out)";
  m.def("build_info", &build_info);
  m.def("device_count", &device_count);
  m.def("error_string", &error_string);
  m.attr("STATUS_OK") = int(kOk);
  m.attr("STATUS_DRAFTS_OUT_OF_RANGE") = int(kErrDraftsOutOfRange);
  m.attr("STATUS_BLOCK_TABLE_TOO_SHORT") = int(kErrBlockTableTooShort);
  m.attr("STATUS_BAD_ARGUMENT") = int(kErrBadArgument);
  m.attr("STATUS_QUERY_LEN") = int(kErrQueryLen);
  m.attr("STATUS_SEQ_LENS") = int(kErrSeqLens);
  m.attr("STATUS_BLOCK_ID_OUT_OF_RANGE") = int(kErrBlockIdOutOfRange);
  m.attr("STATUS_SLOT_OUT_OF_RANGE") = int(kErrSlotOutOfRange);
  m.attr("STATUS_TEMPERATURE") = int(kErrTemperature);
  m.attr("STATUS_TOP_K") = int(kErrTopK);
  m.attr("STATUS_TOP_P") = int(kErrTopP);
  m.attr("STATUS_MIN_P") = int(kErrMinP);
  m.attr("STATUS_WEIGHTS") = int(kErrWeights);
  m.attr("STATUS_BAD_PARENT") = int(kErrBadParent);
  m.attr("STATUS_DUPLICATE_SIBLING") = int(kErrDuplicateSibling);
  m.attr("STATUS_ACCEPTED_PATH") = int(kErrAcceptedPath);
  m.attr("STATUS_CONTEXT_LEN") = int(kErrContextLen);
  m.attr("STATUS_TOKEN_PARENT") = int(kErrTokenParent);
  m.attr("STATUS_STATS_POSITION") = int(kErrStatsPosition);
  m.attr("STATUS_KV_SCALE") = int(kErrKvScale);
  m.attr("STATUS_SINKS") = int(kErrSinks);
  m.attr("NUM_ERROR_COUNTERS") = int(kNumErrorCounters);
  bindings::register_planner(m);
  bindings::register_confidence(m);
  bindings::register_sampling(m);
  bindings::register_attention(m);
  bindings::register_verifier(m);
}
