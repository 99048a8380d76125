/* hiprtc over the proxy: programs are kept here; hiprtcCompileProgram compiles on the
 * worker (PROGRAM_COMPILE, with the program's own headers) and keeps the code object and
 * the log. Link states are kept here too: hiprtcLinkComplete sends every input in one
 * PROGRAM_LINK, linked by the worker's runtime (cuLink* on a cuda worker, hiprtcLink* on
 * a hip one). The session is libamdhip64.so's (this library links against it). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "client.h"
#include "file_bytes.h"
#include "opcodes.h"

#define API HIPR_EXPORT

typedef enum {
    HIPRTC_SUCCESS = 0,
    HIPRTC_ERROR_OUT_OF_MEMORY = 1,
    HIPRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    HIPRTC_ERROR_INVALID_INPUT = 3,
    HIPRTC_ERROR_INVALID_PROGRAM = 4,
    HIPRTC_ERROR_INVALID_OPTION = 5,
    HIPRTC_ERROR_COMPILATION = 6,
    HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
    HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
    HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
    HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
    HIPRTC_ERROR_INTERNAL_ERROR = 11,
    HIPRTC_ERROR_LINKING = 100,
} hiprtcResult;

struct hipr_program {
    char *source, *name, *log;
    uint8_t *code;
    size_t code_len;
    int n_headers;
    char **headers, **include_names;
};
typedef struct hipr_program *hiprtcProgram;

API const char *hiprtcGetErrorString(hiprtcResult result) {
    switch (result) {
    case HIPRTC_SUCCESS: return "HIPRTC_SUCCESS";
    case HIPRTC_ERROR_OUT_OF_MEMORY: return "HIPRTC_ERROR_OUT_OF_MEMORY";
    case HIPRTC_ERROR_PROGRAM_CREATION_FAILURE: return "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case HIPRTC_ERROR_INVALID_INPUT: return "HIPRTC_ERROR_INVALID_INPUT";
    case HIPRTC_ERROR_INVALID_PROGRAM: return "HIPRTC_ERROR_INVALID_PROGRAM";
    case HIPRTC_ERROR_INVALID_OPTION: return "HIPRTC_ERROR_INVALID_OPTION";
    case HIPRTC_ERROR_COMPILATION: return "HIPRTC_ERROR_COMPILATION";
    case HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE";
    case HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION:
        return "HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION";
    case HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION:
        return "HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION";
    case HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID: return "HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
    case HIPRTC_ERROR_INTERNAL_ERROR: return "HIPRTC_ERROR_INTERNAL_ERROR";
    case HIPRTC_ERROR_LINKING: return "HIPRTC_ERROR_LINKING";
    }
    return "Invalid HIPRTC error code";
}

API hiprtcResult hiprtcVersion(int *major, int *minor) {
    if (!major || !minor) return HIPRTC_ERROR_INVALID_INPUT;
    *major = 6;
    *minor = 2;
    return HIPRTC_SUCCESS;
}

static void free_strings(char **list, int n) {
    if (!list) return;
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}

/* A copy of n strings, or NULL (out of memory). */
static char **copy_strings(const char **list, int n) {
    char **out = calloc((size_t)n, sizeof *out);
    for (int i = 0; out && i < n; i++)
        if (!(out[i] = strdup(list[i]))) {
            free_strings(out, n);
            out = NULL;
        }
    return out;
}

static void free_program(struct hipr_program *p) {
    if (!p) return;
    free_strings(p->headers, p->n_headers);
    free_strings(p->include_names, p->n_headers);
    free(p->source);
    free(p->name);
    free(p->log);
    free(p->code);
    free(p);
}

