/* Stream capture and graph requests for both fronts (see graph_wire.h). */
#define _GNU_SOURCE
#include "graph_wire.h"

#include <pthread.h>

#include "opcodes.h"

static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t stream;
    unsigned long long id;
    uint64_t ops;
} captures[HIPR_MAX_CAPTURES];
static size_t n_captures; /* read without the lock by hipr_capture_note's fast path */
static unsigned long long next_capture_id = 1;

/* A request of one handle whose reply names one handle (`out_key`, when given). */
static int handle_call(int device, uint16_t opcode, const char *key, uint64_t handle,
                       const char *out_key, uint64_t *out) {
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, key, handle);
    hipr_reply r;
    int rc = hipr_call(device, opcode, &m, NULL, 0, NULL, 0, &r);
    if (rc == HIPR_SUCCESS && out_key && (hipr_cbor_uint(r.map, out_key, out) || !*out))
        rc = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    return rc;
}

static int handle_notify(int device, uint16_t opcode, const char *key, uint64_t handle) {
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, key, handle);
    return hipr_notify(device, opcode, &m, NULL, 0);
}

/* With capture_lock held: the slot of `stream`, or -1. */
static long capture_slot_locked(uint64_t stream) {
    for (size_t i = 0; i < n_captures; i++)
        if (captures[i].stream == stream) return (long)i;
    return -1;
}

int hipr_capture_active(uint64_t stream, unsigned long long *id) {
    pthread_mutex_lock(&capture_lock);
    long slot = stream ? capture_slot_locked(stream) : -1;
    if (id) *id = slot >= 0 ? captures[slot].id : 0;
    pthread_mutex_unlock(&capture_lock);
    return slot >= 0;
}

