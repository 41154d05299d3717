/*
 * test_chat_template.c — the chat-template interpreter (runtime/chat_*.c)
 * and its compile-time half (compiler/chat_compile.c):
 *
 *   - golden renders (72): tests/golden/chat/golden.json, made by HF transformers'
 *     apply_chat_template (make_golden.py beside it) for llama3 and qwen3
 *     (their tokenizer_config.json), Mistral-7B-Instruct-v0.1, ChatML and a
 *     template using every supported feature; kiln must match byte for byte,
 *     and name raise_exception's message where transformers raised;
 *   - differential goldens: 1,000 random templates of the supported subset
 *     rendered by jinja2 as transformers configures it (random.json, made by
 *     make_random_golden.py): same output, or an error where jinja2 raised;
 *   - whitespace control, scoping and Undefined rules one at a time;
 *   - refusals by name at parse time (filters, tags, methods, functions);
 *   - caps: output size, loop iterations, nesting depth, memory;
 *   - the engine section: compile a template, load it back, corrupt it.
 */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../compiler/kiln_chat_compile.h"
#include "../compiler/kiln_compiler.h"
#include "../runtime/kiln_chat.h"
#include "kt.h"

#define GOLDEN KILN_SOURCE_DIR "/tests/golden/chat/"
#define TOKDIR KILN_SHARED_DIR "/tokenizers/"

static char *slurp(const char *path, size_t *len) {
    char *p = NULL;
    kiln_error err = {0};
    if (kiln_file_read(path, 64u << 20, &p, len, &err) != KILN_OK) return NULL;
    return p;
}

/* The chat section for a golden template name. */
static kiln_chat_section *section_for(const char *name) {
    char cfg[512], jinja[512];
    bool own = strcmp(name, "llama3") != 0 && strcmp(name, "qwen3") != 0;
    snprintf(cfg, sizeof cfg, TOKDIR "%s/tokenizer_config.json", own ? "llama2" : name);
    snprintf(jinja, sizeof jinja, GOLDEN "%s.jinja", name);
    size_t cl = 0, jl = 0;
    char *c = slurp(cfg, &cl), *j = own ? slurp(jinja, &jl) : NULL;
    kiln_buf payload = {0};
    kiln_error err = {0};
    bool found = false;
    kiln_chat_section *s = NULL;
    if (!c || (own && !j)) {
        fprintf(stderr, "  cannot read %s\n", own && !j ? jinja : cfg);
    } else if (kiln_chat_compile_mem(c, cl, j, jl, name, &payload, &found, &err) != KILN_OK || !found) {
        fprintf(stderr, "  %s: %s\n", name, found ? err.msg : "no template found");
    } else if (kiln_chat_section_load(payload.data, payload.len, &s, &err) != KILN_OK) {
        fprintf(stderr, "  %s: %s\n", name, err.msg);
    }
    kiln_buf_free(&payload);
    free(c);
    free(j);
    return s;
}