API hiprtcResult hiprtcCreateProgram(hiprtcProgram *prog, const char *src, const char *name,
                                     int num_headers, const char **headers,
                                     const char **include_names) {
    if (!prog || !src || num_headers < 0) return HIPRTC_ERROR_INVALID_INPUT;
    if (num_headers > 0) {
        if (!headers || !include_names) return HIPRTC_ERROR_INVALID_INPUT;
        for (int i = 0; i < num_headers; i++)
            if (!headers[i] || !include_names[i] || !include_names[i][0])
                return HIPRTC_ERROR_INVALID_INPUT;
    }
    struct hipr_program *p = calloc(1, sizeof *p);
    if (!p) return HIPRTC_ERROR_OUT_OF_MEMORY;
    p->source = strdup(src);
    p->name = strdup(name ? name : "kernel.hip");
    if (num_headers > 0) {
        p->n_headers = num_headers;
        p->headers = copy_strings(headers, num_headers);
        p->include_names = copy_strings(include_names, num_headers);
    }
    if (!p->source || !p->name || (num_headers > 0 && (!p->headers || !p->include_names))) {
        free_program(p);
        return HIPRTC_ERROR_OUT_OF_MEMORY;
    }
    *prog = p;
    return HIPRTC_SUCCESS;
}

API hiprtcResult hiprtcDestroyProgram(hiprtcProgram *prog) {
    if (!prog || !*prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    free_program(*prog);
    *prog = NULL;
    return HIPRTC_SUCCESS;
}

static hiprtcResult set_log(struct hipr_program *p, const char *text) {
    free(p->log);
    p->log = strdup(text);
    return p->log ? HIPRTC_SUCCESS : HIPRTC_ERROR_OUT_OF_MEMORY;
}

static int is_amd_target(const char *opt) {
    static const char *const prefixes[] = {"--offload-arch=gfx", "--amdgpu-target=gfx", "-mcpu=gfx"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncasecmp(opt, prefixes[i], strlen(prefixes[i])) == 0) return 1;
    return 0;
}

/* A CBOR array of n strings, or NULL (out of memory). */
static cbor_item_t *string_list(const char *const *items, size_t n) {
    cbor_item_t *list = cbor_new_definite_array(n);
    for (size_t i = 0; list && i < n; i++) {
        cbor_item_t *s = cbor_build_string(items[i]);
        int ok = s && cbor_array_push(list, s);
        if (s) cbor_decref(&s);
        if (!ok) cbor_decref(&list);
    }
    return list;
}

/* The hiprtcResult of a failed compile, as hipr.hiprtc gives it: the worker's own when its
 * error names one (details.rtc_result), else by hipError_t. */
static hiprtcResult rtc_result(int code, const cbor_item_t *error) {
    cbor_item_t *details = hipr_cbor_get(error, "details");
    int64_t rtc = -1;
    if (details && hipr_cbor_int(details, "rtc_result", &rtc) == 0 && rtc > 0 &&
        (rtc <= HIPRTC_ERROR_INTERNAL_ERROR || rtc == HIPRTC_ERROR_LINKING))
        return (hiprtcResult)rtc;
    if (code == 1) return HIPRTC_ERROR_INVALID_INPUT;
    if (code == 400) return HIPRTC_ERROR_INVALID_PROGRAM;
    return HIPRTC_ERROR_INTERNAL_ERROR;
}

API hiprtcResult hiprtcCompileProgram(hiprtcProgram prog, int num_options, const char **options) {
    if (!prog || num_options < 0 || (num_options && !options)) return HIPRTC_ERROR_INVALID_INPUT;
    /* An AMD target means nothing to NVRTC: on a cuda worker the device decides (as
     * hipr.hiprtc does). */
    int cuda = strcmp(hipr_backend(), "cuda") == 0;
    size_t kept = 0;
    for (int i = 0; i < num_options; i++) kept += !(cuda && options[i] && is_amd_target(options[i]));
    cbor_item_t *list = cbor_new_definite_array(kept);
    if (!list) return HIPRTC_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < num_options; i++) {
        if (cuda && options[i] && is_amd_target(options[i])) continue;
        cbor_item_t *s = options[i] ? cbor_build_string(options[i]) : NULL;
        int ok = s && cbor_array_push(list, s);
        if (s) cbor_decref(&s);
        if (!ok) {
            cbor_decref(&list);
            return options[i] ? HIPRTC_ERROR_OUT_OF_MEMORY : HIPRTC_ERROR_INVALID_OPTION;
        }
    }
    cbor_item_t *headers = NULL, *names = NULL;
    if (prog->n_headers) {
        headers = string_list((const char *const *)prog->headers, (size_t)prog->n_headers);
        names = string_list((const char *const *)prog->include_names, (size_t)prog->n_headers);
        if (!headers || !names) {
            if (headers) cbor_decref(&headers);
            if (names) cbor_decref(&names);
            cbor_decref(&list);
            return HIPRTC_ERROR_OUT_OF_MEMORY;
        }
    }
    hipr_map m;
    hipr_map_init(&m, 5);
    hipr_map_str(&m, "source", prog->source, strlen(prog->source));
    hipr_map_str(&m, "name", prog->name, strlen(prog->name));
    hipr_map_item(&m, "options", list);
    if (headers) {
        hipr_map_item(&m, "headers", headers);
        hipr_map_item(&m, "include_names", names);
    }
    hipr_reply r;
    int rc = hipr_call(HIPR_ANY_DEVICE, OP_PROGRAM_COMPILE, &m, NULL, 0, NULL, 0, &r);
    free(prog->code);
    prog->code = NULL;
    prog->code_len = 0;
    hiprtcResult result = HIPRTC_SUCCESS;
    if (rc == HIPR_SUCCESS) {
        prog->code = r.bulk;
        prog->code_len = r.bulk_len;
        r.bulk = NULL;
        result = set_log(prog, "");
    } else if (rc == HIPR_OUT_OF_MEMORY) {
        result = HIPRTC_ERROR_OUT_OF_MEMORY;
    } else {
        /* A compile error's message is a first line, then the compiler's log; a worker
         * that cannot compile (the emulator: hipErrorNotSupported) says so in one line. */
        const char *nl = strchr(r.message, '\n');
        result = set_log(prog, nl && nl[1] ? nl + 1 : r.message);
        if (result == HIPRTC_SUCCESS) result = rtc_result(rc, r.map);
    }
    hipr_reply_free(&r);
    return result;
}

