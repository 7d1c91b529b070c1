// KDA forward, prep_variant 2: prepare fused into the recurrence, one kernel, no workspace in memory.
// Rendered after kda_prepare_fast.cu and kda_recurrence.cu, whose per-chunk steps it runs: pf_chunk
// (the producer) and rec_chunk (the consumers), with their helpers and macros.
//
// Why (measured on the H200, kernelfile build of kda@h200): the two-kernel forward spends ~0.78 ms
// in prepare (memory-bound, 1.06 GB of workspace written, then read back) and ~0.66 ms in the
// recurrence (bound by mma.sync issue on the tensor cores) at H96 1 x 8192. They use different
// resources, so they can overlap: here each block runs the prepare of chunk i + 1 in 4 producer
// warps while its consumer warps (one per 16 state rows, as in kda_recurrence) run chunk i.
//
// One block per (segment, value head, V-slice); threads [0, NCONS) are consumers, the next 128 the
// producer. Per iteration i, in lockstep (one __syncthreads per chunk, so no protocol can deadlock):
//   consumers: the recurrence step on ring[i % 2];
//   producer:  issues the loads of chunk i + 2 into in[i % 2] (cp.async, zero-filled past the chunk),
//              then computes chunk i + 1 from in[(i + 1) % 2] into ring[(i + 1) % 2].
// The producer's steps synchronise on named barrier 1 (its 128 threads only). The blob in the ring
// has the layout of the workspace (kda_common.cuh): the consumer code reads it as kda_recurrence does,
// U for all V rows (the block reads its slice). beta logits for chunk j are loaded with its cp.async
// wave, one iteration early, so no global load sits on a chunk's critical path.
// Needs: the safe gate, K = V = 128, C = 16, prep_threads = 128 (checked in kda_host.py).
//
// Outcome on the H200 (kernelfile build of kda@h200, recording reports/kda/kda-h200.recording.jsonl):
// correct on every problem and verification case, but SLOWER than the two kernels: 3.04 ms at H96
// 1 x 8192 (two kernels 1.44), 2.80 ms at H64 (1.05), 2.26 / 1.50 ms on the varlen scenarios
// (1.29 / 0.86-0.89). Predicted ~0.8 ms. The miss: the prediction took prepare's critical path as
// ~2.5k cycles per chunk, but one chunk's prepare is a chain of 4 barriers, a 32-deep tf32 mma chain
// (L), a 16-step serial cumsum of ex2/rcp and the one-warp triangular solve: ~5.9 us per chunk here
// (11.7k cycles). The standalone prepare hid that latency with 5 blocks (chunks) in flight per SM;
// a single producer per block serialises it. To win, a block needs several producer groups working
// on consecutive chunks (3-4 to cover ~6 us with ~1.6 us of consumer work per chunk), which the
// register budget (161 per thread now, 384 threads) does not leave room for at split 1.

#define FNCONS (NWARP * 32)
#define FNTHREADS (FNCONS + 128)

struct FusedSmem {
  unsigned char ring[2][WS_BLOB];          // the blob of chunk i (consumers) and of chunk i + 1 (producer)
  bf16_t in[2][4][CH][PF_BS];              // q, k, a, v rows of chunks i + 1 and i + 2
  float Kp[CH][PF_FS], Qp[CH][PF_FS], Km[CH][PF_FS];
  float CG[KDIM], CL[KDIM], Rq[CH], Rk[CH], B[CH];
};