static void test_golden(void) {
    size_t len;
    char *text = slurp(GOLDEN "golden.json", &len);
    KT_REQUIRE(text);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    KT_REQUIRE(root);
    const char *names[] = {"llama3", "qwen3", "mistral", "chatml", "features"};
    kiln_chat_section *secs[5] = {0};
    for (int i = 0; i < 5; i++) {
        secs[i] = section_for(names[i]);
        KT_CHECKF(secs[i] != NULL, "template %s", names[i]);
    }
    size_t i, n_ok = 0, n_cases = 0;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *tn = json_string_value(json_object_get(c, "template"));
        kiln_chat_section *s = NULL;
        for (int k = 0; k < 5; k++)
            if (!strcmp(tn, names[k])) s = secs[k];
        if (!s) continue;
        json_t *msgs = json_object_get(c, "messages"), *m;
        kiln_chat_message mm[16];
        size_t n = 0, j;
        json_array_foreach(msgs, j, m) {
            mm[n].role = json_string_value(json_object_get(m, "role"));
            mm[n++].content = json_string_value(json_object_get(m, "content"));
        }
        kiln_buf out = {0};
        kiln_error err = {0};
        bool gen = json_is_true(json_object_get(c, "add_generation_prompt"));
        kiln_status st = kiln_chat_section_render(s, mm, n, gen, &out, &err);
        const char *want = json_string_value(json_object_get(c, "output"));
        const char *want_err = json_string_value(json_object_get(c, "error"));
        const char *conv = json_string_value(json_object_get(c, "conversation"));
        n_cases++;
        if (want) {
            bool same = st == KILN_OK && out.len == strlen(want) && memcmp(out.data, want, out.len) == 0;
            KT_CHECKF(same, "%s/%s gen=%d: status %d %s\n--- want ---\n%s\n--- got ---\n%.*s", tn, conv, gen, st,
                      err.msg, want, (int)out.len, out.data ? (const char *)out.data : "");
            n_ok += same;
        } else {
            bool same = st == KILN_ERR_INVALID_ARG && strstr(err.msg, want_err) && strstr(err.msg, "raise_exception");
            KT_CHECKF(same, "%s/%s: want the error '%s', got status %d '%s'", tn, conv, want_err, st, err.msg);
            KT_CHECK(out.len == 0);
            n_ok += same;
        }
        kiln_buf_free(&out);
    }
    printf("  %zu/%zu golden renders match transformers\n", n_ok, n_cases);
    KT_CHECK(n_cases >= 72);
    for (int k = 0; k < 5; k++) kiln_chat_section_free(secs[k]);
    json_decref(root);
}

static void test_random(void) {
    size_t len;
    char *text = slurp(GOLDEN "random.json", &len);
    KT_REQUIRE(text);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    KT_REQUIRE(root);
    kiln_chat_message mm[8];
    size_t n = 0, i;
    json_t *m, *c;
    json_array_foreach(json_object_get(root, "messages"), i, m) {
        mm[n].role = json_string_value(json_object_get(m, "role"));
        mm[n++].content = json_string_value(json_object_get(m, "content"));
    }
    kiln_chat_var vars[] = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    size_t same = 0, total = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *src = json_string_value(json_object_get(c, "template"));
        const char *want = json_string_value(json_object_get(c, "output"));
        kiln_chat_template *t = NULL;
        kiln_error err = {0};
        kiln_buf out = {0};
        kiln_status st = kiln_chat_template_parse(src, strlen(src), &t, &err);
        if (st == KILN_OK) st = kiln_chat_template_render(t, mm, n, vars, 2, true, NULL, &out, &err);
        bool ok = want ? st == KILN_OK && out.len == strlen(want) && (!out.len || !memcmp(out.data, want, out.len)) : st != KILN_OK;
        KT_CHECKF(ok, "case %zu: %s\n--- jinja2 ---\n%s\n--- kiln (%d) ---\n%.*s", i, src,
                  want ? want : json_string_value(json_object_get(c, "error")), st,
                  st == KILN_OK ? (int)out.len : (int)strlen(err.msg), st == KILN_OK ? (out.data ? (const char *)out.data : "") : err.msg);
        same += ok;
        total++;
        kiln_buf_free(&out);
        kiln_chat_template_free(t);
    }
    printf("  %zu/%zu random templates agree with jinja2\n", same, total);
    json_decref(root);
}

/* Render `src` with one user message "hi" (and bos_token "<s>"); returns the status, *out the text or error. */
static kiln_status render(const char *src, char *out, size_t cap, const kiln_chat_limits *lim) {
    kiln_chat_template *t = NULL;
    kiln_error err = {0};
    kiln_status st = kiln_chat_template_parse(src, strlen(src), &t, &err);
    if (st == KILN_OK) {
        kiln_chat_message m[2] = {{"user", "hi"}, {"assistant", "yo"}};
        kiln_chat_var v[1] = {{"bos_token", "<s>"}};
        kiln_buf b = {0};
        st = kiln_chat_template_render(t, m, 2, v, 1, true, lim, &b, &err);
        if (st == KILN_OK) snprintf(out, cap, "%.*s", (int)b.len, b.data ? (const char *)b.data : "");
        kiln_buf_free(&b);
    }
    if (st != KILN_OK) snprintf(out, cap, "%s", err.msg);
    kiln_chat_template_free(t);
    return st;
}

