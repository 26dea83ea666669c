"""Embeddings, classification, scoring and reranking end to end, on vLLM's routes and wire shapes: `/v1/embeddings`
(the openai client, float and base64, `dimensions`, token-id and batch inputs, LangChain's OpenAIEmbeddings),
`/pooling`, `/classify`, `/score` (1:1, 1:N, N:N), `/rerank`, `/v1/rerank` (Jina's shape), `/v2/rerank` (Cohere's),
their 400s, `/metrics` and `/v1/models`.

Models: the tiny float32 pooling checkpoints that scripts/reference/tiny_pooling_models.py writes at setup
(RSERVE_TEST_MODELS/tiny/{bert,xlmr,qwen3_embed,xlmr_cls,bert_cls}); goldens: tests/fixtures/golden/pooling.json,
recorded with sentence-transformers / transformers in float32 by scripts/reference/pooling_refs.py. Every vector must
have the golden's length and a cosine of at least 0.9999 with it; probabilities and scores must be within 1e-4, with
the same ranking.

Servers, one per model and module (started on first use): bert and qwen3_embed with vLLM's `--runner pooling`
(Qwen3ForCausalLM would otherwise generate), bert_cls with `--runner pooling` too; xlmr and xlmr_cls plainly, as
`vllm serve MODEL` picks the pooling runner for an encoder and for a `...ForSequenceClassification` architecture.

On the CPU (no RSERVE_E2E_ARGS) everything runs. With `--device opencl` only the golden embeddings of bert and
qwen3_embed and one rerank run; other devices also run the golden checks of xlmr, xlmr_cls and bert_cls. Under TP=3
(RSERVE_E2E_LAUNCH, or -tp in RSERVE_E2E_ARGS) the module is skipped: the encoders have 4 heads, which 3 ranks do not
divide.
"""

import base64
import json
import math
import os
import shlex
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from conftest import Server, models_root

GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "pooling.json").read_text())
MODELS = GOLDEN["models"]
COSINE = 0.9999
TOLERANCE = 1e-4
MAX_LEN = 512  # the encoders' max_position_embeddings (XLM-R's 514 less its 2 offset rows)

E2E_ARGS = shlex.split(os.environ.get("RSERVE_E2E_ARGS", ""))
ON_OPENCL = "opencl" in os.environ.get("RSERVE_E2E_ARGS", "")
UNDER_TP = bool(os.environ.get("RSERVE_E2E_LAUNCH", "").strip()) or "-tp" in E2E_ARGS
OTHER_DEVICE = bool(E2E_ARGS or UNDER_TP)

pytestmark = pytest.mark.skipif(UNDER_TP, reason="the tiny encoders have 4 attention heads (qwen3_embed 2 KV heads), "
                                                  "which -tp 3 does not divide; the CPU and OpenCL runs cover pooling")
# Request and response shapes do not depend on the device: they run once, in the plain CPU run.
device_independent = pytest.mark.skipif(OTHER_DEVICE, reason="does not depend on the device; run once on the CPU")
not_on_opencl = pytest.mark.skipif(ON_OPENCL, reason="OpenCL runs the bert / qwen3_embed goldens and one rerank")

# name -> the flags vLLM needs for it (the plain ones must be picked by the architecture).
SERVE_ARGS = {
    "bert": ["--runner", "pooling"],
    "qwen3_embed": ["--runner", "pooling"],
    "bert_cls": ["--runner", "pooling"],
    "xlmr": [],
    "xlmr_cls": [],
}


def start(name: str) -> Server:
    folder = models_root() / MODELS[name]["folder"]
    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"tiny pooling checkpoint missing at {folder}: run scripts/fetch-models.sh "
                    "(scripts/reference/tiny_pooling_models.py writes it)")
    return Server(*SERVE_ARGS[name], "--served-model-name", name, "--max-model-len", str(MAX_LEN),
                  "--dtype", "float32", model=folder, name=f"rserve {name}")


@pytest.fixture(scope="module")
def servers():
    """Servers by model name, each started on first use and stopped at the end of the module."""
    live: dict[str, Server] = {}

    def get(name: str) -> Server:
        if name not in live:
            live[name] = start(name)
        return live[name]

    yield get
    failures = []
    for name, s in live.items():
        code = s.stop()
        if code != 0:
            failures.append(f"{name} exited with {code}\n{s.log()}")
    assert not failures, "\n".join(failures)


def post(server: Server, path: str, body: dict) -> requests.Response:
    return requests.post(f"{server.url}{path}", headers=server.headers(), json=body, timeout=120)


