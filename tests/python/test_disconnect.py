"""A client killed mid-stream aborts its request: generation stops early, and once the server is idle no KV blocks
are in use (read from /metrics). Other requests are unaffected. The same holds for a non-streaming client that hangs
up while it waits."""

import subprocess
import sys
import textwrap
import time

from conftest import MODEL_NAME, stream_chat_text

MAX_TOKENS = 600

STREAM_CLIENT = textwrap.dedent("""
    import sys
    from openai import OpenAI
    client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)
    stream = client.completions.create(model=sys.argv[3], prompt="Count: one, two, three,", stream=True,
                                       max_tokens=int(sys.argv[4]), temperature=0, extra_body={"ignore_eos": True})
    for chunk in stream:
        print(repr(chunk.choices[0].text), flush=True)
""")


def test_killed_client_frees_its_kv_blocks(server, client):
    before = server.wait_idle()
    proc = subprocess.Popen([sys.executable, "-c", STREAM_CLIENT, server.url, server.api_key, MODEL_NAME, str(MAX_TOKENS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(5)]
        assert all(lines), f"the client got no stream: {lines} {proc.stderr.read() if proc.poll() is not None else ''}"
        during = server.metrics()
        assert during["rserve:kv_blocks_used"] > 0, during
    finally:
        proc.kill()
        proc.wait(timeout=30)

    after = server.wait_idle(timeout=60)
    assert after["rserve:kv_blocks_used"] == 0, after
    assert after["vllm:kv_cache_usage_perc"] == 0, after
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < MAX_TOKENS, f"the request ran to the end ({generated} tokens) instead of being aborted"

    # The server still answers normally.
    text, finish = stream_chat_text(client, "Say hello.", max_tokens=8)
    assert text and finish in ("stop", "length")
    time.sleep(0.1)
    assert server.wait_idle()["rserve:kv_blocks_used"] == 0


PLAIN_CLIENT = textwrap.dedent("""
    import sys
    from openai import OpenAI
    client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)
    print("sending", flush=True)
    client.completions.create(model=sys.argv[3], prompt="Count: one, two, three,", max_tokens=int(sys.argv[4]),
                              temperature=0, extra_body={"ignore_eos": True})
""")


def test_killed_non_streaming_client_aborts_its_request(server):
    before = server.wait_idle()
    proc = subprocess.Popen([sys.executable, "-c", PLAIN_CLIENT, server.url, server.api_key, MODEL_NAME,
                             str(MAX_TOKENS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "sending"
        deadline = time.time() + 60
        while server.metrics()["vllm:generation_tokens_total"] < before["vllm:generation_tokens_total"] + 3:
            assert time.time() < deadline, "the request never started generating"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    after = server.wait_idle(timeout=60)
    assert after["rserve:kv_blocks_used"] == 0, after
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < MAX_TOKENS, f"the request ran to the end ({generated} tokens) instead of being aborted"
