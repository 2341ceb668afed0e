/* Deliberately broken attncheck plug-ins, one per way an implementation can misbehave. Compiled once per
 * BAD_* definition; each is correct naive attention (float32, float64) except for its one misbehaviour, so the
 * harness must report it as a falsified law with a minimal case, and keep going; or, for a table that
 * declares what it cannot (BAD_ABI_VERSION, BAD_NO_ENTRY, BAD_V1_KEY_LENGTHS, BAD_EMPTY_ROWS, BAD_NEGATIVE_MAX_T),
 * refuse it; or, for one declaring what attncheck cannot hold (BAD_HUGE_PAGES), refuse the run up front. */
#include <attncheck/plugin.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(BAD_CRASH_THEN_HANG_STARTUP)
/* Loads once: the first worker leaves a mark in $BAD_STATE_FILE, and every worker started after it hangs while
 * loading (before the handshake ends), as a plug-in whose start-up needs a device the crash left locked. */
__attribute__((constructor)) static void load(void) {
  const char* state = getenv("BAD_STATE_FILE");
  if (!state) return;
  if (access(state, F_OK) == 0)
    for (;;) pause();
  FILE* f = fopen(state, "w");
  if (f) fclose(f);
}
#endif

static uint32_t dtype; /* of the call in progress */

static double at(const attncheck_tensor_in* t, int64_t b, int64_t h, int64_t i, int64_t d) {
  const int64_t n = b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3];
  return dtype == ATTNCHECK_DTYPE_F64 ? ((const double*)t->data)[n] : ((const float*)t->data)[n];
}

static int32_t forward(const attncheck_call* call, char* message, size_t message_size) {
  const int64_t B = call->q.shape[0], H = call->q.shape[1], Tq = call->q.shape[2], D = call->q.shape[3];
  const int64_t Tk = call->k.shape[2], group = H / call->k.shape[1]; /* query head h reads kv head h/group */
  const double scale = call->has_scale ? call->scale : 1.0 / sqrt((double)D);
  int64_t rows = Tq;
  dtype = call->dtype;
#if defined(BAD_CRASH)
  if (Tq >= 3) raise(SIGSEGV); /* dies as a null dereference would, once T reaches 3 */
#elif defined(BAD_HANG)
  if (Tk >= 4)
    for (;;) pause(); /* never returns once T reaches 4; only a kill ends it */
#elif defined(BAD_HANG_ALWAYS)
  for (;;) pause(); /* no call ever returns */
#elif defined(BAD_ERROR)
  if (D % 4 != 0) {
    snprintf(message, message_size, "this kernel needs D to be a multiple of 4, got D = %lld", (long long)D);
    return ATTNCHECK_ERROR;
  }
#elif defined(BAD_WRONG_SIZE)
  rows = Tq + 1; /* off by one: writes a row past the end of the output */
#elif defined(BAD_NON_UTF8)
  /* Bytes that are not UTF-8 (0xFF, 0xFE, a lone continuation byte) in its messages and on stderr. */
  if (D >= 2) {
    snprintf(message, message_size, "bad \xff\xfe bytes \x80 in the message at D = %lld", (long long)D);
    return ATTNCHECK_ERROR;
  }
  if (Tq >= 3) {
    fputs("stderr \xff\xfe\x80 before the crash\n", stderr);
    fflush(stderr);
    raise(SIGSEGV);
  }
#elif defined(BAD_SETSID_CHILD)
  /* Starts a daemon once: a child in a session of its own that outlives the call (and, unless attncheck
   * ends it, the run). */
  static int started = 0;
  if (!started) {
    started = 1;
    if (fork() == 0) {
      setsid();
      if (fork() == 0)
        for (;;) pause();
      _exit(0);
    }
  }
#elif defined(BAD_IGNORE_TERM_HANG)
  signal(SIGTERM, SIG_IGN); /* deaf to SIGTERM... */
  if (Tk >= 4)
    for (;;) pause(); /* ...and hangs once T reaches 4 */
#elif defined(BAD_CRASH_THEN_HANG_STARTUP)
  if (Tq >= 2) raise(SIGSEGV);
#elif defined(BAD_UNWRITTEN)
  /* With an explicit scale, returns OK without writing the last query row (a kernel whose tail tile is launched
   * on one path only): a buffer reused from a call that wrote every row must not pass that call's values off. */
  if (call->has_scale) rows = Tq - 1;
#elif defined(BAD_UNKNOWN_STATUS)
  /* A status plugin.h does not define (an ABI of its own, or a missing return): its outputs mean nothing. */
  snprintf(message, message_size, "status 7 means 'ok, mostly' here");
  return 7;
#endif
  (void)message;
  (void)message_size;
  double w[4096];
  if (Tk > 4096) return ATTNCHECK_UNSUPPORTED;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t qi = i < Tq ? i : Tq - 1;
        double sum = 0, max = 0;
        for (int64_t j = 0; j <= qi && j < Tk; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += at(&call->q, b, h, qi, d) * at(&call->k, b, h / group, j, d);
          w[j] = s * scale;
          if (j == 0 || w[j] > max) max = w[j];
        }
#if defined(BAD_NAN)
        max = 0; /* softmax without subtracting the row max: exp overflows to inf, inf/inf = NaN */
#endif
        for (int64_t j = 0; j <= qi && j < Tk; ++j) sum += (w[j] = exp(w[j] - max));
#if defined(BAD_LSE_FAR)
        if (call->lse) /* the LSE right, then one more value 100,000 doubles past the end of its buffer */
          call->lse->data[b * call->lse->strides[0] + h * call->lse->strides[1] + i * call->lse->strides[2]] =
              max + log(sum);
#endif
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= qi && j < Tk; ++j) o += w[j] / sum * at(&call->v, b, h / group, j, d);
          const int64_t n = b * call->output.strides[0] + h * call->output.strides[1] + i * call->output.strides[2] +
                            d * call->output.strides[3];
          if (dtype == ATTNCHECK_DTYPE_F64)
            ((double*)call->output.data)[n] = o;
          else
            ((float*)call->output.data)[n] = (float)o;
        }
      }
