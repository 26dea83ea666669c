"""`vllm serve` job-script flags on the real binary: one server started with a bundle of the flags job scripts pass
(some implemented, some accepted with a warning) plus `--config FILE.yaml`, which must serve requests and log one
warning per ignored flag; a flag file key the command line overrides; `--tokenizer` given as a Hub repo id found in
the `--download-dir` cache; refused flags, which stop start-up with a one-line reason and exit code 1 (not clap's
usage error, 2); every spelling of every flag of the fixture generated from vLLM's parser, none of which may be a usage
error; and `--enable-ssl-refresh` picking up renewed certificate files."""

import json
import os
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import openai
import pytest
import requests

from conftest import MODEL_NAME, Server, model_path, rserve_bin

TOKENIZER_REPO = "rserve-test/smollm2-tokenizer"


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    """A Hugging Face cache holding only a tokenizer repo (SmolLM2's tokenizer.json, written by `rserve convert`)."""
    d = tmp_path_factory.mktemp("cli")
    out = d / "converted"
    subprocess.run([str(rserve_bin()), "convert", str(model_path()), str(out), "--dtype", "float16"],
                   check=True, capture_output=True, timeout=300)
    cache = d / "hub"
    repo = cache / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(out / name, snapshot / name)
    return cache


@pytest.fixture(scope="module")
def job_script_server(tmp_path_factory, hf_cache):
    config = tmp_path_factory.mktemp("cfg") / "serve.yaml"
    # A file key the command line overrides (the served name), one only the file sets (max_logprobs, with an
    # underscore), and a switch vLLM ignores here.
    config.write_text("served-model-name: [from-the-file]\nmax_logprobs: 2\nenable-chunked-prefill: true\n"
                      "load_format: safetensors\n")
    s = Server("--config", str(config),
               "--enable-chunked-prefill", "--download-dir", str(hf_cache), "--swap-space", "4",
               "--disable-fastapi-docs", "--load-format", "auto", "--quantization", "gguf",
               "--data-parallel-size", "1", "--allowed-origins", '["*"]', "--root-path", "/api",
               "--tokenizer", TOKENIZER_REPO, "--max-num-partial-prefills", "2", "--ssl-ciphers", "ECDHE-RSA-AES256",
               "--enable-ssl-refresh", "--trust_remote_code", "-dp=1",
               "--default-chat-template-kwargs", '{"enable_thinking": false}',
               "--disable-access-log-for-endpoints", "/health,/v1/models", "--enable-request-id-headers",
               env={"HF_HUB_OFFLINE": "1"}, name="job-script server")
    yield s
    code = s.stop()
    assert code == 0, f"job-script server exited with {code}\n{s.log()}"


def test_job_script_flags_start_and_serve(job_script_server):
    s = job_script_server
    client = s.client()
    # The command line's --served-model-name wins over the file's.
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0)
    assert r.choices[0].message.content
    # Behind --root-path too.
    prefixed = openai.OpenAI(base_url=f"{s.url}/api/v1", api_key=s.api_key, max_retries=0)
    assert [m.id for m in prefixed.models.list().data] == [MODEL_NAME]
    # --enable-request-id-headers answers the caller's id.
    r = requests.get(f"{s.url}/health", headers={"X-Request-Id": "job-1"}, timeout=30)
    assert r.headers["x-request-id"] == "job-1"
    # --disable-access-log-for-endpoints leaves /v1/models out of the access log, not the chat request.
    deadline = time.time() + 5
    while not any('"POST /v1/chat/completions' in line for line in s.lines) and time.time() < deadline:
        time.sleep(0.1)
    assert any('"POST /v1/chat/completions' in line for line in s.lines), s.log()
    assert not any('"GET /v1/models' in line for line in s.lines), s.log()


def test_file_only_keys_apply(job_script_server):
    client = job_script_server.client()
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2, logprobs=2, temperature=0)
    assert len(r.choices[0].logprobs.top_logprobs[0]) == 2
    with pytest.raises(openai.BadRequestError, match="between 0 and 2"):
        client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2, logprobs=3)


def test_one_warning_per_ignored_flag(job_script_server):
    lines = job_script_server.lines
    for flag in ["--enable-chunked-prefill", "--swap-space", "--disable-fastapi-docs", "--ssl-ciphers",
                 "--enable-ssl-refresh"]:
        hits = [line for line in lines if f"Ignoring {flag}:" in line]
        assert len(hits) == 1, f"{flag}: {hits}\n" + "\n".join(lines[:40])
        assert "WARN" in hits[0]
    # Implemented flags are not reported as ignored.
    for flag in ["--download-dir", "--quantization", "--tokenizer", "--data-parallel-size", "--root-path",
                 "--load-format", "--trust-remote-code", "--max-num-partial-prefills"]:
        assert not any(f"Ignoring {flag}" in line for line in lines), flag


