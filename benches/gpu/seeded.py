"""Seeded sampling on a GPU server, with the Python standard library only (the GPU machine has no venv): the checks of
tests/python/test_sampling.py against a server already running on PORT. `alone-and-mixed` (the seeded request alone,
twice, and inside a batch of 32 mixed requests) or `preemption` (the seeded request last among 12 long ones on a
server whose KV cache cannot hold them all; the preemption counter must move). Prints one line per check; exit 1 on a
mismatch."""

import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 8012
BASE = f"http://127.0.0.1:{PORT}"
PROMPT = "Write a short story about a lighthouse keeper and a storm."
SEEDED = dict(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=24)
OTHERS = [
    dict(temperature=0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.9, seed=5),
    dict(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.3),
    dict(temperature=1.2, min_p=0.1, repetition_penalty=1.3),
    dict(temperature=0, logit_bias={"13": 5.0}),
    dict(temperature=0.6, logprobs=3),
    dict(temperature=0.9, top_k=5, seed=99),
]


def model() -> str:
    with urllib.request.urlopen(f"{BASE}/v1/models") as r:
        return json.load(r)["data"][0]["id"]


def complete(prompt: str, kw: dict) -> str:
    body = {"model": MODEL, "prompt": prompt, "ignore_eos": True, "max_tokens": 24, **kw}
    req = urllib.request.Request(f"{BASE}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)["choices"][0]["text"]


def preemptions() -> float:
    with urllib.request.urlopen(f"{BASE}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:num_preemptions_total"):
                return float(line.split()[-1])
    return 0.0


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        sys.exit(1)


MODEL = model()
if sys.argv[1] == "diagnose":
    # Which part moves: the logits (greedy moves too) or the draw (only sampled requests move).
    for name, kw in [("greedy", dict(temperature=0)), ("seeded", SEEDED)]:
        alone = complete(PROMPT, kw)
        jobs = [(PROMPT, kw)] + [(f"Item {i}: tell me about {w}.", OTHERS[i % len(OTHERS)])
                                 for i, w in enumerate(["rivers", "stars", "bread", "glass"] * 8)][:31]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            got = list(pool.map(lambda j: complete(*j), jobs))
        same = next((i for i, (a, b) in enumerate(zip(alone, got[0])) if a != b), min(len(alone), len(got[0])))
        print(f"{name}: alone == in batch: {got[0] == alone}; first {same} of {len(alone)} characters agree")
    sys.exit(0)
if sys.argv[1] == "alone-and-mixed":
    alone = complete(PROMPT, SEEDED)
    check("seeded request repeats alone", alone == complete(PROMPT, SEEDED), f"{len(alone)} characters")
    words = ["rivers", "stars", "bread", "glass"] * 8
    jobs = [(PROMPT, SEEDED)] + [(f"Item {i}: tell me about {w}.", OTHERS[i % len(OTHERS)])
                                 for i, w in enumerate(words)][:31]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        got = list(pool.map(lambda j: complete(*j), jobs))
    check("seeded request repeats inside 32 mixed requests", got[0] == alone and all(got))
    check("another seed draws something else", complete(PROMPT, {**SEEDED, "seed": 4321}) != alone)
else:
    alone = complete(PROMPT, SEEDED)
    before = preemptions()
    with ThreadPoolExecutor(max_workers=13) as pool:
        others = [pool.submit(complete, f"Story {i}: once upon a time", dict(temperature=0.8, max_tokens=160))
                  for i in range(12)]
        time.sleep(1.0)
        got = pool.submit(complete, PROMPT, SEEDED).result()
        assert all(f.result() for f in others)
    moved = preemptions() - before
    check("requests were preempted", moved > 0, f"{moved:.0f} preemptions")
    check("seeded request repeats after preemption", got == alone)
