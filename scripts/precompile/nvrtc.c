/* A stand-in for NVRTC beside driver.c: nvrtcCompileProgram writes the source and its
 * options to $PRECOMPILE_SOURCES/k<pid>_<n>.{cu,opts} and answers at once with a placeholder
 * PTX, "// precompile <pid>_<n>". CubeCL compiles one kernel at a time; compile_sources.py
 * then compiles them all on every core, and environment.py puts their PTX in place of the
 * placeholders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
typedef int nvrtcResult;
struct prog { char *src; char ptx[64]; };
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int next = 0;
nvrtcResult nvrtcVersion(int *major, int *minor) { *major = 13; *minor = 0; return 0; }
const char *nvrtcGetErrorString(nvrtcResult r) { return "stand-in NVRTC error"; }
nvrtcResult nvrtcCreateProgram(struct prog **p, const char *src, const char *name, int n, const char *const *h, const char *const *i) {
  struct prog *x = calloc(1, sizeof *x); x->src = strdup(src); *p = x; return 0;
}
nvrtcResult nvrtcCompileProgram(struct prog *p, int n, const char *const *opts) {
  const char *dir = getenv("PRECOMPILE_SOURCES"); if (!dir) dir = ".";
  pthread_mutex_lock(&mu); int k = next++; pthread_mutex_unlock(&mu);
  char path[4096];
  snprintf(path, sizeof path, "%s/k%d_%05d.cu", dir, (int)getpid(), k);
  FILE *f = fopen(path, "w"); if (!f) return 1; fputs(p->src, f); fclose(f);
  snprintf(path, sizeof path, "%s/k%d_%05d.opts", dir, (int)getpid(), k);
  f = fopen(path, "w"); if (!f) return 1; for (int j = 0; j < n; j++) fprintf(f, "%s\n", opts[j]); fclose(f);
  snprintf(p->ptx, sizeof p->ptx, "// precompile %d_%05d\n", (int)getpid(), k);
  return 0;
}
nvrtcResult nvrtcGetPTXSize(struct prog *p, size_t *s) { *s = strlen(p->ptx) + 1; return 0; }
nvrtcResult nvrtcGetPTX(struct prog *p, char *out) { memcpy(out, p->ptx, strlen(p->ptx) + 1); return 0; }
nvrtcResult nvrtcGetProgramLogSize(struct prog *p, size_t *s) { *s = 1; return 0; }
nvrtcResult nvrtcGetProgramLog(struct prog *p, char *out) { out[0] = 0; return 0; }
nvrtcResult nvrtcDestroyProgram(struct prog **p) { if (p && *p) { free((*p)->src); free(*p); *p = NULL; } return 0; }
