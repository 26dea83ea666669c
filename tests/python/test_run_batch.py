"""`rserve run-batch` (vLLM's `vllm run-batch`) on SmolLM2: 1,000 mixed chat / completion lines with invalid ones
among them, run as a job killed with SIGKILL and rerun: each line answered exactly once (the invalid ones as error
lines, each custom_id once); greedy answers equal the server's; stdin input; refused flags."""

import functools
import http.server
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from conftest import MAX_MODEL_LEN, MODEL_NAME, REFERENCE_ARGS, model_path, rserve_bin

# Another device or a launcher (scripts/test.sh's OpenCL and -tp 3 passes) runs the batch again on fewer lines, and
# leaves out the tests that do not depend on the device.
OTHER_DEVICE = bool(os.environ.get("RSERVE_E2E_ARGS", "").strip() or os.environ.get("RSERVE_E2E_LAUNCH", "").strip())
LINES = 200 if OTHER_DEVICE else 1000
device_independent = pytest.mark.skipif(OTHER_DEVICE, reason="does not depend on the device; run once, by the default pass")
# Every INVALID_EVERY-th line is broken, in turn in each of these ways.
INVALID_EVERY = 25
INVALID_KINDS = ["not json", "unknown url", "no custom_id", "bad temperature", "stream"]
CHAT_EVERY = 20
TOPICS = ["Sea", "Cat", "Paris", "Rain", "Music", "Moon", "Bread", "Trees", "Chess"]


def launch() -> list[str]:
    return shlex.split(os.environ.get("RSERVE_E2E_LAUNCH", ""))


def batch_command(inp: Path | str, out: Path | str, *extra: str) -> list[str]:
    return [
        *launch(), str(rserve_bin()), "run-batch", "-i", str(inp), "-o", str(out), str(model_path()),
        "--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", "256M",
        *REFERENCE_ARGS, *shlex.split(os.environ.get("RSERVE_E2E_ARGS", "")), *extra,
    ]


def body(i: int) -> tuple[str, dict]:
    """Line i's url and body: mostly completions of a one-word prompt, every CHAT_EVERY-th line a chat (its template
    makes the prompt ~30 tokens; 2 shared CPU cores compute ~200 tokens/s of this model, prompt or output); greedy
    on most lines, seeded sampling on some; 1-3 output tokens, so that 1,000 lines take about half a minute."""
    topic = TOPICS[i % len(TOPICS)]
    sampling = {"temperature": 0} if i % 3 else {"temperature": 0.8, "seed": i}
    if i % CHAT_EVERY == 1:
        return "/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 1 + i % 3, **sampling,
                                        "messages": [{"role": "user", "content": topic}]}
    return "/v1/completions", {"model": MODEL_NAME, "max_tokens": 1 + i % 3, **sampling, "prompt": topic}


