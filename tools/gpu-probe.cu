// gpu-probe.cu - one-shot checks of the GPU facts Lynx-C's CUDA code
// relies on (docs/gpu.md, "One command on a GPU host"): the %globaltimer
// step, a registered /dev/shm region seen through a second mapping, the
// host-mapped read round trip, the cost of a system fence against
// acquire/release, which CUDA calls block while a persistent kernel
// spins, and how many blocks of large grids become resident.
// Built as bin/lynx-gpu-probe where CUDA is (accel/cuda/CMakeLists.txt);
// run by tests/gpu/prove.sh (make gpu-prove). About 20-40 s; prints one
// "CHECK name: result" line each, exits 1 when a CUDA call fails.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      printf("CHECK %s: FAILED %s\n", #x, cudaGetErrorString(e_));             \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__device__ __forceinline__ uint64_t gt(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// 1. %globaltimer: smallest non-zero step and distinct values in 200k reads.
__global__ void k_gt(unsigned long long *out) {
  uint64_t prev = gt(), minstep = ~0ull, distinct = 0;
  for (int i = 0; i < 200000; i++) {
    uint64_t t = gt();
    if (t != prev) {
      distinct++;
      if (t - prev < minstep)
        minstep = t - prev;
      prev = t;
    }
  }
  out[0] = minstep;
  out[1] = distinct;
}

// 2. Serial (dependent) volatile loads of host-mapped memory: the PCIe RTT.
__global__ void k_rtt(const uint32_t *p, int n, unsigned long long *out) {
  uint32_t idx = 0;
  uint64_t t0 = gt();
  for (int i = 0; i < n; i++)
    idx = (*(const volatile uint32_t *)(p + ((idx + i * 64) & 0x3ffff))) & 1;
  out[0] = (gt() - t0) / n;
  out[1] = idx;
}

// 3. Cost of publishing to host-mapped memory: a posted store then
//    mode 0: membar.sys (= __threadfence_system, fence.sc.sys)
//    mode 1: fence.acq_rel.sys
//    mode 2: st.release.sys (no separate fence)
//    mode 3: no fence (the store alone)
__global__ void k_fence(uint32_t *p, int n, int mode, unsigned long long *out) {
  uint64_t t0 = gt();
  for (int i = 0; i < n; i++) {
    p[(i * 16) & 0xffff] = i; // payload-like store
    if (mode == 0) {
      __threadfence_system();
      *(volatile uint32_t *)(p + 0x10000) = i;
    } else if (mode == 1) {
      asm volatile("fence.acq_rel.sys;" ::: "memory");
      *(volatile uint32_t *)(p + 0x10000) = i;
    } else if (mode == 2) {
      asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p + 0x10000),
                   "r"(i)
                   : "memory");
    } else {
      *(volatile uint32_t *)(p + 0x10000) = i;
    }
  }
  out[0] = (gt() - t0) / n;
}

// 4. A persistent spinner, as the Lynx kernel: polls a host-mapped stop word.
__global__ void k_spin(const volatile uint32_t *stop, unsigned int *started) {
  if (threadIdx.x == 0)
    atomicAdd(started, 1u);
  while (!*stop)
    __nanosleep(1000);
}

// 5. Residency: a kernel with the Lynx kernel's static shared memory
//    (38,800 B, ptxas) and 128 threads, each block counting itself.
__global__ void k_res(const volatile uint32_t *stop, unsigned int *started) {
  __shared__ uint8_t pad[38800];
  if (threadIdx.x == 0) {
    pad[blockIdx.x % 38800] = 1;
    atomicAdd(started, 1u);
  }
  while (!*stop)
    __nanosleep(1000);
  if (pad[0] == 2)
    *(volatile uint32_t *)started = 0; // keep pad
}

// 6. Read of a value written through a second MAP_SHARED mapping of the
//    same /dev/shm file (another process's view, as a frontend's).
__global__ void k_read(const uint32_t *p, unsigned int *out) {
  *out = *(const volatile uint32_t *)p;
}

