/*
 * face.h - face verification (paper §6.4): wire formats, a deterministic
 * synthetic face generator, local binary pattern (LBP) histograms and their
 * chi-square distance.
 *
 * Shared by the accelerator-side application, the host-centric baseline
 * server (bench/face_baseline.c) and the load tool (bench/face_load.c), so
 * the three compute the very same answer. Plain C11: no allocation, no libc
 * beyond memcpy, no libm, and every function is FACE_HD (__host__
 * __device__ under nvcc), so the same code runs in a CUDA kernel.
 *
 * Wire formats (docs/face-verify.md):
 *
 *   request  (FACE_REQ_LEN = 1036 bytes)
 *     0   12    label: ASCII, padded at the end with NUL or space bytes;
 *               after trimming the padding, 1..12 bytes of 0x21..0x7e
 *     12  1024  image: 32x32 grayscale, row-major, one u8 per pixel
 *
 *   response (FACE_RESP_LEN = 8 bytes)
 *     0   1     match: 1 when distance < FACE_THRESHOLD, else 0
 *     1   3     zero
 *     4   4     chi-square distance, IEEE-754 binary32, little-endian
 *
 *   error response: the 5 bytes "ERROR" (malformed request, unknown label,
 *   back-end failure)
 *
 *   database: memcached key "face:" + trimmed label, value = the 1024-byte
 *   stored image.
 *
 * Method: every pixel gets an 8-neighbour LBP code (borders replicate the
 * edge pixels), mapped to one of 59 uniform-pattern bins; the image is a 4x4
 * grid of 8x8 cells and the descriptor is the 16 cell histograms
 * concatenated (944 bins). Two images are compared by the chi-square
 * distance of their descriptors, sum (a-b)^2/(a+b), computed in 16.16 fixed
 * point with integer sums, so it is bit-identical whatever the summation
 * order (a GPU reduction gives the CPU's result).
 */
#ifndef LYNX_FACE_H
#define LYNX_FACE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define FACE_HD __host__ __device__
#else
#define FACE_HD
#endif

#define FACE_W 32
#define FACE_H 32
#define FACE_PIXELS (FACE_W * FACE_H) /* 1024 */
#define FACE_LABEL_LEN 12
#define FACE_REQ_LEN (FACE_LABEL_LEN + FACE_PIXELS) /* 1036 */
#define FACE_RESP_LEN 8
#define FACE_ERROR "ERROR"
#define FACE_ERROR_LEN 5
#define FACE_KEY_PREFIX "face:"
#define FACE_KEY_PREFIX_LEN 5
#define FACE_KEY_MAX (FACE_KEY_PREFIX_LEN + FACE_LABEL_LEN + 1) /* with NUL */

#define FACE_CELL 8                        /* cell side, pixels */
#define FACE_GRID (FACE_W / FACE_CELL)     /* 4 cells per side */
#define FACE_CELLS (FACE_GRID * FACE_GRID) /* 16 */
#define FACE_LBP_BINS 59                   /* 58 uniform patterns + 1 */
#define FACE_HIST_BINS (FACE_CELLS * FACE_LBP_BINS) /* 944 */
#define FACE_DIST_MAX (2.0f * FACE_PIXELS)          /* chi-square upper bound */

/* Distances below it are a match. Chosen between the genuine and impostor
 * distributions of the synthetic generator (docs/face-verify.md). */
#define FACE_THRESHOLD 540.0f

/* ---- LBP and distance ---- */

/* The 8-neighbour LBP code of pixel (x, y) of a w x h image: bit p is set
 * when neighbour p >= the centre, neighbours in clockwise order starting at
 * the top-left one: p0 (x-1,y-1), p1 (x,y-1), p2 (x+1,y-1), p3 (x+1,y),
 * p4 (x+1,y+1), p5 (x,y+1), p6 (x-1,y+1), p7 (x-1,y). Coordinates outside
 * the image are clamped to the edge. */
FACE_HD uint8_t face_lbp_code(const uint8_t *img, int w, int h, int x, int y);

/* The histogram bin of an LBP code: 0 for 0x00, 1..56 for the patterns
 * with one circular run of 1..7 ones (1 + (ones-1)*8 + position of the
 * run's first bit), 57 for 0xff, 58 for every non-uniform pattern. */
FACE_HD int face_lbp_bin(uint8_t code);

/* The 944-bin descriptor of a 32x32 image: hist[cell*59 + bin], cells in
 * row-major order, each summing to 64. */
FACE_HD void face_histogram(const uint8_t *img, uint16_t *hist);

/* Chi-square distance of two descriptors, 0..FACE_DIST_MAX; symmetric. */
FACE_HD float face_chi2(const uint16_t *a, const uint16_t *b);

/* Compares two 32x32 images: 1 when they show the same face (distance <
 * FACE_THRESHOLD), else 0; *dist gets the distance when dist != NULL. */
FACE_HD int face_verify(const uint8_t *probe, const uint8_t *stored,
                        float *dist);

/* ---- wire formats ---- */

/* Splits a request: 0 and *label, *img pointing into msg, or -1 when len
 * is not FACE_REQ_LEN or the label is malformed. */
FACE_HD int face_req_parse(const void *msg, size_t len, const uint8_t **label,
                           const uint8_t **img);

/* Builds a request into out (FACE_REQ_LEN bytes). */
FACE_HD void face_req_encode(uint8_t *out, const uint8_t *label,
                             const uint8_t *img);

/* The memcached key of a label, NUL-terminated, into key (FACE_KEY_MAX
 * bytes): its length (6..17), or -1 when the label is malformed (empty,
 * a byte outside 0x21..0x7e before the padding, or non-padding after it). */
FACE_HD int face_key(const uint8_t *label, char *key);

/* Writes the 8-byte response. */
FACE_HD void face_resp_encode(uint8_t *out, int match, float dist);

/* Reads a response: 0, or -1 when len != FACE_RESP_LEN, match is not 0/1
 * or the padding is not zero. */
FACE_HD int face_resp_decode(const void *buf, size_t len, int *match,
                             float *dist);

/* ---- deterministic synthetic database ---- */

/* The label of identity index under seed: 12 characters of [0-9a-z]
 * (Crockford base32, lower case), distinct for distinct indices below
 * 2^32 under one seed. */
FACE_HD void face_label(uint64_t seed, uint32_t index, uint8_t *label);

/* The stored (enrolment) image of an identity: a smooth synthetic face
 * whose layout, features and shading depend on (seed, index). */
FACE_HD void face_image(uint64_t seed, uint32_t index, uint8_t *img);

/* Another capture of the same identity: sub-pixel shift, gray-level gain
 * and offset, and pixel noise, all drawn from (seed, index, variant). A
 * genuine probe is face_probe(seed, i, v) sent with face_label(seed, i); an
 * impostor probe is face_probe(seed, j, v) with j != i. */
FACE_HD void face_probe(uint64_t seed, uint32_t index, uint32_t variant,
                        uint8_t *img);

/* An identity other than index among n >= 2, drawn from (seed, index,
 * variant): the impostor for that request. */
FACE_HD uint32_t face_impostor(uint64_t seed, uint32_t index, uint32_t variant,
                               uint32_t n);

#endif
