#!/usr/bin/env python3
"""Reference fixture for rserve's command line: every flag `vllm serve` accepts, read from vLLM's own argument parser.

Method: the parser is *built*, not parsed from text. The script imports vLLM and calls
`vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())`, the function `vllm serve` uses for its
sub-parser (FrontendArgs + AsyncEngineArgs.add_cli_args, which generates most flags from the config dataclasses in
vllm/config/*.py), then walks the resulting argparse actions. Nothing is typed by hand.

What it records (tests/fixtures/vllm/serve_flags.json):
  - `vllm_version`: `vllm.__version__`;
  - `flags`: one entry per argparse action with option strings, in registration order:
      `names`      every option string (long name first as argparse lists them; `--no-x` for BooleanOptionalAction,
                   short aliases such as `-tp`),
      `dest`       the namespace attribute,
      `group`      the help group (vLLM's config class, e.g. "CacheConfig"),
      `takes_value` whether the flag consumes a value (argparse `nargs` != 0),
      `nargs`      argparse's nargs (null, "?", "+", "*" or a number),
      `action`     the argparse action class name (e.g. "_StoreTrueAction", "BooleanOptionalAction"),
      `choices`    the allowed values as strings, or null,
      `default`    the default as JSON (values JSON cannot hold are written with `str()`),
      `help`       the first line of the help text (null for hidden flags: `hidden: true`).

vLLM 0.34.0 needs torch to import; the parser does not touch a GPU, but `DeviceConfig` infers the platform when the
parser is built, so the script sets `VLLM_TARGET_DEVICE=cpu` (vLLM's CPU platform) before importing. Usage (not run
by CI; no GPU needed):
    python3 -m venv /tmp/vllmref
    /tmp/vllmref/bin/pip download vllm==0.34.0 --no-deps -d /tmp/vllm_wheel
    /tmp/vllmref/bin/pip install --no-deps /tmp/vllm_wheel/vllm-0.34.0-*.whl
    /tmp/vllmref/bin/pip install torch==2.14.0 "fastapi[standard]<0.137" "transformers<5.23,>=5.16.1" pydantic \
        regex huggingface_hub cachetools psutil openai msgspec pyzmq cbor2 cloudpickle blake3 py-cpuinfo aiohttp \
        pybase64 openai_harmony partial_json_parser llguidance xgrammar prometheus_client pillow pyyaml
    /tmp/vllmref/bin/python scripts/reference/vllm_serve_flags.py
(torch from PyPI brings its CUDA library wheels, which it loads at import even without a GPU; the wheel's full
requirement set is not installable as a whole from PyPI alone (flashinfer-python==0.7.3) and is not needed.)
writes tests/fixtures/vllm/serve_flags.json.
"""

import argparse
import json
import os
import sys

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "vllm", "serve_flags.json")


def jsonable(value):
    """The default as JSON when it is plain data, else its `str()` (enums, callables, dataclass instances)."""
    if value is argparse.SUPPRESS:
        return None
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, (list, tuple)):
            return [jsonable(v) for v in value]
        return str(value)


def first_line(text):
    if not text or text == argparse.SUPPRESS:
        return None
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return None


def group_titles(parser):
    titles = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            titles[id(action)] = group.title
    return titles


def main():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    titles = group_titles(parser)
    flags = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        nargs = action.nargs
        flags.append(
            {
                "names": list(action.option_strings),
                "dest": action.dest,
                "group": titles.get(id(action)),
                "takes_value": nargs != 0,
                "nargs": nargs,
                "action": type(action).__name__,
                "choices": None if action.choices is None else [str(c) for c in action.choices],
                "default": jsonable(action.default),
                "help": first_line(action.help),
                "hidden": action.help == argparse.SUPPRESS,
            }
        )
    out = {
        "vllm_version": vllm.__version__,
        "generated_by": "scripts/reference/vllm_serve_flags.py (vLLM's make_arg_parser, built and walked)",
        "flags": flags,
    }
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"{len(flags)} flags of vLLM {vllm.__version__} -> {os.path.normpath(FIXTURE)}", file=sys.stderr)


if __name__ == "__main__":
    main()
