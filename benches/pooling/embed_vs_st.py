"""Embedding throughput: rserve's /v1/embeddings against sentence-transformers on the same BERT-base-shaped model.

Writes (standard library only, once; reused when its stamp matches) a random-weight float32 BERT of BERT-base's shape
(hidden 768, 12 layers, 12 heads, intermediate 3072, 512 positions; the tiny bert's WordPiece tokenizer, mean pooling
+ Normalize as sentence-transformers files), then measures on the same inputs, 64 texts of exactly 128 tokens each
([CLS] + 126 whole-word tokens + [SEP]):

  (a) sentence-transformers: SentenceTransformer(MODEL).encode(texts, batch_size=64) in float32, `--threads` torch
      threads, on `--device` (cpu or cuda), after a warm-up; the median of `--reps` runs;
  (b) rserve: the same 64 inputs as token ids in one POST /v1/embeddings, and as 64 concurrent one-input requests;
      the median of `--reps` runs each, against a server given by --url, or started here from --rserve-bin (with
      `--runner pooling --dtype float32 --device DEVICE` and --rserve-args; on the CPU give it the same threads,
      e.g. --rserve-args "--cpu-threads 2").

It prints tokens/s of each, the ratio rserve / sentence-transformers, the lowest cosine between the two's vectors
(a check that both computed the same thing) and a markdown row for BENCHMARKS.md.

Needs torch and sentence-transformers (the reference venv, or the GPU machine's python); HTTP through urllib.

    /work/venv-ref/bin/python benches/pooling/embed_vs_st.py --rserve-bin target/release/rserve \\
        --rserve-args "--cpu-threads 2" --threads 2
    python3 benches/pooling/embed_vs_st.py --device cuda --rserve-bin ./rserve --model /tmp/bert_base
"""

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import urllib.request

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "reference"))
import tiny_pooling_models as tpm  # noqa: E402  (the generator of the tiny pooling checkpoints)

NAME = "bert_base"
SHAPE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
SCALES = dict(tpm.SCALES["bert"], salt=7)
READY = "Application startup complete."
ADDRESS_RE = re.compile(r"Starting vLLM API server 0 on (https?)://(\S+):(\d+)")


def write_model(dest: Path):
    """The BERT-base-shaped checkpoint (about 350 MB of float32); skipped when its stamp matches."""
    cfg = tpm.config_bert()
    cfg.update(SHAPE)
    cfg.update({"dtype": "float32", "torch_dtype": "float32", "transformers_version": tpm.TRANSFORMERS_VERSION})
    files = {
        "config.json": tpm.dumps(cfg),
        "tokenizer.json": tpm.dumps(tpm.bert_tokenizer_json(tpm.bert_vocab())),
        "tokenizer_config.json": tpm.dumps(tpm.bert_tokenizer_config()),
        "modules.json": tpm.dumps(tpm.st_modules(("Transformer", ""), ("Pooling", "1_Pooling"),
                                                 ("Normalize", "2_Normalize"))),
        "1_Pooling/config.json": tpm.dumps(tpm.pooling_config("mean_tokens", SHAPE["hidden_size"])),
        "sentence_bert_config.json": tpm.dumps({"max_seq_length": 512, "do_lower_case": False}),
    }
    stamp = f"{tpm.VERSION} {json.dumps(files, sort_keys=True)} {json.dumps(SCALES, sort_keys=True)}"
    stamp = tpm.hashlib.sha256(stamp.encode()).hexdigest() + "\n"
    if (dest / tpm.STAMP).is_file() and (dest / tpm.STAMP).read_text() == stamp:
        return
    print(f"embed_vs_st: writing the BERT-base-shaped model to {dest} (a minute)", flush=True)
    tmp = dest.parent / f".{dest.name}.tmp"
    tpm.shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    items = [(t, shape, tpm.f32_bytes(NAME, t, shape, kind, SCALES))
             for t, shape, kind in tpm.encoder_tensors("bert", cfg)]
    tpm.write_safetensors(tmp / "model.safetensors", items)
    for path, text in files.items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_text(text)
    (tmp / tpm.STAMP).write_text(stamp)
    tpm.shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def inputs(n: int, seq: int):
    """n texts of exactly `seq` tokens and their ids: whole-word vocabulary entries, seeded."""
    vocab = tpm.bert_vocab()
    ids = {t: i for i, t in enumerate(vocab)}
    words = [w for w in tpm._dedup(tpm.WORDS) if w.isalpha()]
    rnd = tpm.random.Random(1234)
    texts, id_lists = [], []
    for _ in range(n):
        ws = [rnd.choice(words) for _ in range(seq - 2)]
        texts.append(" ".join(ws))
        id_lists.append([ids["[CLS]"]] + [ids[w] for w in ws] + [ids["[SEP]"]])
    return texts, id_lists


