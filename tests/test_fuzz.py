"""The fuzzer (python -m adaptive_verify.fuzz, docs/fuzzing.md) in CI: a seeded campaign of about a minute over
every public op, each chunk of calls in its own process, that must find nothing; and the fuzzer's own checks, each
shown to catch what it is for (a write past a tensor, a crashing call, a call that never returns).

The long campaign behind docs/fuzzing.md is the same code: ``python -m adaptive_verify.fuzz --calls 100000``.
"""
import torch

from adaptive_verify.fuzz import OPS, run_campaign
from adaptive_verify.fuzz.core import Case, run_case
from adaptive_verify.fuzz.guards import Guards

SEED = 20261201


def test_a_seeded_campaign_over_every_op_finds_nothing():
    rep = run_campaign(SEED, calls=2500, chunk=250, jobs=2)  # about 35 s on the 2-core CI machine
    assert rep.calls == 2500
    failing = rep.failing()
    assert not failing, "\n".join(f"{f['outcome']}: {f['op']}:{f['index']} ({f['what']}) {f['detail'][:300]}\n"
                                  f"    {f['repro']}" for f in failing)
    for op in OPS:  # not vacuous: every op ran valid (or documented-safe) calls and had bad ones rejected
        outcomes = rep.counts[op]
        assert outcomes.get("ok", 0) + outcomes.get("safe", 0) > 0, (op, outcomes)
        assert outcomes.get("rejected", 0) > 0, (op, outcomes)


def test_the_fuzzer_reports_a_stray_write_a_crash_and_a_hang():
    rep = run_campaign(1, ops=["_selftest_guard", "_selftest_crash", "_selftest_hang"], calls=3, chunk=3,
                       case_timeout=3, startup=15)
    outcomes = {f["op"]: f["outcome"] for f in rep.failures}
    assert outcomes == {"_selftest_guard": "guard", "_selftest_crash": "crash", "_selftest_hang": "hang"}
    crash = next(f for f in rep.failures if f["op"] == "_selftest_crash")
    assert "SIGSEGV" in crash["detail"]


def test_guards_see_writes_between_rows_and_past_the_end_but_not_inside():
    g = Guards()
    t = g.tensor("t", torch.zeros(3, 4), row_gap=2)  # rows 6 elements apart, the last dim contiguous
    assert t.stride() == (6, 1) and not g.violations()
    t.fill_(1.0)  # inside the tensor: fine
    assert not g.violations()
    torch.as_strided(t, (3, 6), (6, 1))[1, 5] = 2.0  # a gap element between rows 1 and 2
    assert g.violations() and g.violations()[0].startswith("t: 1 margin element")
    g2 = Guards()
    out = g2.empty("out", (5,), torch.int64)
    torch.as_strided(out, (6,), (1,))[5] = 0
    assert g2.violations()


def test_cases_are_judged_by_their_kind():
    def raises(exc):
        def call():
            raise exc
        return call

    assert run_case(Case("invalid", raises(ValueError("drafts must be ...")), names=("drafts",)))[0] == "rejected"
    assert run_case(Case("invalid", raises(ValueError("something")), names=("drafts",)))[0] == "bad_error"
    assert run_case(Case("invalid", raises(RuntimeError("drafts")), names=("drafts",)))[0] == "bad_error"
    assert run_case(Case("invalid", lambda: 1, names=("drafts",)))[0] == "not_rejected"
    assert run_case(Case("maybe", lambda: 1, names=("drafts",)))[0] == "accepted"
    assert run_case(Case("valid", raises(ValueError("drafts"))))[0] == "unexpected_error"