API hiprtcResult hiprtcGetProgramLogSize(hiprtcProgram prog, size_t *size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    *size = (prog->log ? strlen(prog->log) : 0) + 1;
    return HIPRTC_SUCCESS;
}

API hiprtcResult hiprtcGetProgramLog(hiprtcProgram prog, char *log) {
    if (!prog || !log) return HIPRTC_ERROR_INVALID_INPUT;
    const char *text = prog->log ? prog->log : "";
    memcpy(log, text, strlen(text) + 1);
    return HIPRTC_SUCCESS;
}

API hiprtcResult hiprtcGetCodeSize(hiprtcProgram prog, size_t *size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    *size = prog->code_len;
    return HIPRTC_SUCCESS;
}

API hiprtcResult hiprtcGetCode(hiprtcProgram prog, char *code) {
    if (!prog || !code) return HIPRTC_ERROR_INVALID_INPUT;
    if (prog->code_len) memcpy(code, prog->code, prog->code_len);
    return HIPRTC_SUCCESS;
}

/* --- bitcode: what a -fgpu-rdc compile gives to link ---------------------------------- */

/* The program's code as the worker's compiler gave it: with -fgpu-rdc, relocatable code
 * for hiprtcLinkAddData (a hip worker's LLVM bitcode; a cuda worker's relocatable CUBIN,
 * or PTX for a virtual architecture, as hiprtc on NVIDIA gives nvrtc's code here). */
API hiprtcResult hiprtcGetBitcodeSize(hiprtcProgram prog, size_t *size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    if (!prog->code) return HIPRTC_ERROR_INVALID_PROGRAM;
    *size = prog->code_len;
    return HIPRTC_SUCCESS;
}

API hiprtcResult hiprtcGetBitcode(hiprtcProgram prog, char *bitcode) {
    if (!prog || !bitcode) return HIPRTC_ERROR_INVALID_INPUT;
    if (!prog->code) return HIPRTC_ERROR_INVALID_PROGRAM;
    memcpy(bitcode, prog->code, prog->code_len);
    return HIPRTC_SUCCESS;
}

/* --- linking ------------------------------------------------------------------------- */

/* hipJitOption values the link state reads (numbered as CUjit_option). */
enum {
    JIT_INFO_LOG_BUFFER = 3,
    JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    JIT_ERROR_LOG_BUFFER = 5,
    JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
};
/* hiprtcJITInputType values the worker links (PROGRAM_LINK's `kinds`). */
static int known_input(int kind) { return (kind >= 0 && kind <= 5) || (kind >= 100 && kind <= 102); }

