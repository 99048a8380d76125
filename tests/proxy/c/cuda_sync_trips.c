/* Which synchronizing calls go to the worker: run with HIPR_PROXY_TRACE=1 by
 * tests/proxy/test_cuda_sync_trips.py, which reads the round trips each traced call made
 * between the "== step" lines printed here. A synchronize with nothing asked of the device
 * since the last one is answered without the network; the null stream's synchronize is the
 * device's while no stream is non-blocking; an error keeps the next one remote. With the
 * argument "fork", a forked child then makes a fused launch + synchronize of its own and
 * exits: under HIPR_PROXY_MARKS the marks file must still not exist afterwards (only the
 * process that read the variable writes it, at its own exit). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_proc.h"

static void step(const char *name) { fprintf(stderr, "== %s\n", name); }

int main(int argc, char **argv) {
    PROC(init, (unsigned), "cuInit");
    PROC(retain, (void **, int), "cuDevicePrimaryCtxRetain");
    PROC(set, (void *), "cuCtxSetCurrent");
    PROC(release, (int), "cuDevicePrimaryCtxRelease");
    PROC(alloc, (CUdeviceptr *, size_t), "cuMemAlloc");
    PROC(mfree, (CUdeviceptr), "cuMemFree");
    PROC(memset8, (CUdeviceptr, unsigned char, size_t), "cuMemsetD8");
    PROC(dtoh, (void *, CUdeviceptr, size_t), "cuMemcpyDtoH");
    PROC(load, (CUmodule *, const void *), "cuModuleLoadData");
    PROC(function, (CUfunction *, CUmodule, const char *), "cuModuleGetFunction");
    PROC(launch, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                  unsigned, CUstream, void **, void **), "cuLaunchKernel");
    PROC(ctx_sync, (void), "cuCtxSynchronize");
    PROC(stream_sync, (CUstream), "cuStreamSynchronize");
    PROC(stream_create, (CUstream *, unsigned), "cuStreamCreate");
    PROC(stream_destroy, (CUstream), "cuStreamDestroy");
    PROC(unload, (CUmodule), "cuModuleUnload");
    PROC(stream_query, (CUstream), "cuStreamQuery");
    PROC(event_create, (void **, unsigned), "cuEventCreate");
    PROC(event_record, (void *, CUstream), "cuEventRecord");
    PROC(event_query, (void *), "cuEventQuery");
    PROC(event_sync, (void *), "cuEventSynchronize");
    PROC(event_destroy, (void *), "cuEventDestroy");
    if (failures) return 1;

    EXPECT(init(0) == 0);
    void *ctx = NULL;
    EXPECT(retain(&ctx, 0) == 0 && set(ctx) == 0);
    enum { N = 256 };
    CUdeviceptr a = 0;
    EXPECT(alloc(&a, N * sizeof(float)) == 0);
    CUmodule mod = NULL;
    CUfunction fill = NULL;
    EXPECT(load(&mod, "hipr:builtin") == 0 && function(&fill, mod, "fill_f32") == 0);
    float value = 3.0f;
    unsigned long long n = N;
    void *params[] = {&a, &value, &n};

    /* the first launch asks the kernel's parameter layout */
    EXPECT(launch(fill, 1, 1, 1, N, 1, 1, 0, NULL, params, NULL) == 0);
    step("launch then ctx sync");
    EXPECT(launch(fill, 1, 1, 1, N, 1, 1, 0, NULL, params, NULL) == 0);
    EXPECT(ctx_sync() == 0);
    step("idle ctx sync");
    EXPECT(ctx_sync() == 0);
    step("idle null-stream sync");
    EXPECT(stream_sync(NULL) == 0);
    float back[N];
    step("copy back then sync");
    EXPECT(dtoh(back, a, sizeof back) == 0 && back[0] == 3.0f && back[N - 1] == 3.0f);
    EXPECT(ctx_sync() == 0);
    step("memset then null-stream sync");
    EXPECT(memset8(a, 0, sizeof back) == 0);
    EXPECT(stream_sync(NULL) == 0);
    step("non-blocking stream");
    CUstream s = NULL;
    EXPECT(stream_create(&s, 1) == 0);
    EXPECT(stream_sync(NULL) == 0); /* still idle: nothing asked since the last one */
    EXPECT(memset8(a, 0, sizeof back) == 0);
    EXPECT(stream_sync(NULL) == 0);
    EXPECT(stream_sync(NULL) == 0);
    EXPECT(stream_destroy(s) == 0);
    step("events and queries");
    void *ev = NULL;
    EXPECT(event_create(&ev, 0) == 0);
    EXPECT(event_record(ev, NULL) == 0);
    EXPECT(event_query(ev) == 0 || event_query(ev) == 600); /* 600: CUDA_ERROR_NOT_READY */
    EXPECT(event_sync(ev) == 0);
    EXPECT(ctx_sync() == 0);
    EXPECT(event_query(ev) == 0);
    EXPECT(event_sync(ev) == 0);
    EXPECT(stream_query(NULL) == 0);
    EXPECT(event_destroy(ev) == 0);
    step("error then sync");
    EXPECT(ctx_sync() == 0);
    CUdeviceptr gone = 0;
    EXPECT(alloc(&gone, 4096) == 0 && mfree(gone) == 0);
    EXPECT(memset8(gone, 1, 4096) == 0); /* fire-and-forget: its error comes later */
    EXPECT(ctx_sync() != 0);
    EXPECT(ctx_sync() == 0);
    if (argc > 1 && strcmp(argv[1], "fork") == 0) {
        step("fork");
        fflush(NULL);
        pid_t child = fork();
        if (child == 0) {
            /* The child's own session: the parent's handles are not valid here. */
            CUdeviceptr b = 0;
            CUmodule m2 = NULL;
            CUfunction f2 = NULL;
            int ok = alloc(&b, N * sizeof(float)) == 0 && load(&m2, "hipr:builtin") == 0 &&
                     function(&f2, m2, "fill_f32") == 0;
            void *p2[] = {&b, &value, &n};
            ok = ok && launch(f2, 1, 1, 1, N, 1, 1, 0, NULL, p2, NULL) == 0 && ctx_sync() == 0;
            exit(ok ? 0 : 3); /* exit, not _exit: the library's destructor runs */
        }
        int status = 0;
        EXPECT(child > 0 && waitpid(child, &status, 0) == child);
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        const char *marks = getenv("HIPR_PROXY_MARKS");
        if (marks) EXPECT(access(marks, F_OK) != 0); /* the child wrote none */
    }
    step("end");
    EXPECT(unload(mod) == 0 && mfree(a) == 0);
    EXPECT(release(0) == 0);
    if (failures) return 1;
    puts("ok");
    return 0;
}
