/*
 * fuzz_config.c — libFuzzer target for the config.json parser
 * (kiln_config_parse): any byte string must give KILN_OK or a clean error.
 * On success the invariants the rest of the compiler relies on must hold.
 *
 *   ./fuzz_config -max_total_time=30 fuzz/corpus/config
 */
#include <stdint.h>
#include <stdlib.h>

#include "../compiler/kiln_compiler.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_model_config m;
    kiln_error err;
    if (kiln_config_parse((const char *)data, size, "fuzz/config.json", &m, &err) == KILN_OK) {
        if (m.hidden_size <= 0 || m.n_layers <= 0 || m.n_heads <= 0 || m.n_kv_heads <= 0 ||
            m.n_heads % m.n_kv_heads != 0 || m.head_dim <= 0 || m.head_dim % 2 != 0 || m.vocab_size <= 0 ||
            !(m.rms_norm_eps > 0) || !(m.rope_theta > 0) || m.n_eos < 0 || m.n_eos > KILN_MAX_EOS ||
            m.bos_token_id < -1 || m.bos_token_id >= m.vocab_size || m.sliding_window < 0)
            abort();
        /* GPTQ's dynamic rules over the module names the importer asks about: a group kiln reads, or a
         * clean error (a pattern that backtracks for ages stops at the match limit) */
        static const char *const mods[] = {"model.layers.0.self_attn.q_proj", "model.layers.31.mlp.down_proj"};
        for (int i = 0; i < 2; i++) {
            int group = -1;
            const kiln_gptq_rule *rule = NULL;
            if (kiln_ckpt_quant_module(&m.quant, mods[i], &group, &rule, &err) == KILN_OK &&
                (group < 0 || (rule && rule->skip && group != 0) || (group && m.quant.method == KILN_CKPT_QUANT_GPTQ &&
                                                                   group != 32 && group != 64 && group != 128)))
                abort();
        }
    }
    return 0;
}
