/* Stream capture and graphs of the CUDA driver API, as far as the worker serves them
 * (graph_wire.c, shared with the HIP front): captures of created streams answered from
 * the process's table of capturing streams, graphs built by capture or node by node
 * (kernel, memset and device-to-device copy nodes), instantiated, launched and destroyed
 * on the worker. Graphs and executable graphs are records of this file, so a destroyed
 * or unknown one is refused here (CUDA_ERROR_INVALID_HANDLE) rather than by a later
 * synchronising call. What the worker cannot do (graph update, node queries and other
 * node kinds) stays a stub that names itself once. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_front.h"
#include "graph_wire.h"

struct hipr_cu_graph {
    uint64_t id; /* the worker's graph or executable graph */
    int device;
    int exec; /* 1: an executable graph */
    uint64_t nodes; /* a graph's: added, or operations captured (cuGraphGetNodes's count) */
    struct hipr_cu_graph *next;
};

/* Graphs and executable graphs alive, under hipr_cu_lock. */
static struct hipr_cu_graph *graphs;

#define NODE(id) ((CUgraphNode)(uintptr_t)(id))

/* A new record of the worker's graph `id`; on no memory the worker's graph is destroyed. */
static CUresult keep(CUgraph *out, int device, uint64_t id, int exec, uint64_t nodes) {
    struct hipr_cu_graph *g = malloc(sizeof *g);
    if (!g) {
        (void)(exec ? hipr_graph_exec_destroy(device, id) : hipr_graph_destroy(device, id));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *g = (struct hipr_cu_graph){id, device, exec, nodes, NULL};
    pthread_mutex_lock(&hipr_cu_lock);
    g->next = graphs;
    graphs = g;
    pthread_mutex_unlock(&hipr_cu_lock);
    *out = g;
    return CUDA_SUCCESS;
}

/* `g` when it is a live graph (exec 0) or executable graph (exec 1): *out a copy. */
static CUresult find(CUgraph g, int exec, struct hipr_cu_graph *out) {
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_graph *p = graphs;
    while (p && !(p == g && p->exec == exec)) p = p->next;
    if (p) *out = *p;
    pthread_mutex_unlock(&hipr_cu_lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Unlinks and frees `g` when it is live and of kind `exec`: *out its copy. */
static CUresult take(CUgraph g, int exec, struct hipr_cu_graph *out) {
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&hipr_cu_lock);
    for (struct hipr_cu_graph **p = &graphs; *p; p = &(*p)->next)
        if (*p == g && g->exec == exec) {
            *out = *g;
            *p = g->next;
            free(g);
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

void hipr_cu_forget_graphs(void) {
    for (struct hipr_cu_graph *g = graphs, *next; g; g = next) {
        next = g->next;
        free(g);
    }
    graphs = NULL;
}

/* The current context's device and the worker's handle of `s`. */
static CUresult stream_on(CUstream s, int *device, uint64_t *id) {
    *id = 0;
    CUresult rc = hipr_cu_ctx_device(device);
    return rc ? rc : hipr_cu_stream(s, id);
}


/* --- stream capture --------------------------------------------------------------------- */

/* The worker captures in relaxed mode whatever the mode asked: the proxy does not refuse
 * the calls a global or thread-local capture would (they are the program's to avoid). */
API CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    if (mode < 0 || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    uint64_t id;
    CUresult rc = stream_on(s, &dev, &id);
    if (rc) return rc;
    if (!id) {
        static int warned;
        hipr_warn_once("cuStreamBeginCapture: the default streams (the worker's null stream) "
                    "cannot be captured; capture a created stream "
                    "(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)",
                    &warned);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return hipr_cu_error(hipr_capture_begin(dev, id));
}

/* CUDA 10.0's form, before capture modes: a global capture. */
API CUresult cuStreamBeginCapture(CUstream s) { return cuStreamBeginCapture_v2(s, 0); }

API CUresult cuStreamEndCapture(CUstream s, CUgraph *graph) {
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    *graph = NULL;
    int dev;
    uint64_t id, gid = 0, ops = 0;
    CUresult rc = stream_on(s, &dev, &id);
    if (rc == CUDA_SUCCESS) rc = hipr_cu_error(hipr_capture_end(dev, id, &gid, &ops));
    return rc ? rc : keep(graph, dev, gid, 0, ops);
}

/* The status of `s`'s capture and its id (0 when none). */
static CUresult capture_state(CUstream s, int *status, cuuint64_t *id) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    uint64_t sid;
    CUresult rc = hipr_cu_stream(s, &sid);
    if (rc) return rc;
    unsigned long long cid = 0;
    *status = hipr_capture_active(sid, &cid) ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                             : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id) *id = cid;
    return CUDA_SUCCESS;
}

API CUresult cuStreamIsCapturing(CUstream s, int *status) { return capture_state(s, status, NULL); }

API CUresult cuStreamGetCaptureInfo(CUstream s, int *status, cuuint64_t *id) {
    return capture_state(s, status, id);
}

/* The graph being captured exists only on the worker until the capture ends: no graph
 * and no dependencies are given out during it. */
API CUresult cuStreamGetCaptureInfo_v2(CUstream s, int *status, cuuint64_t *id, CUgraph *graph,
                                       const CUgraphNode **deps, size_t *n_deps) {
    CUresult rc = capture_state(s, status, id);
    if (rc == CUDA_SUCCESS) {
        if (graph) *graph = NULL;
        if (deps) *deps = NULL;
        if (n_deps) *n_deps = 0;
    }
    return rc;
}

API CUresult cuStreamGetCaptureInfo_v3(CUstream s, int *status, cuuint64_t *id, CUgraph *graph,
                                       const CUgraphNode **deps, const void **edges,
                                       size_t *n_deps) {
    CUresult rc = cuStreamGetCaptureInfo_v2(s, status, id, graph, deps, n_deps);
    if (rc == CUDA_SUCCESS && edges) *edges = NULL;
    return rc;
}

static __thread int tl_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */

API CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    if (!mode || *mode < 0 || *mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    int old = tl_capture_mode;
    tl_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* --- graphs ----------------------------------------------------------------------------- */

API CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    if (!graph || flags) return CUDA_ERROR_INVALID_VALUE;
    *graph = NULL;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS) rc = hipr_cu_error(hipr_graph_create(dev, &id));
    return rc ? rc : keep(graph, dev, id, 0, 0);
}

API CUresult cuGraphDestroy(CUgraph graph) {
    struct hipr_cu_graph g;
    CUresult rc = take(graph, 0, &g);
    return rc ? rc : hipr_cu_error(hipr_graph_destroy(g.device, g.id));
}

/* Flags the worker's instantiation honours: its graphs allocate nothing (no memory
 * nodes: nothing to free at launch), upload is what instantiation on the worker already
 * does, and node priorities are the one priority streams have. */
static CUresult instantiate(CUgraphExec *exec, CUgraph graph, cuuint64_t flags) {
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    *exec = NULL;
    const cuuint64_t honoured = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if (flags & ~honoured) {
        static int warned;
        hipr_warn_once("cuGraphInstantiate: device-launchable graphs (and unknown flags) are not "
                    "served (CUDA_ERROR_NOT_SUPPORTED)",
                    &warned);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct hipr_cu_graph g;
    CUresult rc = find(graph, 0, &g);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS) rc = hipr_cu_error(hipr_graph_instantiate(g.device, g.id, &id));
    return rc ? rc : keep(exec, g.device, id, 1, 0);
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                         unsigned long long flags) {
    return instantiate(exec, graph, flags);
}

/* CUDA 10 and 11's forms (an error node and a log); the log stays empty. */
API CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                   char *log, size_t log_size) {
    if (error_node) *error_node = NULL;
    if (log && log_size) log[0] = '\0';
    return instantiate(exec, graph, 0);
}

API CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                char *log, size_t log_size) {
    return cuGraphInstantiate_v2(exec, graph, error_node, log, log_size);
}

API CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                          CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    params->hErrNode_out = NULL;
    params->result_out = 1; /* CUDA_GRAPH_INSTANTIATE_ERROR */
    CUresult rc = CUDA_SUCCESS;
    if (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) {
        int dev;
        uint64_t sid;
        rc = stream_on(params->hUploadStream, &dev, &sid);
    }
    if (rc == CUDA_SUCCESS) rc = instantiate(exec, graph, params->flags);
    if (rc == CUDA_SUCCESS) params->result_out = 0;
    return rc;
}

API CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
    struct hipr_cu_graph g;
    CUresult rc = find(exec, 1, &g);
    int dev;
    uint64_t sid;
    if (rc == CUDA_SUCCESS) rc = stream_on(s, &dev, &sid);
    if (rc) return rc;
    hipr_capture_note(sid, 1); /* launched into a capture: its graph becomes a node */
    return hipr_cu_error(hipr_graph_launch(g.device, g.id, sid));
}

/* The worker instantiated the graph on its GPU already: uploading adds nothing. */
API CUresult cuGraphUpload(CUgraphExec exec, CUstream s) {
    struct hipr_cu_graph g;
    CUresult rc = find(exec, 1, &g);
    int dev;
    uint64_t sid;
    return rc ? rc : stream_on(s, &dev, &sid);
}