#if defined(BAD_LSE_FAR)
  if (call->lse) call->lse->data[B * H * Tq + 100000] = 0;
#endif
  return ATTNCHECK_OK;
}

#ifdef BAD_D_SINKS_FAR
/* Zero gradients, written where they belong, and one d_sinks value 100,000 doubles past its H entries. */
static int32_t backward(const attncheck_backward_call* bc, char* message, size_t message_size) {
  const attncheck_tensor_out* parts[3] = {&bc->dq, &bc->dk, &bc->dv};
  (void)message;
  (void)message_size;
  for (int p = 0; p < 3; ++p) {
    const attncheck_tensor_out* t = parts[p];
    for (int64_t b = 0; b < t->shape[0]; ++b)
      for (int64_t h = 0; h < t->shape[1]; ++h)
        for (int64_t i = 0; i < t->shape[2]; ++i)
          for (int64_t d = 0; d < t->shape[3]; ++d) {
            const int64_t n = b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3];
            if (bc->forward->dtype == ATTNCHECK_DTYPE_F64)
              ((double*)t->data)[n] = 0;
            else
              ((float*)t->data)[n] = 0;
          }
  }
  if (bc->d_sinks) {
    for (int64_t h = 0; h < bc->dq.shape[1]; ++h) bc->d_sinks[h] = 0;
    bc->d_sinks[bc->dq.shape[1] + 100000] = 0;
  }
  return ATTNCHECK_OK;
}
#endif

#ifdef BAD_DK_SHAPE
/* Zero gradients, but dK and dV written with one head per query head (H) instead of per kv head (H_kv):
 * with grouped heads it writes past the end of both. */
static int32_t backward(const attncheck_backward_call* bc, char* message, size_t message_size) {
  const int64_t B = bc->dq.shape[0], H = bc->dq.shape[1], Tq = bc->dq.shape[2], D = bc->dq.shape[3];
  const int64_t Tk = bc->dk.shape[2];
  const attncheck_tensor_out* parts[3] = {&bc->dq, &bc->dk, &bc->dv};
  (void)message;
  (void)message_size;
  for (int p = 0; p < 3; ++p)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < (p == 0 ? Tq : Tk); ++i)
          for (int64_t d = 0; d < D; ++d) {
            const attncheck_tensor_out* t = parts[p];
            const int64_t n = b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3];
            if (bc->forward->dtype == ATTNCHECK_DTYPE_F64)
              ((double*)t->data)[n] = 0;
            else
              ((float*)t->data)[n] = 0;
          }
  return ATTNCHECK_OK;
}
#endif

#ifdef BAD_NO_ENTRY
/* Exports its table under the wrong name: the loader must say which symbol it looked for. */
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin_table(void);
#define ENTRY attncheck_plugin_table
#else
#define ENTRY attncheck_plugin
#endif