// the cp.async wave of chunk rows [t0, t0 + m) into in[buf]; one group per call (empty when m <= 0)
__device__ __forceinline__ void fz_load(FusedSmem& sm, int buf, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                        const bf16_t* __restrict__ v, const bf16_t* __restrict__ a,
                                        long long t0, int m, int h, int hv, int ptid) {
  if (m > 0) {
#pragma unroll
    for (int i = ptid; i < 4 * CH * 16; i += 128) {
      const int x = i >> 8, r = (i >> 4) & 15, p = i & 15;
      const size_t row = t0 + min(r, m - 1);
      const bf16_t* src = x < 2 ? (x ? k : q) + (row * H + h) * KDIM : (x == 2 ? a : v) + (row * HV + hv) * KDIM;
      pf_cp_async16(&sm.in[buf][x][r][8 * p], src + 8 * p, r < m ? 16 : 0);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// prepare of one chunk (m valid rows) from in[buf] into blob: kda_prepare_fast.cu's steps (pf_chunk),
// synchronised on named barrier 1 among the 128 producer threads
__device__ __forceinline__ void fz_prepare(FusedSmem& sm, int buf, unsigned char* blob, int m, float beta_logit,
                                           float bias, float A2, float scale, int ptid) {
  if (ptid < CH) sm.B[ptid] = ptid < m ? rcp(1.f + ex2(-PF_LOG2E * beta_logit)) : 0.f;
  asm volatile("cp.async.wait_group 1;" ::: "memory");   // this chunk's wave; the next one may fly
  pf_sync<1>();
  const int lane = ptid & 31;
  pf_chunk<1>(sm.in[buf], sm.Kp, sm.Qp, sm.Km, sm.CG, sm.CL, sm.Rq, sm.Rk, sm.B, blob, m, bias, A2, scale, ptid,
              lane, ptid >> 5, lane >> 2, lane & 3);
}

// the beta logit of row `ptid` of a chunk (0 past its end); loaded one iteration before its use
__device__ __forceinline__ float fz_beta(const bf16_t* __restrict__ b, long long t0, int m, int hv, int ptid) {
  return ptid < CH && ptid < m ? bf16_to_f32(b[(size_t)(t0 + ptid) * HV + hv]) : 0.f;
}

extern "C" __global__ void __launch_bounds__(FNTHREADS)
kda_fused(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
          const bf16_t* __restrict__ a, const bf16_t* __restrict__ b, const float* __restrict__ A_log,
          const float* __restrict__ dt_bias, bf16_t* __restrict__ o, const float* __restrict__ h0,
          float* __restrict__ hT, const long long* __restrict__ cu_seqlens, const int* __restrict__ seq_order,
          float scale) {
  extern __shared__ __align__(16) unsigned char fz_smem[];
  FusedSmem& sm = *reinterpret_cast<FusedSmem*>(fz_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int sp = blockIdx.x % SPLIT, hv = (blockIdx.x / SPLIT) % HV, h = hv / (HV / H);
  const int n = seq_order[blockIdx.x / (SPLIT * HV)];
  const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
  const int nc = (int)((eos - bos + CH - 1) / CH);
  const bool producer = tid >= FNCONS;
  const int ptid = tid - FNCONS;
  const int vg0 = sp * NWARP, v0 = 16 * (vg0 + warp);
  auto rows = [&](int j) { return (int)min((long long)CH, eos - bos - (long long)j * CH); };

  float S[NT][4];
  const size_t sbase = ((size_t)n * HV + hv) * VDIM * KDIM;
  float bias = 0.f, A2 = 0.f, beta_next = 0.f;
  if (producer) {
    bias = dt_bias[hv * KDIM + ptid];
    A2 = expf(A_log[hv]) * PF_LOG2E;
    if (nc > 0) {
      fz_load(sm, 0, q, k, v, a, bos, rows(0), h, hv, ptid);
      const float beta0 = fz_beta(b, bos, rows(0), hv, ptid);
      fz_load(sm, 1, q, k, v, a, bos + CH, nc > 1 ? rows(1) : 0, h, hv, ptid);
      beta_next = nc > 1 ? fz_beta(b, bos + CH, rows(1), hv, ptid) : 0.f;
      fz_prepare(sm, 0, sm.ring[0], rows(0), beta0, bias, A2, scale, ptid);
    }
  } else {
    rec_load_state(S, h0, sbase, v0, g, t);
  }
  __syncthreads();

  for (int i = 0; i < nc; ++i) {
    if (producer) {
      const int j = i + 2;
      fz_load(sm, i & 1, q, k, v, a, bos + (long long)j * CH, j < nc ? rows(j) : 0, h, hv, ptid);
      const float beta_after = j < nc ? fz_beta(b, bos + (long long)j * CH, rows(j), hv, ptid) : 0.f;
      if (i + 1 < nc) fz_prepare(sm, (i + 1) & 1, sm.ring[(i + 1) & 1], rows(i + 1), beta_next, bias, A2, scale, ptid);
      beta_next = beta_after;
    } else {
      const unsigned char* st = sm.ring[i & 1];
      rec_chunk(S, st, (const F4*)(st + WS_U) + ((vg0 + warp) * 32 + lane) * 2, o, bos + (long long)i * CH,
                cu_seqlens + n + 1, hv, v0, lane);
    }
    __syncthreads();
  }
  if (producer) {
    asm volatile("cp.async.wait_all;" ::: "memory");
    return;
  }
  rec_store_state(S, hT, sbase, v0, g, t);
}
