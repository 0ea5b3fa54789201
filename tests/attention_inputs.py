"""Inputs shared by the write_kv tests on CPU and CUDA."""
import torch

NAN = float("nan")


def _kv_problem(seed, dtype, T, Hkv, D, num_blocks, block_size, n_skip):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(T, Hkv, D, generator=g).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T]  # distinct: no write order to depend on
    slots[torch.randperm(T, generator=g)[:n_skip]] = -1
    k_cache = torch.full((num_blocks, block_size, Hkv, D), NAN, dtype=dtype)
    v_cache = torch.full((num_blocks, block_size, Hkv, D), NAN, dtype=dtype)
    return k, v, k_cache, v_cache, slots.to(torch.int64)
