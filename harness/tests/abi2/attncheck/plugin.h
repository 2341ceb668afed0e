/* The attncheck plug-in ABI: a shared library exports one C function returning a table (ABI version first,
 * then name, capabilities, a forward call and, from ABI 2, an optional backward call), and attncheck checks
 * every law against it. Plain C99, only <stddef.h> and <stdint.h>; nothing may throw or longjmp across it:
 * errors are status codes plus a message.
 *
 * ABI 2 only appends: every ABI-1 struct keeps its layout and offsets, so a plug-in built against the ABI-1
 * header keeps loading unchanged (harness/tests/abi1/ holds a frozen copy of that header and proves it). */
#ifndef ATTNCHECK_PLUGIN_H
#define ATTNCHECK_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

/** The versions of the table. attncheck loads both; a table with any other version is rejected, the numbers
 *  named. ABI 1 is an attncheck_plugin_v1 table, ABI 2 an attncheck_plugin_v2 table. */
#define ATTNCHECK_PLUGIN_ABI_V1 1u
#define ATTNCHECK_PLUGIN_ABI_V2 2u
/** The newest ABI this header describes: the version of an attncheck_plugin_v2 table. A table declared as
 *  attncheck_plugin_v1 must say ATTNCHECK_PLUGIN_ABI_V1, never this: the loader would read an ABI-2 tail
 *  that is not there (it rejects a tail it can tell is garbage, but it cannot tell every time). */
#define ATTNCHECK_PLUGIN_ABI_VERSION ATTNCHECK_PLUGIN_ABI_V2

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
/* ABI 2 only: an ABI-1 table that sets one of these is rejected (it has no fields to carry them). */
#define ATTNCHECK_CAP_GQA 0x10u         /**< k, v may have H_kv heads, H_kv dividing H; query head h reads kv head
                                             h / (H / H_kv) (repeat_interleave, FlashAttention, ggml) */
#define ATTNCHECK_CAP_KEY_LENGTHS 0x20u /**< honours call->key_lengths (key padding) */
#define ATTNCHECK_CAP_WINDOW 0x40u      /**< honours call->window (a left sliding window) */

/* What a query row that sees no key returns (all its keys padding, outside the window, or in its future),
 * as attncheck_plugin_v2.empty_rows. Libraries disagree; attncheck's core returns zero. */
#define ATTNCHECK_EMPTY_ROWS_UNSPECIFIED 0u /**< either is accepted; reports say which one it follows */
#define ATTNCHECK_EMPTY_ROWS_ZERO 1u        /**< output 0, weights 0 (FlashAttention) */
#define ATTNCHECK_EMPTY_ROWS_NAN 2u         /**< NaN (PyTorch's math path: softmax of an all -inf row) */

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

/** One forward call: output = softmax(mask(Q Kᵀ · scale)) V for each (b,h), the mask being causal (with
 *  the call's alignment), and from ABI 2 also key padding and a sliding window. With aligned position
 *  p = i (top-left) or i + T_k - T_q (bottom-right), query i of batch entry b sees exactly the keys j with
 *  j <= p, j < key_lengths[b] (when given) and j >= p - window (when window >= 0). */
typedef struct attncheck_call {
  uint32_t dtype;     /**< one ATTNCHECK_DTYPE_* bit, the same for every tensor */
  uint32_t alignment; /**< one ATTNCHECK_ALIGN_* bit; only matters when T_q != T_k */
  int32_t has_scale;  /**< 0: use the default scale 1/sqrt(D); otherwise multiply QKᵀ by `scale` */
  double scale;       /**< finite and > 0 when has_scale != 0 */
  /** [B,H,T_q,D], [B,H_kv,T_k,D], [B,H_kv,T_k,D]; H_kv = H unless the plug-in declares ATTNCHECK_CAP_GQA */
  attncheck_tensor_in q, k, v;
  attncheck_tensor_out output;   /**< [B,H,T_q,D] */
  attncheck_tensor_out* weights; /**< [B,H,T_q,T_k], or NULL when not wanted (or not offered) */
  /* ABI 2: an ABI-1 plug-in never reads the fields below, and attncheck never sends it a call that needs
   * them (its flags cannot declare them). */
  /** B entries: keys j >= key_lengths[b] of batch entry b are padding (0 <= key_lengths[b] <= T_k); NULL: no
   *  padding. Always NULL unless the plug-in declares ATTNCHECK_CAP_KEY_LENGTHS. */
  const int64_t* key_lengths;
  /** < 0: no window; else the query at aligned position p sees keys p - window .. p only. Always < 0 unless
   *  the plug-in declares ATTNCHECK_CAP_WINDOW. */
  int64_t window;
} attncheck_call;