@pytest.mark.parametrize("flags, fragment", [
    (["--lora-modules", "a=b"], "--lora-modules is not supported by rserve: LoRA adapters"),
    (["--headless"], "--headless is not supported by rserve"),
    (["--reasoning-parser-plugin", "my_parser.py"],
     "--reasoning-parser-plugin is not supported by rserve: only the built-in reasoning parsers"),
    (["--quantization", "awq"], "--quantization awq does not match the checkpoint"),
])
def test_refused_flags_exit_1_with_one_line(flags, fragment):
    r = subprocess.run([str(rserve_bin()), str(model_path()), "--port", "0", *flags], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "RUST_LOG": "error"})
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], r.stderr


def test_config_file_errors_exit_1(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1\n")
    r = subprocess.run([str(rserve_bin()), str(model_path()), "--config", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "not valid YAML" in r.stderr, r.stderr


def _self_signed(key, crt, cn: str):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "2", "-subj", f"/CN={cn}",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)


def test_ssl_refresh_serves_the_new_certificate(tmp_path):
    """`--enable-ssl-refresh`: replacing the key and certificate files switches new connections to them."""
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    _self_signed(key, crt, "first")
    s = Server("--ssl-keyfile", str(key), "--ssl-certfile", str(crt), "--enable-ssl-refresh", name="ssl refresh")
    try:
        served = lambda: ssl.get_server_certificate(("127.0.0.1", s.port), timeout=10)  # noqa: E731
        first = served()
        assert first.strip() == crt.read_text().strip()
        new_key, new_crt = tmp_path / "key2.pem", tmp_path / "cert2.pem"
        _self_signed(new_key, new_crt, "second")
        # Replace both files (key first, as a renewal script would), then wait for the poll.
        os.replace(new_key, key)
        os.replace(new_crt, crt)
        deadline = time.time() + 15
        while served() == first and time.time() < deadline:
            time.sleep(0.5)
        assert served().strip() == crt.read_text().strip(), s.log()
        assert any("reloaded the TLS configuration" in line for line in s.lines), s.log()
    finally:
        assert s.stop() == 0, s.log()


def _sample(flag: dict) -> list[str]:
    """A value each flag takes: its first choice, its default, else "1" (as the Rust parser test picks them)."""
    if not flag["takes_value"]:
        return []
    # Where rserve checks more than vLLM's parser does (a registry name, a JSON object).
    overrides = {"--tool-call-parser": "hermes", "--reasoning-parser": "qwen3", "--default-chat-template-kwargs": "{}"}
    if flag["names"][0] in overrides:
        return [overrides[flag["names"][0]]]
    choices = [c for c in flag["choices"] or [] if c != "None"]
    if choices:
        return [choices[0]]
    default, many = flag["default"], flag["nargs"] in ("+", "*") or flag["action"] == "_AppendAction"
    if isinstance(default, str) and default:
        return [default]
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return [str(default)]
    if isinstance(default, list) and many and default:
        return [str(d) for d in default]
    if isinstance(default, (list, dict)) and not many:
        return [json.dumps(default)]
    return ["1"]


def test_no_vllm_flag_is_a_usage_error(tmp_path):
    """Every spelling of every `vllm serve` flag (the fixture from vLLM's parser) on the real binary: it may be
    refused (exit 1, one line) or get as far as loading the model (missing here: exit 1), never clap's exit 2."""
    fixture = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm" / "serve_flags.json").read_text())
    config = tmp_path / "c.yaml"
    config.write_text("port: 8001\n")
    missing_model = str(tmp_path / "no-such-model")
    env = {**os.environ, "RUST_LOG": "error", "HF_HUB_OFFLINE": "1"}
    usage_errors = []
    for flag in fixture["flags"]:
        for name in flag["names"]:
            value = [str(config)] if name == "--config" else _sample(flag)
            r = subprocess.run([str(rserve_bin()), missing_model, name, *value], capture_output=True, text=True,
                               timeout=60, env=env)
            if r.returncode == 2 or "Usage:" in r.stderr:
                usage_errors.append(f"{name} {' '.join(value)}: {r.stderr.strip()[:200]}")
            else:
                assert r.returncode == 1, (name, r.returncode, r.stderr)
    assert not usage_errors, "\n".join(usage_errors)
