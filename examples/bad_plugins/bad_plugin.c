/* Deliberately broken attncheck plug-ins, one per way an implementation can misbehave. Compiled once per
 * BAD_* definition; each is correct naive attention (float32, float64) except for its one misbehaviour, so the
 * harness must report it as a falsified law with a minimal case, and keep going. */
#include <attncheck/plugin.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static uint32_t dtype; /* of the call in progress */

static double at(const attncheck_tensor_in* t, int64_t b, int64_t h, int64_t i, int64_t d) {
  const int64_t n = b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3];
  return dtype == ATTNCHECK_DTYPE_F64 ? ((const double*)t->data)[n] : ((const float*)t->data)[n];
}

static int32_t forward(const attncheck_call* call, char* message, size_t message_size) {
  const int64_t B = call->q.shape[0], H = call->q.shape[1], Tq = call->q.shape[2], D = call->q.shape[3];
  const int64_t Tk = call->k.shape[2];
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
          for (int64_t d = 0; d < D; ++d) s += at(&call->q, b, h, qi, d) * at(&call->k, b, h, j, d);
          w[j] = s * scale;
          if (j == 0 || w[j] > max) max = w[j];
        }
#if defined(BAD_NAN)
        max = 0; /* softmax without subtracting the row max: exp overflows to inf, inf/inf = NaN */
#endif
        for (int64_t j = 0; j <= qi && j < Tk; ++j) sum += (w[j] = exp(w[j] - max));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= qi && j < Tk; ++j) o += w[j] / sum * at(&call->v, b, h, j, d);
          const int64_t n = b * call->output.strides[0] + h * call->output.strides[1] + i * call->output.strides[2] +
                            d * call->output.strides[3];
          if (dtype == ATTNCHECK_DTYPE_F64)
            ((double*)call->output.data)[n] = o;
          else
            ((float*)call->output.data)[n] = (float)o;
        }
      }
  return ATTNCHECK_OK;
}

#ifdef BAD_NO_ENTRY
/* Exports its table under the wrong name: the loader must say which symbol it looked for. */
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin_table(void);
#define ENTRY attncheck_plugin_table
#else
#define ENTRY attncheck_plugin
#endif

ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* ENTRY(void) {
  static const attncheck_plugin_v1 table = {
#ifdef BAD_ABI_VERSION
      .abi_version = 99, /* built against a future plugin.h */
#else
      .abi_version = ATTNCHECK_PLUGIN_ABI_VERSION,
#endif
      .dtypes = ATTNCHECK_DTYPE_F32 | ATTNCHECK_DTYPE_F64,
      .alignments = ATTNCHECK_ALIGN_TOP_LEFT,
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE,
      .max_T = 0,
      .name = "bad-plugin",
      .description = "deliberately broken",
      .forward = forward,
  };
  return &table;
}