/** The forward call. Writes at most message_size bytes (NUL included) of explanation into `message`
 *  when it does not return ATTNCHECK_OK. Must not throw, longjmp or keep pointers past the return. */
typedef int32_t (*attncheck_forward_fn)(const attncheck_call* call, char* message, size_t message_size);

/** One backward call (ABI 2): the gradients of L = sum(output ∘ d_output) with respect to q, k and v, for the
 *  forward call `forward` describes (its inputs and options). In a backward call forward->output is a
 *  scratch buffer [B,H,T_q,D] the plug-in may use (to recompute O, say); what it holds afterwards is ignored.
 *  forward->weights is NULL. Every tensor has the call's dtype. */
typedef struct attncheck_backward_call {
  const attncheck_call* forward;
  attncheck_tensor_in d_output; /**< dO [B,H,T_q,D] */
  /** dQ [B,H,T_q,D]; dK, dV [B,H_kv,T_k,D]: the gradient of a kv head shared by a group of query heads sums
   *  over the group. Write every element and nothing outside them. */
  attncheck_tensor_out dq, dk, dv;
} attncheck_backward_call;

/** The backward call (ABI 2): same status codes and message rules as the forward call. */
typedef int32_t (*attncheck_backward_fn)(const attncheck_backward_call* call, char* message, size_t message_size);

/** The table a plug-in hands over. Its first field is always the ABI version, so any loader can read it. */
typedef struct attncheck_plugin_v1 {
  uint32_t abi_version; /**< ATTNCHECK_PLUGIN_ABI_V1 for this table, first, always */
  uint32_t dtypes;      /**< ATTNCHECK_DTYPE_* bits accepted (at least one) */
  uint32_t alignments;  /**< ATTNCHECK_ALIGN_* bits honoured when T_q != T_k; top-left if 0 */
  uint32_t flags;       /**< ATTNCHECK_CAP_* bits */
  int64_t max_T;        /**< the largest T_q and T_k accepted; 0 means no limit */
  const char* name;        /**< short name, e.g. "my-kernel" */
  const char* description; /**< one line, may be NULL */
  attncheck_forward_fn forward;
} attncheck_plugin_v1;

/** The ABI-2 table: every field of attncheck_plugin_v1 in the same order (so the same offsets), then the
 *  ABI-2 fields. abi_version is ATTNCHECK_PLUGIN_ABI_V2; the entry point returns it cast to
 *  `const attncheck_plugin_v1*`, and the loader casts it back after reading the version. */
typedef struct attncheck_plugin_v2 {
  uint32_t abi_version; /**< ATTNCHECK_PLUGIN_ABI_V2 (= ATTNCHECK_PLUGIN_ABI_VERSION), first, always */
  uint32_t dtypes;      /**< ATTNCHECK_DTYPE_* bits accepted (at least one) */
  uint32_t alignments;  /**< ATTNCHECK_ALIGN_* bits honoured when T_q != T_k; top-left if 0 */
  uint32_t flags;       /**< ATTNCHECK_CAP_* bits, the ABI-2 ones included */
  int64_t max_T;        /**< the largest T_q and T_k accepted; 0 means no limit */
  const char* name;        /**< short name, e.g. "my-kernel" */
  const char* description; /**< one line, may be NULL */
  attncheck_forward_fn forward;
  /* ABI 2 */
  uint32_t empty_rows;            /**< one ATTNCHECK_EMPTY_ROWS_* value */
  uint32_t reserved;              /**< 0 */
  attncheck_backward_fn backward; /**< NULL: forward only (attncheck then checks the forward laws only) */
} attncheck_plugin_v2;

/** The one entry point: returns a table with static storage duration (never NULL): an attncheck_plugin_v1,
 *  or an attncheck_plugin_v2 cast to this type (its abi_version says which). */
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNCHECK_PLUGIN_H */