#define RENDERS(src, want)                                                           \
    do {                                                                             \
        char got_[4096];                                                             \
        kiln_status st_ = render(src, got_, sizeof got_, NULL);                      \
        KT_CHECKF(st_ == KILN_OK && !strcmp(got_, want), "%s → [%s], want [%s]", src, got_, want); \
    } while (0)

#define REFUSES(src, code, text)                                                     \
    do {                                                                             \
        char got_[4096];                                                             \
        kiln_status st_ = render(src, got_, sizeof got_, NULL);                      \
        KT_CHECKF(st_ == (code) && strstr(got_, text), "%s → %d [%s], want %d [%s]", src, st_, got_, code, text); \
    } while (0)

static void test_whitespace(void) {
    RENDERS("a\n  {% if true %}\nb\n  {% endif %}\nc", "a\nb\nc");        /* lstrip_blocks + trim_blocks */
    RENDERS("a\n  {{ 1 }}\nb", "a\n  1\nb");                              /* neither applies to {{ }} */
    RENDERS("a\n  {# c #}\nb", "a\nb");                                   /* comments like blocks */
    RENDERS("a  {%- if true -%}  \n b {%- endif %}", "ab");
    RENDERS("a \u3000{{- 'x' -}}\u3000 b", "axb");                       /* Python's whitespace set */
    RENDERS("a\n  {%+ if true %}b{% endif +%}\nc", "a\n  b\nc");
    RENDERS("x\r\ny\rz\n", "x\ny\nz");                                    /* newlines; one trailing dropped */
    RENDERS("x\n\n", "x\n");
    RENDERS("a  {% if true %}\nb{% endif %}", "a  b");                    /* lstrip only at a line start */
    RENDERS("{{ '}}' }}{{ {'a': {'b': 1}}['a']['b'] }}", "}}1");          /* ends only outside brackets */
}

static void test_escapes(void) {
    /* the outputs of jinja2 for the same literals */
    char got[256];
    KT_EQ_INT(render("{{ 'a\\qb\\x41\\u00e9\\U0001F600\\'\\\"\\\\\\n\\t|' }}", got, sizeof got, NULL), KILN_OK);
    KT_EQ_STR(got, "a\\qbA\xc3\xa9\xf0\x9f\x98\x80'\"\\\n\t|");
    KT_EQ_INT(render("{{ ('x\\0y'|length) ~ ('x\\0y'[1] == '\\x00') }}", got, sizeof got, NULL), KILN_OK);
    KT_EQ_STR(got, "3True");
    RENDERS("{{ 'line\\\ncont' }}", "linecont");
    REFUSES("{{ 'bad\\x4' }}", KILN_ERR_PARSE, "truncated \\x escape");
    REFUSES("{{ '\\ud800' }}", KILN_ERR_UNSUPPORTED, "not a Unicode scalar value");
}

