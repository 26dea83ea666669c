"""32 concurrent streaming clients all complete, and their greedy outputs equal the outputs of the same prompts sent
one at a time."""

from concurrent.futures import ThreadPoolExecutor

from conftest import stream_chat_text

N_CLIENTS = 32
TOPICS = ["the sea", "mountains", "a cat", "bread", "rain", "the moon", "music", "trains", "coffee", "winter",
          "a garden", "rivers", "books", "the sun", "bicycles", "a city", "snow", "birds", "tea", "a forest",
          "the desert", "clocks", "boats", "apples", "a library", "wind", "stars", "a bridge", "honey", "dogs",
          "a lighthouse", "autumn"]
PROMPTS = [f"Write one short sentence about {t}." for t in TOPICS[:N_CLIENTS]]
MAX_TOKENS = 24


def test_32_concurrent_streams_match_sequential(server):
    client = server.client()
    sequential = [stream_chat_text(client, p, max_tokens=MAX_TOKENS) for p in PROMPTS]
    assert all(finish in ("stop", "length") and text for text, finish in sequential), sequential

    def one(prompt):
        # A client per thread, as independent users would have.
        return stream_chat_text(server.client(), prompt, max_tokens=MAX_TOKENS)

    with ThreadPoolExecutor(max_workers=N_CLIENTS) as pool:
        concurrent = list(pool.map(one, PROMPTS))
    assert len(concurrent) == N_CLIENTS
    mismatches = [(p, s, c) for p, s, c in zip(PROMPTS, sequential, concurrent) if s != c]
    assert not mismatches, f"{len(mismatches)} of {N_CLIENTS} differ, e.g. {mismatches[:3]}"
    m = server.wait_idle()
    assert m["rserve:kv_blocks_used"] == 0