static volatile uint32_t *h_stop; // host-mapped stop word
static unsigned int *h_started;   // host-mapped counter
static uint32_t *d_stop;
static unsigned int *d_started;

struct op {
  const char *name;
  int which;
  cudaError_t e;
  volatile int done;
};
static void *g_shm;

static void *run_op(void *arg) {
  struct op *o = (struct op *)arg;
  void *p = NULL;
  cudaStream_t s;
  switch (o->which) {
  case 0:
    o->e = cudaMalloc(&p, 1 << 20);
    break;
  case 1:
    o->e = cudaHostAlloc(&p, 1 << 20, cudaHostAllocPortable);
    break;
  case 2:
    o->e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (!o->e)
      o->e = cudaMalloc(&p, 4096);
    if (!o->e)
      o->e = cudaMemsetAsync(p, 0, 4096, s);
    if (!o->e)
      o->e = cudaStreamSynchronize(s);
    break;
  case 3:
    o->e = cudaHostRegister(g_shm, 1 << 20,
                            cudaHostRegisterMapped | cudaHostRegisterPortable);
    break;
  case 4:
    o->e = cudaHostUnregister(g_shm);
    break;
  case 5: {
    static void *hp;
    o->e = cudaHostAlloc(&hp, 4096, 0);
    if (!o->e)
      o->e = cudaFreeHost(hp);
    break;
  }
  case 6:
    o->e = cudaMalloc(&p, 4096);
    if (!o->e)
      o->e = cudaFree(p);
    break;
  }
  o->done = 1;
  return NULL;
}

// Runs op `which` while a spinner runs; 1 when it returned within 2 s.
static int while_spinning(const char *name, int which, cudaStream_t ks) {
  struct op o = {name, which, cudaSuccess, 0};
  pthread_t t;
  double t0;
  *h_stop = 0;
  k_spin<<<1, 32, 0, ks>>>(d_stop, d_started);
  CK(cudaGetLastError());
  usleep(100000);
  t0 = now_s();
  pthread_create(&t, NULL, run_op, &o);
  while (!o.done && now_s() - t0 < 2.0)
    usleep(1000);
  int ok = o.done;
  *h_stop = 1; // releases the spinner (and any call waiting for it)
  pthread_join(t, NULL);
  CK(cudaStreamSynchronize(ks));
  printf("CHECK while a persistent kernel runs: %-34s %s (%s)\n", name,
         ok ? "returns" : "BLOCKS until the kernel exits",
         cudaGetErrorString(o.e));
  return ok;
}

