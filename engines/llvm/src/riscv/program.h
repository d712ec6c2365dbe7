/* The tables a generated program.c defines for runtime.c. */
#include <stdint.h>

typedef void (*xpu_stage_fn)(void **bufs, const int64_t *syms, int64_t lo, int64_t hi);
enum { XPU_INPUT, XPU_CONST, XPU_VALUE };
struct xpu_slot { int kind; int index; };
struct xpu_stage { xpu_stage_fn fn; int64_t lo, hi; };
struct xpu_step { int nstages; const struct xpu_stage *stages; int nbufs; const struct xpu_slot *bufs; };
struct xpu_tensor { const char *name; const char *descr; int elem_size; int rank; const int64_t *shape; };
struct xpu_output { struct xpu_tensor tensor; struct xpu_slot slot; };

extern const struct xpu_tensor xpu_inputs[];
extern const struct xpu_tensor xpu_values[];
extern const unsigned char *const xpu_consts[];
extern const struct xpu_step xpu_steps[];
extern const struct xpu_output xpu_outputs[];
