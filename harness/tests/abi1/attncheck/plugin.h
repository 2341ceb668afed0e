/* FROZEN copy of attncheck/plugin.h at ABI 1 (attncheck fd06874). Never edit it: harness/tests builds a
 * plug-in against it to prove that plug-ins built before ABI 2 keep loading and passing. */
/* The attncheck plug-in ABI: a shared library exports one C function returning a table (ABI version first,
 * then name, capabilities and a forward call), and attncheck checks every law against it. Plain C99, only
 * <stddef.h> and <stdint.h>; nothing may throw or longjmp across it: errors are status codes plus a message. */
#ifndef ATTNCHECK_PLUGIN_H
#define ATTNCHECK_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

/** The ABI this header describes. A table with another version is rejected, both numbers named. */
#define ATTNCHECK_PLUGIN_ABI_VERSION 1u

/** Marks the entry point exported from the plug-in's shared library. */
#if defined(_WIN32)
#define ATTNCHECK_PLUGIN_EXPORT __declspec(dllexport)
#else
#define ATTNCHECK_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/** The entry point's symbol name, as the loader looks it up. */
#define ATTNCHECK_PLUGIN_ENTRY_NAME "attncheck_plugin"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, as bits of attncheck_plugin_v1.dtypes and as the value of attncheck_call.dtype.
 * float16 and bfloat16 elements are passed as their raw 16-bit patterns (uint16_t). */
#define ATTNCHECK_DTYPE_F32 0x1u  /**< IEEE binary32, `float` */
#define ATTNCHECK_DTYPE_F64 0x2u  /**< IEEE binary64, `double` */
#define ATTNCHECK_DTYPE_F16 0x4u  /**< IEEE binary16, raw bits in a uint16_t */
#define ATTNCHECK_DTYPE_BF16 0x8u /**< bfloat16 (top half of a binary32), raw bits in a uint16_t */

/* Causal alignment when T_q != T_k, as bits of attncheck_plugin_v1.alignments and attncheck_call.alignment. */
#define ATTNCHECK_ALIGN_TOP_LEFT 0x1u     /**< query i sees keys j <= i (PyTorch's is_causal) */
#define ATTNCHECK_ALIGN_BOTTOM_RIGHT 0x2u /**< query i sees keys j <= i + T_k - T_q (FlashAttention >= 2.1) */

/* Capability flags, as bits of attncheck_plugin_v1.flags. */
#define ATTNCHECK_CAP_RETURNS_WEIGHTS 0x1u /**< forward fills call->weights when it is not NULL */
#define ATTNCHECK_CAP_CUSTOM_SCALE 0x2u    /**< forward honours call->scale when call->has_scale != 0 */
#define ATTNCHECK_CAP_CROSS_LENGTHS 0x4u   /**< accepts T_q != T_k (with the alignments declared) */
#define ATTNCHECK_CAP_NONFINITE_SAFE 0x8u  /**< a NaN/Inf in a future key or value never reaches an output */

/* Status codes forward returns. */
#define ATTNCHECK_OK 0          /**< output (and weights, when asked) written in full */
#define ATTNCHECK_ERROR 1       /**< failed; a message says why */
#define ATTNCHECK_UNSUPPORTED 2 /**< the call is outside what the plug-in supports; a message says what */

/** An input tensor: [B,H,T,D] (element (b,h,i,d) at data + b*strides[0] + h*strides[1] + i*strides[2] +
 *  d*strides[3], strides in elements, not bytes). */
typedef struct attncheck_tensor_in {
  const void* data;
  int64_t shape[4];
  int64_t strides[4];
} attncheck_tensor_in;

/** An output tensor the caller owns: [B,H,T_q,D] for the output, [B,H,T_q,T_k] for weights. Write every
 *  element and nothing outside it. */
typedef struct attncheck_tensor_out {
  void* data;
  int64_t shape[4];
  int64_t strides[4];
} attncheck_tensor_out;

/** One forward call: output = softmax(causal_mask(Q Kᵀ · scale)) V for each (b,h). */
typedef struct attncheck_call {
  uint32_t dtype;     /**< one ATTNCHECK_DTYPE_* bit, the same for every tensor */
  uint32_t alignment; /**< one ATTNCHECK_ALIGN_* bit; only matters when T_q != T_k */
  int32_t has_scale;  /**< 0: use the default scale 1/sqrt(D); otherwise multiply QKᵀ by `scale` */
  double scale;       /**< finite and > 0 when has_scale != 0 */
  attncheck_tensor_in q, k, v;   /**< [B,H,T_q,D], [B,H,T_k,D], [B,H,T_k,D] */
  attncheck_tensor_out output;   /**< [B,H,T_q,D] */
  attncheck_tensor_out* weights; /**< [B,H,T_q,T_k], or NULL when not wanted (or not offered) */
} attncheck_call;

/** The forward call. Writes at most message_size bytes (NUL included) of explanation into `message`
 *  when it does not return ATTNCHECK_OK. Must not throw, longjmp or keep pointers past the return. */
typedef int32_t (*attncheck_forward_fn)(const attncheck_call* call, char* message, size_t message_size);

/** The table a plug-in hands over. Its first field is always the ABI version, so any loader can read it. */
typedef struct attncheck_plugin_v1 {
  uint32_t abi_version; /**< ATTNCHECK_PLUGIN_ABI_VERSION, first, always */
  uint32_t dtypes;      /**< ATTNCHECK_DTYPE_* bits accepted (at least one) */
  uint32_t alignments;  /**< ATTNCHECK_ALIGN_* bits honoured when T_q != T_k; top-left if 0 */
  uint32_t flags;       /**< ATTNCHECK_CAP_* bits */
  int64_t max_T;        /**< the largest T_q and T_k accepted; 0 means no limit */
  const char* name;        /**< short name, e.g. "my-kernel" */
  const char* description; /**< one line, may be NULL */
  attncheck_forward_fn forward;
} attncheck_plugin_v1;

/** The one entry point: returns a table with static storage duration (never NULL). */
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNCHECK_PLUGIN_H */
