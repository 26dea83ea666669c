#!/usr/bin/env python3
"""Reference fixtures for `/metrics`: vLLM's Grafana dashboards (the PromQL they run) and vLLM v1's Prometheus metric
definitions (name, type, help string, label names, label values, histogram buckets), read from vLLM's source
distribution with Python's `json` and `ast` (nothing is imported or run, nothing is typed by hand).

The dashboards are not in vLLM's wheel, only in its sdist on PyPI. This script downloads the sdist of one version
from PyPI (the `sdist` file of that release in `https://pypi.org/pypi/vllm/json`), checks its sha256 against
PyPI's, and reads, without unpacking the archive:
  - `examples/observability/prometheus_grafana/grafana.json` (the dashboard of vLLM's Prometheus/Grafana example)
    and the two dashboards of `examples/observability/dashboards/grafana/`;
  - `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger.__init__`: every `self._gauge_cls/_counter_cls/
    _histogram_cls(name=..., documentation=..., labelnames=..., buckets=...)` call, and `log_metrics_info`);
  - `vllm/v1/metrics/buckets.py` (the bucket families: the static tuples and the 1-2-5 rule of `request_tokens`);
  - the label values vLLM fills in: `FINISH_REASON_STRINGS` (vllm/v1/engine/__init__.py),
    `PromptTokenStats.ALL_SOURCES` (stats.py), `CacheHitSource` (cache_hit_source.py), the sleep states and waiting
    reasons of loggers.py;
  - `CacheConfig`'s fields (vllm/config/cache.py), the label names of `vllm:cache_config_info`.

It writes:
  tests/fixtures/vllm/grafana.json   per dashboard: its panels' titles and PromQL expressions, and the metric names
                                     they reference (`vllm:*` as written, histogram series with their suffix);
  tests/fixtures/vllm/metrics.json   per metric of PrometheusStatLogger: type, help, label names, the bucket family
                                     and its bounds (or its rule), plus the label values above.

Usage (needs only network access to PyPI; not run by CI):
    /work/main/.venv/bin/python scripts/reference/vllm_grafana_refs.py [VERSION]      # default 0.34.0
"""

import ast
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import urllib.parse
import urllib.request

VERSION = sys.argv[1] if len(sys.argv) > 1 else "0.34.0"
FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "vllm")
DASHBOARDS = (
    "examples/observability/prometheus_grafana/grafana.json",
    "examples/observability/dashboards/grafana/performance_statistics.json",
    "examples/observability/dashboards/grafana/query_statistics.json",
)
METRIC_RE = re.compile(r"vllm:[A-Za-z0-9_:]+")
KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}


def sdist():
    """(url, sha256, bytes) of the release's sdist, as PyPI lists it."""
    # The project's JSON lists every release's files (`/pypi/vllm/<version>/json` is the same entry for one release).
    index_url = "https://pypi.org/pypi/vllm/json"
    with urllib.request.urlopen(index_url) as r:
        release = json.load(r)["releases"][VERSION]
    entry = next(u for u in release if u["packagetype"] == "sdist")
    url = urllib.parse.urljoin(index_url, entry["url"])
    with urllib.request.urlopen(url) as r:
        data = r.read()
    # A PyPI mirror lists files relative to itself; the fixture names the file's canonical address.
    if "/packages/" in url and not url.startswith("https://files.pythonhosted.org/"):
        url = "https://files.pythonhosted.org/packages/" + url.rsplit("packages/", 1)[1]
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["digests"]["sha256"]:
        raise SystemExit(f"sha256 mismatch for {url}: {digest} != {entry['digests']['sha256']}")
    return entry["filename"], url, digest, data


class Archive:
    def __init__(self, data):
        self.tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
        self.root = self.tar.getnames()[0].split("/")[0]

    def read(self, path):
        f = self.tar.extractfile(f"{self.root}/{path}")
        if f is None:
            raise SystemExit(f"{path} not in the sdist")
        return f.read().decode("utf-8")


def dashboard(text):
    """Panels (title, PromQL expressions) of a Grafana dashboard, nested rows included, and the metric names."""
    panels = []

    def walk(items):
        for p in items:
            walk(p.get("panels", []))
            exprs = [t["expr"] for t in p.get("targets", []) if t.get("expr")]
            if exprs:
                panels.append({"title": p.get("title", ""), "exprs": exprs})

    walk(json.loads(text).get("panels", []))
    names = sorted({m for p in panels for e in p["exprs"] for m in METRIC_RE.findall(e)})
    return {"panels": panels, "metrics": names}


def literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def class_node(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def function(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def buckets(text):
    """The bucket families of buckets.py: static tuples by family, and the 1-2-5 rule of `request_tokens`."""
    tree = ast.parse(text)
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            value = literal(node.value)
            if isinstance(value, tuple):
                constants[node.target.id] = [float(v) for v in value]
    families = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_STATIC_FAMILY_DEFAULTS":
            for k, v in zip(node.value.keys, node.value.values):
                families[literal(k)] = constants[v.id]
    rule = function(tree, "build_1_2_5_buckets")
    call = next(n for n in ast.walk(rule) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "build_buckets")
    families["request_tokens"] = {"mantissas": literal(call.args[0]), "max": "max_model_len"}
    return families


def metrics(loggers, families):
    """Every metric PrometheusStatLogger.__init__ creates, in source order."""
    tree = ast.parse(loggers)
    init = function(class_node(tree, "PrometheusStatLogger"), "__init__")
    # `x_buckets = histogram_buckets("family", ...)` assignments name each histogram's family.
    bucket_vars = {}
    for node in ast.walk(init):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "histogram_buckets"
        ):
            bucket_vars[node.targets[0].id] = literal(node.value.args[0])
    base_labels = None
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "labelnames":
            base_labels = literal(node.value)
    out = {}
    for node in ast.walk(init):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in KINDS):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        labels = kw.get("labelnames")
        if isinstance(labels, ast.Name) and labels.id == "labelnames":
            labels = list(base_labels)
        elif isinstance(labels, ast.BinOp):
            labels = list(base_labels) + literal(labels.right)
        else:
            labels = literal(labels)
        doc = kw["documentation"]
        entry = {
            "type": KINDS[node.func.attr],
            "help": literal(doc) if not isinstance(doc, ast.JoinedStr) else None,
            "labels": labels,
        }
        if "buckets" in kw:
            family = bucket_vars[kw["buckets"].id]
            entry["bucket_family"] = family
            entry["buckets"] = families[family]
        out[literal(kw["name"])] = entry
    # log_metrics_info: the info gauge of the cache config.
    info = function(class_node(tree, "PrometheusStatLogger"), "log_metrics_info")
    for node in ast.walk(info):
        if isinstance(node, ast.If) and "cache_config" in ast.unparse(node.test):
            values = {t.targets[0].id: literal(t.value) for t in node.body if isinstance(t, ast.Assign)}
            out[values["name"]] = {"type": "gauge", "help": values["documentation"], "labels": "cache_config_fields"}
    return out


def label_values(archive, loggers):
    engine = ast.parse(archive.read("vllm/v1/engine/__init__.py"))
    finish = next(
        literal(n.value)
        for n in engine.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "FINISH_REASON_STRINGS"
    )
    stats = ast.parse(archive.read("vllm/v1/metrics/stats.py"))
    sources = next(
        literal(n.value)
        for n in class_node(stats, "PromptTokenStats").body
        if isinstance(n, ast.AnnAssign) and n.target.id == "ALL_SOURCES"
    )
    hit = ast.parse(archive.read("vllm/v1/metrics/cache_hit_source.py"))
    hit_sources = [literal(n.value) for n in class_node(hit, "CacheHitSource").body if isinstance(n, ast.Assign)]
    tree = ast.parse(loggers)
    consts = {
        n.targets[0].id: literal(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
    }
    init = function(class_node(tree, "PrometheusStatLogger"), "__init__")
    sleep = next(literal(n.value) for n in ast.walk(init) if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "sleep_state")
    return {
        "finished_reason": list(finish),
        "prompt_tokens_by_source": list(sources),
        "prompt_tokens_cached_by_source": hit_sources,
        "sleep_state": sleep,
        "waiting_reason": [consts["WAITING_REASON_CAPACITY"], consts["WAITING_REASON_DEFERRED"]],
        "admission_reason": list(consts["ADMISSION_REASONS"]),
    }


def cache_config_fields(text):
    """CacheConfig's dataclass fields in order: `metrics_info()` is `{k: str(v) for k, v in self.__dict__.items()}`."""
    cls = class_node(ast.parse(text), "CacheConfig")
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and "ClassVar" not in ast.unparse(n.annotation)
    ]


def main():
    filename, url, digest, data = sdist()
    archive = Archive(data)
    source = {"vllm_version": VERSION, "sdist": filename, "url": url, "sha256": digest,
              "generated_by": "scripts/reference/vllm_grafana_refs.py"}
    dashboards = {path: dashboard(archive.read(path)) for path in DASHBOARDS}
    loggers = archive.read("vllm/v1/metrics/loggers.py")
    families = buckets(archive.read("vllm/v1/metrics/buckets.py"))
    defs = metrics(loggers, families)
    os.makedirs(FIXTURES, exist_ok=True)
    with open(os.path.join(FIXTURES, "grafana.json"), "w", encoding="utf-8") as f:
        json.dump({"source": source, "dashboards": dashboards}, f, indent=1)
        f.write("\n")
    with open(os.path.join(FIXTURES, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "source": source,
                "metrics": defs,
                "label_values": label_values(archive, loggers),
                "cache_config_fields": cache_config_fields(archive.read("vllm/config/cache.py")),
            },
            f,
            indent=1,
        )
        f.write("\n")
    print(f"{len(dashboards)} dashboards, {len(defs)} metrics from {url}")


if __name__ == "__main__":
    main()
