/* Hostile sizes and bodies against the layout and the message parsers, with
 * the code under test compiled into this test with UBSan (signed overflow,
 * shifts, bounds: any report aborts the test; tests/sync.cmake). Before
 * issue 15 a HELLO with two tensors of 2^62 elements overflowed the
 * parameter count. Also SHA-256 against the FIPS 180-2 examples, and the
 * endpoint rules. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DISTRO_WITH_SYNC
#include "common/sha256.h"
#include "sync/sync_internal.h"
#include "testutil.h"

static void hex(const uint8_t *d, char *out) {
  for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

Test(sync_layout, sha256_fips_examples) {
  static const struct {
    const char *msg, *digest;
  } v[] = {
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  uint8_t d[32];
  char h[65];
  for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
    distro__sha256(v[k].msg, strlen(v[k].msg), d);
    hex(d, h);
    cr_assert_str_eq(h, v[k].digest, "SHA-256(\"%s\")", v[k].msg);
  }
  /* One million 'a', fed in uneven pieces (every buffering path). */
  static char a[1000000];
  memset(a, 'a', sizeof a);
  distro__sha256_ctx c;
  distro__sha256_init(&c);
  for (size_t off = 0, step = 1; off < sizeof a; off += step, step = step * 7 % 131 + 1)
    distro__sha256_update(&c, a + off, off + step <= sizeof a ? step : sizeof a - off);
  distro__sha256_final(&c, d);
  hex(d, h);
  cr_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The fragment digest is a SHA-256 tree (1 MiB leaves, hashed in
 * parallel); here computed leaf by leaf from its definition. */
static void tree_ref(const float *x, int64_t n, uint8_t out[32]) {
  const size_t bytes = 4 * (size_t)n, leaf = (size_t)1 << 20;
  uint8_t *buf = malloc(1 + leaf), len[8], d[32];
  distro__sha256_ctx root;
  distro__sha256_init(&root);
  distro__sha256_update(&root, "\x01", 1);
  distro__put_u64(len, bytes);
  distro__sha256_update(&root, len, 8);
  for (size_t off = 0; off < bytes; off += leaf) {
    const size_t k = bytes - off < leaf ? bytes - off : leaf;
    buf[0] = 0;
    memcpy(buf + 1, (const uint8_t *)x + off, k);
    distro__sha256(buf, k + 1, d);
    distro__sha256_update(&root, d, 32);
  }
  distro__sha256_final(&root, out);
  free(buf);
}

Test(sync_layout, fragment_digest_is_the_sha256_tree) {
  const int64_t sizes[] = {1, 1000, 262144, 262145, 600000};
  float *x = malloc(sizeof(float) * 600000);
  tu_rng r = {tu_seed()};
  tu_fill_normal(&r, x, 600000, 1.0f);
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    uint8_t a[32], b[32];
    distro__sy_hash(x, sizes[k], a);
    tree_ref(x, sizes[k], b);
    cr_assert_eq(memcmp(a, b, 32), 0, "%lld floats", (long long)sizes[k]);
    x[sizes[k] - 1] += 1.0f; /* one value changed: another digest */
    distro__sy_hash(x, sizes[k], b);
    cr_assert_neq(memcmp(a, b, 32), 0, "%lld floats: a change went unnoticed", (long long)sizes[k]);
  }
  free(x);
}

static distro_status build(int nt, const int64_t *numel, int P, distro_fragmenting fr, int64_t max_block, int block) {
  distro__sy_layout L;
  const distro_status st = distro__sy_layout_build(&L, nt, numel, NULL, 1, P, fr, max_block, DISTRO_OUTER_INT4, block);
  if (st == DISTRO_OK) {
    /* Every element in exactly one piece. */
    int64_t sum = 0;
    for (int q = 0; q < L.frags.npieces; q++) sum += L.frags.pieces[q].count;
    cr_assert_eq(sum, L.total);
    distro__sy_layout_destroy(&L);
  }
  return st;
}