#define MAX_LINK_INPUTS 256

struct link_input {
    int kind;
    uint8_t *data;
    size_t len;
    char *name;
};

struct hipr_link {
    struct link_input in[MAX_LINK_INPUTS];
    size_t n;
    char *info_log, *error_log; /* the program's buffers (hipJitOption), or NULL */
    size_t info_size, error_size;
    uint8_t *out; /* hiprtcLinkComplete's image, owned until hiprtcLinkDestroy */
    size_t out_len;
};
typedef struct hipr_link *hiprtcLinkState;

/* Log option values are passed by value in the pointer slot, as CUDA's are. */
static void read_options(struct hipr_link *l, unsigned n, const int *keys, void **values) {
    if (!keys || !values) return;
    for (unsigned i = 0; i < n; i++) {
        switch (keys[i]) {
        case JIT_INFO_LOG_BUFFER: l->info_log = values[i]; break;
        case JIT_INFO_LOG_BUFFER_SIZE_BYTES: l->info_size = (size_t)(uintptr_t)values[i]; break;
        case JIT_ERROR_LOG_BUFFER: l->error_log = values[i]; break;
        case JIT_ERROR_LOG_BUFFER_SIZE_BYTES: l->error_size = (size_t)(uintptr_t)values[i]; break;
        default: break; /* optimisation and target options: the worker's linker decides */
        }
    }
}

static void write_log(char *buf, size_t size, const char *text) {
    if (!buf || !size) return;
    size_t n = strlen(text);
    if (n >= size) n = size - 1;
    memcpy(buf, text, n);
    buf[n] = 0;
}

API hiprtcResult hiprtcLinkCreate(unsigned int num_options, int *options, void **values,
                                  hiprtcLinkState *state) {
    if (!state || (num_options && (!options || !values))) return HIPRTC_ERROR_INVALID_INPUT;
    struct hipr_link *l = calloc(1, sizeof *l);
    if (!l) return HIPRTC_ERROR_OUT_OF_MEMORY;
    read_options(l, num_options, options, values);
    *state = l;
    return HIPRTC_SUCCESS;
}

static hiprtcResult add_input(struct hipr_link *l, int kind, const void *data, size_t len,
                              const char *name) {
    if (!known_input(kind) || !data || !len) return HIPRTC_ERROR_INVALID_INPUT;
    if (l->n == MAX_LINK_INPUTS) return HIPRTC_ERROR_INVALID_INPUT;
    struct link_input *in = &l->in[l->n];
    in->data = malloc(len);
    in->name = strdup(name && name[0] ? name : "input");
    if (!in->data || !in->name) {
        free(in->data);
        free(in->name);
        return HIPRTC_ERROR_OUT_OF_MEMORY;
    }
    memcpy(in->data, data, len);
    in->len = len;
    in->kind = kind;
    l->n++;
    return HIPRTC_SUCCESS;
}

API hiprtcResult hiprtcLinkAddData(hiprtcLinkState state, int input_type, void *image,
                                   size_t image_size, const char *name, unsigned int num_options,
                                   int *options, void **values) {
    (void)num_options, (void)options, (void)values;
    if (!state) return HIPRTC_ERROR_INVALID_INPUT;
    return add_input(state, input_type, image, image_size, name);
}

/* The file is the program's, on this machine: its bytes go to the worker. */
API hiprtcResult hiprtcLinkAddFile(hiprtcLinkState state, int input_type, const char *path,
                                   unsigned int num_options, int *options, void **values) {
    (void)num_options, (void)options, (void)values;
    if (!state || !path) return HIPRTC_ERROR_INVALID_INPUT;
    uint8_t *buf = NULL;
    size_t len = 0;
    hipr_file_status status = hipr_read_file(path, &buf, &len);
    if (status == HIPR_FILE_NO_MEMORY) return HIPRTC_ERROR_OUT_OF_MEMORY;
    if (status != HIPR_FILE_OK) return HIPRTC_ERROR_INVALID_INPUT;
    const char *base = strrchr(path, '/');
    hiprtcResult rc = add_input(state, input_type, buf, len, base ? base + 1 : path);
    free(buf);
    return rc;
}

