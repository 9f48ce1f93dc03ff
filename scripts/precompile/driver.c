/* A stand-in for the CUDA driver (libcuda.so) on a machine without a GPU, impersonating one
 * H100 80GB HBM3 (sm_90, 132 SMs): enough of the driver API for a CubeCL program to run its
 * whole course, so that CubeCL compiles, and keeps in its environment file, every kernel the
 * program would compile on that GPU (scripts/precompile.sh).
 *
 * Device memory is host memory, each allocation ending against a guard page. Kernels are
 * not run; reads of device memory give 0x7f bytes (large finite values: no target check
 * finds a bad row). Events read a virtual clock that each launch advances by its
 * function's time: CubeCL's throughput probes take 20 ms, for real too since CubeCL times
 * them with the wall clock. Every other function takes longer than any roofline allows, so no
 * autotune stops before each of its candidates is compiled, and a little less than the one
 * loaded before it, which makes each autotune's last candidate its winner. The autotune
 * results such a run stores are meaningless, and precompile.sh drops them. Launches and
 * tensor maps past the limits the driver checks fail as they do on the GPU: an autotune whose
 * candidates fail there falls back to others, and those must be compiled too.
 * STAND_IN_TRACE=1 prints each call. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdint.h>
#include <math.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double vclock = 0.0; /* ms */
static size_t allocated = 0;
static const size_t total_mem = 85017493504ULL; /* what an H100 80GB HBM3 reports */
static long launches = 0, modules = 0;
static int trace = -1;
static void tr(const char *f) { if (trace < 0) trace = getenv("STAND_IN_TRACE") != NULL; if (trace) fprintf(stderr, "[stand-in driver] %s\n", f); }
#define T tr(__func__)

/* CubeCL's throughput benchmarker aims each probe at 20 ms: a count that takes that long. */
#define PROBE_MS 20.0
struct fn { char name[512]; int probe; double ms; };
static long functions = 0;
/* STAND_IN_LATER=slower makes each function slower than the one before instead, so that each
 * autotune picks its first candidate rather than its last; STAND_IN_LATER=random gives each
 * a time drawn from STAND_IN_SEED, so that it picks any. What a GPU picks decides some of the
 * kernels that come after, and precompile.sh runs all three ways. */
static double function_ms(void) {
  static unsigned long long state = 0;
  const char *order = getenv("STAND_IN_LATER");
  if (order && strcmp(order, "random") == 0) {
    if (state == 0) {
      const char *seed = getenv("STAND_IN_SEED");
      state = 0x9E3779B97F4A7C15ULL ^ strtoull(seed ? seed : "1", NULL, 10);
    }
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return 1e8 * (1.0 + (double)(state % 1000000) / 1e6);
  }
  double step = order && strcmp(order, "slower") == 0 ? 1.001 : 0.999;
  return 1e8 * pow(step, (double)(functions++ % 5000));
}
struct ev { double t; };

