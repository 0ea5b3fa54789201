"""The closing line of every run (tests/gpu_skips.py) counts the cuda-marked tests that were skipped."""
import pytest

SUITE = """
import pytest

@pytest.mark.cuda
@pytest.mark.skip(reason="no GPU")
def test_gpu_a(): pass

@pytest.mark.cuda
@pytest.mark.skip(reason="no GPU")
def test_gpu_b(): pass

@pytest.mark.cuda
def test_gpu_that_ran(): pass

@pytest.mark.skip(reason="something else")
def test_other(): pass

def test_plain(): pass
"""


def test_closing_line_counts_skipped_cuda_tests_only(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "gpu_skips", "-q", "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=2, skipped=3)
    result.stdout.fnmatch_lines(["GPU: 2 tests skipped for want of a GPU (marked cuda); 1 other skip"])


def test_closing_line_is_printed_when_nothing_was_skipped(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite="def test_plain(): pass\n")
    result = pytester.runpytest("-p", "gpu_skips", "-q")
    result.stdout.fnmatch_lines(["GPU: 0 tests skipped for want of a GPU (marked cuda); 0 other skips"])
