"""The pooling goldens (tests/fixtures/golden/pooling.json) against a device the end-to-end suite does not run on
(the GPU machine: no pytest or openai client there): for each tiny pooling model, starts rserve with the given
arguments, sends the golden inputs as token ids over HTTP (urllib) and checks every embedding's cosine (>= 0.9999),
the classifier's probabilities and the cross-encoder's rerank scores (within 1e-4, the same order). Prints one line
per model and exits non-zero on a miss.

    python3 benches/pooling/golden_check.py --rserve-bin target/release/rserve --models models/x \\
        --rserve-args "--device cuda --dtype float32"
"""

import argparse
import json
import math
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary, folder, extra):
    port = free_port()
    cmd = [binary, str(folder), "--port", str(port), "--served-model-name", "m", "--runner", "pooling"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"rserve exited: {proc.stderr.read()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc, port
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("rserve did not start")


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def check(name, model, port):
    if "dimension" in model:
        texts = model["texts"]
        r = post(port, "/v1/embeddings", {"model": "m", "input": [t["ids"] for t in texts]})
        worst = min(cosine(d["embedding"], t["embedding"]) for d, t in zip(r["data"], texts))
        return worst >= 0.9999, f"lowest cosine {worst:.7f} over {len(texts)} inputs"
    if "id2label" in model:
        texts = model["texts"]
        r = post(port, "/classify", {"model": "m", "input": [t["ids"] for t in texts]})
        err = max(abs(p - q) for d, t in zip(r["data"], texts) for p, q in zip(d["probs"], t["probs"]))
        labels = all(d["label"] == t["label"] for d, t in zip(r["data"], texts))
        return err <= 1e-4 and labels, f"largest probability error {err:.2e}, labels {'equal' if labels else 'DIFFER'}"
    r = post(port, "/rerank", {"model": "m", "query": model["query"], "documents": model["documents"]})
    got = {x["index"]: x["relevance_score"] for x in r["results"]}
    want = model["rerank"]
    err = max(abs(got[i] - w["score"]) for i, w in enumerate(want))
    order = [x["index"] for x in r["results"]] == model["rerank_order"]
    return err <= 1e-4 and order, f"largest score error {err:.2e}, order {'equal' if order else 'DIFFERS'}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rserve-bin", required=True)
    ap.add_argument("--models", default=str(ROOT / "models/x"))
    ap.add_argument("--rserve-args", default="")
    args = ap.parse_args()
    golden = json.loads((ROOT / "tests/fixtures/golden/pooling.json").read_text())
    failed = 0
    for name, model in golden["models"].items():
        proc, port = serve(args.rserve_bin, Path(args.models) / model["folder"], shlex.split(args.rserve_args))
        try:
            ok, line = check(name, model, port)
        finally:
            proc.terminate()
            proc.wait()
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {line}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
