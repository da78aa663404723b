/*
 * What q4_amx.c and q8_amx.c share about Intel's AMX tiles: whether this process may use them,
 * their configuration, and the 16 x 16 transposes between tiles and rows.
 *
 * AMX needs the kernel's permission once per process (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, Linux 5.16 and later); without it the first tile instruction faults.
 * A tile's state is per thread, and other code on the same threads may keep a configuration
 * loaded between its calls (torch's oneDNN micro-kernels remember per thread which one they
 * loaded last and skip loading it again): so a thread saves the configuration it finds, loads
 * ours, and after its last tile instruction loads the saved one again, or releases the tiles
 * where it found none (`amx_enter`, `amx_leave`).
 */
#ifndef PAGODA_AMX_TILES_H
#define PAGODA_AMX_TILES_H

#include <cpuid.h>
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TARGET "amx-tile,amx-bf16,amx-int8,avx512f,avx512vl,avx512bw,avx512bf16,avx2,fma,f16c"
/* A tile's rows at most: the weight rows of a panel, the activation rows of a row tile. */
#define AMX_ROWS 16
#define AMX_TILE_BYTES 1024

#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

enum { AMX_BF16 = 22, AMX_TILE = 24, AMX_INT8 = 25 }; /* CPUID.(7, 0):EDX bits */

/* Tiles of AMX_ROWS activation rows that m rows take. */
static inline int amx_row_tiles(int m) { return (m + AMX_ROWS - 1) / AMX_ROWS; }

struct amx_tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static inline int amx_cpu_has(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    if (!(d & (1u << AMX_TILE)) || !(d & (1u << AMX_BF16)) || !(d & (1u << AMX_INT8)))
        return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16")
        && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* 1 where this CPU has AMX (tiles, BF16 and INT8) and the kernel lets this process use the
 * tiles; asked once per library. */
static inline int amx_permitted(void)
{
    static int state = -1;
    if (state < 0)
        state = amx_cpu_has() && syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM,
                                         AMX_XFEATURE_XTILEDATA) == 0;
    return state;
}

/* Save this thread's tile configuration into *saved (all zeros where none is loaded) and
 * load one of 8 tiles, tile t being rows[t] rows of colsb[t] bytes. */
__attribute__((target(AMX_TARGET), always_inline))
static inline void amx_enter(struct amx_tile_config *saved, const uint8_t rows[8],
                             const uint16_t colsb[8])
{
    struct amx_tile_config config;
    _tile_storeconfig(saved);
    memset(&config, 0, sizeof(config));
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = rows[t];
        config.colsb[t] = colsb[t];
    }
    _tile_loadconfig(&config);
}

/* Give the thread back the configuration amx_enter found (the tiles' contents are not kept). */
__attribute__((target(AMX_TARGET), always_inline))
static inline void amx_leave(const struct amx_tile_config *saved)
{
    if (saved->palette)
        _tile_loadconfig(saved);
    else
        _tile_release();
}

/* r[i] lane j -> r[j] lane i, for 16 registers of 16 dwords. */
__attribute__((target(AMX_TARGET), always_inline))
static inline void amx_transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4G + c]: lane L holds rows 4G..4G+3 of column 4L + c. */
    __m512i u[16];
    for (int g = 0; g < 4; g++) {
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

/* Sums [weight row][activation row] of 16 x 16 (activation rows row0 ..) into y [m, n]'s
 * rows, columns n0 .. n0 + 15: only the rows below m and the columns below n. */
__attribute__((target(AMX_TARGET), always_inline))
static inline void amx_store_transposed(const float *sums, int row0, int m, int n, int n0,
                                        float *y)
{
    __m512i r[AMX_ROWS];
    for (int i = 0; i < AMX_ROWS; i++)
        r[i] = _mm512_load_si512(sums + i * AMX_ROWS);
    amx_transpose16(r);
    int width = n - n0 < AMX_ROWS ? n - n0 : AMX_ROWS;
    __mmask16 columns = (__mmask16)((1u << width) - 1);
    for (int i = 0; i < AMX_ROWS && row0 + i < m; i++)
        _mm512_mask_storeu_ps(y + (size_t)(row0 + i) * n + n0, columns,
                              _mm512_castsi512_ps(r[i]));
}

#endif
