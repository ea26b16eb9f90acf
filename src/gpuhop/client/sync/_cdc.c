/* The dataset chunker's rolling hash in C: the same candidates as the numpy code in
 * chunking.py (which stays as the fallback, and the tests compare the two).
 *
 * H(i) = sum of d[i-k] * P**k for k < 32, modulo 2**32, for every position i >= 31;
 * rolled as H(i) = H(i-1) * P + d[i] - d[i-32] * P**32. A position is a candidate when
 * H(i) < easy_below; out[] gets (i << 1) | (H(i) < hard_below), in increasing i.
 *
 * The positions are split into LANES runs hashed side by side: each run's hash is one
 * chain of multiply-adds, and independent chains keep the CPU's multipliers busy.
 * Built by hatch_build.py (loaded with ctypes: no Python API, any Python version).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define WINDOW 32
#define LANES 4
#define P 0x9E3779B1u

static uint32_t window_hash(const uint8_t *d, size_t i) {
    uint32_t h = 0;
    for (size_t j = i + 1 - WINDOW; j <= i; j++) h = h * P + d[j];
    return h;
}

/* Returns the number of candidates written to out, which must have room for n. */
size_t gpuhop_cdc_candidates(const uint8_t *d, size_t n, uint32_t easy_below,
                             uint32_t hard_below, int64_t *out) {
    if (n < WINDOW) return 0;
    uint32_t pw = 1; /* P**32 */
    for (int k = 0; k < WINDOW; k++) pw *= P;
    size_t first = WINDOW - 1, count = n - first;
    size_t per = (count + LANES - 1) / LANES;
    size_t start[LANES], end[LANES], found[LANES];
    uint32_t h[LANES];
    for (int l = 0; l < LANES; l++) {
        start[l] = first + l * per < n ? first + l * per : n;
        end[l] = start[l] + per < n ? start[l] + per : n;
        found[l] = 0;
    }
    /* Each lane writes its candidates from out[start - first] on: never past its own
     * run's room, so the lanes' lists only need moving together at the end. */
    for (int l = 0; l < LANES; l++) {
        if (start[l] >= end[l]) continue;
        h[l] = window_hash(d, start[l]);
        if (h[l] < easy_below)
            out[start[l] - first + found[l]++] =
                ((int64_t)start[l] << 1) | (h[l] < hard_below);
    }
    size_t common = per;
    for (int l = 0; l < LANES; l++)
        if (end[l] - start[l] < common) common = end[l] - start[l];
    for (size_t s = 1; s < common; s++) {
        for (int l = 0; l < LANES; l++) {
            size_t i = start[l] + s;
            h[l] = h[l] * P + d[i] - d[i - WINDOW] * pw;
            if (h[l] < easy_below)
                out[start[l] - first + found[l]++] = ((int64_t)i << 1) | (h[l] < hard_below);
        }
    }
    for (int l = 0; l < LANES; l++) { /* the runs' ends past the shortest one's */
        for (size_t i = start[l] + (common ? common : 1); i < end[l]; i++) {
            h[l] = h[l] * P + d[i] - d[i - WINDOW] * pw;
            if (h[l] < easy_below)
                out[start[l] - first + found[l]++] = ((int64_t)i << 1) | (h[l] < hard_below);
        }
    }
    size_t total = found[0];
    for (int l = 1; l < LANES; l++) {
        if (found[l]) memmove(out + total, out + (start[l] - first), found[l] * sizeof *out);
        total += found[l];
    }
    return total;
}
