"""lm-evaluation-harness against the server (issue #46 item 3): its `local-completions` model runs the committed tasks
in tests/fixtures/lm_eval (loglikelihood requests: `echo` + `logprobs` + `max_tokens` 1; generate_until requests)
against rserve serving the float32 checkpoint `rserve convert` writes from the test model, tokenizing with that
checkpoint's tokenizer. Every loglikelihood equals lm-eval's `hf` model on the same checkpoint within 1e-3 nats, and
every greedy generation equals its (tests/fixtures/lm_eval/hf_reference.json, written by
scripts/reference/lm_eval_refs.py).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import Server, model_path, rserve_bin

# The protocol does not depend on the device, and a float32 server start costs a minute on the OpenCL CPU runtime:
# the plain run and the TP=3 run take it.
pytestmark = pytest.mark.skipif("opencl" in os.environ.get("RSERVE_E2E_ARGS", ""), reason="CPU and TP=3 cover it")

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is in tests/python/requirements.txt")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lm_eval"
REFERENCE = json.loads((FIXTURES / "hf_reference.json").read_text())["requests"]
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lm_eval") / "smollm2-f32"
    subprocess.run([str(rserve_bin()), "convert", str(model_path()), str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="module")
def served(checkpoint):
    # lm-eval's local models send no API key.
    # float32 on every device (the default dtype turns a float32 checkpoint to half precision off the CPU, as vLLM).
    s = Server("--dtype", "float32", model=checkpoint, api_key=None, name="lm-eval")
    yield s
    s.stop()


def test_lm_eval_local_completions_equals_hf(served, checkpoint, monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(FIXTURES)  # the tasks' data_files are relative to their folder
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_args = (f"model=smollm2,base_url={served.url}/v1/completions,tokenizer={checkpoint},"
                  "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1,timeout=120")
    res = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=list(REFERENCE),
                                  task_manager=TaskManager(include_path=str(FIXTURES)), batch_size=4,
                                  log_samples=True)
    worst = 0.0
    for task, docs in REFERENCE.items():
        samples = {str(s["doc_id"]): s for s in res["samples"][task]}
        assert set(samples) == set(docs), task
        for doc, want in docs.items():
            got = [r[0] for r in samples[doc]["resps"]]
            if isinstance(want, str):
                assert got[0] == want, f"{task} doc {doc}: generated {got[0]!r}, hf {want!r}"
                continue
            assert len(got) == len(want), f"{task} doc {doc}"
            for (ll, _greedy), w in zip(got, want):
                worst = max(worst, abs(ll - w))
    assert worst < TOLERANCE, f"worst loglikelihood difference from lm-eval's hf model: {worst:.2e} nats"
    # Both kinds of request produced the tasks' metrics.
    assert "acc,none" in res["results"]["rserve_capitals"]
    assert "exact_match,none" in res["results"]["rserve_arith"]