def ok(r: requests.Response) -> dict:
    assert r.status_code == 200, f"{r.status_code}: {r.text}"
    return r.json()


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def norm(a) -> float:
    return math.sqrt(sum(x * x for x in a))


def assert_vector(got, want, where: str, unit: bool = True):
    assert len(got) == len(want), f"{where}: length {len(got)}, golden {len(want)}"
    c = cosine(got, want)
    assert c >= COSINE, f"{where}: cosine {c:.6f} with the golden"
    if unit:
        assert abs(norm(got) - 1.0) < 1e-4, f"{where}: norm {norm(got)}"
    else:
        assert abs(norm(got) - norm(want)) <= 1e-3 * norm(want), f"{where}: norm {norm(got)}, golden {norm(want)}"


def texts(name: str) -> list[dict]:
    return MODELS[name]["texts"]


def decode_base64(s: str) -> list[float]:
    raw = base64.b64decode(s)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def assert_error(r: requests.Response, statuses=(400,)):
    assert r.status_code in statuses, f"{r.status_code}: {r.text}"
    if r.status_code == 400:
        err = r.json()["error"]
        assert err["message"] and err["code"] == 400, err


def metric_total(server: Server, name: str) -> float:
    """A counter summed over its label sets (request_success_total has one per finished_reason)."""
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rpartition(" ")[2])
    return total


# ---------------------------------------------------------------------------------------------------------------
# Golden vectors (every device)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bert", "qwen3_embed", pytest.param("xlmr", marks=not_on_opencl)])
def test_embeddings_equal_sentence_transformers(servers, name):
    """A batch of 8 texts (1 to a few hundred tokens) in one request, floats: each vector is the model's
    sentence-transformers pipeline output (pooling, xlmr's Dense + Tanh, Normalize)."""
    s = servers(name)
    rows = texts(name)
    r = s.client().embeddings.create(model=name, input=[t["text"] for t in rows], encoding_format="float")
    assert [d.index for d in r.data] == list(range(len(rows)))
    for d, t in zip(r.data, rows):
        assert_vector(d.embedding, t["embedding"], f"{name} {t['text'][:30]!r}")
    assert r.usage.prompt_tokens == sum(len(t["ids"]) for t in rows)


@pytest.mark.parametrize("name", ["bert", "qwen3_embed", pytest.param("xlmr", marks=not_on_opencl)])
def test_token_id_inputs(servers, name):
    """The golden token ids as input (one list, then a batch of lists) give the same vectors as the texts."""
    s = servers(name)
    rows = texts(name)
    client = s.client()
    one = client.embeddings.create(model=name, input=rows[1]["ids"], encoding_format="float")
    assert len(one.data) == 1
    assert_vector(one.data[0].embedding, rows[1]["embedding"], f"{name} ids")
    many = client.embeddings.create(model=name, input=[t["ids"] for t in rows], encoding_format="float")
    for d, t in zip(many.data, rows):
        assert_vector(d.embedding, t["embedding"], f"{name} ids {t['text'][:30]!r}")
    assert many.usage.prompt_tokens == sum(len(t["ids"]) for t in rows)


# ---------------------------------------------------------------------------------------------------------------
# /v1/embeddings options
# ---------------------------------------------------------------------------------------------------------------

@device_independent
@pytest.mark.parametrize("name", ["bert", "xlmr", "qwen3_embed"])
def test_raw_vectors_without_normalize(servers, name):
    """`use_activation: false` (vLLM's switch, formerly `normalize`) skips the Normalize module."""
    s = servers(name)
    rows = texts(name)
    r = ok(post(s, "/v1/embeddings", {"model": name, "input": [t["text"] for t in rows[:4]],
                                      "encoding_format": "float", "use_activation": False}))
    for d, t in zip(r["data"], rows):
        assert_vector(d["embedding"], t["raw"], f"{name} raw {t['text'][:30]!r}", unit=False)


@device_independent
def test_base64_is_little_endian_f32(servers):
    s = servers("bert")
    rows = texts("bert")
    client = s.client()
    floats = client.embeddings.create(model="bert", input=rows[3]["text"], encoding_format="float").data[0].embedding
    b64 = client.embeddings.create(model="bert", input=rows[3]["text"], encoding_format="base64").data[0].embedding
    assert isinstance(b64, str)
    decoded = decode_base64(b64)
    assert len(decoded) == 64
    assert max(abs(a - b) for a, b in zip(decoded, floats)) < 1e-6
    # The client's default (it asks for base64 and decodes) gives the same vector.
    default = client.embeddings.create(model="bert", input=rows[3]["text"]).data[0].embedding
    assert max(abs(a - b) for a, b in zip(default, floats)) < 1e-6
    assert_vector(decoded, rows[3]["embedding"], "bert base64")


