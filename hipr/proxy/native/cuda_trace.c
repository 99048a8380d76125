/* HIPR_PROXY_TRACE=1: every driver entry point cuGetProcAddress hands out (served or a
 * stub) is wrapped so that each call prints its name and CUresult on stderr. The CUDA
 * runtime, cuBLAS and PyTorch reach the driver through cuGetProcAddress, so this shows
 * what a library asks for and which answer made it give up, without knowing any
 * signature: a trampoline swaps the caller's return address for its own (kept on a
 * per-thread stack), jumps to the entry point with every argument register and stack
 * argument untouched, and on return prints the result and goes back to the caller.
 * Off (the variable unset) nothing is wrapped and the lookup costs one load. x86-64 only;
 * elsewhere the trace prints the lookups alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <sys/uio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

/* Not cuda_front.h: the export-table spy (tests/proxy/cuda/build_spy.py) builds this file
 * where libcbor's headers are not installed. */
#include <pthread.h>

#include "cuda_trace.h"
#include "cuda_types.h"

CUresult cuGetErrorName(CUresult error, const char **str);

/* The core's per-thread count of round trips (client.c). Weak: the export-table spy builds
 * this file without the core, and then no call is counted as having waited. */
__attribute__((weak)) unsigned hipr_round_trips(void);
static unsigned round_trips(void) { return hipr_round_trips ? hipr_round_trips() : 0; }

#define SLOTS 1024 /* entry points wrapped, at most (NVIDIA's driver exports ~600) */
#define DEPTH 256  /* nested traced calls per thread (host callbacks calling the driver) */

static int trace_on = -1;
static int trace_args; /* HIPR_PROXY_TRACE=2: arguments and what they point at, too */

static void install_crash_report(void);

int hipr_cu_trace_enabled(void) {
    int on = __atomic_load_n(&trace_on, __ATOMIC_RELAXED);
    if (on < 0) {
        const char *v = getenv("HIPR_PROXY_TRACE");
        on = v && *v && strcmp(v, "0") != 0;
        trace_args = on && strcmp(v, "2") == 0;
        if (on && __atomic_exchange_n(&trace_on, on, __ATOMIC_RELAXED) < 0)
            install_crash_report();
        __atomic_store_n(&trace_on, on, __ATOMIC_RELAXED);
    }
    return on;
}

/* The driver call the crashing thread was in, or returned from last. */
static __thread const char *tl_last;
static __thread int tl_inside;

static void describe(const char *what, uintptr_t address) {
    Dl_info info;
    if (address && dladdr((void *)address, &info) && info.dli_fname)
        fprintf(stderr, "hipr trace:   %s %#lx = %s(%s+%#lx)\n", what, (unsigned long)address,
                info.dli_fname, info.dli_sname ? info.dli_sname : "?",
                (unsigned long)(address - (uintptr_t)(info.dli_saddr ? info.dli_saddr
                                                                      : info.dli_fbase)));
    else
        fprintf(stderr, "hipr trace:   %s %#lx\n", what, (unsigned long)address);
}

/* A crash under HIPR_PROXY_TRACE says where it happened and after which driver call (a
 * runtime calling an empty slot of a private export table jumps to address 0: its caller
 * is then the word on top of the stack). Diagnostics only: the process dies as before
 * (SA_RESETHAND puts the default action back, and the fault repeats on return). */
static void crash_report(int sig, siginfo_t *info, void *context) {
    uintptr_t pc = 0, sp = 0;
#if defined(__x86_64__) && defined(__linux__)
    const ucontext_t *uc = context;
    pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#else
    (void)context;
#endif
    fprintf(stderr, "hipr trace: signal %d (fault address %#lx) %s %s\n", sig,
            (unsigned long)(uintptr_t)info->si_addr, tl_inside ? "inside" : "after",
            tl_last ? tl_last : "no traced driver call");
    describe("pc", pc);
    if (sp && pc < 4096) describe("called from", *(const uintptr_t *)sp);
}

