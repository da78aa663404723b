// A grammar's token bitmask applied to logits: -inf where a token's bit is clear.
// Bit j of 32-bit word w of a row's mask stands for token 32 w + j (xgrammar's layout).
// Words with every bit set (most of them inside a JSON string) are skipped whole; the others
// are applied a byte at a time through a table of each byte's eight lane masks, branch-free.
#include <stdint.h>
#include <string.h>

#define NEG_INF_BITS 0xff800000u

static uint32_t keep_lanes[256][8];
static int tables_ready;

static void build_tables(void) {
    for (int byte = 0; byte < 256; byte++)
        for (int j = 0; j < 8; j++) keep_lanes[byte][j] = ((byte >> j) & 1) ? 0xffffffffu : 0u;
    tables_ready = 1;
}

static void apply_byte(uint32_t *out, const uint32_t *keep) {
    for (int j = 0; j < 8; j++) out[j] = (out[j] & keep[j]) | (NEG_INF_BITS & ~keep[j]);
}

int tb_apply(float *logits, int64_t logits_stride, const int32_t *bitmask, int64_t words,
             const int64_t *rows, int64_t num_rows, int64_t vocab) {
    if (words * 32 < vocab) return -1;
    if (!tables_ready) build_tables();
    for (int64_t r = 0; r < num_rows; r++) {
        uint32_t *row = (uint32_t *)(logits + rows[r] * logits_stride);
        const uint32_t *mask = (const uint32_t *)(bitmask + r * words);
        int64_t full_words = vocab / 32;
        for (int64_t w = 0; w < full_words; w++) {
            uint32_t bits = mask[w];
            if (bits == 0xffffffffu) continue;
            for (int b = 0; b < 4; b++) apply_byte(row + w * 32 + b * 8, keep_lanes[(bits >> (8 * b)) & 255]);
        }
        for (int64_t t = full_words * 32; t < vocab; t++)  // the last, partial word
            if (!((mask[t / 32] >> (t % 32)) & 1u)) row[t] = NEG_INF_BITS;
    }
    return 0;
}
