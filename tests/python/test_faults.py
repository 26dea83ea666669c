"""Faults, overload and limits (issue #28 items 1 and 2), end to end against the real binary:

- a panic inside an engine step (the hidden `--testing-panic-in-step-after N`): the streams in flight get an SSE
  error event and close, a non-streaming request in flight gets a 500 OpenAI error; then `/health` and new requests
  answer 503 with Retry-After (with `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`), or the server exits with code 1 (vLLM's
  default, so that a supervisor restarts it);
- a backend error in a step (`--testing-error-in-step-after N`, as when the device runs out of memory): the requests
  of that step fail with 500 and the engine keeps serving, with no KV block held;
- slowloris: 200 connections sending their headers a byte a second do not stop a normal client, and are closed at
  `--http-header-timeout`;
- `--max-connections`, `--http-body-timeout`, `--h11-max-header-count`, `--max-request-time`, and the default / cap
  of `max_tokens` from `--override-generation-config`'s `max_new_tokens` (vLLM's rule).
"""

import json
import os
import socket
import threading
import time

import openai
import pytest
import requests

from conftest import MODEL_NAME, Server

# The HTTP front's own tests (slow clients, connection limit) do not depend on the device or the launch: like
# test_http.py, they run once, in the plain run (scripts/test.sh repeats the suite with RSERVE_E2E_ARGS / _LAUNCH). The
# step hooks work under an MPI launch too (they act in rank 0's loop, before the step's broadcast; the workers are
# stopped when the dead loop's runner is dropped, or by MPI_Abort when the server exits 1).
FRONT_RUN = not (os.environ.get("RSERVE_E2E_ARGS") or os.environ.get("RSERVE_E2E_LAUNCH"))
front_only = pytest.mark.skipif(not FRONT_RUN, reason="the HTTP front's tests run once, in the plain run")
KEEP_ALIVE = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}


def _wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _sse_stream(srv: Server, result: dict, started: threading.Event):
    """A long streaming completion; `result["events"]` holds its `data:` payloads, in order."""
    events = []
    result["events"] = events
    try:
        with requests.post(f"{srv.url}/v1/completions", headers=srv.headers(), stream=True, timeout=120,
                           json={"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 900,
                                 "ignore_eos": True, "stream": True, "temperature": 0}) as r:
            result["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    events.append(line[6:].decode())
                    started.set()
        result["closed"] = True
    except Exception as e:  # noqa: BLE001 - the test reads it
        result["exception"] = e
    finally:
        started.set()


def _plain(srv: Server, result: dict):
    try:
        r = requests.post(f"{srv.url}/v1/completions", headers=srv.headers(), timeout=120,
                          json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 900, "ignore_eos": True})
        result["status"], result["body"] = r.status_code, r.json()
    except Exception as e:  # noqa: BLE001
        result["exception"] = e


def test_panic_in_a_step_fails_the_requests_in_flight_then_503_with_retry_after():
    srv = Server("--testing-panic-in-step-after", "40", env=KEEP_ALIVE, name="panicking server")
    try:
        assert requests.get(f"{srv.url}/health", timeout=30).status_code == 200
        stream, plain, started = {}, {}, threading.Event()
        t1 = threading.Thread(target=_sse_stream, args=(srv, stream, started), daemon=True)
        t1.start()
        assert started.wait(60), "the stream never started"
        t2 = threading.Thread(target=_plain, args=(srv, plain), daemon=True)
        t2.start()
        t1.join(60)
        t2.join(60)
        # The stream: 200, some chunks, then one error event and [DONE], and the connection closes.
        assert stream.get("closed") and stream["status"] == 200, stream
        events = stream["events"]
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert "panics on purpose" in error["message"] and set(error) >= {"message", "type", "code"}, error
        assert any("choices" in json.loads(e) for e in events[:-2]), "the stream had chunks before the panic"
        # The request that waited for its whole answer: a 500 OpenAI error.
        assert plain.get("status") == 500, plain
        assert plain["body"]["error"]["type"] == "InternalServerError", plain
        # From now on: unhealthy, and new requests are refused with Retry-After.
        health = requests.get(f"{srv.url}/health", timeout=30)
        assert health.status_code == 503
        r = requests.post(f"{srv.url}/v1/completions", headers=srv.headers(), timeout=30,
                          json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", (r.status_code, r.headers)
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
        with pytest.raises(openai.APIStatusError) as e:
            srv.client().chat.completions.create(model=MODEL_NAME, max_tokens=2,
                                                 messages=[{"role": "user", "content": "Hi"}])
        assert e.value.status_code == 503
        assert "a step panicked" in srv.log(200)
        # Kept alive, it still shuts down cleanly.
        assert srv.stop() == 0, srv.log()
    finally:
        srv.kill()


def test_a_dead_engine_exits_the_server_with_code_1_by_default():
    srv = Server("--testing-panic-in-step-after", "2", name="dying server")
    try:
        started = time.time()
        with pytest.raises(openai.InternalServerError):
            srv.client().completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=8, extra_body={"ignore_eos": True})
        code = srv.wait_exit(30)
        assert code == 1, srv.log()
        assert time.time() - started < 10
        assert "The engine died: shutting down the API server" in srv.log(200)
    finally:
        srv.kill()