static void install_crash_report(void) {
    static const int signals[] = {SIGSEGV, SIGBUS, SIGILL};
    for (size_t i = 0; i < sizeof signals / sizeof *signals; i++) {
        struct sigaction old;
        if (sigaction(signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = crash_report;
        sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(signals[i], &sa, NULL);
    }
}

#if defined(__x86_64__) && defined(__linux__)

static struct {
    const char *name;
    void *fn;
} slots[SLOTS];
static int n_slots;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread uintptr_t tl_return[DEPTH];
static __thread int tl_slot[DEPTH];
static __thread uint64_t tl_args[DEPTH][6];
static __thread int tl_depth;
static __thread unsigned tl_trips[DEPTH]; /* hipr_round_trips() when each call began */

/* The 8 bytes at `p` after the call (an out-parameter's value), read without faulting
 * when `p` is no pointer: process_vm_readv on this process says EFAULT instead. */
static int peek(uint64_t p, uint64_t *out) {
    if (p < 4096 || p >= ((uint64_t)1 << 47)) return 0;
    struct iovec local = {out, sizeof *out}, remote = {(void *)(uintptr_t)p, sizeof *out};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)sizeof *out;
}

/* Called by the trampoline of slot `i` before the entry point: keeps the caller's return
 * address (and, traced with arguments, the six integer argument registers at `regs`) and
 * gives the entry point to jump to. */
__attribute__((visibility("hidden"), used)) void *hipr_cu_trace_enter(int i, uintptr_t ret,
                                                                       const uint64_t *regs) {
    if (tl_depth >= DEPTH) {
        fprintf(stderr, "hipr proxy: trace: more than %d nested driver calls\n", DEPTH);
        abort();
    }
    tl_return[tl_depth] = ret;
    tl_slot[tl_depth] = i;
    if (trace_args) memcpy(tl_args[tl_depth], regs, sizeof tl_args[tl_depth]);
    tl_trips[tl_depth] = round_trips();
    tl_depth++;
    tl_last = slots[i].name;
    tl_inside = 1;
    return slots[i].fn;
}

/* Called after the entry point returned `rc`: prints, and gives the caller's address. */
__attribute__((visibility("hidden"), used)) uintptr_t hipr_cu_trace_leave(int rc) {
    tl_depth--;
    const char *name = slots[tl_slot[tl_depth]].name;
    tl_last = name;
    tl_inside = tl_depth > 0;
    const char *err = NULL;
    if (rc && cuGetErrorName((CUresult)rc, &err) != CUDA_SUCCESS) err = NULL;
    char args[512] = "";
    if (trace_args) {
        /* The registers as passed, then what each that is a pointer points at now. */
        const uint64_t *a = tl_args[tl_depth];
        int n = snprintf(args, sizeof args, "(%#lx, %#lx, %#lx, %#lx, %#lx, %#lx)",
                         (unsigned long)a[0], (unsigned long)a[1], (unsigned long)a[2],
                         (unsigned long)a[3], (unsigned long)a[4], (unsigned long)a[5]);
        for (int k = 0; k < 6 && n > 0 && (size_t)n < sizeof args; k++) {
            uint64_t v;
            if (peek(a[k], &v))
                n += snprintf(args + n, sizeof args - (size_t)n, " *a%d=%#lx", k,
                              (unsigned long)v);
        }
    }
    /* Which calls went to the worker and waited: the ones a program's speed hangs on. */
    unsigned trips = round_trips() - tl_trips[tl_depth];
    char waited[48] = "";
    if (trips) snprintf(waited, sizeof waited, " (%u round trip%s)", trips, trips > 1 ? "s" : "");
    if (rc)
        fprintf(stderr, "hipr trace: %s%s -> %d %s%s\n", name, args, rc, err ? err : "(unknown)",
                waited);
    else
        fprintf(stderr, "hipr trace: %s%s -> 0%s\n", name, args, waited);
    return tl_return[tl_depth];
}

/* SLOTS trampolines of 16 bytes: slot i loads i into r11 (not an argument register) and
 * joins the common part. After `pop` of the return address the stack is as the caller
 * laid it out less that word; `call *%r11` puts our own return address in its place, so
 * stack arguments are where the entry point expects them. */
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        "hipr_cu_trace_slots:\n"
        ".set hipr_slot_i, 0\n"
        ".rept 1024\n"
        ".p2align 4\n"
        "endbr64\n"
        "movl $hipr_slot_i, %r11d\n"
        "jmp hipr_cu_trace_common\n"
        ".set hipr_slot_i, hipr_slot_i + 1\n"
        ".endr\n"
        "hipr_cu_trace_common:\n"
        "popq %r10\n"
        /* 6 integer and 8 vector argument registers; rsp stays 16-aligned */
        "subq $176, %rsp\n"
        "movq %rdi, 0(%rsp)\n"
        "movq %rsi, 8(%rsp)\n"
        "movq %rdx, 16(%rsp)\n"
        "movq %rcx, 24(%rsp)\n"
        "movq %r8, 32(%rsp)\n"
        "movq %r9, 40(%rsp)\n"
        "movdqu %xmm0, 48(%rsp)\n"
        "movdqu %xmm1, 64(%rsp)\n"
        "movdqu %xmm2, 80(%rsp)\n"
        "movdqu %xmm3, 96(%rsp)\n"
        "movdqu %xmm4, 112(%rsp)\n"
        "movdqu %xmm5, 128(%rsp)\n"
        "movdqu %xmm6, 144(%rsp)\n"
        "movdqu %xmm7, 160(%rsp)\n"
        "movl %r11d, %edi\n"
        "movq %r10, %rsi\n"
        "movq %rsp, %rdx\n"
        "call hipr_cu_trace_enter\n"
        "movq %rax, %r11\n"
        "movq 0(%rsp), %rdi\n"
        "movq 8(%rsp), %rsi\n"
        "movq 16(%rsp), %rdx\n"
        "movq 24(%rsp), %rcx\n"
        "movq 32(%rsp), %r8\n"
        "movq 40(%rsp), %r9\n"
        "movdqu 48(%rsp), %xmm0\n"
        "movdqu 64(%rsp), %xmm1\n"
        "movdqu 80(%rsp), %xmm2\n"
        "movdqu 96(%rsp), %xmm3\n"
        "movdqu 112(%rsp), %xmm4\n"
        "movdqu 128(%rsp), %xmm5\n"
        "movdqu 144(%rsp), %xmm6\n"
        "movdqu 160(%rsp), %xmm7\n"
        "addq $176, %rsp\n"
        "xorl %eax, %eax\n"
        "call *%r11\n"
        "pushq %rax\n"
        "subq $8, %rsp\n"
        "movl %eax, %edi\n"
        "call hipr_cu_trace_leave\n"
        "movq %rax, %r10\n"
        "addq $8, %rsp\n"
        "popq %rax\n"
        "pushq %r10\n"
        "ret\n"
        ".popsection\n");

