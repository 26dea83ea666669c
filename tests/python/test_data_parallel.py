"""Data parallelism (`-dp 2`): two engine replicas in one server behind one endpoint. The golden prompts, sent
concurrently, get the same greedy text as from one replica and land on both replicas (per-replica `engine` labels on
/metrics); requests that share a long prefix land on the replica holding it (its prefix cache hits go up, the other's
do not); a client killed mid-stream frees its blocks on the replica that ran it; `run-batch -dp 2` answers as one
replica does. Runs on the suite's device
(`RSERVE_E2E_ARGS`, e.g. `--device opencl`). Under an MPI launcher (`-tp 3`) only the last test runs: one process
asked for -dp x -tp is told the mpiexec line it needs (test_parallel.py runs -dp x -tp over MPI)."""

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import MODEL_NAME, REFERENCE_ARGS, REPO, Server, model_path, rserve_bin

GOLDEN = json.loads((REPO / "tests/fixtures/golden/smollm2_greedy.json").read_text())["prompts"]
UNDER_MPI = bool(os.environ.get("RSERVE_E2E_LAUNCH")) or "-tp" in shlex.split(os.environ.get("RSERVE_E2E_ARGS", ""))
needs_one_process = pytest.mark.skipif(UNDER_MPI, reason="these start one process; -dp x -tp over MPI is test_parallel.py's")
SAMPLE = re.compile(r'^([^{\s]+)\{([^}]*)\} (\S+)$')


def per_engine(server: Server, name: str, **labels: str) -> dict[str, float]:
    """{engine: value} of metric `name` (summed over its other labels, filtered by `labels`)."""
    out: dict[str, float] = defaultdict(float)
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(got.get(k) == v for k, v in labels.items()):
            out[got["engine"]] += float(m.group(3))
    return dict(out)


