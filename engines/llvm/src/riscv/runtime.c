/* The runtime of an xpu riscv64 build: reads the program's inputs from .npy files, runs
 * the compiled kernels in order and writes the outputs as .npy files.
 *
 *   program --input NAME=FILE.npy ... --out DIR
 *
 * Everything program-specific (inputs, constants, kernels, outputs) comes from the
 * generated program.c; this file is the same for every build. Errors name the input or
 * file and exit with status 2. */
/* POSIX signals and sigsetjmp under -std=c11 (the vector probe below). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "program.h"

static void die(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(2);
}

#if XPU_RVV
#include <setjmp.h>
#include <signal.h>
#include <sys/auxv.h>

static sigjmp_buf probe_jump;

static void probe_illegal(int sig) {
    (void)sig;
    siglongjmp(probe_jump, 1);
}

/* Whether this CPU runs RVV 1.0: the kernel's hwcap says so, or a `vsetvli` executes (some
 * kernels and emulators do not report V in the hwcap). Kernels built for rv64gcv would
 * otherwise stop on an illegal instruction somewhere in the middle of a run. */
static int cpu_has_vector(void) {
    if (getauxval(AT_HWCAP) & (1UL << ('V' - 'A'))) return 1;
    struct sigaction probe, old;
    memset(&probe, 0, sizeof probe);
    probe.sa_handler = probe_illegal;
    sigemptyset(&probe.sa_mask);
    if (sigaction(SIGILL, &probe, &old) != 0) return 0;
    volatile int ok = 0;
    if (sigsetjmp(probe_jump, 1) == 0) {
        /* vsetvli t0, zero, e32, m1, ta, ma (encoded: the runtime is compiled for rv64gc) */
        __asm__ volatile(".4byte 0x0d0072d7" ::: "t0");
        ok = 1;
    }
    sigaction(SIGILL, &old, NULL);
    return ok;
}
#endif

/* The value of `key` in a .npy header dict, copied into out (at most n bytes). */
static int header_field(const char *h, const char *key, char *out, size_t n) {
    const char *p = strstr(h, key);
    if (!p) return 0;
    p += strlen(key);
    while (*p == ' ' || *p == ':' ) p++;
    size_t i = 0;
    if (*p == '\'') {
        p++;
        while (*p && *p != '\'' && i + 1 < n) out[i++] = *p++;
    } else if (*p == '(') {
        while (*p && *p != ')' && i + 1 < n) out[i++] = *p++;
        if (*p == ')' && i + 1 < n) out[i++] = ')';
    } else {
        while (*p && *p != ',' && *p != '}' && i + 1 < n) out[i++] = *p++;
    }
    out[i] = 0;
    return 1;
}