def input_line(i: int) -> tuple[str, str | None]:
    """The text of input line i and its custom_id (None when the line has none); invalid lines marked by id."""
    url, b = body(i)
    cid = f"req-{i}"
    if i % INVALID_EVERY == INVALID_EVERY - 1:
        kind = INVALID_KINDS[(i // INVALID_EVERY) % len(INVALID_KINDS)]
        cid = f"bad-{i}"
        if kind == "not json":
            return '{"custom_id": "' + cid + '", "body": {', None
        if kind == "unknown url":
            url = "/v1/embeddings"
        if kind == "no custom_id":
            return json.dumps({"method": "POST", "url": url, "body": b}), None
        if kind == "bad temperature":
            b["temperature"] = 9
        if kind == "stream":
            b["stream"] = True
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": b}), cid


def write_input(path: Path, n: int) -> tuple[list[str], int]:
    """Writes n lines (and a blank line, which is no request); returns the custom_ids and the count without one."""
    ids, idless = [], 0
    with path.open("w") as f:
        for i in range(n):
            text, cid = input_line(i)
            f.write(text + "\n")
            if i == 10:
                f.write("\n")
            if cid is None:
                idless += 1
            else:
                ids.append(cid)
    return ids, idless


def read_output(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n"), "the output ends with a complete line"
    return [json.loads(line) for line in text.splitlines()]


def check_complete(out: list[dict], ids: list[str], idless: int):
    """Every input line answered exactly once: valid ones with a body, invalid ones with an OpenAI error."""
    got = [o["custom_id"] for o in out if o["custom_id"] is not None]
    assert sorted(got) == sorted(ids), "each custom_id exactly once"
    assert sum(o["custom_id"] is None for o in out) == idless
    for o in out:
        assert o["id"].startswith("vllm-") and o["response"]["request_id"].startswith("vllm-batch-")
        cid = o["custom_id"]
        if cid is not None and cid.startswith("req-"):
            assert o["response"]["status_code"] == 200, o
            assert o["error"] is None
            b = o["response"]["body"]
            assert b["model"] == MODEL_NAME and b["usage"]["completion_tokens"] >= 1, o
        else:
            assert o["response"]["status_code"] == 400, o
            assert o["response"]["body"] is None
            assert o["error"]["error"]["type"] == "BadRequestError" and o["error"]["error"]["message"], o


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """One batch of LINES lines, run as a killed job is: SIGKILL once a third of the lines are written (plus a torn
    line), then the same command again, which resumes (under an MPI launcher, which a SIGKILL does not stop at once,
    one plain run).
    Returns (command, output path, custom_ids, id-less count, the rerun's log)."""
    d = tmp_path_factory.mktemp("batch")
    inp, out = d / "in.jsonl", d / "out.jsonl"
    ids, idless = write_input(inp, LINES)
    cmd = batch_command(inp, out)
    if not launch():
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 300
            while time.time() < deadline and proc.poll() is None:
                if out.exists() and out.read_bytes().count(b"\n") >= LINES // 3:
                    break
                time.sleep(0.02)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        written = [line for line in out.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]
        if len(written) == LINES:
            # A fast device finished before the kill: keep the first third, as if it had been killed there.
            written = written[: LINES // 3]
        assert LINES // 3 <= len(written) < LINES
        # And a torn last line, as a kill in the middle of a write leaves it.
        out.write_bytes(b"".join(written) + b'{"id":"vllm-torn","custom_id":"req-')
    start = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Batch complete" in r.stderr, r.stderr[-2000:]
    print(f"run-batch: the rest of {LINES} lines in {time.time() - start:.1f} s")
    return cmd, out, ids, idless, r.stderr


def test_every_line_is_answered_once_across_a_kill(batch):
    _, out_path, ids, idless, log = batch
    if not launch():
        assert "Resuming" in log, log[-2000:]
    out = read_output(out_path)
    assert len(out) == LINES
    check_complete(out, ids, idless)
    by_id = {o["custom_id"]: o for o in out}
    chat, cmpl = by_id["req-1"]["response"]["body"], by_id["req-2"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    assert cmpl["object"] == "text_completion" and cmpl["choices"][0]["text"]
    messages = {o["custom_id"]: o["error"]["error"]["message"] for o in out if o["error"] and o["custom_id"]}
    assert messages["bad-49"].startswith("URL /v1/embeddings was used."), messages["bad-49"]
    assert "temperature" in messages["bad-99"]
    assert messages["bad-124"] == "Request must not be sent in stream mode"


@device_independent
def test_a_finished_batch_is_not_run_again(batch):
    cmd, out_path, _, _, _ = batch
    before = out_path.read_bytes()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and f"{LINES} skipped" in r.stderr, r.stderr[-2000:]
    assert out_path.read_bytes() == before


def test_greedy_answers_equal_the_servers(batch, server):
    """The same bodies through the HTTP server: identical answers apart from the id, the timestamp and the prefix
    cache's hits (the server has seen other prompts)."""
    out = read_output(batch[1])
    by_id = {o["custom_id"]: o for o in out}
    for i in [1, 2, 4, 5, 41, 3]:  # greedy lines of both routes, and line 3, seeded sampling
        url, b = body(i)
        http = requests.post(server.url + url, json=b, headers=server.headers(), timeout=120)
        assert http.status_code == 200, http.text
        want, got = http.json(), by_id[f"req-{i}"]["response"]["body"]
        for answer in (want, got):
            answer.pop("id"), answer.pop("created")
            answer["usage"].pop("prompt_tokens_details", None)
        assert got == want, f"line {i}"
    url, b = body(99)
    bad = requests.post(server.url + url, json={**b, "temperature": 9}, headers=server.headers(), timeout=60)
    assert bad.status_code == 400 and by_id["bad-99"]["error"] == bad.json()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@device_independent
def test_input_from_stdin_or_a_url_and_refused_flags(tmp_path):
    lines = [input_line(i)[0] for i in range(4)] + ["[1]"]
    text = "\n".join(lines) + "\n"
    out = tmp_path / "stdin.jsonl"
    r = subprocess.run(batch_command("-", out), input=text, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    got = read_output(out)
    assert len(got) == 5 and sum(o["response"]["status_code"] == 200 for o in got) == 4

    (tmp_path / "in.jsonl").write_text(text)
    handler = functools.partial(QuietHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "url.jsonl"
        url = f"http://127.0.0.1:{httpd.server_address[1]}/in.jsonl"
        r = subprocess.run(batch_command(url, out), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-4000:]
        assert len(read_output(out)) == 5
        r = subprocess.run(batch_command(url + ".missing", out), capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "404" in r.stderr, r.stderr[-2000:]
    finally:
        httpd.shutdown()

    r = subprocess.run(batch_command(tmp_path / "missing.jsonl", out), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "missing.jsonl" in r.stderr
    r = subprocess.run(batch_command("-", "http://example.invalid/out.jsonl"), capture_output=True, text=True,
                       timeout=60, input="")
    assert r.returncode != 0 and "local file only" in r.stderr, r.stderr
    r = subprocess.run(batch_command("-", out, "--enable-lora"), capture_output=True, text=True, timeout=60, input="")
    assert r.returncode != 0 and "--enable-lora is not supported" in r.stderr, r.stderr
