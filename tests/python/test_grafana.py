"""vLLM's Grafana dashboards against the real server: after a few requests, every metric their PromQL reads is in
/metrics, for our model_name, with samples, so that every panel shows data.

The dashboards come from vLLM's sdist (tests/fixtures/vllm/grafana.json, written by
scripts/reference/vllm_grafana_refs.py): the example dashboard of examples/observability/prometheus_grafana and the
two of examples/observability/dashboards/grafana.
"""

import json
import re
from collections import defaultdict

import requests

from conftest import MODEL_NAME, REPO

FIXTURE = REPO / "tests" / "fixtures" / "vllm" / "grafana.json"
SAMPLE_RE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(server) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of /metrics: {series name: [(labels, value), ...]}."""
    r = requests.get(f"{server.url}/metrics", timeout=30)
    # What Python's Prometheus client (and so vLLM) answers a plain scrape with.
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = r.text
    out = defaultdict(list)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"unparsable sample line: {line!r}"
        out[m.group(1)].append((dict(LABEL_RE.findall(m.group(2) or "")), float(m.group(3))))
    return out


def family(name: str, samples) -> str:
    """The histogram family of a `_bucket`/`_sum`/`_count` series (when the family is a histogram), else the name."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)] if name.endswith(suffix) else None
        if base and f"{base}_count" in samples and f"{base}_sum" in samples:
            return base
    return name


def test_every_dashboard_metric_has_samples(server, client):
    # A few requests of every kind the panels look at: chat and completions, streamed and not, n > 1, a length stop
    # and a stop string, a prompt served partly from the prefix cache.
    prompt = "Write a list of the planets of the solar system, one per line, with a fact about each of them."
    for _ in range(2):
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0)
    client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi."}],
                                   max_tokens=6, n=2, temperature=0.8, seed=1)
    stream = client.completions.create(model=MODEL_NAME, prompt="1, 2, 3,", max_tokens=12, stop=[","], stream=True,
                                       temperature=0)
    assert "".join(c.choices[0].text for c in stream if c.choices)
    server.wait_idle()

    samples = scrape(server)
    dashboards = json.loads(FIXTURE.read_text())["dashboards"]
    missing = []
    for path, board in dashboards.items():
        assert board["metrics"], f"{path}: no metric names found in the fixture"
        for name in board["metrics"]:
            series = [(labels, v) for labels, v in samples.get(name, []) if labels.get("model_name") == MODEL_NAME]
            if not series:
                missing.append(f"{path}: {name} is not exported for model_name={MODEL_NAME!r}")
                continue
            if any(labels.get("engine") != "0" for labels, _ in series):
                missing.append(f"{path}: {name} lacks vLLM's engine=\"0\" label")
            base = family(name, samples)
            if base != name:
                # A histogram: the requests above must have been observed.
                count = sum(v for labels, v in samples[f"{base}_count"] if labels.get("model_name") == MODEL_NAME)
                if count <= 0:
                    missing.append(f"{path}: {name} has no observations")
            elif name.endswith("_total") and sum(v for _, v in series) <= 0:
                missing.append(f"{path}: {name} never counted")
    assert not missing, "\n".join(missing)

    # The finish-reason panel groups by finished_reason: vLLM's values, with our stops and length stops counted.
    reasons = {labels["finished_reason"]: v for labels, v in samples["vllm:request_success_total"]}
    assert set(reasons) == {"stop", "length", "abort", "error", "repetition"}, reasons
    assert reasons["length"] >= 1 and reasons["stop"] >= 1, reasons
    # n=2 went to vLLM's per-request histograms once, as one request.
    assert samples["vllm:request_params_n_sum"][0][1] >= 2
