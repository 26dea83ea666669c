"""The HTTP front as vLLM's behaves for proxies, browsers and job scripts: CORS preflights (off by default, then
`--allowed-origins`), HTTPS with a certificate made here (`--ssl-keyfile`/`--ssl-certfile`), `--root-path` behind a
path prefix, `/load` with `--enable-server-load-tracking`, `/reset_prefix_cache` (a development route, served with
`VLLM_SERVER_DEV_MODE=1`), flag errors at start-up, and a server whose engine thread died (the hidden testing flag
`--testing-fail-engine-after-requests`): `/health` 503, 5xx OpenAI-shaped errors, and still exit code 0 on SIGTERM.

Two extra servers: the "front" server (HTTPS + CORS + root path + load tracking + dev mode) and the dying one."""

import signal
import ssl
import subprocess
import time

import httpx2 as httpx  # the openai client's HTTP library (openai 3 uses httpx2)
import openai
import pytest
import requests

from conftest import MODEL_NAME, Server, model_path, rserve_bin

ORIGIN = "https://app.example"
PREFIX = "/prefix"


def _preflight(url: str, origin: str, verify: str | bool = True) -> requests.Response:
    """What a browser sends before a cross-origin POST with an API key."""
    return requests.options(url, timeout=30, verify=verify, headers={
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    })


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (the openssl command line): (key path, cert path)."""
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return key, crt


@pytest.fixture(scope="module")
def front(cert):
    key, crt = cert
    s = Server("--ssl-keyfile", str(key), "--ssl-certfile", str(crt),
               "--allowed-origins", f'["{ORIGIN}"]', "--allow-credentials",
               "--root-path", PREFIX, "--enable-server-load-tracking",
               env={"VLLM_SERVER_DEV_MODE": "1"}, name="front server")
    s.verify = str(crt)
    yield s
    code = s.stop()
    assert code == 0, f"front server exited with {code}\n{s.log()}"


def test_cors_is_off_by_default_like_vllm(server):
    r = _preflight(f"{server.url}/v1/chat/completions", "http://localhost:3000")
    assert "access-control-allow-origin" not in r.headers, r.headers


def test_cors_preflight_from_an_allowed_origin(front):
    r = _preflight(f"{front.url}/v1/chat/completions", ORIGIN, front.verify)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization,content-type"
    # Another origin gets no permission: the browser blocks the call.
    r = _preflight(f"{front.url}/v1/chat/completions", "https://evil.example", front.verify)
    assert "access-control-allow-origin" not in r.headers
    # The real request from the page carries the header too.
    r = requests.get(f"{front.url}/v1/models", headers={**front.headers(), "Origin": ORIGIN}, verify=front.verify,
                     timeout=30)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def test_https_through_the_openai_client(front, cert):
    assert front.url.startswith("https://")
    assert any(f"Starting vLLM API server 0 on https://127.0.0.1:{front.port}" in line for line in front.lines)
    ctx = ssl.create_default_context(cafile=str(cert[1]))
    with httpx.Client(verify=ctx) as http:
        client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=front.api_key, http_client=http, max_retries=0)
        r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
        assert r.choices[0].message.content
        # And behind the proxy's prefix.
        client = openai.OpenAI(base_url=f"{front.url}{PREFIX}/v1", api_key=front.api_key, http_client=http,
                               max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    # A client that does not trust the certificate is refused.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{front.url}/health", timeout=30)


def test_root_path_serves_with_and_without_the_prefix(front):
    for path in [f"{PREFIX}/health", "/health", f"{PREFIX}/version"]:
        assert requests.get(f"{front.url}{path}", verify=front.verify, timeout=30).status_code == 200, path
    r = requests.get(f"{front.url}{PREFIX}/v1/models", verify=front.verify, timeout=30)
    assert r.status_code == 401, "the API key guards /v1 behind the prefix too"
    assert requests.get(f"{front.url}/prefixed/health", verify=front.verify, timeout=30).status_code == 404


def test_load_counts_running_generation_requests(front, server):
    get_load = lambda s: requests.get(f"{s.url}/load", verify=s.verify, timeout=30).json()  # noqa: E731
    assert get_load(server) == {"server_load": 0}, "no tracking without --enable-server-load-tracking"
    assert get_load(front) == {"server_load": 0}
    r = requests.post(f"{front.url}/v1/completions", headers=front.headers(), verify=front.verify, stream=True,
                      timeout=60, json={"model": MODEL_NAME, "prompt": "Count: one, two,", "max_tokens": 16,
                                        "stream": True, "ignore_eos": True})
    assert r.status_code == 200
    assert get_load(front) == {"server_load": 1}
    for _ in r.iter_lines():
        pass
    deadline = time.time() + 10
    while get_load(front)["server_load"] != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert get_load(front) == {"server_load": 0}


def test_reset_prefix_cache(front, server):
    assert requests.post(f"{server.url}/reset_prefix_cache", timeout=30).status_code == 404, \
        "a development route: only with VLLM_SERVER_DEV_MODE=1"
    assert any("Route: /reset_prefix_cache, Methods: POST" in line for line in front.lines)
    prompt = "The quick brown fox jumps over the lazy dog. " * 12
    client = front.client(http_client=httpx.Client(verify=ssl.create_default_context(cafile=front.verify)))

    def hits_of(p: str) -> float:
        before = front.metrics()["vllm:prefix_cache_hits_total"]
        client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=1)
        return front.metrics()["vllm:prefix_cache_hits_total"] - before

    hits_of(prompt)
    assert hits_of(prompt) > 0, "the second time the prompt's blocks come from the cache"
    front.wait_idle()
    r = requests.post(f"{front.url}/reset_prefix_cache", verify=front.verify, timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    assert hits_of(prompt) == 0, "the cache was emptied"
    r = requests.post(f"{front.url}{PREFIX}/reset_prefix_cache?reset_running_requests=true", verify=front.verify,
                      timeout=30)
    assert r.json() == {"success": True}
    info = requests.get(f"{front.url}/server_info?config_format=json", verify=front.verify, timeout=30).json()
    assert info["vllm_config"]["served_model_name"] == [MODEL_NAME]
    assert info["vllm_env"] == {"VLLM_SERVER_DEV_MODE": "1"} or "VLLM_SERVER_DEV_MODE" in info["vllm_env"]


@pytest.mark.parametrize("flags,fragment", [
    (["--ssl-keyfile", "/nonexistent/key.pem", "--ssl-certfile", "/nonexistent/cert.pem"], "--ssl-certfile"),
    (["--ssl-keyfile", "/nonexistent/key.pem"], "together"),
    (["--ssl-cert-reqs", "2"], "--ssl-keyfile"),
    (["--allowed-origins", "http://a.example"], "JSON list"),
    (["--root-path", "prefix"], "--root-path"),
])
def test_front_flag_errors_at_start_up(flags, fragment):
    r = subprocess.run([str(rserve_bin()), str(model_path()), "--port", "0", *flags], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert fragment in r.stderr, r.stderr
    assert "panicked" not in r.stderr


def test_dead_engine_is_503_on_health_and_5xx_on_requests_then_exits_0():
    # Kept up after its engine died (by default the server exits with code 1 then, as vLLM's: test_faults.py).
    srv = Server("--testing-fail-engine-after-requests", "1", name="dying server",
                 env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    try:
        client = srv.client()
        assert requests.get(f"{srv.url}/health", timeout=30).status_code == 200
        client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
        # The second request finds the engine thread exiting under it.
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
        body = e.value.response.json()
        assert e.value.status_code == 500 and set(body["error"]) == {"message", "type", "param", "code"}, body
        deadline = time.time() + 10
        while requests.get(f"{srv.url}/health", timeout=30).status_code != 503 and time.time() < deadline:
            time.sleep(0.05)
        assert requests.get(f"{srv.url}/health", timeout=30).status_code == 503
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=2)
        assert e.value.status_code >= 500 and "error" in e.value.response.json()
        srv.signal(signal.SIGTERM)
        assert srv.wait_exit(60) == 0, srv.log()
    finally:
        srv.kill()