API CUresult cuGraphExecDestroy(CUgraphExec exec) {
    struct hipr_cu_graph g;
    CUresult rc = take(exec, 1, &g);
    return rc ? rc : hipr_cu_error(hipr_graph_exec_destroy(g.device, g.id));
}

/* The number of nodes (a captured graph's: the operations issued on the capturing
 * stream); the nodes' handles are not kept, so a call asking for them is refused. */
API CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    struct hipr_cu_graph g;
    CUresult rc = find(graph, 0, &g);
    if (rc) return rc;
    if (nodes) {
        static int warned;
        hipr_warn_once("cuGraphGetNodes: a graph's node handles are not served, only their "
                       "count (CUDA_ERROR_NOT_SUPPORTED)",
                       &warned);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    *count = (size_t)g.nodes;
    return CUDA_SUCCESS;
}

/* --- nodes ------------------------------------------------------------------------------- */

/* The worker's handles of `n` dependencies, in a buffer of the caller's to free. */
static CUresult dependencies(const CUgraphNode *deps, size_t n, uint64_t **out) {
    *out = NULL;
    if (n && !deps) return CUDA_ERROR_INVALID_VALUE;
    if (n > HIPR_MAX_GRAPH_DEPS) return CUDA_ERROR_INVALID_VALUE;
    if (!n) return CUDA_SUCCESS;
    uint64_t *ids = malloc(n * sizeof *ids);
    if (!ids) return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if (!deps[i]) {
            free(ids);
            return CUDA_ERROR_INVALID_VALUE;
        }
        ids[i] = (uint64_t)(uintptr_t)deps[i];
    }
    *out = ids;
    return CUDA_SUCCESS;
}

enum node_kind { MEMSET_NODE, MEMCPY_NODE, KERNEL_NODE };

struct node_args {
    enum node_kind kind;
    uint64_t dst, src, size; /* memset (dst, value in src), memcpy */
    const struct hipr_cu_launch *launch;
};

