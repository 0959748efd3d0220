/* offramp ramp tap: an ONNX Runtime custom op that decides early exits inside the call.

   RampTap(logits[B, C]) -> outcome float[B, 2] (top-1 label, exit score)   domain "offramp",
                                                                          attr ramp

   Every tapped stage (services/runtime/taps.py) ends each active ramp's head in one of these.
   The op computes each row's top-1 and exit score (lower = more confident, the same kinds as
   services/exits/scores.py) and, when the calling thread has begun a tapped run
   (offramp_tap_begin), marks the rows whose score is below the ramp's threshold as exited
   and calls the run's callback with them, so their answers leave while the stage goes on.
   A ramp where nothing exits costs its head plus this loop: no Python, no GIL. Labels and
   scores of every row come back as an ordinary output (telemetry; a label is exact in a
   float below 2^24 classes).

   Built at run time by services/runtime/tap_library.py with the system C compiler; no ONNX
   Runtime headers needed. The declarations below are the parts of the runtime's C ABI this
   op uses: the OrtApi function table is append-only (a slot never moves), and the
   OrtCustomOp table is read up to the version it declares. */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct OrtStatus OrtStatus;  /* NULL = success */
typedef void (*OrtFn)(void);

/* Slots of the OrtApi table (its version-1 part, frozen since ONNX Runtime 1.0). */
enum {
  SLOT_CREATE_CUSTOM_OP_DOMAIN = 26,
  SLOT_CUSTOM_OP_DOMAIN_ADD = 27,
  SLOT_ADD_CUSTOM_OP_DOMAIN = 28,
  SLOT_GET_TENSOR_MUTABLE_DATA = 51,
  SLOT_GET_DIMENSIONS_COUNT = 61,
  SLOT_GET_DIMENSIONS = 62,
  SLOT_GET_TENSOR_TYPE_AND_SHAPE = 65,
  SLOT_KERNEL_INFO_GET_ATTRIBUTE_INT64 = 86,
  SLOT_KERNEL_CONTEXT_GET_INPUT = 90,
  SLOT_KERNEL_CONTEXT_GET_OUTPUT = 91,
  SLOT_RELEASE_STATUS = 93,
  SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
  API_SLOTS_USED = 100
};
typedef struct OrtApi { OrtFn slot[API_SLOTS_USED]; } OrtApi;
typedef struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

#define ORT_API_VERSION_USED 1u  /* every slot above exists since version 1 */
#define CALL(index, type) ((type)(g_api->slot[index]))

typedef OrtStatus* (*GetInputFn)(const void* ctx, size_t index, const void** out);
typedef OrtStatus* (*GetOutputFn)(void* ctx, size_t index, const int64_t* dims, size_t n,
                                  void** out);
typedef OrtStatus* (*TypeAndShapeFn)(const void* value, void** info);
typedef OrtStatus* (*DimsCountFn)(const void* info, size_t* out);
typedef OrtStatus* (*DimsFn)(const void* info, int64_t* dims, size_t n);
typedef void (*ReleaseFn)(void* object);
typedef OrtStatus* (*MutableDataFn)(void* value, void** out);
typedef OrtStatus* (*AttrInt64Fn)(const void* info, const char* name, int64_t* out);
typedef OrtStatus* (*CreateDomainFn)(const char* domain, void** out);
typedef OrtStatus* (*DomainAddFn)(void* domain, const void* op);
typedef OrtStatus* (*AddDomainFn)(void* options, void* domain);

/* The custom op table as the runtime defines it today. It reads the fields of the version an
   op declares (some regardless of it), so every field is filled. Version 15 keeps the
   version-1 kernel entry points (CreateKernel / KernelCompute). */
typedef struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const struct OrtCustomOp*, const OrtApi*, const void* info);
  const char* (*GetName)(const struct OrtCustomOp*);
  const char* (*GetExecutionProviderType)(const struct OrtCustomOp*);
  int (*GetInputType)(const struct OrtCustomOp*, size_t);
  size_t (*GetInputTypeCount)(const struct OrtCustomOp*);
  int (*GetOutputType)(const struct OrtCustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const struct OrtCustomOp*);
  void (*KernelCompute)(void* kernel, void* ctx);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const struct OrtCustomOp*, size_t);
  int (*GetOutputCharacteristic)(const struct OrtCustomOp*, size_t);
  int (*GetInputMemoryType)(const struct OrtCustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const struct OrtCustomOp*);
  int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp*);
  int (*GetVariadicOutputMinArity)(const struct OrtCustomOp*);
  int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp*);
  OrtStatus* (*CreateKernelV2)(const struct OrtCustomOp*, const OrtApi*, const void* info,
                               void** kernel);
  OrtStatus* (*KernelComputeV2)(void* kernel, void* ctx);
  OrtStatus* (*InferOutputShapeFn)(const struct OrtCustomOp*, void* ctx);
  int (*GetStartVersion)(const struct OrtCustomOp*);
  int (*GetEndVersion)(const struct OrtCustomOp*);
  size_t (*GetMayInplace)(int** inputs, int** outputs);
  void (*ReleaseMayInplace)(int* inputs, int* outputs);
  size_t (*GetAliasMap)(int** inputs, int** outputs);
  void (*ReleaseAliasMap)(int* inputs, int* outputs);
} OrtCustomOp;

