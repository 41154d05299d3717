#!/usr/bin/env python3
"""make_golden.py — golden renders of chat templates for tests/test_chat_template.c.

Renders each case with HF transformers' apply_chat_template(messages,
tokenize=False, add_generation_prompt=...) and writes golden.json beside this
script. Templates:
  llama3, qwen3   the chat_template of SHARED/tokenizers/{llama3,qwen3}/tokenizer_config.json
  mistral         mistral.jinja: the chat_template of the published
                  mistralai/Mistral-7B-Instruct-v0.1 tokenizer_config.json
                  (bos <s>, eos </s>), with SHARED/tokenizers/llama2's tokens
  chatml          chatml.jinja: the ChatML template as HF's chat-template docs give it
  features        features.jinja: kiln's own template using each supported feature
A case whose template raises records the error text instead of the output.
"encode" holds apply_chat_template(tokenize=True) ids for tests/cli_chat.sh:
SHARED/models/pycode-22m's tokenizer with mistral.jinja as its chat_template.jinja.

usage: python3 tests/golden/chat/make_golden.py [SHARED_DIR]   (default ../shared)
Needs transformers and jinja2 (no torch). Deterministic.
"""
import json
import os
import sys

import jinja2
import transformers
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "..", "shared")

SYS = {"role": "system", "content": "You are a helpful assistant."}
def U(t): return {"role": "user", "content": t}
def A(t): return {"role": "assistant", "content": t}

CONVERSATIONS = {
    "user": [U("Hello!")],
    "system_user": [SYS, U("What is the capital of France?")],
    "multi_turn": [U("Hi there."), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"), U("Why?")],
    "system_multi_turn": [SYS, U("Hi."), A("Hello."), U("Bye.")],
    "think": [U("What is 2+2?"), A("<think>\nThe user asks for 2+2.\nThat is 4.\n</think>\n\nIt is 4."), U("And 3+3?")],
    "think_last": [U("What is 2+2?"), A("<think>\nAdd them.\n</think>\n\n4")],
    "non_ascii": [U("Grüße aus Köln! 你好，世界。Привет 🎉👩‍💻"), A("¡Hola! こんにちは ✓")],
    "template_chars": [U("{{ x }} {% if true %}yes{% endif %} {# no #} <|im_end|> [INST] </s>"), A("{{- '\\n' -}}")],
    "whitespace": [U("  padded  \n\n"), A("\n  answer\t \n")],
    "empty_content": [U(""), A("")],
    "two_users": [U("First."), U("Second.")],
    "tool_results": [U("Weather?"), A("Checking."), {"role": "tool", "content": "{\"temp\": 21}"},
                     {"role": "tool", "content": "<tool_response>sunny</tool_response>"}, U("Thanks")],
}

CASES = [
    ("llama3", ["user", "system_user", "multi_turn", "system_multi_turn", "non_ascii", "template_chars", "whitespace", "empty_content"]),
    ("qwen3", ["user", "system_user", "multi_turn", "system_multi_turn", "think", "think_last", "non_ascii", "template_chars", "whitespace", "empty_content", "tool_results"]),
    ("mistral", ["user", "system_user", "multi_turn", "non_ascii", "template_chars", "two_users", "whitespace"]),
    ("chatml", ["user", "system_user", "multi_turn", "non_ascii", "template_chars", "whitespace"]),
    ("features", ["system_user", "multi_turn", "non_ascii", "template_chars"]),
]


def tokenizer_for(name):
    fam = name if name in ("llama3", "qwen3") else "llama2"
    return PreTrainedTokenizerFast.from_pretrained(os.path.join(SHARED, "tokenizers", fam))


def encode_cases():
    import shutil
    import tempfile
    src = os.path.join(SHARED, "models", "pycode-22m")
    with tempfile.TemporaryDirectory() as d:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(src, f), d)
        shutil.copy(os.path.join(HERE, "mistral.jinja"), os.path.join(d, "chat_template.jinja"))
        tok = PreTrainedTokenizerFast.from_pretrained(d)
        cases = []
        for prompt in ("def fib(n):", "Grüße {{ x }} </s>"):
            msgs = [U(prompt)]
            ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            cases.append({"model": "pycode-22m", "template": "mistral", "prompt": prompt, "ids": list(ids)})
        return cases


def main():
    out = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "cases": []}
    for name, convs in CASES:
        tok = tokenizer_for(name)
        template = None
        if name not in ("llama3", "qwen3"):
            with open(os.path.join(HERE, name + ".jinja"), encoding="utf-8") as f:
                template = f.read()
        for conv in convs:
            for gen in (False, True):
                case = {"template": name, "conversation": conv, "add_generation_prompt": gen,
                        "messages": CONVERSATIONS[conv]}
                try:
                    case["output"] = tok.apply_chat_template(CONVERSATIONS[conv], chat_template=template,
                                                             tokenize=False, add_generation_prompt=gen)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                out["cases"].append(case)
    out["encode"] = encode_cases()
    path = os.path.join(HERE, "golden.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(out['cases'])} cases")


if __name__ == "__main__":
    main()