/* A node of `graph` after `deps`, as `a` says. */
static CUresult add_node(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                         const struct node_args *a) {
    struct hipr_cu_graph g;
    CUresult rc = find(graph, 0, &g);
    uint64_t *ids = NULL, id = 0;
    if (rc == CUDA_SUCCESS) rc = dependencies(deps, n, &ids);
    if (rc) return rc;
    int hip;
    switch (a->kind) {
    case MEMSET_NODE:
        hip = hipr_graph_add_memset(g.device, g.id, ids, n, a->dst, (unsigned)a->src, a->size, &id);
        break;
    case MEMCPY_NODE:
        hip = hipr_graph_add_memcpy(g.device, g.id, ids, n, a->dst, a->src, a->size, &id);
        break;
    default:
        hip = hipr_graph_add_kernel(g.device, g.id, ids, n, &a->launch->config, a->launch->args,
                                    a->launch->args_len, &id);
    }
    free(ids);
    if (hip) return hipr_cu_error(hip);
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_graph *p = graphs;
    while (p && p != graph) p = p->next;
    if (p) p->nodes++;
    pthread_mutex_unlock(&hipr_cu_lock);
    *node = NODE(id);
    return CUDA_SUCCESS;
}

static CUresult kernel_node(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                            CUfunction f, const unsigned grid[3], const unsigned block[3],
                            unsigned shared, void **params, void **extra) {
    struct hipr_cu_launch *l = malloc(sizeof *l); /* 6 KiB: off the caller's stack */
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = hipr_cu_launch_prepare(l, f, grid, block, shared, params, extra);
    if (rc == CUDA_SUCCESS) {
        struct node_args a = {.kind = KERNEL_NODE, .launch = l};
        rc = add_node(node, graph, deps, n, &a);
    }
    free(l);
    return rc;
}

API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  size_t n, const CUDA_KERNEL_NODE_PARAMS *p) {
    if (!node || !p) return CUDA_ERROR_INVALID_VALUE;
    *node = NULL;
    const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
    const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    return kernel_node(node, graph, deps, n, p->func, grid, block, p->sharedMemBytes,
                       p->kernelParams, p->extra);
}

/* CUDA 12's form: a CUkernel (`kern`) where `func` is NULL; its context must be live. */
API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                     size_t n, const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!node || !p) return CUDA_ERROR_INVALID_VALUE;
    uint64_t ctx_id;
    if (p->ctx && hipr_cu_ctx_id(p->ctx, &ctx_id)) return CUDA_ERROR_INVALID_CONTEXT;
    CUDA_KERNEL_NODE_PARAMS v1 = p->v1;
    if (!v1.func) v1.func = (CUfunction)p->kern;
    return cuGraphAddKernelNode(node, graph, deps, n, &v1);
}

/* A memset whose element's bytes are one byte, over a contiguous range (one row, or
 * rows whose pitch is their width): the worker's memset node sets bytes. */
API CUresult cuGraphAddMemsetNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  size_t n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    if (!node || !p) return CUDA_ERROR_INVALID_VALUE;
    *node = NULL;
    uint64_t ctx_id;
    if (ctx && hipr_cu_ctx_id(ctx, &ctx_id)) return CUDA_ERROR_INVALID_CONTEXT;
    unsigned w = p->elementSize;
    if ((w != 1 && w != 2 && w != 4) || !p->dst || p->dst % w || !p->width || !p->height)
        return CUDA_ERROR_INVALID_VALUE;
    if (w < 4 && p->value >> (8 * w)) return CUDA_ERROR_INVALID_VALUE;
    uint8_t b[4];
    memcpy(b, &p->value, 4); /* little-endian, as the device */
    int uniform = w == 1 || (b[0] == b[1] && (w == 2 || (b[1] == b[2] && b[2] == b[3])));
    size_t row = p->width * w;
    if (p->width > SIZE_MAX / w || (p->height > 1 && p->height > SIZE_MAX / row))
        return CUDA_ERROR_INVALID_VALUE;
    if (!uniform || (p->height > 1 && p->pitch != row)) {
        static int warned;
        hipr_warn_once("cuGraphAddMemsetNode: a pattern of differing bytes, or rows with a pitch "
                    "other than their width, is not served: the worker's memset node sets "
                    "bytes of one range (CUDA_ERROR_NOT_SUPPORTED)",
                    &warned);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct node_args a = {.kind = MEMSET_NODE, .dst = p->dst, .src = b[0], .size = row * p->height};
    return add_node(node, graph, deps, n, &a);
}