@device_independent
def test_dimensions_cut_then_normalise(servers):
    """bert's config says is_matryoshka: `dimensions` 16 is the vector's first 16 values, normalised again."""
    s = servers("bert")
    rows = texts("bert")
    r = s.client().embeddings.create(model="bert", input=[t["text"] for t in rows], dimensions=16,
                                     encoding_format="float")
    for d, t in zip(r.data, rows):
        assert_vector(d.embedding, t["dim16"], f"bert dimensions=16 {t['text'][:30]!r}")


@device_independent
def test_dimensions_on_a_model_without_matryoshka_is_400(servers):
    s = servers("xlmr")
    r = post(s, "/v1/embeddings", {"model": "xlmr", "input": "dog", "dimensions": 16})
    assert_error(r)


@device_independent
def test_input_longer_than_the_limit(servers):
    """600 tokens on a 512-token model: 400; with truncate_prompt_tokens it passes."""
    s = servers("bert")
    ids = texts("bert")[7]["ids"]
    long = (ids[:-1] * 3)[:599] + [ids[-1]]
    assert len(long) == 600
    assert_error(post(s, "/v1/embeddings", {"model": "bert", "input": long}))
    assert_error(post(s, "/v1/embeddings", {"model": "bert", "input": " ".join(["dog"] * 600)}))
    r = ok(post(s, "/v1/embeddings", {"model": "bert", "input": long, "truncate_prompt_tokens": 500,
                                      "encoding_format": "float"}))
    assert len(r["data"][0]["embedding"]) == 64 and abs(norm(r["data"][0]["embedding"]) - 1) < 1e-4
    assert r["usage"]["prompt_tokens"] == 500


@device_independent
def test_concurrent_requests_match_the_golden(servers):
    """16 single-text requests at once (the engine batches inputs of different lengths)."""
    s = servers("qwen3_embed")
    rows = texts("qwen3_embed") * 2
    client = s.client()

    def one(t):
        return client.embeddings.create(model="qwen3_embed", input=t["text"], encoding_format="float").data[0]

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, rows))
    for d, t in zip(got, rows):
        assert_vector(d.embedding, t["embedding"], f"concurrent {t['text'][:30]!r}")


@device_independent
def test_embedding_response_shape(servers):
    s = servers("bert")
    r = ok(post(s, "/v1/embeddings", {"model": "bert", "input": ["dog", "What is the capital of France?"]}))
    assert r["object"] == "list" and r["model"] == "bert" and r["id"]
    assert [(d["object"], d["index"]) for d in r["data"]] == [("embedding", 0), ("embedding", 1)]
    assert r["usage"]["prompt_tokens"] == r["usage"]["total_tokens"] == 3 + 9


@device_independent
def test_langchain_openai_embeddings(servers):
    langchain_openai = pytest.importorskip("langchain_openai")
    s = servers("bert")
    rows = texts("bert")
    emb = langchain_openai.OpenAIEmbeddings(model="bert", base_url=f"{s.url}/v1", api_key=s.api_key,
                                            check_embedding_ctx_length=False)
    docs = emb.embed_documents([t["text"] for t in rows[:5]])
    for got, t in zip(docs, rows):
        assert_vector(got, t["embedding"], f"langchain {t['text'][:30]!r}")
    assert_vector(emb.embed_query(rows[2]["text"]), rows[2]["embedding"], "langchain query")


# ---------------------------------------------------------------------------------------------------------------
# /pooling
# ---------------------------------------------------------------------------------------------------------------

@device_independent
def test_pooling_route_embed_task(servers):
    s = servers("bert")
    rows = texts("bert")
    r = ok(post(s, "/pooling", {"model": "bert", "input": [t["text"] for t in rows[:3]], "task": "embed"}))
    assert r["object"] == "list" and len(r["data"]) == 3
    for d, t in zip(r["data"], rows):
        assert d["object"] == "pooling"
        assert_vector(d["data"], t["embedding"], f"/pooling {t['text'][:30]!r}")
    assert r["usage"]["prompt_tokens"] == sum(len(t["ids"]) for t in rows[:3])