def test_a_failed_step_fails_its_requests_and_the_engine_keeps_serving():
    srv = Server("--testing-error-in-step-after", "3", name="failing-step server")
    try:
        client = srv.client()
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=8, extra_body={"ignore_eos": True})
        assert "out of device memory" in e.value.response.json()["error"]["message"]
        assert requests.get(f"{srv.url}/health", timeout=30).status_code == 200
        r = client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=8, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
        m = srv.wait_idle(30)
        assert m["vllm:kv_cache_usage_perc"] == 0.0, m
        assert srv.stop() == 0, srv.log()
    finally:
        srv.kill()


def _connect(srv: Server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.setblocking(False)
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@front_only
def test_slowloris_connections_do_not_stop_a_client_and_close_at_the_header_timeout():
    timeout = 2.0
    srv = Server("--http-header-timeout", str(timeout), name="slowloris server")
    socks = []
    try:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {srv.api_key}\r\n".encode()
        opened = time.time()
        socks = [_connect(srv) for _ in range(200)]
        closed_at: dict[int, float] = {}
        sent = 0

        def drip():
            # One more header byte on every open connection.
            nonlocal sent
            for i, s in enumerate(socks):
                if i in closed_at:
                    continue
                try:
                    s.send(head[sent % len(head):sent % len(head) + 1])
                except OSError:
                    closed_at[i] = time.time() - opened
            sent += 1

        drip()
        # A normal client is served at once, while the 200 hold their connections.
        t0 = time.time()
        r = srv.client(timeout=10).completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=4)
        assert r.choices[0].text is not None and time.time() - t0 < 5
        deadline = opened + timeout + 3
        next_drip = time.time() + 1
        while len(closed_at) < len(socks) and time.time() < deadline:
            for i, s in enumerate(socks):
                if i not in closed_at and _closed_by_peer(s):
                    closed_at[i] = time.time() - opened
            if time.time() >= next_drip:
                drip()
                next_drip += 1
            time.sleep(0.05)
        assert len(closed_at) == len(socks), f"{len(socks) - len(closed_at)} slow connections still open"
        first, last = min(closed_at.values()), max(closed_at.values())
        assert first >= timeout - 0.5 and last <= timeout + 2.5, (first, last)
        # And the server still serves.
        assert requests.get(f"{srv.url}/health", timeout=10).status_code == 200
    finally:
        for s in socks:
            s.close()
        assert srv.stop() == 0, srv.log()


@front_only
def test_a_body_slower_than_the_body_timeout_is_408_and_too_many_headers_431():
    srv = Server("--http-body-timeout", "1", "--h11-max-header-count", "40", name="body-timeout server")
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + srv.api_key.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
        t0 = time.time()
        answer = s.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 408"), answer
        assert 0.8 < time.time() - t0 < 5
        assert '"code":408' in answer
        s.close()
        # vLLM's --h11-max-header-count (and --h11-max-incomplete-event-size, the head's bytes): 431 beyond it.
        many = {f"x-h{i}": "v" for i in range(60)}
        assert requests.get(f"{srv.url}/health", headers=many, timeout=10).status_code == 431
        assert requests.get(f"{srv.url}/health", headers=dict(list(many.items())[:20]), timeout=10).status_code == 200
    finally:
        assert srv.stop() == 0, srv.log()


@front_only
def test_one_connection_over_the_limit_is_503_with_retry_after():
    srv = Server("--max-connections", "4", "--http-header-timeout", "20", name="connection-limit server")
    socks = []
    try:
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(4)]
        time.sleep(0.2)
        r = requests.get(f"{srv.url}/health", timeout=10)
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", r.status_code
        assert r.json()["error"]["code"] == 503
        for s in socks:
            s.close()
        socks = []
        _wait(lambda: requests.get(f"{srv.url}/health", timeout=10).status_code == 200, 10, "a free connection slot")
    finally:
        for s in socks:
            s.close()
        assert srv.stop() == 0, srv.log()


def test_max_request_time_ends_a_request_and_frees_its_blocks():
    srv = Server("--max-request-time", "1", name="deadline server")
    try:
        t0 = time.time()
        r = srv.client().completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=900,
                                            temperature=0, extra_body={"ignore_eos": True})
        elapsed = time.time() - t0
        assert r.choices[0].finish_reason == "abort", r
        assert 0 < r.usage.completion_tokens < 900 and 0.9 < elapsed < 5, (r.usage, elapsed)
        m = srv.wait_idle(30)
        assert m["vllm:kv_cache_usage_perc"] == 0.0, m
        # A short request is untouched.
        r = srv.client().completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
    finally:
        assert srv.stop() == 0, srv.log()


def test_max_new_tokens_of_the_generation_config_is_the_default_and_the_cap_of_max_tokens():
    srv = Server("--override-generation-config", '{"max_new_tokens": 7}', name="max-tokens server")
    try:
        client = srv.client()
        r = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", extra_body={"ignore_eos": True})
        assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (7, "length"), r
        # vLLM caps a client's own max_tokens at an override's max_new_tokens too.
        r = client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=50, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 7, r
        r = client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3, r
    finally:
        assert srv.stop() == 0, srv.log()
