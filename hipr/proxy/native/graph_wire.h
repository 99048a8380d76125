/* Stream capture and graphs on the worker, shared by the HIP and the CUDA front: the
 * requests (STREAM_BEGIN_CAPTURE / END_CAPTURE, GRAPH_*) and the process's table of
 * capturing streams, which answers capture queries without the network. Streams, graphs,
 * nodes and executable graphs are the worker's handles. Every function returns a
 * hipError_t; CUDA numbers these errors alike (ILLEGAL_STATE 401, STREAM_CAPTURE_* 90x). */
#ifndef HIPR_GRAPH_WIRE_H
#define HIPR_GRAPH_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* Streams of one process capturing at once. */
#define HIPR_MAX_CAPTURES 256
/* A node's dependencies (GRAPH_ADD_*'s `dependencies`). */
#define HIPR_MAX_GRAPH_DEPS 1024
#define HIPR_ILLEGAL_STATE 401
#define HIPR_CAPTURE_UNSUPPORTED 900

/* Begin capturing worker stream `stream` on `device`: 900 for the null stream (0), which
 * cannot be captured, 401 when it captures already, 2 when HIPR_MAX_CAPTURES do. */
int hipr_capture_begin(int device, uint64_t stream);
/* End the capture of `stream`: the captured graph in *graph (0 on error) and, when `ops`
 * is given, how many operations hipr_capture_note counted in it; 401 when the stream does
 * not capture. The capture ends in this table whatever the worker answers. */
int hipr_capture_end(int device, uint64_t stream, uint64_t *graph, uint64_t *ops);
/* `n` operations (launches, copies, memsets, event records, graph launches) were issued on
 * worker stream `stream`: counted when it captures (the captured graph's nodes). */
void hipr_capture_note(uint64_t stream, unsigned n);
/* 1 when `stream` captures, its capture's id (unique in the process, never 0) in *id. */
int hipr_capture_active(uint64_t stream, unsigned long long *id);
/* The stream was destroyed: its capture goes with it. */
void hipr_capture_drop(uint64_t stream);

int hipr_graph_create(int device, uint64_t *graph);
/* Fire-and-forget: an error comes back with a later synchronising call. */
int hipr_graph_destroy(int device, uint64_t graph);
int hipr_graph_instantiate(int device, uint64_t graph, uint64_t *exec);
int hipr_graph_launch(int device, uint64_t exec, uint64_t stream);
int hipr_graph_exec_destroy(int device, uint64_t exec);

/* Nodes of `graph` after `deps` (n_deps node handles of the same graph, at most
 * HIPR_MAX_GRAPH_DEPS), the new node's handle in *node. */
int hipr_graph_add_memset(int device, uint64_t graph, const uint64_t *deps, size_t n_deps,
                          uint64_t ptr, unsigned value, uint64_t size, uint64_t *node);
int hipr_graph_add_memcpy(int device, uint64_t graph, const uint64_t *deps, size_t n_deps,
                          uint64_t dst, uint64_t src, uint64_t size, uint64_t *node);
/* A kernel node: a launch's configuration (its stream unused) and packed arguments. */
int hipr_graph_add_kernel(int device, uint64_t graph, const uint64_t *deps, size_t n_deps,
                          const hipr_launch_config *config, const void *args, size_t args_len,
                          uint64_t *node);

#endif