extern char hipr_cu_trace_slots[] __attribute__((visibility("hidden")));

void *hipr_cu_trace_wrap(const char *name, void *fn) {
    if (!fn) return fn;
    /* a pointer handed out already wraps itself: never wrap a trampoline */
    if ((char *)fn >= hipr_cu_trace_slots && (char *)fn < hipr_cu_trace_slots + 16 * SLOTS)
        return fn;
    pthread_mutex_lock(&slots_lock);
    void *out = NULL;
    for (int i = 0; i < n_slots && !out; i++)
        if (slots[i].fn == fn) out = hipr_cu_trace_slots + 16 * i;
    if (!out && n_slots < SLOTS) {
        /* the caller's string may not outlive the lookup; kept for the process */
        slots[n_slots].name = strdup(name ? name : "?");
        slots[n_slots].fn = fn;
        out = hipr_cu_trace_slots + 16 * n_slots;
        n_slots++;
    }
    pthread_mutex_unlock(&slots_lock);
    return out ? out : fn;
}

const void *hipr_cu_trace_table(const char *tag, const void *table, size_t n, size_t first) {
    void **copy = malloc(n * sizeof *copy);
    if (!copy) return table;
    memcpy(copy, table, n * sizeof *copy);
    for (size_t i = first; i < n; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s[%zu]", tag, i);
        copy[i] = hipr_cu_trace_wrap(name, copy[i]);
    }
    return copy; /* kept for the process, as the tables are */
}

#else

void *hipr_cu_trace_wrap(const char *name, void *fn) {
    (void)name;
    return fn;
}

const void *hipr_cu_trace_table(const char *tag, const void *table, size_t n, size_t first) {
    (void)tag, (void)n, (void)first;
    return table;
}

#endif
