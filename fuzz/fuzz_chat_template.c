/*
 * fuzz_chat_template.c — libFuzzer target for the chat-template interpreter
 * (runtime/kiln_chat.h). The first byte modulo 3 picks the mode:
 *
 *   0  the rest is a template: parse it, and if it parses, render it against
 *      a fixed conversation, with and without the generation prompt;
 *   1  the rest is message contents separated by NUL bytes, rendered by a
 *      fixed template that uses the string methods, slices and loops of the
 *      Qwen3 and Llama 3 templates;
 *   2  the rest is an engine chat section (JSON): load it, render it.
 *
 * Any input must end in KILN_OK or a clean error (never KILN_ERR_INTERNAL),
 * within the small caps set here, so a hostile template cannot hang or
 * exhaust memory.
 *
 *   ./fuzz_chat_template -max_total_time=30 fuzz/corpus/chat_template
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fixed_template[] =
    "{%- set ns = namespace(last=messages|length - 1) %}"
    "{%- for m in messages[::-1] %}{% if m.role == 'user' and not m.content.startswith('<tool') %}"
    "{% set ns.last = (messages|length - 1) - loop.index0 %}{% endif %}{% endfor %}"
    "{{- bos_token }}{%- for m in messages %}"
    "{%- set content = m.content %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "<|{{ m.role }}|>{{ content | trim }}{% if reasoning is defined %}[{{ reasoning.strip('\\n') }}]{% endif %}"
    "{{ content[1:4] ~ content[::-2] ~ (content|length) }}{{ content.replace('a', 'bb').upper() }}"
    "{{ content.split() | tojson }}{{ {'c': content} | tojson(indent=1) }}{{ content.endswith(('x', '\\n')) }}"
    "{%- if loop.index0 > ns.last %}!{% endif %}{{ eos_token if loop.last }}"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

static void check(kiln_status st, const kiln_buf *out, const kiln_chat_limits *lim) {
    if (st == KILN_ERR_INTERNAL) abort();
    if (st == KILN_OK && out->len > lim->max_output) abort();
    if (st != KILN_OK && out->len != 0) abort(); /* a failed render leaves nothing behind */
}

static void render(const kiln_chat_template *t, const kiln_chat_message *m, size_t n) {
    static const kiln_chat_var vars[] = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    kiln_chat_limits lim;
    kiln_chat_limits_default(&lim);
    lim.max_output = 1 << 16;
    lim.max_memory = 8 << 20;
    lim.max_iters = 20000;
    lim.max_steps = 200000;
    for (int gen = 0; gen < 2; gen++) {
        kiln_buf out = {0};
        kiln_error err;
        kiln_status st = kiln_chat_template_render(t, m, n, vars, 2, gen, &lim, &out, &err);
        check(st, &out, &lim);
        kiln_buf_free(&out);
    }
}

static void fuzz_template(const uint8_t *data, size_t size) {
    static const kiln_chat_message conv[] = {
        {"system", "You are helpful."}, {"user", "Hi {{ x }}"}, {"assistant", "<think>\nhm\n</think>\n\nHello!"},
        {"user", "Grüße 🎉"}};
    kiln_chat_template *t = NULL;
    kiln_error err;
    kiln_status st = kiln_chat_template_parse((const char *)data, size, &t, &err);
    if (st == KILN_ERR_INTERNAL || (st == KILN_OK) != (t != NULL)) abort();
    if (t) render(t, conv, 4);
    kiln_chat_template_free(t);
}

static void fuzz_messages(const uint8_t *data, size_t size) {
    static kiln_chat_template *t;
    kiln_error err;
    if (!t && kiln_chat_template_parse(fixed_template, strlen(fixed_template), &t, &err) != KILN_OK) abort();
    char *copy = malloc(size + 1);
    if (!copy) return;
    memcpy(copy, data, size);
    copy[size] = 0;
    kiln_chat_message m[8];
    size_t n = 0;
    static const char *const roles[] = {"system", "user", "assistant", "user", "assistant", "tool", "user", "assistant"};
    for (char *p = copy; n < 8 && p <= copy + size; p += strlen(p) + 1) {
        m[n].role = roles[n];
        m[n].content = p;
        n++;
    }
    render(t, m, n);
    free(copy);
}

static void fuzz_section(const uint8_t *data, size_t size) {
    static const kiln_chat_message conv[] = {{"user", "Hi"}, {"assistant", "Hello"}};
    kiln_chat_section *c = NULL;
    kiln_error err;
    kiln_status st = kiln_chat_section_load(data, size, &c, &err);
    if (st == KILN_ERR_INTERNAL || (st == KILN_OK) != (c != NULL)) abort();
    if (!c) return;
    kiln_chat_limits lim;
    kiln_chat_limits_default(&lim);
    lim.max_output = 1 << 16;
    lim.max_memory = 8 << 20;
    lim.max_iters = 20000;
    lim.max_steps = 200000;
    kiln_buf out = {0};
    st = kiln_chat_template_render(c->tmpl, conv, 2, c->vars, c->n_vars, true, &lim, &out, &err);
    check(st, &out, &lim);
    kiln_buf_free(&out);
    kiln_chat_section_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_template(data + 1, size - 1); break;
    case 1: fuzz_messages(data + 1, size - 1); break;
    default: fuzz_section(data + 1, size - 1); break;
    }
    return 0;
}
