#!/usr/bin/env python3
"""make_random_golden.py — differential goldens for kiln's Jinja interpreter.

Generates random templates (seeded, so the output is deterministic) from
kiln's supported subset: expressions mixing literals, message fields,
operators, filters, tests, methods, slices, conditionals; if/for/set
statements with random whitespace control. Each is rendered by jinja2 exactly
as transformers compiles chat templates (its _compile_jinja_template:
trim_blocks, lstrip_blocks, loopcontrols, its tojson) and recorded in
random.json: the output, or "error" when jinja2 raised (kiln must then fail
too, with any status). Documented differences (non-ASCII case mapping, tuple
printing, chained comparisons, bignums) are kept out of the grammar.

usage: python3 tests/golden/chat/make_random_golden.py [N]   (default 1000)
"""
import json
import os
import random
import sys

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
MESSAGES = [
    {"role": "system", "content": " You are helpful.\n"},
    {"role": "user", "content": "Hello, World! Grüße 世界 a,b,,c"},
    {"role": "assistant", "content": "<think>\nhm\n</think>\n\nOK {{ x }}"},
]
STRINGS = ["'a'", "'Hello World'", "' pad '", "'é'", "''", "'a,b'", "\"q'uote\"", "'\\n\\tx'", "'<think>'", "'10'", "'2.5'"]
NAMES = ["messages[0].content", "messages[1]['content']", "messages[-1].content", "messages[1].role", "m", "ns.v", "nope",
         "messages|length", "add_generation_prompt", "bos_token", "tools", "messages[5]"]


class Gen:
    def __init__(self, rng):
        self.r = rng

    def lit(self):
        r = self.r
        k = r.randrange(8)
        if k == 0: return str(r.randint(-5, 20))
        if k == 1: return r.choice(["0.5", "1e16", "-2.25", "3.0", "0.1", "1e-5", "7.0"])
        if k == 2: return r.choice(STRINGS)
        if k == 3: return r.choice(["true", "false", "none", "True", "None"])
        if k == 4: return "[" + ", ".join(self.lit() for _ in range(r.randint(0, 3))) + "]"
        if k == 5: return "{" + ", ".join(f"{r.choice(STRINGS[:3])}: {self.lit()}" for _ in range(r.randint(0, 2))) + "}"
        return r.choice(NAMES)

    def expr(self, d=0):
        r = self.r
        if d > 3: return self.lit()
        k = r.randrange(14)
        if k < 3: return self.lit()
        a = self.expr(d + 1)
        if k == 3:
            op = r.choice(["+", "-", "*", "/", "//", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"])
            return f"({a} {op} {self.expr(d + 1)})"
        if k == 4:
            return f"({r.randint(-9, 9)} {r.choice(['%', '**', '//'])} {r.randint(1, 5)})"
        if k == 5:
            f = r.choice(["length", "trim", "string", "tojson", "first", "last", "join", "join(', ')", "reverse|list",
                          "list", "default('d')", "default('x', true)", "int", "float", "abs", "lower", "upper",
                          "capitalize", "replace('a', 'A')", "tojson(indent=2)", "items|list", "select('string')|list",
                          "map('string')|join('|')", "reject('none')|list", "e"])
            return f"({a}|{f})"
        if k == 6:
            t = r.choice(["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                          "iterable", "sequence", "true", "false", "boolean", "not none", "not defined"])
            return f"({a} is {t})"
        if k == 7:
            m = r.choice(["split()", "split(',')", "split(',', 1)", "strip()", "lstrip('\\n ')", "rstrip()",
                          "startswith('H')", "endswith(('!', 'c'))", "replace(',', ';')", "find('o')", "count('l')",
                          "upper()", "lower()", "strip('<>')"])
            return f"({r.choice(STRINGS + NAMES[:4])}.{m})"
        if k == 8:
            s = r.choice(["[0]", "[-1]", "[1:]", "[::-1]", "[:2]", "[1:4:2]", "[5]", "['role']", ".role", "[::2]"])
            # slicing a non-sequence: jinja2 errors, unless constant folding made it undefined; kiln errors
            ok = ":" not in s or r.random() < 0.0
            return f"({a}){s}" if ok and r.random() < 0.5 else f"{r.choice(NAMES[:4] + ['messages'])}{s}"
        if k == 9:
            return f"({a} if {self.expr(d + 1)} else {self.expr(d + 1)})"
        if k == 10:
            return f"(not {a})"
        if k == 11:
            return f"(-{r.randint(0, 9)})"
        if k == 12:
            return f"{{'k': {a}, 'n': [1, 2.5, none]}}|tojson"
        return f"namespace(v={a}).v"

    def ws(self):
        return self.r.choice(["", " ", "\n", "  \n  ", "\t", "\n\n"])

    def tag(self, body):
        r = self.r
        return "{%" + r.choice(["", "-", "+"]) + " " + body + " " + r.choice(["", "-"]) + "%}"

    def stmt(self, d=0):
        r = self.r
        k = r.randrange(6 if d < 2 else 2)
        if k == 0: return self.ws() + "{{" + r.choice(["", "-"]) + " " + self.expr() + " " + r.choice(["", "-"]) + "}}" + self.ws()
        if k == 1: return r.choice(["text", "A b", " ", "\n", "x\n  y"]) + self.ws()
        if k == 2:
            s = self.tag(f"if {self.expr()}") + self.block(d) + self.ws()
            if r.random() < 0.5: s += self.tag(f"elif {self.expr()}") + self.block(d)
            if r.random() < 0.5: s += self.tag("else") + self.block(d)
            return s + self.tag("endif") + self.ws()
        if k == 3:
            it = r.choice(["messages", "messages[::-1]", "messages[1:]", "[1, 2, 3]", "'abc'", "{'a': 1, 'b': 2}",
                           "range(4)", "nope", "(messages if " + self.expr() + " else [])"])
            flt = f" if {self.expr()}" if r.random() < 0.2 else ""
            body = "{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}" if r.random() < 0.5 else ""
            ctl = self.tag(r.choice(["break", "continue"])) if r.random() < 0.2 else ""
            s = self.tag(f"for m in {it}{flt}") + body + self.block(d) + ctl
            if r.random() < 0.3: s += self.tag("else") + self.block(d)
            return s + self.tag("endfor") + self.ws()
        if k == 4:
            return self.tag(f"set ns.v = {self.expr()}") + self.ws() + "{{ ns.v }}"
        return self.tag(f"set m = {self.expr()}") + "{{ m }}" + self.ws()

    def block(self, d):
        return "".join(self.stmt(d + 1) for _ in range(self.r.randint(1, 3)))

    def template(self):
        head = self.tag("set ns = namespace(v=0)")
        return head + "".join(self.stmt() for _ in range(self.r.randint(1, 5)))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    g = Gen(random.Random(20261130))
    cases = []
    for _ in range(n):
        t = g.template()
        case = {"template": t}
        try:
            out = _compile_jinja_template(t).render(messages=MESSAGES, tools=None, documents=None,
                                                     add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
            case["output"] = out
        except Exception as e:  # noqa: BLE001 — any failure: kiln must fail too
            case["error"] = type(e).__name__ + ": " + str(e)[:200]
        cases.append(case)
    with open(os.path.join(HERE, "random.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "messages": MESSAGES, "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"random.json: {n} cases, {sum('error' in c for c in cases)} raise")


if __name__ == "__main__":
    main()