/* One side of a 3D copy: its device address when it is device memory that the copy
 * reads or writes as one range; 0 otherwise. */
static uint64_t linear(int type, CUdeviceptr dev, size_t x, size_t y, size_t z, size_t pitch,
                       size_t height, size_t lod, const CUDA_MEMCPY3D *p) {
    if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED) return 0;
    if (!dev || lod || !hipr_cu_is_device(dev)) return 0;
    size_t h = p->Height ? p->Height : 1, d = p->Depth ? p->Depth : 1;
    if (h > 1 && pitch != p->WidthInBytes) return 0;
    if (d > 1 && (pitch != p->WidthInBytes || height != h)) return 0;
    return dev + x + y * pitch + z * pitch * height;
}

/* A device-to-device copy of one range: the worker's memcpy node copies device bytes. */
API CUresult cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  size_t n, const CUDA_MEMCPY3D *p, CUcontext ctx) {
    if (!node || !p) return CUDA_ERROR_INVALID_VALUE;
    *node = NULL;
    uint64_t ctx_id;
    if (ctx && hipr_cu_ctx_id(ctx, &ctx_id)) return CUDA_ERROR_INVALID_CONTEXT;
    size_t h = p->Height ? p->Height : 1, d = p->Depth ? p->Depth : 1;
    if (!p->WidthInBytes || h > SIZE_MAX / p->WidthInBytes || d > SIZE_MAX / (h * p->WidthInBytes))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t src = linear(p->srcMemoryType, p->srcDevice, p->srcXInBytes, p->srcY, p->srcZ,
                          p->srcPitch, p->srcHeight, p->srcLOD, p);
    uint64_t dst = linear(p->dstMemoryType, p->dstDevice, p->dstXInBytes, p->dstY, p->dstZ,
                          p->dstPitch, p->dstHeight, p->dstLOD, p);
    if (!src || !dst) {
        static int warned;
        hipr_warn_once("cuGraphAddMemcpyNode: only copies between device memory of this "
                    "process, of one contiguous range, are served: the worker's memcpy node "
                    "copies device bytes (CUDA_ERROR_NOT_SUPPORTED)",
                    &warned);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct node_args a = {.kind = MEMCPY_NODE, .dst = dst, .src = src, .size = p->WidthInBytes * h * d};
    return add_node(node, graph, deps, n, &a);
}

/* The per-thread-default-stream forms: the same calls (every default stream is the
 * worker's null stream). */
ALIAS(CUresult, cuStreamBeginCapture_ptsz, cuStreamBeginCapture, (CUstream))
ALIAS(CUresult, cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2, (CUstream, int))
ALIAS(CUresult, cuStreamEndCapture_ptsz, cuStreamEndCapture, (CUstream, CUgraph *))
ALIAS(CUresult, cuStreamIsCapturing_ptsz, cuStreamIsCapturing, (CUstream, int *))
ALIAS(CUresult, cuStreamGetCaptureInfo_ptsz, cuStreamGetCaptureInfo, (CUstream, int *, cuuint64_t *))
ALIAS(CUresult, cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v2,
      (CUstream, int *, cuuint64_t *, CUgraph *, const CUgraphNode **, size_t *))
ALIAS(CUresult, cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3,
      (CUstream, int *, cuuint64_t *, CUgraph *, const CUgraphNode **, const void **, size_t *))
ALIAS(CUresult, cuGraphLaunch_ptsz, cuGraphLaunch, (CUgraphExec, CUstream))
ALIAS(CUresult, cuGraphUpload_ptsz, cuGraphUpload, (CUgraphExec, CUstream))
ALIAS(CUresult, cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams,
      (CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *))