CUresult cuInit(unsigned int f) { T; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { T; *v = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int o) { T; *d = o; return o == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
CUresult cuDeviceGetCount(int *c) { T; *c = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGetName(char *n, int len, CUdevice d) { T; snprintf(n, len, "NVIDIA H100 80GB HBM3"); return CUDA_SUCCESS; }
CUresult cuDeviceTotalMem(size_t *b, CUdevice d) { T; *b = total_mem; return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { T; memset(u, 7, sizeof *u); return CUDA_SUCCESS; }
CUresult cuDeviceGetPCIBusId(char *p, int len, CUdevice d) { T; snprintf(p, len, "00000000:19:00.0"); return CUDA_SUCCESS; }
CUresult cuDeviceGetLuid(char *l, unsigned int *m, CUdevice d) { T; return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  T;
  int x = 0;
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: x = 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: x = 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: x = 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: x = 64; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: x = 2147483647; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: x = 65535; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: x = 65535; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: x = 49152; break;
  case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: x = 65536; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: x = 32; break;
  case CU_DEVICE_ATTRIBUTE_MAX_PITCH: x = 2147483647; break;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: x = 65536; break;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: x = 1980000; break;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: x = 512; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: x = 132; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: x = 9; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: x = 0; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: x = 232448; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: x = 233472; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: x = 2048; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: x = 32; break;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: x = 65536; break;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: x = 52428800; break;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: x = 5120; break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: x = 2619000; break;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: x = 0x19; break;
  case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: x = 5; break;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
  case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
  case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: x = 1; break;
  default: x = 0;
  }
  *v = x; return CUDA_SUCCESS;
}
static int ctx_dummy;
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { T; *c = (CUcontext)&ctx_dummy; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease(CUdevice d) { T; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned int f) { T; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *f, int *a) { T; *f = 0; *a = 1; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { T; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *c) { T; *c = (CUcontext)&ctx_dummy; return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent(CUcontext c) { T; return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent(CUcontext *c) { T; if (c) *c = (CUcontext)&ctx_dummy; return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *d) { T; *d = 0; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { T; return CUDA_SUCCESS; }
CUresult cuCtxGetStreamPriorityRange(int *l, int *g) { T; if (l) *l = 0; if (g) *g = -5; return CUDA_SUCCESS; }
CUresult cuCtxSetLimit(CUlimit l, size_t v) { T; return CUDA_SUCCESS; }
CUresult cuCtxGetLimit(size_t *v, CUlimit l) { T; *v = 1024; return CUDA_SUCCESS; }
CUresult cuCtxGetApiVersion(CUcontext c, unsigned int *v) { T; *v = 13000; return CUDA_SUCCESS; }
CUresult cuCtxGetFlags(unsigned int *f) { T; *f = 0; return CUDA_SUCCESS; }

CUresult cuGetErrorString(CUresult e, const char **s) { static char b[64]; snprintf(b, 64, "stand-in driver error %d", (int)e); *s = b; return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult e, const char **s) { static char b[64]; snprintf(b, 64, "CUDA_ERROR_%d", (int)e); *s = b; return CUDA_SUCCESS; }

/* A write past an allocation faults where it happens. */
struct hdr { size_t map; size_t size; };
static CUresult alloc(CUdeviceptr *p, size_t n) {
  size_t page = 4096, need = (n ? n : 1);
  size_t body = (need + 511) / 512 * 512;
  size_t map = (body + page - 1) / page * page + 2 * page;
  char *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  mprotect(m + map - page, page, PROT_NONE);
  char *start = m + map - page - body;
  struct hdr *h = (struct hdr *)m; h->map = map; h->size = n;
  *(char **)(start - 16) = m; /* base, for the free */
  pthread_mutex_lock(&mu); allocated += n; pthread_mutex_unlock(&mu);
  *p = (CUdeviceptr)start; return CUDA_SUCCESS;
}
static void release(CUdeviceptr p) {
  if (!p) return;
  char *m = *(char **)((char *)p - 16);
  struct hdr *h = (struct hdr *)m;
  pthread_mutex_lock(&mu); allocated -= h->size; pthread_mutex_unlock(&mu);
  munmap(m, h->map);
}
CUresult cuMemAlloc(CUdeviceptr *p, size_t n) { T; return alloc(p, n); }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { T; return alloc(p, n); }
CUresult cuMemAllocPitch(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) { T; *pitch = (w + 511) / 512 * 512; return alloc(p, *pitch * h); }
CUresult cuMemFree(CUdeviceptr p) { T; release(p); return CUDA_SUCCESS; }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { T; release(p); return CUDA_SUCCESS; }
CUresult cuMemAllocHost(void **p, size_t n) { T; *p = calloc(1, n ? n : 1); return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int f) { T; *p = calloc(1, n ? n : 1); return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }
CUresult cuMemFreeHost(void *p) { T; free(p); return CUDA_SUCCESS; }
CUresult cuMemHostRegister(void *p, size_t n, unsigned int f) { T; return CUDA_SUCCESS; }
CUresult cuMemHostUnregister(void *p) { T; return CUDA_SUCCESS; }
CUresult cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int f) { T; *d = (CUdeviceptr)p; return CUDA_SUCCESS; }
CUresult cuMemGetInfo(size_t *f, size_t *t) { T; *t = total_mem; *f = total_mem > allocated ? total_mem - allocated : 0; return CUDA_SUCCESS; }
CUresult cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t n) { T; memcpy((void *)d, s, n); return CUDA_SUCCESS; }
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) { T; memcpy((void *)d, s, n); return CUDA_SUCCESS; }
CUresult cuMemcpyDtoH(void *d, CUdeviceptr s, size_t n) { T; memset(d, 0x7f, n); /* no kernel ran: reads give large finite values (no error found, no bad row) */ return CUDA_SUCCESS; }
CUresult cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) { T; memset(d, 0x7f, n); /* no kernel ran: reads give large finite values (no error found, no bad row) */ return CUDA_SUCCESS; }
CUresult cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) { T; memmove((void *)d, (void *)s, n); return CUDA_SUCCESS; }
CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { T; memmove((void *)d, (void *)s, n); return CUDA_SUCCESS; }
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { T; memmove((void *)d, (void *)s, n); return CUDA_SUCCESS; }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { T; memmove((void *)d, (void *)s, n); return CUDA_SUCCESS; }
static const char *base2d(const CUDA_MEMCPY2D *c, int src) {
  CUmemorytype t = src ? c->srcMemoryType : c->dstMemoryType;
  const char *p = src ? (t == CU_MEMORYTYPE_HOST ? (const char *)c->srcHost : (const char *)c->srcDevice)
                      : (t == CU_MEMORYTYPE_HOST ? (const char *)c->dstHost : (const char *)c->dstDevice);
  return p;
}
CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *c, CUstream st) {
  T;
  const char *s = base2d(c, 1); char *d = (char *)base2d(c, 0);
  for (size_t y = 0; y < c->Height; y++)
    memmove(d + (c->dstY + y) * c->dstPitch + c->dstXInBytes, s + (c->srcY + y) * c->srcPitch + c->srcXInBytes, c->WidthInBytes);
  return CUDA_SUCCESS;
}
CUresult cuMemcpy2D(const CUDA_MEMCPY2D *c) { return cuMemcpy2DAsync(c, 0); }
CUresult cuMemcpy2DUnaligned(const CUDA_MEMCPY2D *c) { return cuMemcpy2DAsync(c, 0); }
CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { T; memset((void *)d, v, n); return CUDA_SUCCESS; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { T; memset((void *)d, v, n); return CUDA_SUCCESS; }
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { T; unsigned short *p = (void *)d; for (size_t i = 0; i < n; i++) p[i] = v; return CUDA_SUCCESS; }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { T; unsigned int *p = (void *)d; for (size_t i = 0; i < n; i++) p[i] = v; return CUDA_SUCCESS; }
CUresult cuMemsetD32(CUdeviceptr d, unsigned int v, size_t n) { return cuMemsetD32Async(d, v, n, 0); }
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p) { T; memset(data, 0, 8); return CUDA_SUCCESS; }

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  T; pthread_mutex_lock(&mu); modules++; pthread_mutex_unlock(&mu);
  *m = (CUmodule)malloc(16); return CUDA_SUCCESS;
}
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v) { return cuModuleLoadData(m, image); }
CUresult cuModuleUnload(CUmodule m) { T; free(m); return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  T; struct fn *x = calloc(1, sizeof *x); snprintf(x->name, sizeof x->name, "%s", name);
  pthread_mutex_lock(&mu);
  x->probe = strstr(name, "throughput") || strstr(name, "launch_overhead") || strstr(name, "prime_buffer");
  x->ms = x->probe ? PROBE_MS : function_ms();
  pthread_mutex_unlock(&mu);
  *f = (CUfunction)x; return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  T; return a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && (v < 0 || v > 232448)
    ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c) { T; return CUDA_SUCCESS; }
CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  T;
  switch (a) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
  case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 64; break;
  default: *v = 0;
  }
  return CUDA_SUCCESS;
}
static void advance(CUfunction f) {
  double d = f ? ((struct fn *)f)->ms : 1.0;
  if (f && ((struct fn *)f)->probe) usleep((useconds_t)(PROBE_MS * 1000));
  pthread_mutex_lock(&mu); vclock += d; launches++;
  pthread_mutex_unlock(&mu);
}
/* The limits the driver checks at launch (an H100's): a candidate past them fails on the GPU,
 * and an autotune then moves on to candidates it would not try otherwise. */
static CUresult launch_limits(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                              unsigned smem) {
  if (gx == 0 || gy == 0 || gz == 0 || gx > 2147483647u || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
  if (bx == 0 || by == 0 || bz == 0 || bx > 1024 || by > 1024 || bz > 64 ||
      (unsigned long long)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
  if (smem > 232448) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sm, CUstream s, void **p, void **e) {
  T; CUresult r = launch_limits(gx, gy, gz, bx, by, bz, sm); if (r != CUDA_SUCCESS) return r;
  advance(f); return CUDA_SUCCESS;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  T; CUresult r = launch_limits(c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                                c->sharedMemBytes);
  if (r != CUDA_SUCCESS) return r;
  advance(f); return CUDA_SUCCESS;
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sm, CUstream s, void **p) { return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sm, s, p, NULL); }
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int b, size_t s) { T; *n = 1; return CUDA_SUCCESS; }
CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c) { T; *n = 16; return CUDA_SUCCESS; }