Test(sync_layout, hostile_sizes_are_refused_without_overflow) {
  const int64_t big2[2] = {(int64_t)1 << 62, (int64_t)1 << 62}, max1[1] = {INT64_MAX}, neg[2] = {5, -7},
                zero[2] = {5, 0}, cap[2] = {(int64_t)1 << 28, (int64_t)1 << 28}, over[3] = {(int64_t)1 << 28, (int64_t)1 << 28, 1},
                small[2] = {192, 64};
  cr_assert_eq(build(2, big2, 4, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_ERR_INVALID, "2 x 2^62 elements");
  cr_assert_eq(build(1, max1, 1, DISTRO_FRAG_SEQUENTIAL, 0, 64), DISTRO_ERR_INVALID, "2^63 - 1 elements");
  cr_assert_eq(build(2, neg, 1, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_ERR_INVALID);
  cr_assert_eq(build(2, zero, 1, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_ERR_INVALID);
  cr_assert_eq(build(3, over, 2, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_ERR_INVALID, "the sum passes 2^29");
  cr_assert_eq(build(2, small, 0, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_ERR_INVALID);
  cr_assert_eq(build(2, small, 5000, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_ERR_INVALID);
  cr_assert_eq(build(2, small, 2, (distro_fragmenting)99, 0, 64), DISTRO_ERR_INVALID);
  cr_assert_eq(build(2, small, 2, DISTRO_FRAG_BALANCED, 0, 0), DISTRO_ERR_INVALID);
  cr_assert_eq(build(2, small, 2, DISTRO_FRAG_BALANCED, 0, INT32_MAX), DISTRO_ERR_INVALID);
  cr_assert_eq(build(0, small, 2, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_ERR_INVALID);
  /* 2^29 parameters in blocks of 1: 2^29 blocks, more than a layout may hold. */
  cr_assert_eq(build(2, cap, 2, DISTRO_FRAG_BALANCED, 1, 64), DISTRO_ERR_INVALID);
  /* The largest job, and a block far larger than any tensor (clamped: same layout). */
  cr_assert_eq(build(2, cap, 4, DISTRO_FRAG_BALANCED, 0, 64), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(build(2, small, 2, DISTRO_FRAG_SEQUENTIAL, INT64_MAX, 64), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(build(2, small, 2, DISTRO_FRAG_BALANCED, -5, 64), DISTRO_OK, "%s", distro_last_error());
}

/* A valid HELLO body: nt tensors, nver versions, endpoint, key. */
static size_t hello(uint8_t *b, int nt, const int64_t *numel, const uint32_t *flags, int nver, const char *ep,
                    const char *key) {
  size_t n = 0;
  distro__put_u32(b, (uint32_t)nt), n = 4;
  for (int i = 0; i < nt; i++) distro__put_u64(b + n, (uint64_t)numel[i]), distro__put_u32(b + n + 8, flags ? flags[i] : 0), n += 12;
  distro__put_u32(b + n, (uint32_t)nver), n += 4;
  for (int i = 0; i < nver; i++) distro__put_u64(b + n, (uint64_t)i), n += 8;
  b[n++] = (uint8_t)strlen(ep), b[n++] = 0;
  memcpy(b + n, ep, strlen(ep)), n += strlen(ep);
  b[n++] = (uint8_t)strlen(key), b[n++] = 0;
  memcpy(b + n, key, strlen(key)), n += strlen(key);
  return n;
}

Test(sync_layout, hostile_hello_bodies) {
  uint8_t b[1024];
  distro__sy_hello h;
  char why[300];
  const int64_t ok[2] = {192, 64}, big2[2] = {(int64_t)1 << 62, (int64_t)1 << 62}, neg[1] = {-1};
  const char *key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
  size_t n = hello(b, 2, ok, NULL, 2, "tcp://127.0.0.1:5555", key);
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), 0, "%s", why);
  cr_assert_eq(h.total, 256);
  cr_assert_str_eq(h.key, key);
  n = hello(b, 2, big2, NULL, 0, "", "");
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "2 x 2^62 elements");
  n = hello(b, 1, neg, NULL, 0, "", "");
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED);
  const uint32_t badflag[2] = {0, 0x80};
  n = hello(b, 2, ok, badflag, 0, "", "");
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "unknown flag bits");
  n = hello(b, 2, ok, NULL, 0, "tcp://evil host:1", "");
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "space in the endpoint");
  n = hello(b, 2, ok, NULL, 0, "pgm://x;y:1", "");
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "other transport");
  n = hello(b, 2, ok, NULL, 0, "", "0123456789012345678901234567890123456789 ");
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "key of 41 characters");
  n = hello(b, 2, ok, NULL, 0, "", "012345678901234567890123456789012345678\x7f");
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "not Z85");
  n = hello(b, 2, ok, NULL, 0, "", "");
  cr_assert_eq(distro__sy_parse_hello(b, n + 1, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "a byte after the end");
  distro__put_u32(b, 0xffffffffu);
  cr_assert_eq(distro__sy_parse_hello(b, n, &h, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "2^32 - 1 tensors");
  /* Every prefix and every single-byte change of a valid body: no UB, and
   * whatever parses has a total within the cap. */
  n = hello(b, 2, ok, NULL, 3, "ipc:///tmp/x.ipc", key);
  tu_rng r = {tu_seed()};
  for (size_t k = 0; k <= n; k++) (void)distro__sy_parse_hello(b, k, &h, why, sizeof why);
  for (int it = 0; it < 20000; it++) {
    uint8_t c[1024];
    memcpy(c, b, n);
    const size_t at = (size_t)(tu_next(&r) % n);
    c[at] = (uint8_t)tu_next(&r);
    if (distro__sy_parse_hello(c, n, &h, why, sizeof why) == 0) {
      cr_assert(h.total >= 1 && h.total <= DISTRO__SY_MAX_NUMEL);
      cr_assert(h.nt >= 1 && h.nt <= DISTRO__SY_MAX_TENSORS);
    }
  }
}

Test(sync_layout, hostile_welcome_bodies) {
  uint8_t b[4096];
  distro__sy_welcome w;
  char why[300];
  /* P 2, codec INT4, block 64, balanced, max_block, tau 2, versions, hashes, one peer. */
  size_t n = 0;
  distro__put_u32(b, 2), distro__put_u32(b + 4, DISTRO_OUTER_INT4), distro__put_u32(b + 8, 64);
  distro__put_u32(b + 12, DISTRO_FRAG_BALANCED), distro__put_u64(b + 16, (uint64_t)INT64_MAX), distro__put_u32(b + 24, 2);
  n = 28;
  memset(b + n, 0, 2 * 72), n += 2 * 72;
  distro__put_u32(b + n, 1), n += 4;
  distro__put_u32(b + n, 3), n += 4;
  const char *ep = "tcp://127.0.0.1:4000";
  b[n++] = (uint8_t)strlen(ep), b[n++] = 0;
  memcpy(b + n, ep, strlen(ep)), n += strlen(ep);
  b[n++] = 0, b[n++] = 0;
  cr_assert_eq(distro__sy_parse_welcome(b, n, &w, why, sizeof why), 0, "%s", why);
  cr_assert_eq(w.npeers, 1);
  cr_assert_str_eq(w.peer[0].endpoint, ep);
  /* A layout from it: the huge max_block is clamped, no overflow. */
  const int64_t numel[2] = {192, 64};
  distro__sy_layout L;
  cr_assert_eq(distro__sy_layout_build(&L, 2, numel, NULL, 1, (int)w.P, (distro_fragmenting)w.fragmenting, w.max_block,
                                       (distro_outer_codec)w.codec, (int)w.block),
               DISTRO_OK, "%s", distro_last_error());
  distro__sy_layout_destroy(&L);
  const uint32_t bad[][2] = {{0, 0}, {0, 5000}, {0, 0xffffffffu}, {4, 99}, {8, 0}, {8, 0xffffffffu}, {12, 7}, {24, 0xffffffffu}};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    uint8_t c[4096];
    memcpy(c, b, n);
    distro__put_u32(c + bad[k][0], bad[k][1]);
    cr_assert_eq(distro__sy_parse_welcome(c, n, &w, why, sizeof why), DISTRO_SYNC_E_MALFORMED, "field at %u = %u",
                 bad[k][0], bad[k][1]);
  }
  tu_rng r = {tu_seed()};
  for (size_t k = 0; k <= n; k++) (void)distro__sy_parse_welcome(b, k, &w, why, sizeof why);
  for (int it = 0; it < 20000; it++) {
    uint8_t c[4096];
    memcpy(c, b, n);
    c[tu_next(&r) % n] = (uint8_t)tu_next(&r);
    if (distro__sy_parse_welcome(c, n, &w, why, sizeof why) == 0)
      cr_assert(w.P >= 1 && w.P <= DISTRO__SY_MAX_FRAGMENTS && w.npeers <= DISTRO__SY_MAX_PEERS);
  }
}

Test(sync_layout, endpoint_rules) {
  char why[200];
  static const struct {
    const char *ep;
    int bind, want;
  } v[] = {
      {"tcp://127.0.0.1:5555", 0, 1}, {"tcp://127.9.8.7:*", 1, 1},  {"tcp://localhost:80", 0, 1},
      {"tcp://[::1]:80", 0, 1},       {"ipc:///tmp/a.ipc", 1, 1},   {"inproc://x", 1, 1},
      {"tcp://0.0.0.0:5555", 1, 0},   {"tcp://*:5555", 1, 0},       {"tcp://10.0.0.1:1", 0, 0},
      {"tcp://eth0:5555", 1, 0},      {"tcp://128.0.0.1:5", 0, 0},  {"tcp://127.0.0.256:5", 0, 0},
      {"tcp://127.0.0.1:*", 0, -1},   {"tcp://127.0.0.1:0", 0, -1}, {"tcp://127.0.0.1:65536", 0, -1},
      {"tcp://127.0.0.1", 0, -1},     {"tcp://:5", 0, -1},          {"tcp://a b:5", 0, -1},
      {"udp://127.0.0.1:5", 0, -1},   {"ipc://", 1, -1},            {"ipc://*", 0, -1},
      {"tcp://[::1:5", 0, -1},        {"tcp://::1:5", 0, -1},       {"", 0, -1},
      {"tcp://a;127.0.0.1:5", 0, -1},
  };
  for (size_t k = 0; k < sizeof v / sizeof *v; k++)
    cr_assert_eq(distro__sy_endpoint_check(v[k].ep, v[k].bind, why, sizeof why), v[k].want, "'%s' (bind %d): %s",
                 v[k].ep, v[k].bind, why);
  cr_assert_eq(distro__sy_endpoint_check(NULL, 0, why, sizeof why), -1);
}
#else
Test(sync_layout, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