def wait_idle(server: Server, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        busy = per_engine(server, "vllm:num_requests_running")
        waiting = per_engine(server, "vllm:num_requests_waiting")
        if not any(busy.values()) and not any(waiting.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"not idle after {timeout} s")


def completion_text(server: Server, prompt_ids: list[int]) -> str:
    r = server.client().completions.create(model=MODEL_NAME, prompt=prompt_ids, max_tokens=32, temperature=0,
                                           extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert r.usage.completion_tokens == 32
    return r.choices[0].text


@pytest.fixture(scope="module")
def dp_server():
    s = Server("-dp", "2", name="-dp 2")
    yield s
    code = s.stop()
    assert code == 0, f"-dp 2 server exited with {code}\n{s.log()}"


@needs_one_process
def test_golden_prompts_match_one_replica_and_spread_over_both(server, dp_server):
    log = dp_server.log(400)
    assert "Data-parallel replica 0" in log and "Data-parallel replica 1" in log, log
    prompts = [p["prompt_token_ids"] for p in GOLDEN[:8]]
    one_replica = [completion_text(server, p) for p in prompts]
    before = per_engine(dp_server, "vllm:request_success_total")
    with ThreadPoolExecutor(len(prompts)) as pool:
        two_replicas = list(pool.map(lambda p: completion_text(dp_server, p), prompts))
    assert two_replicas == one_replica
    after = per_engine(dp_server, "vllm:request_success_total")
    served = {e: after[e] - before.get(e, 0) for e in after}
    assert set(served) == {"0", "1"}, served
    assert served["0"] > 0 and served["1"] > 0 and sum(served.values()) == len(prompts), served
    # Every engine-level series is per replica: the KV pool of each, the running gauge of each.
    assert set(per_engine(dp_server, "rserve:kv_blocks_total")) == {"0", "1"}
    assert set(per_engine(dp_server, "vllm:num_requests_running")) == {"0", "1"}


@needs_one_process
def test_a_shared_long_prefix_lands_on_the_replica_that_holds_it(dp_server):
    wait_idle(dp_server)
    client = dp_server.client()
    prefix = " ".join(f"Item {i}: a line of the shared document that every request repeats." for i in range(20))
    requests_before = per_engine(dp_server, "vllm:request_success_total")
    hits_before = per_engine(dp_server, "vllm:prefix_cache_hits_total")
    for question in ["What is item 3?", "What is item 7?", "What is item 11?", "Summarise it."]:
        client.completions.create(model=MODEL_NAME, prompt=f"{prefix}\n{question}", max_tokens=4, temperature=0)
    requests_after = per_engine(dp_server, "vllm:request_success_total")
    hits_after = per_engine(dp_server, "vllm:prefix_cache_hits_total")
    served = {e: requests_after[e] - requests_before.get(e, 0) for e in requests_after}
    hits = {e: hits_after[e] - hits_before.get(e, 0) for e in hits_after}
    holder = max(served, key=served.get)
    other = "1" if holder == "0" else "0"
    assert served[holder] == 4 and served[other] == 0, served
    # Three requests found the prefix cached (hundreds of tokens each); the other replica computed nothing.
    assert hits[holder] >= 3 * 200 and hits[other] == 0, hits


STREAM_CLIENT = textwrap.dedent("""
    import sys
    from openai import OpenAI
    client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)
    stream = client.completions.create(model=sys.argv[3], prompt="Count: one, two, three,", stream=True,
                                       max_tokens=600, temperature=0, extra_body={"ignore_eos": True})
    for chunk in stream:
        print(repr(chunk.choices[0].text), flush=True)
""")


@needs_one_process
def test_a_killed_client_frees_its_blocks_on_the_replica_that_ran_it(dp_server):
    wait_idle(dp_server)
    aborted_before = per_engine(dp_server, "vllm:request_success_total", finished_reason="abort")
    proc = subprocess.Popen([sys.executable, "-c", STREAM_CLIENT, dp_server.url, dp_server.api_key, MODEL_NAME],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(5)]
        assert all(lines), f"the client got no stream: {lines}"
        used = per_engine(dp_server, "rserve:kv_blocks_used")
        owner = [e for e, v in used.items() if v > 0]
        assert len(owner) == 1, used
    finally:
        proc.kill()
        proc.wait(timeout=30)
    wait_idle(dp_server, timeout=60)
    assert per_engine(dp_server, "rserve:kv_blocks_used") == {"0": 0, "1": 0}
    assert per_engine(dp_server, "vllm:kv_cache_usage_perc") == {"0": 0, "1": 0}
    aborted = per_engine(dp_server, "vllm:request_success_total", finished_reason="abort")
    assert aborted[owner[0]] - aborted_before.get(owner[0], 0) == 1, aborted


@needs_one_process
def test_run_batch_takes_dp_and_answers_as_one_replica(server, tmp_path):
    prompts = [p["prompt_token_ids"] for p in GOLDEN[:6]]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"custom_id": f"g{i}", "method": "POST", "url": "/v1/completions", "body": {
        "model": MODEL_NAME, "prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True,
        "skip_special_tokens": False}}) + "\n" for i, p in enumerate(prompts)))
    r = subprocess.run([str(rserve_bin()), "run-batch", "-i", str(inp), "-o", str(out), str(model_path()),
                        "--served-model-name", MODEL_NAME, "--max-model-len", "1024", "--kv-cache-memory-bytes", "256M",
                        *REFERENCE_ARGS, *shlex.split(os.environ.get("RSERVE_E2E_ARGS", "")), "-dp", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Data-parallel replica 1" in r.stderr
    answers = {line["custom_id"]: line["response"]["body"]["choices"][0]["text"]
               for line in map(json.loads, out.read_text().splitlines())}
    assert [answers[f"g{i}"] for i in range(len(prompts))] == [completion_text(server, p) for p in prompts]


def test_data_parallel_with_tensor_parallel_in_one_process_names_both_flags_and_the_mpiexec_line():
    r = subprocess.run([str(rserve_bin()), str(model_path()), "-dp", "2", "-tp", "3"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "--data-parallel-size 2" in r.stderr and "--tensor-parallel-size 3" in r.stderr, r.stderr
    assert "mpiexec -n 6" in r.stderr, r.stderr
