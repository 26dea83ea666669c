#!/usr/bin/env python3
"""Reference fixture for `rserve plan`: what transformers says about each config under tests/fixtures/configs/.

For every tests/fixtures/configs/*.json (config.json files of published models) this builds the model with
transformers on the meta device (no memory, no weights) and records:
  - `parameters`: the number of distinct parameters (tied embeddings counted once), i.e. what the weights hold;
  - `layer_types`: transformers' per-layer attention kind when the config class defines it ("full_attention" /
    "sliding_attention"), else null (a multimodal wrapper's, e.g. Gemma3ForConditionalGeneration's, from its text
    config: the decoder is what holds the KV cache);
  - `sliding_window`: the resolved window, when the (text) config has one;
  - `kv_values_per_token`: K and V values the transformers cache holds per token over all layers, measured by
    running a 3-token forward pass on the meta device (shapes only) and summing the cache tensors;
  - for configs with a sliding window, `kv_values_at_len`: the same after a forward pass of `kv_len` = 2 x window
    tokens (transformers keeps window - 1 tokens in a sliding layer: what the next token attends to besides itself);
  - for mixtures of experts, `active_parameters`: the parameters one token uses, i.e. `parameters` less, in each
    layer's `experts` module, the share of the experts it is not routed to (numel x (experts - top_k) / experts);
  - for multimodal configs (a `vision_config`), `parameters_by_module`: the same parameters split by the model's
    top-level modules (`language_model`, `vision_tower`, `multi_modal_projector`, an untied `lm_head`), so a planner
    that counts the vision tower can be checked part by part.

Usage (needs torch + transformers; not run by CI):
    /work/venv-ref/bin/python scripts/reference/plan_refs.py tests/fixtures/configs
writes tests/fixtures/configs/refs.json.
"""

import glob
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def load_config(path: str):
    with open(path) as f:
        raw = json.load(f)
    raw.pop("auto_map", None)  # use the transformers implementation, never remote code
    model_type = raw.pop("model_type")
    return AutoConfig.for_model(model_type, **raw)


def build(cfg):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def count(cfg) -> int:
    return sum(p.numel() for p in build(cfg).parameters())


def count_by_module(cfg) -> dict:
    """Parameters per top-level module: `model.vision_tower.x` counts under `vision_tower`, `lm_head.weight` under
    `lm_head` (tied weights are listed once, under the module that owns them)."""
    parts: dict = {}
    for name, p in build(cfg).named_parameters():
        path = name.split(".")
        key = path[1] if path[0] == "model" and len(path) > 2 else path[0]
        parts[key] = parts.get(key, 0) + p.numel()
    return dict(sorted(parts.items()))


def active(cfg, total: int):
    """`total` less the idle experts' share of every `experts` module, or None without experts."""
    text = cfg.get_text_config()
    experts = getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None)
    top_k = getattr(text, "num_experts_per_tok", None)
    if not experts or not top_k:
        return None
    in_experts = sum(p.numel() for n, p in build(cfg).named_parameters() if ".experts." in n)
    return total - in_experts * (experts - top_k) // experts


def cache_values(cfg, tokens: int) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
        out = model(input_ids=torch.zeros((1, tokens), dtype=torch.long), use_cache=True)
    cache = out.past_key_values
    return sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)


def main(folder: str) -> None:
    out = {"transformers": transformers.__version__, "configs": {}}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name == "refs":
            continue
        cfg = load_config(path)
        # The decoder's config (the config itself for a text-only model, `text_config` for a multimodal wrapper).
        text = cfg.get_text_config()
        layer_types = getattr(text, "layer_types", None)
        window = getattr(text, "sliding_window", None)
        entry = {
            "parameters": count(cfg),
            "layer_types": list(layer_types) if layer_types is not None else None,
            "sliding_window": window,
            "kv_values_per_token": cache_values(cfg, 3) // 3,
        }
        if window:
            entry["kv_len"] = 2 * window
            entry["kv_values_at_len"] = cache_values(cfg, 2 * window)
        act = active(cfg, entry["parameters"])
        if act is not None:
            entry["active_parameters"] = act
        if getattr(cfg, "vision_config", None) is not None:
            entry["parameters_by_module"] = count_by_module(cfg)
        out["configs"][name] = entry
        print(name, out["configs"][name]["parameters"], file=sys.stderr)
    with open(os.path.join(folder, "refs.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
