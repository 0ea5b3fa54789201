// adaptive_verify._C's verifier host helpers (python/adaptive_verify/verifier.py): slot_inputs (plan_budget),
// shifted_costs (shifted cost tables), record_rows (record_confidence on CPU).
#include <pybind11/numpy.h>

#include "adaptive_verify/verifier/slots.h"
#include "bindings/common.h"

namespace adaptive_verify {
namespace bindings {

namespace {

// The engine's host array as int64 data: 1-D, C-contiguous int64 of n entries, any count for n < 0 (verifier.py
// converts anything else first; this only refuses what it was not given).
const int64_t* int64_data(const py::array& a, int64_t n, const char* op, const char* name) {
  if (a.ndim() != 1 || (n >= 0 && a.shape(0) != n) || !a.dtype().is(py::dtype::of<int64_t>()) ||
      !(a.flags() & py::array::c_style))
    throw py::value_error(std::string("adaptive_verify._C.") + op + ": " + name +
                          " must be a contiguous 1-D int64 array" + (n >= 0 ? " of num_reqs entries" : ""));
  return static_cast<const int64_t*>(a.data());
}

}  // namespace

void register_verifier(py::module_& m) {
  using S = verifier::SlotParams;
  // slot_inputs(params_address, drafts, req_indices or None): the struct's other fields are the caller's; these two
  // arrays change object every step, so their pointers are read here (cheaper than from Python).
  m.def("slot_inputs", [](uintptr_t address, const py::array& drafts, const py::object& req_indices) {
    S p = params_at<S>(address);
    p.drafts = int64_data(drafts, p.num_reqs, "slot_inputs", "drafts");
    p.req_indices = req_indices.is_none()
                        ? nullptr
                        : int64_data(req_indices.cast<py::array>(), p.num_reqs, "slot_inputs", "req_indices");
    return verifier::slot_inputs_cpu(p);
  });
  // shifted_costs(base, shift, at_shift, at_zero, out): out[n] = float32(base[shift + n] - at_shift + at_zero) for
  // every n of out (float64 base, float32 out, both 1-D contiguous, base holding shift + len(out) values).
  m.def("shifted_costs", [](const py::array& base, int64_t shift, double at_shift, double at_zero, py::array& out) {
    if (base.ndim() != 1 || !base.dtype().is(py::dtype::of<double>()) || !(base.flags() & py::array::c_style) ||
        out.ndim() != 1 || !out.dtype().is(py::dtype::of<float>()) || !(out.flags() & py::array::c_style) ||
        !out.writeable() || shift < 0 || base.shape(0) - shift < out.shape(0))
      throw py::value_error(
          "adaptive_verify._C.shifted_costs: base must be contiguous float64 holding shift + len(out) values and out "
          "a writable contiguous float32 array");
    verifier::shifted_costs_cpu(static_cast<const double*>(base.data()), shift, at_shift, at_zero, out.shape(0),
                                static_cast<float*>(out.mutable_data()));
  });
  // record_rows(table, snapshot or 0, max_reqs, K, req_indices, conf, conf_stride0, conf_stride1, Kc): record_confidence
  // on CPU tables (addresses of float32 host memory the caller owns; req_indices a contiguous int64 array of R rows).
  m.def("record_rows", [](uintptr_t table, uintptr_t snapshot, int64_t max_reqs, int32_t K, const py::array& idx,
                          uintptr_t conf, int64_t stride0, int64_t stride1, int32_t Kc) {
    const int64_t* rows = int64_data(idx, -1, "record_rows", "req_indices");
    return verifier::record_rows_cpu(reinterpret_cast<float*>(table), reinterpret_cast<float*>(snapshot), max_reqs, K,
                                     rows, idx.shape(0),
                                     reinterpret_cast<const float*>(conf), stride0, stride1, Kc);
  });
  m.attr("SLOT_PARAMS") = struct_layout<S>({
      AV_FIELD(S, drafts), AV_FIELD(S, req_indices), AV_FIELD(S, num_reqs), AV_FIELD(S, max_reqs),
      AV_FIELD(S, max_drafts), AV_FIELD(S, draft_limit), AV_FIELD(S, min_verify), AV_FIELD(S, snapshot),
      AV_FIELD(S, snapshot_gen), AV_FIELD(S, gen), AV_FIELD(S, prior), AV_FIELD(S, marks), AV_FIELD(S, stamp),
      AV_FIELD(S, conf_out), AV_FIELD(S, drafts_out), AV_FIELD(S, sums)});
  m.attr("SLOT_STATUS") = py::make_tuple(int(verifier::kSlotDraftsOutOfRange), int(verifier::kSlotIndexOutOfRange),
                                         int(verifier::kSlotIndexRepeated));
}

}  // namespace bindings
}  // namespace adaptive_verify
