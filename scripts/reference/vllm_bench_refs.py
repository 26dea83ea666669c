#!/usr/bin/env python3
"""Reference fixture for `rserve bench serve`: the flags and result-JSON keys of `vllm bench serve`, read from vLLM's
own source with Python's `ast` (nothing is imported or run, nothing is copied by hand).

What it records (tests/fixtures/vllm/bench_serve.json):
  - `vllm_version`: from the wheel's file name;
  - `flags`: every option string `vllm bench serve` accepts (`add_argument` calls of `add_cli_args` in
    vllm/benchmarks/serve.py and of `add_dataset_parser`, `add_random_dataset_base_args`,
    `add_random_multimodal_dataset_args` in vllm/benchmarks/datasets/datasets.py), with its default (when a literal),
    action, nargs and choices; `argparse.BooleanOptionalAction` flags also give their `--no-` form;
  - `result_keys`: the keys `main_async` writes into the result JSON (`result_json["..."] = `; the ones under an `if`
    are `setup_conditional`), the keys of the generation branch's `result = {...}` in `benchmark` (`benchmark`), the
    per-request arrays dropped unless `--save-detailed` (`detailed_only`), keys `benchmark` adds only in some runs
    (`conditional`: `result["..."] = `, probe stats, server metrics), the metric key templates of
    `process_one_metric` and the metrics it is called with;
  - `default_run_keys` / `detailed_run_keys`: the exact key set of a run with default flags (no `--goodput`,
    `--metadata`, `--ramp-up-strategy`, no speculative decoding or probes), without and with `--save-detailed`;
  - `summary_labels`: the labels of the printed summary lines (`"{:<40} {:<10}".format("Label:", ...)`).

Usage (no vLLM install needed; not run by CI):
    /work/main/.venv/bin/pip download vllm==0.34.0 --no-deps -d /tmp/vllm_wheel
    cd /tmp/vllm_src && unzip -o /tmp/vllm_wheel/vllm-0.34.0-*.whl 'vllm/benchmarks/*' 'vllm/entrypoints/cli/benchmark/*'
    /work/main/.venv/bin/python scripts/reference/vllm_bench_refs.py /tmp/vllm_src /tmp/vllm_wheel/vllm-0.34.0-*.whl
writes tests/fixtures/vllm/bench_serve.json.
"""

import ast
import json
import os
import re
import sys

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "vllm", "bench_serve.json")
DATASET_PARSER_FUNCS = ("add_dataset_parser", "add_random_dataset_base_args", "add_random_multimodal_dataset_args")


