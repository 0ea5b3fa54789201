"""How the planner should hear about chunked-prefill tokens: greedy adaptive vs no speculation for each
PREFILL_PLANNING way in adaptive_verify/sim/engine.py (mean of seeds 0 and 1, 400 measured steps).

    python benchmarks/sim_prefill_planning.py   # a markdown table, about a minute on 2 cores
"""
import numpy as np
import adaptive_verify.sim.engine as e
import adaptive_verify.sim as s
def steep():
    d = s.profile_dict("dsv4-pro-8xb300")
    d["cost"] = {"table": {"format_version": 1, "verify_ms": [[1, 1.0], [4096, 4096.0]], "draft_ms": 0.0, "graph_sizes": [], "max_tokens": 4096, "metadata": {}}}
    d["acceptance"]["head_noise"] = 0.5; d["acceptance"]["conditional"] = d["acceptance"]["conditional"][:4]
    d["drafter"] = {"num_drafts": 4, "kind": "block"}
    d["workload"] = {"prompt_len": [768, 1280], "output_len": [384, 640], "prefill_chunk": 2048}
    return s.Profile.from_dict(d)
cases = [("default profile, c=256", s.get_profile("dsv4-pro-8xb300"), 256, 7),
         ("default profile, c=64", s.get_profile("dsv4-pro-8xb300"), 64, 7),
         ("linear cost 1 ms/token, ~1k prompts, c=128", steep(), 128, 4)]
print("| case | none | " + " | ".join(f"greedy ({m})" for m in ("shifted", "extra", "capacity")) + " |")
print("|---|---:|---:|---:|---:|")
for name, p, c, K in cases:
    none = np.mean([s.simulate(p, s.parse_policy("none", K), c, steps=400, seed=sd)["tokens_per_s"] for sd in (0, 1)])
    cells = []
    for m in ("shifted", "extra", "capacity"):
        e.PREFILL_PLANNING = m
        g = np.mean([s.simulate(p, s.parse_policy("greedy", K), c, steps=400, seed=sd)["tokens_per_s"] for sd in (0, 1)])
        cells.append(f"{g:.0f} ({100*(g/none-1):+.1f}%)")
    e.PREFILL_PLANNING = "shifted"
    print(f"| {name} | {none:.0f} | " + " | ".join(cells) + " |")