class RserveProcess:
    def __init__(self, binary: str, model: Path, device: str, extra: list[str]):
        args = [binary, str(model), "--host", "127.0.0.1", "--port", "0", "--runner", "pooling",
                "--served-model-name", NAME, "--dtype", "float32", "--max-model-len", "512", *extra]
        if device != "cpu":
            args += ["--device", device]
        self.args = args
        self.url = None
        self.lines = []
        self._ready = threading.Event()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace")
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(600) or self.proc.poll() is not None or not self.url:
            self.proc.kill()
            sys.exit("embed_vs_st: rserve did not start: " + " ".join(args) + "\n" + "\n".join(self.lines[-40:]))

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            m = ADDRESS_RE.search(line)
            if m:
                self.url = f"{m.group(1)}://127.0.0.1:{m.group(3)}"
            if READY in line:
                self._ready.set()
        self._ready.set()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def post_embeddings(url, body):
    req = urllib.request.Request(f"{url}/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return [d["embedding"] for d in json.loads(r.read())["data"]]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / ((sum(x * x for x in a) ** 0.5) * (sum(y * y for y in b) ** 0.5))


def timed(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "models" / "x" / "bench" / NAME,
                    help="where the BERT-base-shaped model is (written there if absent)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (give rserve the same)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per input, [CLS] and [SEP] included")
    ap.add_argument("--url", help="a running rserve serving the model as bert_base (else --rserve-bin starts one)")
    ap.add_argument("--rserve-bin", help="the rserve binary to start")
    ap.add_argument("--rserve-args", default="", help="more rserve flags, e.g. \"--cpu-threads 2\"")
    ap.add_argument("--skip-st", action="store_true", help="measure rserve only")
    args = ap.parse_args()

    write_model(args.model)
    texts, ids = inputs(args.inputs, args.tokens)
    total = args.inputs * args.tokens
    results = {}

    st_vecs = None
    if not args.skip_st:
        import torch
        from sentence_transformers import SentenceTransformer
        torch.set_num_threads(args.threads)
        st = SentenceTransformer(str(args.model), device=args.device)
        got = st.tokenize(texts[:1])["input_ids"][0].tolist()
        assert got == ids[0], "the texts do not tokenize to the ids sent to rserve"

        def st_run():
            out = st.encode(texts, batch_size=args.inputs, convert_to_numpy=True)
            if args.device == "cuda":
                torch.cuda.synchronize()
            return out

        t, st_vecs = timed(st_run, args.reps)
        results["st"] = total / t
        print(f"embed_vs_st: sentence-transformers {st.__class__.__module__.split('.')[0]} on {args.device}, "
              f"{args.threads} threads: {t * 1e3:.1f} ms, {results['st']:.0f} tokens/s", flush=True)

    server = None
    url = args.url
    if not url and args.rserve_bin:
        server = RserveProcess(args.rserve_bin, args.model, args.device, shlex.split(args.rserve_args))
        url = server.url
    try:
        if url:
            def one_request():
                return post_embeddings(url, {"model": NAME, "input": ids, "encoding_format": "float"})

            t, vecs = timed(one_request, args.reps)
            results["rserve_batch"] = total / t
            print(f"embed_vs_st: rserve, one request of {args.inputs}: {t * 1e3:.1f} ms, "
                  f"{results['rserve_batch']:.0f} tokens/s", flush=True)

            def concurrent():
                def post(i):
                    return post_embeddings(url, {"model": NAME, "input": ids[i], "encoding_format": "float"})[0]
                with ThreadPoolExecutor(args.inputs) as pool:
                    return list(pool.map(post, range(args.inputs)))

            t, cvecs = timed(concurrent, args.reps)
            results["rserve_concurrent"] = total / t
            print(f"embed_vs_st: rserve, {args.inputs} concurrent requests: {t * 1e3:.1f} ms, "
                  f"{results['rserve_concurrent']:.0f} tokens/s", flush=True)
            if st_vecs is not None:
                worst = min(min(cosine(a, b), cosine(c, b)) for a, c, b in zip(vecs, cvecs, st_vecs.tolist()))
                print(f"embed_vs_st: lowest cosine rserve vs sentence-transformers: {worst:.6f}")
    finally:
        if server:
            server.stop()

    st_rate = results.get("st")
    best = max(results.get("rserve_batch", 0), results.get("rserve_concurrent", 0))
    ratio = f"{best / st_rate:.2f}x" if st_rate and best else "-"
    if st_rate and best:
        print(f"embed_vs_st: rserve / sentence-transformers = {ratio}")
    fmt = lambda k: f"{results[k]:,.0f}" if k in results else "-"  # noqa: E731
    print("\n| machine | device | model | inputs x tokens | sentence-transformers tok/s | rserve 1 request tok/s "
          "| rserve concurrent tok/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {platform.node()} ({os.cpu_count()} cores) | {args.device} ({args.threads} threads) | BERT-base shape f32 "
          f"| {args.inputs} x {args.tokens} | {fmt('st')} | {fmt('rserve_batch')} | {fmt('rserve_concurrent')} "
          f"| {ratio} |")


if __name__ == "__main__":
    main()