@device_independent
def test_pooling_route_default_task(servers):
    """Without `task`: the model's default pooling output, a vector or one row per token (vLLM's token_embed)."""
    s = servers("bert")
    t = texts("bert")[2]
    r = ok(post(s, "/pooling", {"model": "bert", "input": t["text"]}))
    data = r["data"][0]["data"]
    if data and isinstance(data[0], list):
        assert len(data) == len(t["ids"]) and all(len(row) == 64 for row in data)
    else:
        assert_vector(data, t["embedding"], "/pooling default")


# ---------------------------------------------------------------------------------------------------------------
# /classify
# ---------------------------------------------------------------------------------------------------------------

@not_on_opencl
def test_classify_equals_transformers(servers):
    s = servers("xlmr_cls")
    rows = texts("xlmr_cls")
    r = ok(post(s, "/classify", {"model": "xlmr_cls", "input": [t["text"] for t in rows]}))
    assert r["object"] == "list" and len(r["data"]) == len(rows)
    for i, (d, t) in enumerate(zip(r["data"], rows)):
        assert d["index"] == i and d["num_classes"] == 3
        assert max(abs(a - b) for a, b in zip(d["probs"], t["probs"])) < TOLERANCE, (d["probs"], t["probs"])
        assert d["label"] == t["label"]
    assert r["usage"]["prompt_tokens"] == sum(len(t["ids"]) for t in rows)


@device_independent
def test_classify_token_ids_and_raw_logits(servers):
    s = servers("xlmr_cls")
    t = texts("xlmr_cls")[0]
    r = ok(post(s, "/classify", {"model": "xlmr_cls", "input": t["ids"]}))
    assert max(abs(a - b) for a, b in zip(r["data"][0]["probs"], t["probs"])) < TOLERANCE
    raw = ok(post(s, "/classify", {"model": "xlmr_cls", "input": t["text"], "use_activation": False}))
    assert max(abs(a - b) for a, b in zip(raw["data"][0]["probs"], t["logits"])) < 1e-3


@device_independent
def test_plain_serve_picks_the_pooling_runner(servers):
    """xlmr and xlmr_cls were started without --runner: /v1/models lists them, and chat is refused."""
    for name in ("xlmr", "xlmr_cls"):
        s = servers(name)
        models = s.client().models.list().data
        assert [m.id for m in models] == [name]
        r = post(s, "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]})
        assert_error(r, (400, 404))


# ---------------------------------------------------------------------------------------------------------------
# /score and rerank (bert_cls, a cross-encoder)
# ---------------------------------------------------------------------------------------------------------------

def bert_cls():
    return MODELS["bert_cls"]


def test_rerank_equals_cross_encoder(servers):
    """/rerank: the documents sorted by the CrossEncoder's sigmoid score, top_n of them, with their text."""
    g = bert_cls()
    s = servers("bert_cls")
    r = ok(post(s, "/rerank", {"model": "bert_cls", "query": g["query"], "documents": g["documents"], "top_n": 4,
                               "return_documents": True}))
    results = r["results"]
    assert [x["index"] for x in results] == g["rerank_order"][:4]
    for x in results:
        want = g["rerank"][x["index"]]["score"]
        assert abs(x["relevance_score"] - want) < TOLERANCE, (x, want)
        assert x["document"]["text"] == g["documents"][x["index"]]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)


@device_independent
def test_v1_rerank_jina_shape(servers):
    g = bert_cls()
    s = servers("bert_cls")
    r = ok(post(s, "/v1/rerank", {"model": "bert_cls", "query": g["query"], "documents": g["documents"],
                                  "top_n": 2, "return_documents": True}))
    assert r["id"] and r["model"] == "bert_cls"
    assert [x["index"] for x in r["results"]] == g["rerank_order"][:2]
    assert all(x["document"]["text"] == g["documents"][x["index"]] for x in r["results"])
    # Every document is scored, whatever top_n keeps.
    assert r["usage"]["prompt_tokens"] == sum(len(p["ids"]) for p in g["rerank"])
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"]


@device_independent
def test_v2_rerank_cohere_shape(servers):
    g = bert_cls()
    s = servers("bert_cls")
    r = ok(post(s, "/v2/rerank", {"model": "bert_cls", "query": g["query"], "documents": g["documents"]}))
    # No top_n: every document, best first.
    assert [x["index"] for x in r["results"]] == g["rerank_order"]
    for x in r["results"]:
        assert abs(x["relevance_score"] - g["rerank"][x["index"]]["score"]) < TOLERANCE