enum { ELEMENT_FLOAT = 1 };                                 /* ONNXTensorElementDataType */
enum { SCORE_MAX_SOFTMAX = 0, SCORE_ENTROPY = 1, SCORE_MARGIN = 2 };

/* (ramp, batch, n exited rows, their indices, logits [batch, classes], classes,
   outcome [batch, 2]); called on the runtime's calling thread, pointers valid during it */
typedef void (*ExitCallback)(int64_t, int64_t, int64_t, const int64_t*, const float*, int64_t,
                             const float*);

/* One tapped run, begun by the thread that calls the runtime (offramp_tap_begin). */
typedef struct TapRun {
  const float* thresholds;  /* by ramp index; <= 0: never exits */
  int64_t n_thresholds;
  int32_t* exit_at;         /* by row: -1, or the ramp it exited at (written here) */
  int64_t batch;
  int32_t score_kind;
  int32_t report_all;       /* call back at every tap, exit nothing (the order check) */
  int32_t active;
} TapRun;

static const OrtApi* g_api;
static ExitCallback g_on_exit;
static __thread TapRun t_run;

void offramp_tap_callback(ExitCallback on_exit) { g_on_exit = on_exit; }

void offramp_tap_begin(const float* thresholds, int64_t n_thresholds, int32_t* exit_at,
                       int64_t batch, int32_t score_kind, int32_t report_all) {
  TapRun run = {thresholds, n_thresholds, exit_at, batch, score_kind, report_all, 1};
  t_run = run;
}

void offramp_tap_end(void) { t_run.active = 0; }

/* Top-1 label and exit score of one row of logits, as services/exits/scores.py defines
   them (softmax; 1 - max, normalised entropy, 1 - top-2 margin; clipped to [0, 1]). */
static void score_row(const float* z, int64_t classes, int32_t kind, float* outcome) {
  int64_t top = 0;
  float m1 = z[0], m2 = -INFINITY;
  for (int64_t c = 1; c < classes; c++) {
    if (z[c] > m1) { m2 = m1; m1 = z[c]; top = c; }
    else if (z[c] > m2) { m2 = z[c]; }
  }
  double sum = 0.0, weighted = 0.0;
  for (int64_t c = 0; c < classes; c++) {
    float d = z[c] - m1;
    float e = expf(d);  /* as numpy's float32 softmax; summed in double */
    sum += e;
    if (kind == SCORE_ENTROPY) weighted += (double)e * d;
  }
  double s;
  if (kind == SCORE_ENTROPY) {
    s = classes > 1 ? (log(sum) - weighted / sum) / log((double)classes) : 0.0;
  } else if (kind == SCORE_MARGIN) {
    s = classes > 1 ? 1.0 - (1.0 - exp((double)(m2 - m1))) / sum : 0.0;
  } else {
    s = 1.0 - 1.0 / sum;
  }
  outcome[0] = (float)top;
  outcome[1] = (float)(s < 0.0 ? 0.0 : s > 1.0 ? 1.0 : s);
}

typedef struct Kernel { int64_t ramp; } Kernel;

static void* create_kernel(const OrtCustomOp* op, const OrtApi* api, const void* info) {
  (void)op; (void)api;
  Kernel* k = calloc(1, sizeof(Kernel));
  if (k == NULL) return NULL;
  k->ramp = -1;
  OrtStatus* st = CALL(SLOT_KERNEL_INFO_GET_ATTRIBUTE_INT64, AttrInt64Fn)(info, "ramp", &k->ramp);
  if (st != NULL) CALL(SLOT_RELEASE_STATUS, ReleaseFn)(st);
  return k;
}

