/* A minimal NVTX v3 tool (injection library) that writes what a profiler such as Nsight Systems
 * would receive: domains, category names, registered strings, and push/pop ranges with their
 * category and payload. Loaded by the NVTX runtime when NVTX_INJECTION64_PATH points at the
 * compiled .so; output goes to the file named by MIXDIAG_NVTX_RECORD, one tab-separated event
 * per line:
 *
 *   domain  <name>
 *   category  <domain>  <id>  <name>
 *   push  <domain>  <category id>  <payload type>  <payload>  <message>
 *   pop  <domain>
 *
 * Struct layouts and callback ids follow the public, ABI-stable NVTX v3 headers
 * (nvToolsExt.h, nvtxDetail/nvtxTypes.h); they are declared here so the test needs only a C
 * compiler. Test helper for tests/engine/test_nvtx_real_tool.py.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table, unsigned int *out_size);
} NvtxExportTableCallbacks;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t exportTableId);

enum { ETID_CALLBACKS = 1, CB_MODULE_CORE2 = 5 };
enum { CORE2_RangePushEx = 4, CORE2_RangePop = 5, CORE2_NameCategoryA = 8, CORE2_RegisterStringA = 10,
       CORE2_CreateA = 12, CORE2_Destroy = 14 };
enum { MSG_ASCII = 1, MSG_REGISTERED = 3 };
enum { PAYLOAD_UINT64 = 1, PAYLOAD_INT64 = 2, PAYLOAD_DOUBLE = 3, PAYLOAD_UINT32 = 4, PAYLOAD_INT32 = 5 };

typedef struct {  /* nvtxEventAttributes_v2 */
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType;
    int32_t reserved0;
    union { uint64_t ullValue; int64_t llValue; double dValue; uint32_t uiValue; int32_t iValue; } payload;
    int32_t messageType;
    union { const char *ascii; const void *unicode; const void *registered; } message;
} EventAttributes;

typedef struct { char *name; } Domain;
typedef struct { Domain *domain; char *text; } RegisteredString;

static FILE *out;

static const char *domain_name(const Domain *d) { return d ? d->name : "(default)"; }

static void *create_domain(const char *name) {
    Domain *d = calloc(1, sizeof *d);
    d->name = strdup(name ? name : "");
    fprintf(out, "domain\t%s\n", d->name);
    return d;
}

static void destroy_domain(void *d) { (void)d; /* handles stay valid until exit */ }

static void name_category(void *d, uint32_t id, const char *name) {
    fprintf(out, "category\t%s\t%u\t%s\n", domain_name(d), id, name);
}

static void *register_string(void *d, const char *text) {
    RegisteredString *s = calloc(1, sizeof *s);
    s->domain = d;
    s->text = strdup(text ? text : "");
    return s;
}

static int push(void *d, const EventAttributes *a) {
    const char *msg = "";
    if (a->messageType == MSG_REGISTERED && a->message.registered)
        msg = ((const RegisteredString *)a->message.registered)->text;
    else if (a->messageType == MSG_ASCII && a->message.ascii)
        msg = a->message.ascii;
    char payload[64] = "";
    switch (a->payloadType) {
    case PAYLOAD_INT64: snprintf(payload, sizeof payload, "%lld", (long long)a->payload.llValue); break;
    case PAYLOAD_UINT64: snprintf(payload, sizeof payload, "%llu", (unsigned long long)a->payload.ullValue); break;
    case PAYLOAD_DOUBLE: snprintf(payload, sizeof payload, "%.17g", a->payload.dValue); break;
    case PAYLOAD_INT32: snprintf(payload, sizeof payload, "%d", a->payload.iValue); break;
    case PAYLOAD_UINT32: snprintf(payload, sizeof payload, "%u", a->payload.uiValue); break;
    default: break;
    }
    fprintf(out, "push\t%s\t%u\t%d\t%s\t%s\n", domain_name(d), a->category, a->payloadType, payload, msg);
    return 0;
}

static int pop(void *d) {
    fprintf(out, "pop\t%s\n", domain_name(d));
    return 0;
}

static void close_out(void) { if (out) fclose(out); }

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
    const char *path = getenv("MIXDIAG_NVTX_RECORD");
    out = fopen(path ? path : "nvtx_record.tsv", "w");
    if (!out) return 0;
    atexit(close_out);
    const NvtxExportTableCallbacks *cb = getExportTable(ETID_CALLBACKS);
    NvtxFunctionTable table = 0;
    unsigned int size = 0;
    if (!cb || !cb->GetModuleFunctionTable(CB_MODULE_CORE2, &table, &size) || size < CORE2_Destroy) return 0;
    *table[CORE2_RangePushEx] = (NvtxFunctionPointer)push;
    *table[CORE2_RangePop] = (NvtxFunctionPointer)pop;
    *table[CORE2_NameCategoryA] = (NvtxFunctionPointer)name_category;
    *table[CORE2_RegisterStringA] = (NvtxFunctionPointer)register_string;
    *table[CORE2_CreateA] = (NvtxFunctionPointer)create_domain;
    *table[CORE2_Destroy] = (NvtxFunctionPointer)destroy_domain;
    return 1;
}