@not_on_opencl
def test_score_one_to_one(servers):
    g = bert_cls()
    s = servers("bert_cls")
    p = g["pairs"][0]
    r = ok(post(s, "/score", {"model": "bert_cls", "text_1": p["text_1"], "text_2": p["text_2"]}))
    assert r["object"] == "list" and r["model"] == "bert_cls"
    assert len(r["data"]) == 1 and r["data"][0]["object"] == "score" and r["data"][0]["index"] == 0
    assert abs(r["data"][0]["score"] - p["score"]) < TOLERANCE
    assert r["usage"]["prompt_tokens"] == len(p["ids"])


@not_on_opencl
@pytest.mark.parametrize("keys", [("text_1", "text_2"), ("queries", "documents")])
def test_score_one_to_many(servers, keys):
    """One query against every document: data[i] scores document i (vLLM accepts text_1 / text_2 and queries /
    documents)."""
    g = bert_cls()
    s = servers("bert_cls")
    r = ok(post(s, "/score", {"model": "bert_cls", keys[0]: g["query"], keys[1]: g["documents"]}))
    assert [d["index"] for d in r["data"]] == list(range(len(g["documents"])))
    for d, p in zip(r["data"], g["rerank"]):
        assert abs(d["score"] - p["score"]) < TOLERANCE, (d, p["score"])
    assert r["usage"]["prompt_tokens"] == sum(len(p["ids"]) for p in g["rerank"])


@not_on_opencl
def test_score_many_to_many(servers):
    """N queries and N documents: pair i is (text_1[i], text_2[i])."""
    g = bert_cls()
    s = servers("bert_cls")
    pairs = g["pairs"]
    r = ok(post(s, "/score", {"model": "bert_cls", "text_1": [p["text_1"] for p in pairs],
                              "text_2": [p["text_2"] for p in pairs]}))
    assert len(r["data"]) == len(pairs)
    for d, p in zip(r["data"], pairs):
        assert abs(d["score"] - p["score"]) < TOLERANCE, (d, p["score"])


@device_independent
def test_score_raw_logit_and_mismatched_lengths(servers):
    g = bert_cls()
    s = servers("bert_cls")
    p = g["pairs"][1]
    r = ok(post(s, "/score", {"model": "bert_cls", "text_1": p["text_1"], "text_2": p["text_2"],
                              "use_activation": False}))
    assert abs(r["data"][0]["score"] - p["logit"]) < 1e-3
    # 2 queries against 3 documents is neither 1:N nor N:N.
    assert_error(post(s, "/score", {"model": "bert_cls", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}))


# ---------------------------------------------------------------------------------------------------------------
# Errors, metrics, models
# ---------------------------------------------------------------------------------------------------------------

@device_independent
def test_chat_on_an_embedding_model_is_refused(servers):
    s = servers("bert")
    r = post(s, "/v1/chat/completions", {"model": "bert", "messages": [{"role": "user", "content": "hi"}]})
    assert_error(r, (400, 404))
    r = post(s, "/v1/completions", {"model": "bert", "prompt": "hi", "max_tokens": 4})
    assert_error(r, (400, 404))


@device_independent
def test_embeddings_on_a_generative_model_is_refused(server):
    """The default test model (SmolLM2, generate runner) has no embedding task."""
    r = requests.post(f"{server.url}/v1/embeddings", headers=server.headers(),
                      json={"model": "smollm2", "input": "hello"}, timeout=60)
    assert_error(r, (400, 404))


@device_independent
def test_metrics_count_pooling_requests(servers):
    """Each input of a request is one engine request (vLLM's rule): 3 inputs add 3 successes and their tokens."""
    s = servers("bert")
    rows = texts("bert")[:3]
    before_ok = metric_total(s, "vllm:request_success_total")
    before_tokens = metric_total(s, "vllm:prompt_tokens_total")
    ok(post(s, "/v1/embeddings", {"model": "bert", "input": [t["ids"] for t in rows]}))
    want_tokens = sum(len(t["ids"]) for t in rows)
    deadline = time.time() + 10
    while True:
        got_ok = metric_total(s, "vllm:request_success_total") - before_ok
        got_tokens = metric_total(s, "vllm:prompt_tokens_total") - before_tokens
        if (got_ok, got_tokens) == (3, want_tokens) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert (got_ok, got_tokens) == (3, want_tokens)


@device_independent
def test_models_lists_the_pooling_model(servers):
    s = servers("bert")
    r = requests.get(f"{s.url}/v1/models", headers=s.headers(), timeout=30).json()
    assert [m["id"] for m in r["data"]] == ["bert"]
    assert r["data"][0]["max_model_len"] == MAX_LEN