CUresult cuEventCreate(CUevent *e, unsigned int f) { T; *e = (CUevent)calloc(1, sizeof(struct ev)); return CUDA_SUCCESS; }
CUresult cuEventDestroy(CUevent e) { T; free(e); return CUDA_SUCCESS; }
CUresult cuEventRecord(CUevent e, CUstream s) { T; pthread_mutex_lock(&mu); ((struct ev *)e)->t = vclock; pthread_mutex_unlock(&mu); return CUDA_SUCCESS; }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int f) { return cuEventRecord(e, s); }
CUresult cuEventSynchronize(CUevent e) { T; return CUDA_SUCCESS; }
CUresult cuEventQuery(CUevent e) { T; return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { T; *ms = (float)(((struct ev *)b)->t - ((struct ev *)a)->t); return CUDA_SUCCESS; }

CUresult cuStreamCreate(CUstream *s, unsigned int f) { T; *s = (CUstream)calloc(1, 64); return CUDA_SUCCESS; }
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int f, int p) { return cuStreamCreate(s, f); }
CUresult cuStreamDestroy(CUstream s) { T; free(s); return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) { T; return CUDA_SUCCESS; }
CUresult cuStreamQuery(CUstream s) { T; return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) { T; return CUDA_SUCCESS; }
CUresult cuStreamGetCtx(CUstream s, CUcontext *c) { T; *c = (CUcontext)&ctx_dummy; return CUDA_SUCCESS; }
CUresult cuStreamGetFlags(CUstream s, unsigned int *f) { T; *f = 0; return CUDA_SUCCESS; }
CUresult cuStreamGetPriority(CUstream s, int *p) { T; *p = 0; return CUDA_SUCCESS; }
CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode m) { T; return CUDA_SUCCESS; }
CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { T; *g = (CUgraph)malloc(16); return CUDA_SUCCESS; }
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *c) { T; *c = CU_STREAM_CAPTURE_STATUS_NONE; return CUDA_SUCCESS; }
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long f) { T; *e = (CUgraphExec)malloc(16); return CUDA_SUCCESS; }
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { T; return CUDA_SUCCESS; }
CUresult cuGraphUpload(CUgraphExec e, CUstream s) { T; return CUDA_SUCCESS; }
CUresult cuGraphDestroy(CUgraph g) { T; free(g); return CUDA_SUCCESS; }
CUresult cuGraphExecDestroy(CUgraphExec e) { T; free(e); return CUDA_SUCCESS; }
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *n, size_t *c) { T; *c = 0; return CUDA_SUCCESS; }