#if defined(BAD_V4_SIZE) || defined(BAD_V4_FLAGS4)
/* An ABI-4 table whose size is not one a table can have, or that declares an ATTNCHECK_CAP4_* bit this attncheck
 * does not know: the loader must say what it expected. */
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* ENTRY(void) {
  static const attncheck_plugin_v4 table = {
#if defined(BAD_V4_SIZE)
      .abi_version = ATTNCHECK_PLUGIN_ABI_V4,
      .table_size = 12, /* no ABI-4 table is 12 bytes */
#else
      ATTNCHECK_PLUGIN_V4_HEADER,
      .flags4 = 0x80000000u,
#endif
      .dtypes = ATTNCHECK_DTYPE_F32,
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE,
      .name = "bad-plugin",
      .description = "deliberately broken",
      .forward = forward,
  };
  return (const attncheck_plugin_v1*)&table;
}
#elif defined(BAD_V3_HEAD_DIMS) || defined(BAD_V3_PAGED_NO_SIZES) || defined(BAD_HUGE_PAGES) || defined(BAD_LSE_FAR) || \
    defined(BAD_D_SINKS_FAR)
/* An ABI-3 table declaring a head-dimension multiple of -8, or paged K and V (both layouts) without a page size:
 * the loader must say what it expected. Or pages of 2^20 keys (the largest the ABI allows), whose pools attncheck
 * cannot hold at its default bounds; or the LSE, or sinks with a backward, whose buffers it writes far past. */
#ifdef BAD_HUGE_PAGES
static const int64_t huge_page[] = {(int64_t)1 << 20};
#endif
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* ENTRY(void) {
  static const attncheck_plugin_v3 table = {
      .abi_version = ATTNCHECK_PLUGIN_ABI_V3,
      .dtypes = ATTNCHECK_DTYPE_F32,
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE,
      .name = "bad-plugin",
      .description = "deliberately broken",
      .forward = forward,
#if defined(BAD_V3_HEAD_DIMS)
      .head_dim_multiple = -8,
#elif defined(BAD_HUGE_PAGES)
      .flags3 = ATTNCHECK_CAP3_PAGED,
      .page_sizes = huge_page,
      .num_page_sizes = 1,
      .page_layouts = ATTNCHECK_PAGED_TOKEN_MAJOR,
#elif defined(BAD_LSE_FAR)
      .flags3 = ATTNCHECK_CAP3_LSE,
#elif defined(BAD_D_SINKS_FAR)
      .flags3 = ATTNCHECK_CAP3_SINKS,
      .backward = backward,
#else
      .flags3 = ATTNCHECK_CAP3_PAGED,
      .page_layouts = ATTNCHECK_PAGED_TOKEN_MAJOR | ATTNCHECK_PAGED_HEAD_MAJOR,
#endif
  };
  return (const attncheck_plugin_v1*)&table;
}
#else
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* ENTRY(void) {
  static const attncheck_plugin_v2 table = {
#if defined(BAD_ABI_VERSION)
      .abi_version = 99, /* built against a future plugin.h */
#elif defined(BAD_V1_KEY_LENGTHS)
      .abi_version = ATTNCHECK_PLUGIN_ABI_V1, /* an ABI-1 table has no field for key lengths... */
#else
      .abi_version = ATTNCHECK_PLUGIN_ABI_V2, /* a v2 table */
#endif
      .dtypes = ATTNCHECK_DTYPE_F32 | ATTNCHECK_DTYPE_F64,
      .alignments = ATTNCHECK_ALIGN_TOP_LEFT,
#if defined(BAD_V1_KEY_LENGTHS)
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_KEY_LENGTHS, /* ...but claims them */
#elif defined(BAD_DK_SHAPE)
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_GQA,
      .backward = backward,
#else
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE,
#endif
#ifdef BAD_EMPTY_ROWS
      .empty_rows = 7, /* none of ATTNCHECK_EMPTY_ROWS_* */
#endif
#if defined(BAD_NEGATIVE_MAX_T)
      .max_T = -1, /* "no limit", as some believe */
#else
      .max_T = 0,
#endif
#if defined(BAD_NON_UTF8)
      .name = "bad-\xff-plugin",
      .description = "deliberately broken \xfe\x80",
#else
      .name = "bad-plugin",
      .description = "deliberately broken",
#endif
      .forward = forward,
  };
  return (const attncheck_plugin_v1*)&table;
}
#endif