static void compute(void* kernel, void* ctx) {
  const Kernel* k = kernel;
  const void* input = NULL;
  void* info = NULL;
  size_t rank = 0;
  int64_t dims[2] = {0, 0};
  float* logits = NULL;
  if (CALL(SLOT_KERNEL_CONTEXT_GET_INPUT, GetInputFn)(ctx, 0, &input) != NULL || input == NULL)
    return;
  if (CALL(SLOT_GET_TENSOR_TYPE_AND_SHAPE, TypeAndShapeFn)(input, &info) != NULL) return;
  CALL(SLOT_GET_DIMENSIONS_COUNT, DimsCountFn)(info, &rank);
  if (rank == 2) CALL(SLOT_GET_DIMENSIONS, DimsFn)(info, dims, 2);
  CALL(SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO, ReleaseFn)(info);
  int64_t batch = rank == 2 ? dims[0] : 0, classes = dims[1];
  CALL(SLOT_GET_TENSOR_MUTABLE_DATA, MutableDataFn)((void*)input, (void**)&logits);

  void* output = NULL;
  int64_t shape[2] = {batch, 2};
  float* outcome = NULL;
  if (CALL(SLOT_KERNEL_CONTEXT_GET_OUTPUT, GetOutputFn)(ctx, 0, shape, 2, &output) != NULL) return;
  CALL(SLOT_GET_TENSOR_MUTABLE_DATA, MutableDataFn)(output, (void**)&outcome);
  if (classes < 1) {  /* nothing to score: label 0, least confident */
    for (int64_t b = 0; b < batch; b++) { outcome[2 * b] = 0.f; outcome[2 * b + 1] = 1.f; }
    return;
  }
  const TapRun* run = t_run.active ? &t_run : NULL;
  int32_t kind = run != NULL ? run->score_kind : SCORE_MAX_SOFTMAX;
  for (int64_t b = 0; b < batch; b++) score_row(logits + b * classes, classes, kind, outcome + 2 * b);
  if (run == NULL || g_on_exit == NULL) return;

  float threshold = (k->ramp >= 0 && k->ramp < run->n_thresholds) ? run->thresholds[k->ramp] : 0.f;
  int64_t rows_n = batch < run->batch ? batch : run->batch;
  int64_t n = 0;
  int64_t* rows = NULL;
  if (!run->report_all && threshold > 0.f) {
    for (int64_t b = 0; b < rows_n; b++) {
      if (run->exit_at[b] < 0 && outcome[2 * b + 1] < threshold) {
        if (rows == NULL && (rows = malloc(sizeof(int64_t) * (size_t)rows_n)) == NULL) return;
        run->exit_at[b] = (int32_t)k->ramp;
        rows[n++] = b;
      }
    }
  }
  if (n > 0 || run->report_all) g_on_exit(k->ramp, batch, n, rows, logits, classes, outcome);
  free(rows);
}

static void destroy(void* kernel) { free(kernel); }
static const char* op_name(const OrtCustomOp* op) { (void)op; return "RampTap"; }
static const char* op_provider(const OrtCustomOp* op) { (void)op; return NULL; }  /* CPU */
static int input_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return ELEMENT_FLOAT; }
static size_t one_input(const OrtCustomOp* op) { (void)op; return 1; }
static int output_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return ELEMENT_FLOAT; }
static size_t one_output(const OrtCustomOp* op) { (void)op; return 1; }
static int required(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int default_memory(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int one(const OrtCustomOp* op) { (void)op; return 1; }
static int latest(const OrtCustomOp* op) { (void)op; return 1 << 30; }
static OrtStatus* create_kernel_v2(const OrtCustomOp* op, const OrtApi* api, const void* info,
                                   void** kernel) {
  *kernel = create_kernel(op, api, info);
  return NULL;
}
static OrtStatus* compute_v2(void* kernel, void* ctx) { compute(kernel, ctx); return NULL; }
static size_t no_pairs(int** a, int** b) { *a = NULL; *b = NULL; return 0; }
static void no_release(int* a, int* b) { (void)a; (void)b; }

static const OrtCustomOp g_ramp_tap = {
    15, create_kernel, op_name, op_provider, input_type, one_input, output_type, one_output,
    compute, destroy, required, required, default_memory, one, one, one, one,
    create_kernel_v2, compute_v2, NULL, one, latest, no_pairs, no_release, no_pairs, no_release};

/* Entry point of SessionOptions.register_custom_ops_library. */
OrtStatus* RegisterCustomOps(void* options, const OrtApiBase* base) {
  g_api = base->GetApi(ORT_API_VERSION_USED);
  if (g_api == NULL) return NULL;  /* cannot happen: every runtime serves version 1 */
  void* domain = NULL;
  OrtStatus* st = CALL(SLOT_CREATE_CUSTOM_OP_DOMAIN, CreateDomainFn)("offramp", &domain);
  if (st != NULL) return st;
  st = CALL(SLOT_CUSTOM_OP_DOMAIN_ADD, DomainAddFn)(domain, &g_ramp_tap);
  if (st != NULL) return st;
  return CALL(SLOT_ADD_CUSTOM_OP_DOMAIN, AddDomainFn)(options, domain);
}

/* Checked by the loader: a library built from another source is rebuilt. */
int offramp_tap_abi(void) { return 1; }
