#!/usr/bin/env python3
"""Reference fixture for rserve's config.json parsing: what transformers resolves from each sample config.

For every engine/tests/fixtures/config/inputs/*.json (hand-copied config.json files of real models plus two
minimal ones that exercise defaults) this loads the config with the transformers class for its architecture and
records the values rserve's `ModelParams` holds. It also re-saves two configs with the installed transformers
(>= 5 writes `rope_parameters` and `dtype` instead of `rope_theta` / `rope_scaling` / `torch_dtype`) as extra inputs
named `*_resaved.json`, so both layouts are covered.

Usage (needs transformers; not run by CI):
    /work/venv-ref/bin/python scripts/reference/config_refs.py engine/tests/fixtures/config
"""

import glob
import json
import os
import sys
import tempfile

import transformers
from transformers import LlamaConfig, MistralConfig, Qwen2Config

CLASSES = {
    "LlamaForCausalLM": LlamaConfig,
    "MistralForCausalLM": MistralConfig,
    "Qwen2ForCausalLM": Qwen2Config,
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
}
ARCH = {LlamaConfig: "Llama", MistralConfig: "Mistral", Qwen2Config: "Qwen2"}
RESAVE = ["llama31_8b_instruct", "qwen25_05b_instruct"]


def config_class(raw: dict):
    arch = (raw.get("architectures") or [None])[0]
    return CLASSES[arch] if arch else CLASSES[raw["model_type"]]


def rope(cfg) -> tuple:
    """(rope_theta, llama3 scaling dict or None) from either config layout."""
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    scaling = getattr(cfg, "rope_scaling", None) or params
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "llama3":
        scaling = {
            k: scaling[k] for k in ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]
        }
    else:
        scaling = None
    return theta, scaling


def resolve(cls, raw: dict) -> dict:
    cfg = cls.from_dict(raw)
    theta, scaling = rope(cfg)
    eos = cfg.eos_token_id
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if cls is Qwen2Config:
        bias = True  # Qwen2Attention builds q/k/v with bias=True unconditionally.
        window = cfg.sliding_window if cfg.use_sliding_window else None
    else:
        bias = getattr(cfg, "attention_bias", False)
        window = getattr(cfg, "sliding_window", None)
    return {
        "architecture": ARCH[cls],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_layers": cfg.num_hidden_layers,
        "num_heads": cfg.num_attention_heads,
        "num_kv_heads": cfg.num_key_value_heads,
        "head_dim": head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": float(theta),
        "rope_scaling": scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": bias,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": eos if isinstance(eos, list) else ([] if eos is None else [eos]),
        "torch_dtype": None if dtype is None else str(dtype).replace("torch.", ""),
        "sliding_window": window,
    }


def main() -> None:
    root = sys.argv[1]
    inputs = os.path.join(root, "inputs")
    for name in RESAVE:
        with open(os.path.join(inputs, name + ".json")) as f:
            raw = json.load(f)
        with tempfile.TemporaryDirectory() as tmp:
            config_class(raw).from_dict(raw).save_pretrained(tmp)
            with open(os.path.join(tmp, "config.json")) as f:
                resaved = f.read()
        with open(os.path.join(inputs, name + "_resaved.json"), "w") as f:
            f.write(resaved)
    refs = {}
    for path in sorted(glob.glob(os.path.join(inputs, "*.json"))):
        with open(path) as f:
            raw = json.load(f)
        refs[os.path.basename(path)] = resolve(config_class(raw), raw)
    out = {"source": "scripts/reference/config_refs.py", "transformers": transformers.__version__, "configs": refs}
    with open(os.path.join(root, "refs.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(refs)} config references")


if __name__ == "__main__":
    main()
