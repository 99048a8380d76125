/* hiprtc over the proxy: programs are kept here; hiprtcCompileProgram compiles on the
 * worker (PROGRAM_COMPILE) and keeps the code object and the log. The session is
 * libamdhip64.so's (this library links against it). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "client.h"
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

static void free_program(struct hipr_program *p) {
    if (!p) return;
    free(p->source);
    free(p->name);
    free(p->log);
    free(p->code);
    free(p);
}

API hiprtcResult hiprtcCreateProgram(hiprtcProgram *prog, const char *src, const char *name,
                                     int num_headers, const char **headers,
                                     const char **include_names) {
    (void)headers;
    (void)include_names;
    if (!prog || !src || num_headers < 0) return HIPRTC_ERROR_INVALID_INPUT;
    if (num_headers > 0) {
        static int warned;
        hipr_warn_once("hiprtcCreateProgram: headers given by the program are not sent to "
                       "the worker yet",
                       &warned);
        return HIPRTC_ERROR_INVALID_INPUT;
    }
    struct hipr_program *p = calloc(1, sizeof *p);
    if (!p) return HIPRTC_ERROR_OUT_OF_MEMORY;
    p->source = strdup(src);
    p->name = strdup(name ? name : "kernel.hip");
    if (!p->source || !p->name) {
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
    hipr_map m;
    hipr_map_init(&m, 3);
    hipr_map_str(&m, "source", prog->source, strlen(prog->source));
    hipr_map_str(&m, "name", prog->name, strlen(prog->name));
    hipr_map_item(&m, "options", list);
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

/* hiprtc functions hip-python loads that are not served yet (name expressions, bitcode,
 * linking): each exists, names itself once on stderr and returns
 * HIPRTC_ERROR_INTERNAL_ERROR. No parameters are declared, which the x86-64 and AArch64
 * calling conventions allow for a function that reads none of its arguments. */
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
RTC_STUB(hiprtcGetBitcode)
RTC_STUB(hiprtcGetBitcodeSize)
RTC_STUB(hiprtcLinkCreate)
RTC_STUB(hiprtcLinkAddFile)
RTC_STUB(hiprtcLinkAddData)
RTC_STUB(hiprtcLinkComplete)
RTC_STUB(hiprtcLinkDestroy)
