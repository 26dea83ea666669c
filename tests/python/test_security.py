"""Security (issue #28 item 5), end to end against the real binary:

- API keys from `--api-key-file` (one per line) are accepted like `--api-key`'s, a wrong key gets 401, and no key (from
  the flag, the file or VLLM_API_KEY) appears in the server's log, even at debug level, or in `--help`;
- a request's `model` is only compared with the served names: a path (relative, absolute, even the served model's
  own file) gets 404 `model_not_found`;
- HF_TOKEN is never printed.
"""

import os
import subprocess

import openai
import pytest
import requests

from conftest import MODEL_NAME, Server, model_path, rserve_bin

# The HTTP front and the command line do not depend on the device: one run (scripts/test.sh repeats the suite).
pytestmark = pytest.mark.skipif(bool(os.environ.get("RSERVE_E2E_ARGS") or os.environ.get("RSERVE_E2E_LAUNCH")),
                                reason="the HTTP front's tests run once, in the plain run")

FLAG_KEY = "sk-flag-9d1c2f"
FILE_KEY = "sk-file-4b7e10"
ENV_KEY = "sk-env-77aa03"
HF_SECRET = "hf_secretToken0123456789"


def test_keys_from_a_file_work_and_no_secret_is_logged(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"# rserve keys\n{FILE_KEY}\n")
    env = {"RUST_LOG": "debug", "VLLM_API_KEY": ENV_KEY, "HF_TOKEN": HF_SECRET}
    s = Server("--api-key-file", str(keys), api_key=FLAG_KEY, env=env, name="keys server")
    try:
        for key in (FLAG_KEY, FILE_KEY):
            r = s.client(api_key=key).completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
            assert r.choices[0].text is not None
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key=FILE_KEY + "x").completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
        log = s.log(last=100_000)
    finally:
        s.stop()
    for secret in (FLAG_KEY, FILE_KEY, HF_SECRET):
        assert secret not in log, f"{secret} in the log"
    # --api-key given: VLLM_API_KEY is not used (clap's rule: the flag wins) and not printed either.
    assert ENV_KEY not in log


def test_help_shows_no_key():
    env = dict(os.environ, VLLM_API_KEY=ENV_KEY, HF_TOKEN=HF_SECRET)
    out = subprocess.run([str(rserve_bin()), "serve", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0
    assert "--api-key-file" in out.stdout
    assert ENV_KEY not in out.stdout + out.stderr and HF_SECRET not in out.stdout + out.stderr


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "file:///etc/passwd", "~/.cache/huggingface",
                                  "SERVED_FILE"])
def test_model_names_never_reach_the_filesystem(server, name):
    if name == "SERVED_FILE":
        name = str(model_path())  # the file the server loaded: still not a served name
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        r = requests.post(f"{server.url}{path}", json={"model": name, "max_tokens": 2, **body},
                          headers=server.headers(), timeout=60)
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == (404, "model"), err


def test_a_failed_gated_download_does_not_print_the_token(tmp_path):
    # No machine here reaches the Hub: the download fails (unreachable, or denied), and the error must name the repo
    # and the cause without the token.
    env = dict(os.environ, HF_TOKEN=HF_SECRET, HF_HOME=str(tmp_path), RUST_LOG="debug")
    env.pop("HF_HUB_OFFLINE", None)
    r = subprocess.run([str(rserve_bin()), "rserve-test/gated-model", "--port", "0"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "rserve-test/gated-model" in out, out[-2000:]
    assert HF_SECRET not in out