int main(void) {
  cudaDeviceProp prop;
  unsigned long long *d_out, h_out[2];
  int drv = 0, rt = 0, wd = 0;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaDeviceGetAttribute(&wd, cudaDevAttrKernelExecTimeout, 0));
  CK(cudaDriverGetVersion(&drv));
  CK(cudaRuntimeGetVersion(&rt));
  printf("CHECK device: %s sm_%d%d, %d SMs, driver %d runtime %d, "
         "canUseHostPointerForRegisteredMem %d, kernelExecTimeout %d\n",
         prop.name, prop.major, prop.minor, prop.multiProcessorCount, drv, rt,
         prop.canUseHostPointerForRegisteredMem, wd);
  CK(cudaMalloc(&d_out, 2 * sizeof(*d_out)));
  cudaStream_t ks;
  CK(cudaStreamCreateWithFlags(&ks, cudaStreamNonBlocking));
  CK(cudaHostAlloc((void **)&h_stop, 4096, cudaHostAllocMapped));
  CK(cudaHostAlloc((void **)&h_started, 4096, cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void **)&d_stop, (void *)h_stop, 0));
  CK(cudaHostGetDevicePointer((void **)&d_started, h_started, 0));

  // 1
  k_gt<<<1, 1>>>(d_out);
  CK(cudaMemcpy(h_out, d_out, 16, cudaMemcpyDeviceToHost));
  printf("CHECK globaltimer: smallest step %llu ns, %llu distinct values in "
         "200k reads\n",
         h_out[0], h_out[1]);

  // /dev/shm region, two mappings (registered one, "frontend" one)
  int fd = shm_open("/lynx-probe", O_RDWR | O_CREAT, 0600);
  shm_unlink("/lynx-probe");
  if (fd < 0 || ftruncate(fd, 1 << 20)) {
    perror("shm");
    return 1;
  }
  g_shm = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  uint32_t *fe = (uint32_t *)mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
                                  MAP_SHARED, fd, 0);
  CK(cudaHostRegister(g_shm, 1 << 20,
                      cudaHostRegisterMapped | cudaHostRegisterPortable));
  uint32_t *d_shm;
  unsigned int *d_val, h_val = 0;
  CK(cudaHostGetDevicePointer((void **)&d_shm, g_shm, 0));
  CK(cudaMalloc(&d_val, 4));
  fe[5] = 0xC0FFEE;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  k_read<<<1, 1>>>(d_shm + 5, d_val);
  CK(cudaMemcpy(&h_val, d_val, 4, cudaMemcpyDeviceToHost));
  printf(
      "CHECK /dev/shm MAP_SHARED registered: device ptr %s host ptr, GPU "
      "reads the other mapping's write: %s\n",
      (void *)d_shm == g_shm ? "==" : "!=", h_val == 0xC0FFEE ? "yes" : "NO");

  // 2
  k_rtt<<<1, 1>>>(d_shm, 2000, d_out);
  CK(cudaMemcpy(h_out, d_out, 16, cudaMemcpyDeviceToHost));
  printf("CHECK host-mapped dependent load round trip: %llu ns\n", h_out[0]);

  // 3
  const char *fname[] = {"membar.sys (__threadfence_system)",
                         "fence.acq_rel.sys", "st.release.sys", "no fence"};
  for (int m = 0; m < 4; m++) {
    k_fence<<<1, 1>>>(d_shm, 20000, m, d_out);
    CK(cudaMemcpy(h_out, d_out, 8, cudaMemcpyDeviceToHost));
    printf("CHECK publish to host memory, store + %s: %llu ns each\n", fname[m],
           h_out[0]);
  }
  CK(cudaHostUnregister(g_shm));

  // 4: calls the agent makes while other instances' kernels run
  const char *names[] = {"cudaMalloc",
                         "cudaHostAlloc",
                         "cudaMemsetAsync+sync",
                         "cudaHostRegister(shm)",
                         "cudaHostUnregister(shm)",
                         "cudaFreeHost",
                         "cudaFree"};
  for (int w = 0; w < 7; w++)
    while_spinning(names[w], w, ks);

  // 5: residency of successive 132-block kernels with 38.8 KB smem each
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_res, 128, 0));
  printf("CHECK occupancy API: %d blocks/SM of 128 threads + 38,800 B\n",
         per_sm);
  *h_stop = 0;
  *h_started = 0;
  cudaStream_t rs[8];
  int sms = prop.multiProcessorCount;
  for (int k = 0; k < 8; k++) {
    CK(cudaStreamCreateWithFlags(&rs[k], cudaStreamNonBlocking));
    k_res<<<sms, 128, 0, rs[k]>>>(d_stop, d_started);
    CK(cudaGetLastError());
    usleep(200000);
    printf("CHECK residency: after kernel %d (%d blocks each), %u blocks "
           "running (expected %d)\n",
           k + 1, sms, __atomic_load_n(h_started, __ATOMIC_ACQUIRE),
           (k + 1) * sms < per_sm * sms ? (k + 1) * sms : per_sm * sms);
  }
  *h_stop = 1;
  CK(cudaDeviceSynchronize());
  return 0;
}