static void test_semantics(void) {
    RENDERS("{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}", "[]");
    RENDERS("{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }}", "[5][5]5");
    RENDERS("{% if true %}{% set y = 1 %}{% endif %}{{ y }}", "1");
    RENDERS("{{ bos_token }}{{ messages[0].content }}{{ add_generation_prompt }}{{ tools }}", "<s>hiTrueNone");
    RENDERS("{{ nope }}|{{ nope|length }}|{% for x in nope %}x{% endfor %}|{{ nope == nope }}", "|0||True");
    RENDERS("{{ messages[5] is defined }}{{ messages[0].missing is defined }}", "FalseFalse");
    RENDERS("{% for a in messages %}{% for b in messages %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}",
            "121;122;");
    RENDERS("{% for m in messages %}{{ loop.previtem is defined }}{{ (loop.nextitem or {}).role }}{% endfor %}", "FalseassistantTrue");
    char year[16];
    KT_EQ_INT(render("{{ strftime_now('%Y') }}", year, sizeof year, NULL), KILN_OK);
    KT_CHECK(strlen(year) == 4 && year[0] == '2');
    RENDERS("{{ 'a' if false }}|{{ 1 and 'x' }}|{{ 0 or [] }}|{{ not none }}", "|x|[]|True");
    REFUSES("{{ nope.attr }}", KILN_ERR_PARSE, "'nope' is undefined");
    REFUSES("{{ nope + 1 }}", KILN_ERR_PARSE, "'nope' is undefined");
    REFUSES("{{ 'a' + 1 }}", KILN_ERR_PARSE, "unsupported operand types for +: 'str' and 'int'");
    REFUSES("{{ 1 < 'a' }}", KILN_ERR_PARSE, "'<' not supported between instances of 'int' and 'str'");
    REFUSES("{{ 1 // 0 }}", KILN_ERR_PARSE, "division");
    REFUSES("{{ 9223372036854775807 + 1 }}", KILN_ERR_INVALID_ARG, "integer overflow");
    REFUSES("{% set x = 1 %}{% set x.y = 2 %}", KILN_ERR_PARSE, "not a namespace");
    REFUSES("{% set ns = namespace() %}{% set ns._p = 2 %}", KILN_ERR_PARSE, "cannot start with '_'");
    REFUSES("\n\n{{ raise_exception('bad ' ~ messages|length) }}", KILN_ERR_INVALID_ARG, "line 3: raise_exception: bad 2");
}

static void test_refusals(void) {
    REFUSES("{{ messages|groupby('role') }}", KILN_ERR_UNSUPPORTED, "line 1: filter 'groupby' is not supported");
    REFUSES("a\n{% macro f() %}{% endmacro %}", KILN_ERR_UNSUPPORTED, "line 2: tag 'macro' is not supported");
    REFUSES("{{ 'a'.format(1) }}", KILN_ERR_UNSUPPORTED, "method 'format' is not supported");
    REFUSES("{{ cycler(1, 2) }}", KILN_ERR_UNSUPPORTED, "function 'cycler' is not supported");
    REFUSES("{{ messages|selectattr('role', 'matching', 'x')|list }}", KILN_ERR_UNSUPPORTED, "test 'matching' is not supported");
    REFUSES("{{ messages|map('wordcount')|list }}", KILN_ERR_UNSUPPORTED, "filter 'wordcount' is not supported");
    REFUSES("{% if x is callable %}{% endif %}", KILN_ERR_UNSUPPORTED, "test 'callable' is not supported");
    REFUSES("{% include 'x' %}", KILN_ERR_UNSUPPORTED, "tag 'include'");
    REFUSES("{{ '%s' % 1 }}", KILN_ERR_UNSUPPORTED, "string formatting");
    REFUSES("{% if true %}", KILN_ERR_PARSE, "missing '{% endif %}'");
    REFUSES("{% endfor %}", KILN_ERR_PARSE, "unexpected '{% endfor %}'");
    REFUSES("{{ 1 ", KILN_ERR_PARSE, "'{{' is never closed");
    REFUSES("{{ 'abc }}", KILN_ERR_PARSE, "unterminated string");
    REFUSES("{# x", KILN_ERR_PARSE, "comment");
    REFUSES("{{ a b }}", KILN_ERR_PARSE, "expected '}}'");
    REFUSES("{{ ) }}", KILN_ERR_PARSE, "unbalanced");
    REFUSES("{% break %}", KILN_ERR_PARSE, "outside a loop");
    REFUSES("{{ x $ y }}", KILN_ERR_PARSE, "unexpected character '$'");
    char bad[4] = {'a', (char)0xC3, '(', 0};
    REFUSES(bad, KILN_ERR_PARSE, "invalid UTF-8 at byte 1");
}

