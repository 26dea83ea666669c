"""Produces benches/tests/fixtures/serve_metrics_numpy.json: reference values for `rserve bench serve`'s statistics
and metric aggregation, computed with numpy the way `vllm bench serve` computes them (np.mean, np.std, np.median,
np.percentile; TPOT = (latency - ttft) / (output_len - 1); goodput over ttft/tpot/e2el SLOs in milliseconds).

Run: /work/venv-ref/bin/python benches/reference/serve_metrics_numpy.py
"""

import json
import os

import numpy as np

rng = np.random.default_rng(1234)
PCTS = [50.0, 90.0, 99.0, 99.9]

samples = []
for n in [1, 2, 3, 10, 101, 1000]:
    xs = rng.lognormal(mean=0.0, sigma=1.0, size=n).tolist()
    samples.append(
        {
            "values": xs,
            "mean": float(np.mean(xs)),
            "std": float(np.std(xs)),
            "median": float(np.median(xs)),
            "percentiles": [[p, float(np.percentile(xs, p))] for p in PCTS],
        }
    )

# A synthetic run: per-request ttft, latency, output length, ITLs, success flag.
requests = []
for i in range(40):
    success = i % 13 != 5
    out_len = int(rng.integers(1, 40))
    ttft = float(rng.uniform(0.01, 0.5))
    itl = rng.uniform(0.005, 0.08, size=max(out_len - 1, 0)).tolist()
    latency = ttft + float(np.sum(itl)) + float(rng.uniform(0.0, 0.01))
    requests.append(
        {
            "success": success,
            "prompt_len": int(rng.integers(4, 300)),
            "output_len": out_len,
            "ttft": ttft,
            "latency": latency,
            "itl": itl,
        }
    )
duration = 7.25
slo = {"ttft": 300.0, "tpot": 45.0}

ttfts, tpots, all_tpots, itls, e2els, out_lens = [], [], [], [], [], []
completed = good = total_input = 0
for r in requests:
    if not r["success"]:
        out_lens.append(0)
        continue
    n = r["output_len"]
    out_lens.append(n)
    total_input += r["prompt_len"]
    tpot = 0.0
    if n > 1:
        tpot = (r["latency"] - r["ttft"]) / (n - 1)
        tpots.append(tpot)
    all_tpots.append(tpot)
    itls += r["itl"]
    ttfts.append(r["ttft"])
    e2els.append(r["latency"])
    completed += 1
for t, p in zip(ttfts, all_tpots):
    if slo["ttft"] / 1000 >= t and slo["tpot"] / 1000 >= p:
        good += 1


def summ(xs):
    ms = [x * 1000 for x in xs]
    return {
        "mean": float(np.mean(ms or 0)),
        "std": float(np.std(ms or 0)),
        "median": float(np.median(ms or 0)),
        "p99": float(np.percentile(ms or 0, 99)),
    }


expected = {
    "completed": completed,
    "total_input": total_input,
    "total_output": int(sum(out_lens)),
    "request_throughput": completed / duration,
    "request_goodput": good / duration,
    "output_throughput": sum(out_lens) / duration,
    "total_token_throughput": (total_input + sum(out_lens)) / duration,
    "ttft_ms": summ(ttfts),
    "tpot_ms": summ(tpots),
    "itl_ms": summ(itls),
    "e2el_ms": summ(e2els),
}

out = {
    "generated_by": "benches/reference/serve_metrics_numpy.py (numpy %s)" % np.__version__,
    "samples": samples,
    "run": {"duration_s": duration, "slo_ms": slo, "requests": requests, "expected": expected},
}
path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "serve_metrics_numpy.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", os.path.normpath(path))