CUresult cuTensorMapEncodeTiled(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t r, void *a, const cuuint64_t *d,
    const cuuint64_t *s, const cuuint32_t *b, const cuuint32_t *e, CUtensorMapInterleave i, CUtensorMapSwizzle w,
    CUtensorMapL2promotion l, CUtensorMapFloatOOBfill o) {
  T; memset(m, 0, sizeof *m);
  /* The requirements the driver documents for a tiled tensor map. */
  static const unsigned elem_bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  unsigned eb = t < sizeof elem_bytes / sizeof *elem_bytes ? elem_bytes[t] : 1;
  if (r < 1 || r > 5 || (uintptr_t)a % (i == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16)) return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t k = 0; k < r; k++) {
    if (d[k] == 0 || d[k] > (1ULL << 32) || b[k] == 0 || b[k] > 256 || e[k] == 0 || e[k] > 8)
      return CUDA_ERROR_INVALID_VALUE;
    if (k + 1 < r && (s[k] % 16 || s[k] >= (1ULL << 40))) return CUDA_ERROR_INVALID_VALUE;
  }
  if (i == CU_TENSOR_MAP_INTERLEAVE_NONE) {
    unsigned inner = b[0] * eb;
    unsigned span = w == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : w == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                  : w == CU_TENSOR_MAP_SWIZZLE_NONE ? 0 : 128;
    if (inner % 16 || (span && inner > span)) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeIm2col(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t r, void *a, const cuuint64_t *d,
    const cuuint64_t *s, const int *lo, const int *up, cuuint32_t c, cuuint32_t p, const cuuint32_t *e,
    CUtensorMapInterleave i, CUtensorMapSwizzle w, CUtensorMapL2promotion l, CUtensorMapFloatOOBfill o) { T; memset(m, 0, sizeof *m); return CUDA_SUCCESS; }

/* What ran, once the program is done (not for the copies loaded only to probe for a driver). */
__attribute__((destructor)) static void report(void) {
  if (launches) fprintf(stderr, "[stand-in driver] %ld launches, %ld modules loaded\n", launches, modules);
}

/* The unversioned names too, as the real driver exports both. */
#define ALIAS(n) extern CUresult n() __attribute__((alias(#n "_v2")));
#undef cuDeviceGetUuid
#undef cuEventElapsedTime
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemAllocHost
#undef cuMemAllocPitch
#undef cuMemGetInfo
#undef cuMemcpyHtoD
#undef cuMemcpyDtoH
#undef cuMemcpyDtoD
#undef cuMemcpyHtoDAsync
#undef cuMemcpyDtoHAsync
#undef cuMemcpyDtoDAsync
#undef cuMemcpy2D
#undef cuMemcpy2DAsync
#undef cuMemcpy2DUnaligned
#undef cuMemsetD8
#undef cuMemsetD32
#undef cuDeviceTotalMem
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuStreamBeginCapture
#undef cuMemHostRegister
#undef cuMemHostGetDevicePointer
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxSetFlags
#undef cuEventDestroy
#undef cuStreamDestroy
#undef cuModuleGetGlobal
ALIAS(cuDeviceGetUuid) ALIAS(cuEventElapsedTime) ALIAS(cuMemAlloc) ALIAS(cuMemFree) ALIAS(cuMemAllocHost)
ALIAS(cuMemAllocPitch) ALIAS(cuMemGetInfo) ALIAS(cuMemcpyHtoD) ALIAS(cuMemcpyDtoH) ALIAS(cuMemcpyDtoD)
ALIAS(cuMemcpyHtoDAsync) ALIAS(cuMemcpyDtoHAsync) ALIAS(cuMemcpyDtoDAsync) ALIAS(cuMemcpy2D) ALIAS(cuMemcpy2DAsync)
ALIAS(cuMemcpy2DUnaligned) ALIAS(cuMemsetD8) ALIAS(cuMemsetD32) ALIAS(cuDeviceTotalMem) ALIAS(cuCtxPushCurrent)
ALIAS(cuCtxPopCurrent) ALIAS(cuStreamBeginCapture) ALIAS(cuMemHostRegister) ALIAS(cuMemHostGetDevicePointer)
ALIAS(cuDevicePrimaryCtxRelease) ALIAS(cuDevicePrimaryCtxSetFlags) ALIAS(cuEventDestroy) ALIAS(cuStreamDestroy)
