"""Benchmarks shipped with the package so that `adaptive-verify bench <area>` works after pip install.

benchmarks/bench_<area>.py in the repository are thin runners of these modules.
"""