static void test_caps(void) {
    kiln_chat_limits lim;
    kiln_chat_limits_default(&lim);
    lim.max_output = 1000;
    char got[4096];
    KT_EQ_INT(render("{% for i in range(2000) %}x{% endfor %}", got, sizeof got, &lim), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(got, "exceeds 1000 bytes");
    kiln_chat_limits_default(&lim);
    lim.max_iters = 5000;
    KT_EQ_INT(render("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", got, sizeof got, &lim),
              KILN_ERR_INVALID_ARG);
    KT_CONTAINS(got, "loops run more than 5000 times");
    RENDERS("{{ range(9223372036854775806, 9223372036854775807, 10) }}{{ range(5, -5, -4) }}{{ range(3, 1) }}",
            "[9223372036854775806][5, 1, -3][]");
    RENDERS("{{ ('' * 1000000000000000000)|length }}{{ ([] * 1000000000000000000)|length }}", "00");
    kiln_chat_limits_default(&lim);
    lim.max_steps = 100000;
    KT_EQ_INT(render("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}",
                     got, sizeof got, &lim), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(got, "steps");
    KT_EQ_INT(render("{{ range(1000000) }}", got, sizeof got, NULL), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(got, "range() of more than 100000 items");
    kiln_chat_limits_default(&lim);
    lim.max_memory = 1 << 20;
    KT_EQ_INT(render("{{ 'x' * 100000000 }}", got, sizeof got, &lim), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(render("{% set ns = namespace(s='xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx') %}{% for i in range(100) %}"
                     "{% set ns.s = ns.s + ns.s %}{% endfor %}", got, sizeof got, &lim),
              KILN_ERR_INVALID_ARG);
    KT_CONTAINS(got, "memory cap");
    kiln_chat_limits_default(&lim);
    lim.max_steps = 10000;
    KT_EQ_INT(render("{% for i in range(100000) %}{{ i }}{% endfor %}", got, sizeof got, &lim), KILN_ERR_INVALID_ARG);
    /* nesting */
    char deep[1024] = "{{ ";
    for (int i = 0; i < 200; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 200; i++) strcat(deep, ")");
    strcat(deep, " }}");
    KT_EQ_INT(render(deep, got, sizeof got, NULL), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(got, "nested deeper than 64");
    char blocks[4096] = "";
    for (int i = 0; i < 100; i++) strcat(blocks, "{% if 1 %}");
    KT_EQ_INT(render(blocks, got, sizeof got, NULL), KILN_ERR_UNSUPPORTED);
    /* chains nest without parentheses: 1 + 1 + ... and x|trim|trim... */
    static char chain[200000];
    strcpy(chain, "{{ 1");
    for (int i = 0; i < 30000; i++) strcat(chain + strlen(chain) - 2, " + 1");
    strcat(chain, " }}");
    KT_EQ_INT(render(chain, got, sizeof got, NULL), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(got, "nested deeper than 256");
    strcpy(chain, "{{ 'x'");
    for (int i = 0; i < 300; i++) strcat(chain, "|trim");
    strcat(chain, " }}");
    KT_EQ_INT(render(chain, got, sizeof got, NULL), KILN_ERR_UNSUPPORTED);
    /* values nested at run time */
    KT_EQ_INT(render("{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
                     got, sizeof got, NULL), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(got, "values nested deeper than 64");
    RENDERS("{% set ns = namespace(x=[]) %}{% for i in range(3) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}", "[[[[]]]]");
    char big_ok[512] = "{{ ";
    for (int i = 0; i < 30; i++) strcat(big_ok, "(");
    strcat(big_ok, "7");
    for (int i = 0; i < 30; i++) strcat(big_ok, ")");
    strcat(big_ok, " }}");
    KT_EQ_INT(render(big_ok, got, sizeof got, NULL), KILN_OK);
}

static void test_section(void) {
    /* list-of-named-templates form, the special tokens, a chat_template.jinja winning */
    const char *cfg = "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"pad_token\": null,"
                      "\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                      "{\"name\": \"default\", \"template\": \"{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"}]}";
    kiln_buf p = {0};
    kiln_error err = {0};
    bool found;
    KT_EQ_INT(kiln_chat_compile_mem(cfg, strlen(cfg), NULL, 0, "cfg", &p, &found, &err), KILN_OK);
    KT_CHECK(found);
    kiln_chat_section *s = NULL;
    KT_EQ_INT(kiln_chat_section_load(p.data, p.len, &s, &err), KILN_OK);
    if (s) {
        kiln_chat_message m = {"user", "hi"};
        kiln_buf out = {0};
        KT_EQ_INT(kiln_chat_section_render(s, &m, 1, false, &out, &err), KILN_OK);
        KT_CHECK(out.len == 8 && !memcmp(out.data, "<B>hi<E>", 8));
        kiln_buf_free(&out);
        kiln_chat_section_free(s);
    }
    /* every truncation of the payload is refused or loads cleanly, never crashes */
    for (size_t cut = 0; cut < p.len; cut++) {
        s = NULL;
        kiln_status st = kiln_chat_section_load(p.data, cut, &s, &err);
        KT_CHECK(st != KILN_OK || s);
        kiln_chat_section_free(s);
    }
    kiln_buf_free(&p);
    p = (kiln_buf){0};
    KT_EQ_INT(kiln_chat_compile_mem(cfg, strlen(cfg), "J{{ 1 }}", 8, "jinja", &p, &found, &err), KILN_OK);
    kiln_buf_append(&p, "", 1);
    KT_CHECK(found && strstr((const char *)p.data, "J{{ 1 }}"));
    kiln_buf_free(&p);
    /* no template; an unsupported one refused at compile time with the hint */
    p = (kiln_buf){0};
    KT_EQ_INT(kiln_chat_compile_mem("{}", 2, NULL, 0, "cfg", &p, &found, &err), KILN_OK);
    KT_CHECK(!found && p.len == 0);
    const char *bad = "{\"chat_template\": \"{% for m in messages %}{{ m|groupby('x') }}{% endfor %}\"}";
    KT_EQ_INT(kiln_chat_compile_mem(bad, strlen(bad), NULL, 0, "cfg", &p, &found, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "filter 'groupby' is not supported");
    KT_CONTAINS(err.msg, "--no-chat-template");
    const char *typ = "{\"chat_template\": \"{{ messages[0].content + 1 }}\"}";
    KT_EQ_INT(kiln_chat_compile_mem(typ, strlen(typ), NULL, 0, "cfg", &p, &found, &err), KILN_ERR_PARSE);
    const char *raises = "{\"chat_template\": \"{{ raise_exception('never') }}\"}";
    KT_EQ_INT(kiln_chat_compile_mem(raises, strlen(raises), NULL, 0, "cfg", &p, &found, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "refuses every sample conversation");
    KT_CHECK(!found && p.len == 0);
    /* a section this runtime cannot parse still opens through kiln_chat_from_engine's path: tmpl NULL */
    kiln_chat_section lame = {.error = "chat template: line 1: tag 'macro' is not supported"};
    kiln_buf lo = {0};
    kiln_chat_message lm = {"user", "x"};
    KT_EQ_INT(kiln_chat_section_render(&lame, &lm, 1, true, &lo, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "this runtime cannot render the engine's chat template: chat template: line 1: tag 'macro'");
    const char *junk[] = {"[]", "{\"template\": 1}", "{\"template\": \"x\", \"special_tokens\": []}",
                          "{\"template\": \"{% if %}\"}", "{\"template\": \"x\", \"special_tokens\": {\"a\": 1}}"};
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        s = NULL;
        KT_CHECK(kiln_chat_section_load((const uint8_t *)junk[i], strlen(junk[i]), &s, &err) != KILN_OK && !s);
    }
}

/* The public API on real engines: pycode-22m with Mistral's template as
 * chat_template.jinja, and the same compiled with --no-chat-template. */
static void test_public_api(void) {
    const char *src = KILN_SHARED_DIR "/models/pycode-22m";
    if (!kiln_path_is_dir(src)) {
        KT_SKIP("%s not present", src);
        return;
    }
    const char *dir = KILN_BINARY_DIR "/chat_api_ckpt";
    const char *files[] = {"config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
                           "tokenizer_config.json"};
    mkdir(dir, 0755);
    char a[1024], b[1024];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        unlink(b);
        KT_CHECK(symlink(a, b) == 0);
    }
    size_t jl;
    char *jinja = slurp(GOLDEN "mistral.jinja", &jl);
    KT_REQUIRE(jinja);
    snprintf(b, sizeof b, "%s/chat_template.jinja", dir);
    FILE *f = fopen(b, "wb");
    KT_REQUIRE(f);
    fwrite(jinja, 1, jl, f);
    fclose(f);
    free(jinja);
    for (int drop = 0; drop < 2; drop++) {
        kiln_compile_options o = {.weight_dtype = KILN_DTYPE_COUNT_, .output_path = KILN_BINARY_DIR "/chat_api.kiln",
                                  .no_chat_template = drop};
        kiln_error err = {0};
        KT_CHECKF(kiln_compile(dir, &o, &err) == KILN_OK, "%s", err.msg);
        kiln_t *k = NULL;
        KT_REQUIRE(kiln_open(o.output_path, 1, &k) == KILN_OK);
        KT_EQ_INT(kiln_has_chat_template(k), !drop);
        kiln_chat_message m[3] = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
        char *text = NULL, msg[256];
        size_t len = 0;
        kiln_status st = kiln_chat_render(k, m, 3, 1, &text, &len, msg, sizeof msg);
        if (drop) {
            KT_EQ_INT(st, KILN_ERR_MISSING);
            KT_CONTAINS(msg, "has no chat template");
            KT_CHECK(text == NULL);
        } else {
            KT_EQ_INT(st, KILN_OK);
            KT_EQ_STR(text ? text : "", "<s>[INST] Hi [/INST]Hello</s> [INST] Bye [/INST]");
            KT_CHECK(text && len == strlen(text));
            kiln_chat_text_free(text);
            m[1].role = "user"; /* two users in a row: the template's raise_exception */
            KT_EQ_INT(kiln_chat_render(k, m, 3, 1, &text, NULL, msg, sizeof msg), KILN_ERR_INVALID_ARG);
            KT_CONTAINS(msg, "raise_exception: Conversation roles must alternate");
            KT_EQ_INT(kiln_chat_render(k, NULL, 1, 1, &text, NULL, msg, sizeof msg), KILN_ERR_INVALID_ARG);
            KT_EQ_INT(kiln_chat_render(k, m, -1, 1, &text, NULL, NULL, 0), KILN_ERR_INVALID_ARG);
        }
        kiln_close(k);
    }
    KT_EQ_INT(kiln_has_chat_template(NULL), 0);
}

static void test_bad_messages(void) {
    kiln_chat_template *t = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_chat_template_parse("x", 1, &t, &err) == KILN_OK);
    kiln_buf b = {0};
    kiln_chat_message m[1] = {{"user", NULL}};
    KT_EQ_INT(kiln_chat_template_render(t, m, 1, NULL, 0, false, NULL, &b, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "message 0 has no content");
    m[0].content = "\xff";
    KT_EQ_INT(kiln_chat_template_render(t, m, 1, NULL, 0, false, NULL, &b, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "not valid UTF-8");
    kiln_chat_template_free(t);
}

int main(void) {
    KT_RUN(test_golden);
    KT_RUN(test_random);
    KT_RUN(test_whitespace);
    KT_RUN(test_escapes);
    KT_RUN(test_semantics);
    KT_RUN(test_refusals);
    KT_RUN(test_caps);
    KT_RUN(test_section);
    KT_RUN(test_bad_messages);
    KT_RUN(test_public_api);
    return KT_END();
}
