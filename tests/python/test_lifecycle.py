"""Process life cycle: start-up errors for flags we cannot honour, `--help` grouping, the start-up log lines, 503 with
Retry-After when the waiting queue is full, and SIGTERM: running requests finish, then exit code 0."""

import signal
import subprocess
import threading
import time

import pytest
import requests

from conftest import MODEL_NAME, Server, model_path, rserve_bin


@pytest.mark.parametrize("flags,fragment", [
    (["-tp", "2"], "MPI"),
    (["--pipeline-parallel-size", "2"], "MPI"),
    (["--distributed-executor-backend", "ray"], "ray"),
    (["--kv-cache-dtype", "fp8"], "kv-cache-dtype"),
    (["--device", "cuda"], "--device"),
])
def test_unsupported_flags_fail_at_start_up(flags, fragment):
    r = subprocess.run([str(rserve_bin()), str(model_path()), *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert fragment in r.stderr, r.stderr


def test_help_groups_flags_like_vllm():
    r = subprocess.run([str(rserve_bin()), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for heading in ["ModelConfig:", "CacheConfig:", "ParallelConfig:", "SchedulerConfig:", "Frontend:"]:
        assert heading in r.stdout
    for flag in ["--max-model-len", "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--tensor-parallel-size",
                 "--served-model-name", "--api-key", "--enable-prefix-caching", "--max-num-seqs"]:
        assert flag in r.stdout


@pytest.mark.parametrize("topic, needle", [("all", "--port"), ("ModelConfig", "--max-model-len"),
                                           ("max-model-len", "--max-model-len"), ("listgroup", "SchedulerConfig")])
def test_help_topics_as_vllm_reads_them(topic, needle):
    r = subprocess.run([str(rserve_bin()), "serve", f"--help={topic}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert needle in r.stdout
    r = subprocess.run([str(rserve_bin()), "serve", "--help=no-such-topic"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "no-such-topic" in r.stderr


def test_start_up_log_lines(server):
    log = "\n".join(server.lines)
    for needle in ["Available KV cache memory:", "GPU KV cache size:", "Maximum concurrency for",
                   "Starting vLLM API server 0 on http://127.0.0.1:", "Available routes are:",
                   "Route: /v1/chat/completions, Methods: POST", "Application startup complete."]:
        assert needle in log, f"missing {needle!r} in the start-up log:\n{server.log(80)}"
    ready = [i for i, line in enumerate(server.lines) if "Application startup complete." in line]
    address = [i for i, line in enumerate(server.lines) if "Starting vLLM API server 0 on" in line]
    assert address[0] < ready[0]


def _stream_in_thread(srv, max_tokens, result, key):
    def run():
        try:
            chunks = list(srv.client().completions.create(
                model=MODEL_NAME, prompt="Count: one, two,", stream=True, max_tokens=max_tokens, temperature=0,
                extra_body={"ignore_eos": True}))
            result[key] = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        except Exception as e:  # noqa: BLE001 - the test reads it
            result[key] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_full_waiting_queue_is_503_with_retry_after():
    srv = Server("--max-num-seqs", "1", "--max-num-waiting", "1", name="overload server")
    try:
        result = {}
        a = _stream_in_thread(srv, 300, result, "a")
        deadline = time.time() + 60
        while srv.metrics()["vllm:num_requests_running"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        b = _stream_in_thread(srv, 4, result, "b")
        while srv.metrics()["vllm:num_requests_waiting"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        r = requests.post(f"{srv.url}/v1/completions", headers=srv.headers(), timeout=60,
                          json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert r.headers.get("Retry-After")
        err = r.json()["error"]
        assert err["type"] == "ServiceUnavailableError" and "waiting" in err["message"]
        a.join(timeout=300)
        b.join(timeout=300)
        assert result["a"] == ["length"] and result["b"] == ["length"], result
    finally:
        assert srv.stop() == 0, srv.log()


def test_sigterm_lets_running_requests_finish_then_exits_0():
    srv = Server(name="shutdown server")
    result = {}
    t = _stream_in_thread(srv, 40, result, "a")
    deadline = time.time() + 60
    while srv.metrics()["vllm:num_requests_running"] < 1 and time.time() < deadline:
        time.sleep(0.05)
    srv.signal(signal.SIGTERM)
    code = srv.wait_exit(timeout=120)
    t.join(timeout=60)
    assert code == 0, srv.log()
    assert result.get("a") == ["length"], f"the running request did not finish: {result}\n{srv.log()}"
    assert "Shutdown complete." in srv.log()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{srv.url}/health", timeout=5)