API hiprtcResult hiprtcLinkComplete(hiprtcLinkState state, void **bin_out, size_t *size_out) {
    if (!state || !bin_out || !state->n) return HIPRTC_ERROR_INVALID_INPUT;
    struct hipr_link *l = state;
    size_t total = 0;
    for (size_t i = 0; i < l->n; i++) total += l->in[i].len;
    uint8_t *bulk = malloc(total);
    uint64_t kinds[MAX_LINK_INPUTS], sizes[MAX_LINK_INPUTS];
    const char *names[MAX_LINK_INPUTS];
    if (!bulk) return HIPRTC_ERROR_OUT_OF_MEMORY;
    size_t at = 0;
    for (size_t i = 0; i < l->n; i++) {
        memcpy(bulk + at, l->in[i].data, l->in[i].len);
        at += l->in[i].len;
        kinds[i] = (uint64_t)l->in[i].kind;
        sizes[i] = l->in[i].len;
        names[i] = l->in[i].name;
    }
    cbor_item_t *name_list = string_list(names, l->n);
    if (!name_list) {
        free(bulk);
        return HIPRTC_ERROR_OUT_OF_MEMORY;
    }
    hipr_map m;
    hipr_map_init(&m, 3);
    hipr_map_u64_list(&m, "kinds", kinds, l->n);
    hipr_map_u64_list(&m, "sizes", sizes, l->n);
    hipr_map_item(&m, "names", name_list);
    hipr_reply r;
    int rc = hipr_call(HIPR_ANY_DEVICE, OP_PROGRAM_LINK, &m, bulk, total, NULL, 0, &r);
    free(bulk);
    hiprtcResult result = HIPRTC_SUCCESS;
    if (rc == HIPR_SUCCESS) {
        free(l->out);
        l->out = r.bulk;
        l->out_len = r.bulk_len;
        r.bulk = NULL;
        char info[4096] = "";
        hipr_cbor_text(r.map, "log", info, sizeof info);
        write_log(l->info_log, l->info_size, info);
        write_log(l->error_log, l->error_size, "");
        *bin_out = l->out;
        if (size_out) *size_out = l->out_len;
    } else {
        /* The message is a first line, then the linker's error log where it gave one. */
        const char *nl = strchr(r.message, '\n');
        write_log(l->error_log, l->error_size, nl && nl[1] ? nl + 1 : r.message);
        if (rc == HIPR_OUT_OF_MEMORY) result = HIPRTC_ERROR_OUT_OF_MEMORY;
        else if (rc == HIPR_NOT_SUPPORTED || rc == HIPR_NO_DEVICE) result = HIPRTC_ERROR_INTERNAL_ERROR;
        else if (rc == HIPR_INVALID_VALUE) result = HIPRTC_ERROR_INVALID_INPUT;
        else result = HIPRTC_ERROR_LINKING;
        if (rc == HIPR_NOT_SUPPORTED) {
            static int warned;
            hipr_warn_once("hiprtcLinkComplete: the worker cannot link (the emulator has no "
                           "device linker)",
                           &warned);
        }
    }
    hipr_reply_free(&r);
    return result;
}

API hiprtcResult hiprtcLinkDestroy(hiprtcLinkState state) {
    if (!state) return HIPRTC_ERROR_INVALID_INPUT;
    for (size_t i = 0; i < state->n; i++) {
        free(state->in[i].data);
        free(state->in[i].name);
    }
    free(state->out);
    free(state);
    return HIPRTC_SUCCESS;
}

/* hiprtc functions hip-python loads that are not served yet (name expressions): each
 * exists, names itself once on stderr and returns HIPRTC_ERROR_INTERNAL_ERROR. No
 * parameters are declared, which the x86-64 and AArch64 calling conventions allow for a
 * function that reads none of its arguments. */
#define RTC_STUB(name)                                                                  \
    HIPR_EXPORT hiprtcResult name(void) {                                               \
        static int warned;                                                              \
        hipr_warn_once(#name " is not served by the hipr proxy yet "                    \
                             "(HIPRTC_ERROR_INTERNAL_ERROR)",                           \
                       &warned);                                                        \
        return HIPRTC_ERROR_INTERNAL_ERROR;                                             \
    }

RTC_STUB(hiprtcAddNameExpression)
RTC_STUB(hiprtcGetLoweredName)
