// KDA forward, session 26 probe: prepare fused into the recurrence with WARP producers.
// Rendered after ops/kda's defines, kda_common.cuh, ops/kda/kda_recurrence.cu (rec_chunk,
// rec_load_state, rec_store_state: the locked recurrence's per-chunk step, unchanged) and
// lab/kda/kda_s26_prepare.cu (s26_chunk: one warp's prepare of one chunk).
//
// One block per (segment, value head, V-slice): NWARP consumer warps (16 state rows each, as
// kda_recurrence) and FZ_P producer warps. Producer p prepares chunks p, p + FZ_P, ... of the
// segment, each into ring slot j % FZ_R of shared memory (the workspace blob layout, U^T only for
// this block's value rows), and the consumers run the chunks in order from the ring. No workspace in
// global memory. Slots hand over on mbarriers:
//   full[s]  (count 32: every lane of the producing warp arrives after its writes)
//   empty[s] (count 32 * NWARP: every consumer thread arrives after its reads)
// Chunk j's producer waits for the consumption of chunk j - FZ_R (empty[s], its (j / FZ_R - 1)-th
// completion); consumers wait full[s]'s (i / FZ_R)-th completion. Parity waits need FZ_P <= FZ_R
// then no barrier is ever two phases ahead of a waiter. (Why warps, not a 128-thread group per
// chunk: lab/kda/plan-session26.md; kda_fused.cu, one lockstep producer group, measured 3.04 ms.)

#ifndef FZ_P
#define FZ_P 4
#endif
#ifndef FZ_R
#define FZ_R 4
#endif
// FZ_P > FZ_R: a producer can be two phases behind on empty[s], which a parity wait cannot tell, so
// the consumers publish instead how many chunks all of them are done with (a shared counter after a
// named barrier among the consumers); producers poll it. full[s] keeps its parity waits either way
// (a consumer is never two phases behind: chunk i + FZ_R cannot be produced before chunk i is consumed).
#if FZ_P > FZ_R
#define FZ_COUNTER 1
#else
#define FZ_COUNTER 0
#endif
#define FZ_NCONS (NWARP * 32)
#define FZ_THREADS ((NWARP + FZ_P) * 32)

__device__ __forceinline__ u32 fz_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void fz_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(fz_u32(bar)) : "memory");
}

// Wait for the completion of the phase with this parity. A watchdog turns a protocol bug into a
// trap (an error the probe reports) instead of a hang: ~4e9 cycles, about 2 s.
__device__ __forceinline__ void fz_wait(unsigned long long* bar, u32 parity) {
  const u32 b = fz_u32(bar);
  u32 done = 0;
  const long long start = clock64();
  for (;;) {
    asm volatile("{\n .reg .pred P1;\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, P1;\n}" : "=r"(done) : "r"(b), "r"(parity) : "memory");
    if (done) return;
    if (clock64() - start > 4000000000ll) __trap();
  }
}

extern "C" __global__ void __launch_bounds__(FZ_THREADS, 1)
kda_s26_fused(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
              const bf16_t* __restrict__ a, const bf16_t* __restrict__ b, const float* __restrict__ A_log,
              const float* __restrict__ dt_bias, bf16_t* __restrict__ o, const float* __restrict__ h0,
              float* __restrict__ hT, const long long* __restrict__ cu_seqlens, const int* __restrict__ seq_order,
              float scale) {
  extern __shared__ __align__(128) unsigned char fz_smem[];
  unsigned char* ring = fz_smem;                                       // FZ_R blobs
  S26Warp* scratch = reinterpret_cast<S26Warp*>(fz_smem + FZ_R * WS_BLOB);   // FZ_P warps' scratch
  __shared__ __align__(8) unsigned long long full[FZ_R], empty[FZ_R];
  __shared__ int consumed;                                             // FZ_COUNTER: chunks all consumers are done with

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int sp = blockIdx.x % SPLIT, hv = (blockIdx.x / SPLIT) % HV, h = hv / (HV / H);
  const int n = seq_order[blockIdx.x / (SPLIT * HV)];
  const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
  const int nc = (int)((eos - bos + CH - 1) / CH);
  const int vg0 = sp * NWARP;                                          // first 16-row group of this block

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < FZ_R; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(fz_u32(&full[s])), "r"(32));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(fz_u32(&empty[s])), "r"(FZ_NCONS));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    consumed = 0;
  }
  __syncthreads();

  if (warp >= NWARP) {                                                 // producer warp p
    const int p = warp - NWARP;
    for (int j = p; j < nc; j += FZ_P) {
      const int s = j % FZ_R, use = j / FZ_R;
#if FZ_COUNTER
      if (use > 0) {                                                   // chunk j - FZ_R consumed
        const long long start = clock64();
        while (*(volatile int*)&consumed < j - FZ_R + 1) {
          __nanosleep(20);
          if (clock64() - start > 4000000000ll) __trap();
        }
        __threadfence_block();
      }
#else
      if (use > 0) fz_wait(&empty[s], (u32)((use - 1) & 1));
#endif
      const long long t0 = bos + (long long)j * CH;
      const int m = (int)min((long long)CH, eos - t0);
      if (j + FZ_P < nc) {      // this warp's next chunk: its q, k, a, v rows into L2 while this one computes
        const long long t1 = t0 + (long long)FZ_P * CH;
        const int m1 = (int)min((long long)CH, eos - t1);
#pragma unroll
        for (int i = lane; i < 4 * CH * 2; i += 32) {
          const int x = i >> 5, r = (i >> 1) & 15, half = i & 1;
          if (r < m1) {
            const size_t row = (size_t)(t1 + r);
            const bf16_t* src = x < 2 ? (x ? k : q) + (row * H + h) * KDIM : (x == 2 ? a : v) + (row * HV + hv) * KDIM;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(src + 64 * half));
          }
        }
      }
      s26_chunk(scratch[p], ring + (size_t)s * WS_BLOB, q, k, v, a, b, A_log, dt_bias, t0, m, hv, h, scale, lane, vg0,
                vg0 + NWARP);
      __syncwarp();
      fz_arrive(&full[s]);
    }
    return;                                                            // no block barrier after this point
  }

  float S[NT][4];
  const size_t sbase = ((size_t)n * HV + hv) * VDIM * KDIM;
  const int v0 = 16 * (vg0 + warp);
  rec_load_state(S, h0, sbase, v0, g, t);
  for (int i = 0; i < nc; ++i) {
    const int s = i % FZ_R;
    fz_wait(&full[s], (u32)((i / FZ_R) & 1));
    const unsigned char* st = ring + (size_t)s * WS_BLOB;
    rec_chunk(S, st, (const F4*)(st + WS_U) + ((vg0 + warp) * 32 + lane) * 2, o, bos + (long long)i * CH,
              cu_seqlens + n + 1, hv, v0, lane);
#if FZ_COUNTER
    asm volatile("bar.sync 1, %0;" ::"n"(FZ_NCONS) : "memory");      // every consumer is done with slot s
    if (tid == 0) {
      __threadfence_block();
      *(volatile int*)&consumed = i + 1;
    }
#else
    fz_arrive(&empty[s]);
#endif
  }
  rec_store_state(S, hT, sbase, v0, g, t);
}