/* "(2, 3)" or "(4,)" or "()" in canonical form. */
static void shape_text(const struct xpu_tensor *t, char *out, size_t n) {
    size_t k = 0;
    k += snprintf(out + k, n - k, "(");
    for (int d = 0; d < t->rank && k < n; d++)
        k += snprintf(out + k, n - k, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (t->rank == 1 && k < n) k += snprintf(out + k, n - k, ",");
    if (k < n) snprintf(out + k, n - k, ")");
}

static void canonical(const char *in, char *out, size_t n) {
    size_t k = 0;
    for (; *in && k + 1 < n; in++) {
        if (*in == ' ') continue;
        out[k++] = *in;
    }
    out[k] = 0;
}

static int64_t numel(const struct xpu_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->shape[d];
    return n;
}

static void *read_npy(const char *path, const struct xpu_tensor *t) {
    FILE *f = fopen(path, "rb");
    if (!f) die("input %s: cannot open %s", t->name, path);
    unsigned char magic[10];
    if (fread(magic, 1, 10, f) != 10 || memcmp(magic, "\x93NUMPY", 6) != 0)
        die("input %s: %s is not a .npy file", t->name, path);
    size_t hlen;
    if (magic[6] == 1) {
        hlen = magic[8] | (magic[9] << 8);
    } else {
        unsigned char more[2];
        if (fread(more, 1, 2, f) != 2) die("input %s: %s: truncated header", t->name, path);
        hlen = magic[8] | (magic[9] << 8) | (more[0] << 16) | ((size_t)more[1] << 24);
    }
    if (hlen > 65536) die("input %s: %s: header too long", t->name, path);
    char *h = calloc(1, hlen + 1);
    if (!h || fread(h, 1, hlen, f) != hlen) die("input %s: %s: truncated header", t->name, path);
    char descr[32], order[16], shape[256], want[256], a[256], b[256];
    if (!header_field(h, "'descr'", descr, sizeof descr) || strcmp(descr, t->descr) != 0)
        die("input %s: dtype must be %s", t->name, t->descr);
    if (!header_field(h, "'fortran_order'", order, sizeof order) || strncmp(order, "False", 5) != 0)
        die("input %s: %s is in Fortran order; write it C-ordered", t->name, path);
    if (!header_field(h, "'shape'", shape, sizeof shape)) die("input %s: %s has no shape", t->name, path);
    shape_text(t, want, sizeof want);
    canonical(shape, a, sizeof a);
    canonical(want, b, sizeof b);
    if (strcmp(a, b) != 0) die("input %s: shape must be %s", t->name, want);
    free(h);
    size_t bytes = (size_t)numel(t) * t->elem_size;
    void *data = malloc(bytes ? bytes : 1);
    if (!data || fread(data, 1, bytes, f) != bytes) die("input %s: %s: truncated data", t->name, path);
    fclose(f);
    return data;
}

static void write_npy(const char *dir, const struct xpu_tensor *t, const void *data) {
    char path[4096], header[512], shape[256];
    snprintf(path, sizeof path, "%s/%s.npy", dir, t->name);
    FILE *f = fopen(path, "wb");
    if (!f) die("output %s: cannot write %s", t->name, path);
    shape_text(t, shape, sizeof shape);
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     t->descr, shape);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    unsigned short hl = (unsigned short)(n + pad + 1);
    unsigned char le[2] = {hl & 0xff, hl >> 8};
    fwrite(le, 1, 2, f);
    fwrite(header, 1, n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t bytes = (size_t)numel(t) * t->elem_size;
    if (fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) die("output %s: cannot write %s", t->name, path);
}

int main(int argc, char **argv) {
#if XPU_RVV
    if (!cpu_has_vector())
        die("this program is built for %s (RISC-V vector extension 1.0) and this CPU does not "
            "implement it%s; build it for rv64gc (xpuctl build --cpu rv64gc) to run here",
            "rv64gcv", "");
#endif
    const char *out = NULL;
    const char *paths[XPU_INPUTS + 1] = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--input") == 0 && i + 1 < argc) {
            const char *arg = argv[++i];
            const char *eq = strchr(arg, '=');
            if (!eq) die("--input %s: expected NAME=FILE.npy", arg, "");
            int found = 0;
            for (int k = 0; k < XPU_INPUTS; k++) {
                if (strlen(xpu_inputs[k].name) == (size_t)(eq - arg) &&
                    strncmp(xpu_inputs[k].name, arg, eq - arg) == 0) {
                    paths[k] = eq + 1;
                    found = 1;
                }
            }
            if (!found) die("--input %s: the program has no such input", arg, "");
        } else {
            die("unknown argument %s (usage: --input NAME=FILE.npy ... --out DIR)", argv[i], "");
        }
    }
    if (!out) die("missing --out DIR%s", "", "");
    mkdir(out, 0755);
    void *inputs[XPU_INPUTS + 1];
    for (int k = 0; k < XPU_INPUTS; k++) {
        if (!paths[k]) die("missing --input %s=FILE.npy", xpu_inputs[k].name, "");
        inputs[k] = read_npy(paths[k], &xpu_inputs[k]);
    }
    void *values[XPU_VALUES + 1];
    for (int k = 0; k < XPU_VALUES; k++) {
        size_t bytes = (size_t)numel(&xpu_values[k]) * xpu_values[k].elem_size;
        values[k] = calloc(1, bytes ? bytes : 1);
        if (!values[k]) die("out of memory for value %s%s", xpu_values[k].name, "");
    }
    const int64_t syms[1] = {0};
    for (int s = 0; s < XPU_STEPS; s++) {
        const struct xpu_step *st = &xpu_steps[s];
        void *bufs[XPU_MAX_BUFFERS + 1];
        for (int b = 0; b < st->nbufs; b++) {
            const struct xpu_slot *sl = &st->bufs[b];
            bufs[b] = sl->kind == XPU_INPUT ? inputs[sl->index]
                    : sl->kind == XPU_CONST ? (void *)xpu_consts[sl->index]
                    : values[sl->index];
        }
        for (int k = 0; k < st->nstages; k++)
            st->stages[k].fn(bufs, syms, st->stages[k].lo, st->stages[k].hi);
    }
    for (int o = 0; o < XPU_OUTPUTS; o++) {
        const struct xpu_slot *sl = &xpu_outputs[o].slot;
        const void *data = sl->kind == XPU_INPUT ? inputs[sl->index]
                         : sl->kind == XPU_CONST ? (const void *)xpu_consts[sl->index]
                         : values[sl->index];
        write_npy(out, &xpu_outputs[o].tensor, data);
    }
    return 0;
}