def parse(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def function(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise SystemExit(f"function {name} not found")


CONSTANTS = {}  # module-level NAME = literal of the files read, for defaults such as DEFAULT_NUM_PROMPTS


def literal(node):
    """The value of a literal expression (or a module constant), `float("inf")` as "inf", anything else as None."""
    if node is None:
        return None
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" and node.args:
        return str(literal(node.args[0]))
    if isinstance(node, (ast.Set, ast.List)):
        return [literal(e) for e in node.elts]
    return None


def flags_of(func):
    out = []
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        kw = {k.arg: k.value for k in node.keywords}
        action = kw.get("action")
        action_name = action.value if isinstance(action, ast.Constant) else (ast.unparse(action) if action else None)
        for name in names:
            entry = {"flag": name, "default": literal(kw.get("default")), "action": action_name}
            if "nargs" in kw:
                entry["nargs"] = literal(kw["nargs"])
            if "choices" in kw and literal(kw["choices"]) is not None:
                choices = literal(kw["choices"])
                entry["choices"] = sorted(choices) if isinstance(choices, (set, list)) else choices
            out.append(entry)
            if action_name and action_name.endswith("BooleanOptionalAction"):
                out.append({"flag": "--no-" + name[2:], "default": None, "action": action_name})
    return out


def subscript_keys(func, target):
    """`target["key"] = ...` assignments in `func`: (key, conditional) where conditional means under an `if`."""
    keys = []

    def visit(node, in_if):
        for child in ast.iter_child_nodes(node):
            child_if = in_if or isinstance(child, ast.If)
            if isinstance(child, ast.Assign):
                for t in child.targets:
                    if (
                        isinstance(t, ast.Subscript)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == target
                        and isinstance(t.slice, ast.Constant)
                    ):
                        keys.append((t.slice.value, in_if))
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child_if)

    visit(func, False)
    return keys


def dict_keys_assigned(func, name):
    """Keys of every `name = {...}` / `name: T = {...}` dict literal in `func`, one list per assignment."""
    found = []
    for node in ast.walk(func):
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        if isinstance(value, ast.Dict) and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found.append([k.value for k in value.keys if isinstance(k, ast.Constant)])
    return found


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, wheel = sys.argv[1], sys.argv[2]
    version = re.match(r"vllm-([^-]+)-", os.path.basename(wheel)).group(1)
    serve = parse(os.path.join(src, "vllm", "benchmarks", "serve.py"))
    datasets = parse(os.path.join(src, "vllm", "benchmarks", "datasets", "datasets.py"))

    for tree in (serve, datasets):
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    CONSTANTS[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    flags = flags_of(function(serve, "add_cli_args"))
    for name in DATASET_PARSER_FUNCS:
        flags += flags_of(function(datasets, name))
    seen, unique = set(), []
    for f in flags:
        if f["flag"] not in seen:
            seen.add(f["flag"])
            unique.append(f)

    main_async = function(serve, "main_async")
    bench = function(serve, "benchmark")
    setup = [k for k, cond in subscript_keys(main_async, "result_json") if not cond]
    setup_conditional = [k for k, cond in subscript_keys(main_async, "result_json") if cond]
    # The generation branch's dict is the one holding "output_throughput" (the other one is the pooling branch's).
    bench_keys = next(ks for ks in dict_keys_assigned(bench, "result") if "output_throughput" in ks)
    conditional = [k for k, _ in subscript_keys(bench, "result")]
    for ks in dict_keys_assigned(bench, "probe_stats"):
        conditional += ks
    ret = [n for n in ast.walk(function(serve, "_get_server_metrics_results")) if isinstance(n, ast.Return)]
    for r in ret:
        if isinstance(r.value, ast.Dict):
            conditional += [k.value for k in r.value.keys if isinstance(k, ast.Constant)]

    # for field in [...]: removed from the result unless --save-detailed.
    detailed_only = []
    for node in ast.walk(main_async):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.List):
            items = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
            if "ttfts" in items:
                detailed_only = items

    # process_one_metric's key templates (f-strings assigned into result) and the metrics it is called with.
    templates = []
    pom = function(bench, "process_one_metric")
    for node in ast.walk(pom):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.JoinedStr):
                    parts = []
                    for v in t.slice.values:
                        parts.append(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}")
                    templates.append("".join(parts).replace("{metric_attribute_name}", "{metric}"))
    metrics = []
    for node in ast.walk(bench):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "process_one_metric":
            metrics.append(node.args[0].value)
    default_metrics = None
    for node in ast.walk(main_async):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "default_percentile_metrics" for t in node.targets
        ):
            default_metrics = default_metrics or node.value.value
    default_percentiles = next(f["default"] for f in unique if f["flag"] == "--metric-percentiles")

    labels = []
    for node in ast.walk(bench):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
            and isinstance(node.func.value, ast.Constant)
            and str(node.func.value.value).startswith("{:<40}")
            and node.args
        ):
            a = node.args[0]
            if isinstance(a, ast.Constant):
                labels.append(a.value)
            elif isinstance(a, ast.JoinedStr):
                labels.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in a.values))

    metric_keys = []
    for m in default_metrics.split(","):
        for t in templates:
            for p in default_percentiles.split(",") if "{p_word}" in t else [None]:
                metric_keys.append(t.replace("{metric}", m).replace("{p_word}", p or ""))
    default_run = [k for k in setup + bench_keys if k not in detailed_only] + metric_keys
    detailed_run = setup + bench_keys + metric_keys

    fixture = {
        "vllm_version": version,
        "source": f"vllm {version} wheel: vllm/benchmarks/serve.py, vllm/benchmarks/datasets/datasets.py",
        "made_by": "scripts/reference/vllm_bench_refs.py",
        "flags": unique,
        "result_keys": {
            "setup": setup,
            "setup_conditional": setup_conditional,
            "benchmark": bench_keys,
            "detailed_only": detailed_only,
            "conditional": conditional,
            "metric_templates": templates,
            "percentile_metrics": metrics,
            "default_percentile_metrics": default_metrics,
            "default_metric_percentiles": default_percentiles,
        },
        "default_run_keys": default_run,
        "detailed_run_keys": detailed_run,
        "summary_labels": labels,
    }
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w", encoding="utf-8") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(FIXTURE)}: {len(unique)} flags, {len(default_run)} default keys")


if __name__ == "__main__":
    main()