void hipr_capture_note(uint64_t stream, unsigned n) {
    /* Every launch on a created stream comes here: nothing to do while nothing captures. */
    if (!stream || !__atomic_load_n(&n_captures, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&capture_lock);
    long slot = capture_slot_locked(stream);
    if (slot >= 0) captures[slot].ops += n;
    pthread_mutex_unlock(&capture_lock);
}

void hipr_capture_drop(uint64_t stream) {
    pthread_mutex_lock(&capture_lock);
    long slot = capture_slot_locked(stream);
    if (slot >= 0) {
        captures[slot] = captures[n_captures - 1];
        __atomic_store_n(&n_captures, n_captures - 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&capture_lock);
}

int hipr_capture_begin(int device, uint64_t stream) {
    if (!stream) return HIPR_CAPTURE_UNSUPPORTED;
    /* The slot is taken before the request, so that two threads beginning captures of
     * one stream cannot both succeed, and given back if the worker refuses. */
    pthread_mutex_lock(&capture_lock);
    int rc = capture_slot_locked(stream) >= 0       ? HIPR_ILLEGAL_STATE
             : n_captures == HIPR_MAX_CAPTURES ? HIPR_OUT_OF_MEMORY
                                                    : HIPR_SUCCESS;
    if (rc == HIPR_SUCCESS) {
        captures[n_captures].stream = stream;
        captures[n_captures].id = next_capture_id++;
        captures[n_captures].ops = 0;
        __atomic_store_n(&n_captures, n_captures + 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&capture_lock);
    if (rc) return rc;
    rc = handle_call(device, OP_STREAM_BEGIN_CAPTURE, "stream", stream, NULL, NULL);
    if (rc) hipr_capture_drop(stream);
    return rc;
}

int hipr_capture_end(int device, uint64_t stream, uint64_t *graph, uint64_t *ops) {
    *graph = 0;
    pthread_mutex_lock(&capture_lock);
    long slot = stream ? capture_slot_locked(stream) : -1;
    if (slot >= 0 && ops) *ops = captures[slot].ops;
    pthread_mutex_unlock(&capture_lock);
    if (slot < 0) return HIPR_ILLEGAL_STATE;
    hipr_capture_drop(stream);
    return handle_call(device, OP_STREAM_END_CAPTURE, "stream", stream, "graph", graph);
}

int hipr_graph_create(int device, uint64_t *graph) {
    *graph = 0;
    hipr_reply r;
    int rc = hipr_call(device, OP_GRAPH_CREATE, NULL, NULL, 0, NULL, 0, &r);
    if (rc == HIPR_SUCCESS && (hipr_cbor_uint(r.map, "graph", graph) || !*graph)) rc = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    return rc;
}

int hipr_graph_destroy(int device, uint64_t graph) {
    return handle_notify(device, OP_GRAPH_DESTROY, "graph", graph);
}

int hipr_graph_instantiate(int device, uint64_t graph, uint64_t *exec) {
    *exec = 0;
    return handle_call(device, OP_GRAPH_INSTANTIATE, "graph", graph, "exec", exec);
}

int hipr_graph_launch(int device, uint64_t exec, uint64_t stream) {
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "exec", exec);
    if (stream) hipr_map_u64(&m, "stream", stream);
    return hipr_notify(device, OP_GRAPH_LAUNCH, &m, NULL, 0);
}

int hipr_graph_exec_destroy(int device, uint64_t exec) {
    return handle_notify(device, OP_GRAPH_EXEC_DESTROY, "exec", exec);
}

/* `m`, already holding the node's own fields, sent as a GRAPH_ADD_* request. */
static int add_node(int device, uint16_t opcode, hipr_map *m, uint64_t graph,
                    const uint64_t *deps, size_t n_deps, uint64_t *node) {
    *node = 0;
    if (n_deps > HIPR_MAX_GRAPH_DEPS || (n_deps && !deps)) {
        hipr_map_free(m);
        return HIPR_INVALID_VALUE;
    }
    hipr_map_u64(m, "graph", graph);
    if (n_deps) hipr_map_u64_list(m, "dependencies", deps, n_deps);
    hipr_reply r;
    int rc = hipr_call(device, opcode, m, NULL, 0, NULL, 0, &r);
    if (rc == HIPR_SUCCESS && (hipr_cbor_uint(r.map, "node", node) || !*node)) rc = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    return rc;
}

/* A memset or copy node: `key` at `at` (ptr, dst), `key2` (value, src), `size` bytes. */
static int range_node(int device, uint16_t opcode, uint64_t graph, const uint64_t *deps,
                      size_t n_deps, const char *key, uint64_t at, const char *key2,
                      uint64_t value, uint64_t size, uint64_t *node) {
    hipr_map m;
    hipr_map_init(&m, 5);
    hipr_map_u64(&m, key, at);
    hipr_map_u64(&m, key2, value);
    hipr_map_u64(&m, "size", size);
    return add_node(device, opcode, &m, graph, deps, n_deps, node);
}

int hipr_graph_add_memset(int device, uint64_t graph, const uint64_t *deps, size_t n_deps,
                          uint64_t ptr, unsigned value, uint64_t size, uint64_t *node) {
    return range_node(device, OP_GRAPH_ADD_MEMSET, graph, deps, n_deps, "ptr", ptr, "value",
                      value, size, node);
}

int hipr_graph_add_memcpy(int device, uint64_t graph, const uint64_t *deps, size_t n_deps,
                          uint64_t dst, uint64_t src, uint64_t size, uint64_t *node) {
    return range_node(device, OP_GRAPH_ADD_MEMCPY, graph, deps, n_deps, "dst", dst, "src", src,
                      size, node);
}

int hipr_graph_add_kernel(int device, uint64_t graph, const uint64_t *deps, size_t n_deps,
                          const hipr_launch_config *c, const void *args, size_t args_len,
                          uint64_t *node) {
    hipr_launch_config config = *c;
    config.stream = 0; /* a node runs on the stream its graph is launched on */
    hipr_map m;
    hipr_map_init(&m, 8);
    hipr_map_launch_config(&m, &config);
    if (args_len) hipr_map_bytes(&m, "args", args, args_len);
    return add_node(device, OP_GRAPH_ADD_KERNEL, &m, graph, deps, n_deps, node);
}

static void forget_captures(void) {
    /* A forked child's session has none of the parent's captures. */
    n_captures = 0;
}

__attribute__((constructor(102))) static void graph_wire_init(void) {
    hipr_fork_guard(&capture_lock, forget_captures);
}
