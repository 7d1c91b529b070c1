// KDA forward, stage 1 for prep_variant 3 ("overlapped"): the steps of kda_prepare_fast.cu (pf_chunk)
// in a persistent kernel that runs *beside* the recurrence instead of before it.
//
// Why (measured on the H200, benchmarks/kda_profile.py, H96 1 x 8192): prepare alone 0.78 ms and the
// recurrence alone 0.70 ms add up, although neither fills the SM: the recurrence issues on ~30% of
// its cycles (1.5 warps per scheduler, ncu), and prepare is latency-bound (0.79 ms with 5 blocks per
// SM, 0.90 with 4, 1.31 with 2, 2.25 with 1: ~6 us per chunk and block, mostly waiting).
//
// How:
//   - grid = PREP_BLOCKS per SM, launched first; each block owns tasks blockIdx.x + i * gridDim.x of
//     the chunk-major task list (task = position in chunk_order * HV + value head), so every block
//     advances through the sequence at the same pace and chunk j of every head is ready early;
//   - the next task's q, k, a, v rows (cp.async) and its gate / beta parameters (registers) are in
//     flight while the current task computes: the ~6 us per chunk become compute only;
//   - after a task's blob is stored: each thread fences, the block syncs, one thread release-stores
//     flags[chunk * HV + hv] = 1. The recurrence (kda_recurrence.cu with PDL_FLAGS) acquires that flag before
//     it copies the blob;
//   - the recurrence is launched with programmatic stream serialization; this kernel lets it start
//     (griddepcontrol.launch_dependents) once its own blocks have cleared their flags. So every
//     producer block is resident before any consumer block exists: a consumer spinning on a flag can
//     never keep its producer from running (no deadlock, whatever the occupancy).
// Defines from op.py: as kda_prepare_fast.cu (rendered before this file), plus PDL_FLAGS.

#define OVL_IN_BYTES (4 * CH * PF_BS * 2)          // one buffer of staged q, k, a, v rows
#define OVL_F_BYTES (CH * PF_FS * 4)               // one of Kp, Qp, Km
#define OVL_SMEM (2 * OVL_IN_BYTES + 3 * OVL_F_BYTES + (2 * KDIM + 3 * CH) * 4)

struct OvlTask {
  int t0, m, hv, slot;   // slot = chunk * HV + hv: the blob and flag index
  unsigned char* blob;
};

__device__ __forceinline__ OvlTask ovl_task(int task, const int* chunk_order, const int* chunk_start,
                                            const int* chunk_len, unsigned char* ws) {
  OvlTask r;
  const int c = chunk_order[task / HV];
  r.hv = task % HV;
  r.t0 = chunk_start[c];
  r.m = chunk_len[c];
  r.slot = c * HV + r.hv;
  r.blob = ws + (size_t)r.slot * WS_BLOB;
  return r;
}

// the task's 4 x 16 rows of q, k, a, v as 16-byte cp.async (zero-filled past the chunk), one group
__device__ __forceinline__ void ovl_issue(bf16_t (*sIn)[CH][PF_BS], const OvlTask& tk, const bf16_t* q,
                                          const bf16_t* k, const bf16_t* v, const bf16_t* a, int tid) {
  const int h = tk.hv / (HV / H);
#pragma unroll
  for (int i = tid; i < 4 * CH * 16; i += 128) {
    const int x = i >> 8, r = (i >> 4) & 15, p = i & 15;
    const size_t row = tk.t0 + min(r, tk.m - 1);
    const bf16_t* src = x < 2 ? (x ? k : q) + (row * H + h) * KDIM : (x == 2 ? a : v) + (row * HV + tk.hv) * KDIM;
    pf_cp_async16(&sIn[x][r][8 * p], src + 8 * p, r < tk.m ? 16 : 0);
  }
}

extern "C" __global__ void __launch_bounds__(128, 1)
kda_prepare_ovl(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                const bf16_t* __restrict__ a,        // raw gate logits [T, HV, K]
                const bf16_t* __restrict__ b,        // beta logits [T, HV]
                const float* __restrict__ A_log,     // [HV]
                const float* __restrict__ dt_bias,   // [HV, K]
                const int* __restrict__ chunk_start, const int* __restrict__ chunk_len,
                const int* __restrict__ chunk_order, // [NC]: chunks by position in their segment
                unsigned char* __restrict__ ws, unsigned* __restrict__ flags, int ntasks, float scale) {
  extern __shared__ __align__(16) unsigned char dsm[];
  bf16_t (*sIn0)[CH][PF_BS] = reinterpret_cast<bf16_t (*)[CH][PF_BS]>(dsm);
  bf16_t (*sIn1)[CH][PF_BS] = reinterpret_cast<bf16_t (*)[CH][PF_BS]>(dsm + OVL_IN_BYTES);
  float (*sKp)[PF_FS] = reinterpret_cast<float (*)[PF_FS]>(dsm + 2 * OVL_IN_BYTES);
  float (*sQp)[PF_FS] = reinterpret_cast<float (*)[PF_FS]>(dsm + 2 * OVL_IN_BYTES + OVL_F_BYTES);
  float (*sKm)[PF_FS] = reinterpret_cast<float (*)[PF_FS]>(dsm + 2 * OVL_IN_BYTES + 2 * OVL_F_BYTES);
  float* sCG = reinterpret_cast<float*>(dsm + 2 * OVL_IN_BYTES + 3 * OVL_F_BYTES);
  float *sCL = sCG + KDIM, *sRq = sCL + KDIM, *sRk = sRq + CH, *sB = sRk + CH;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int P = gridDim.x;

  // clear this block's share of the flags (indexed by chunk * HV + hv), make that visible, then let the
  // recurrence launch: it starts only once every block of this grid has passed this point
  for (int f = blockIdx.x + tid * P; f < ntasks; f += 128 * P) flags[f] = 0u;
  __threadfence();
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  int task = blockIdx.x;
  if (task >= ntasks) return;
  OvlTask cur = ovl_task(task, chunk_order, chunk_start, chunk_len, ws);
  ovl_issue(sIn0, cur, q, k, v, a, tid);
  asm volatile("cp.async.commit_group;" ::: "memory");
  float bias = dt_bias[cur.hv * KDIM + tid], A2 = expf(A_log[cur.hv]) * PF_LOG2E;
  float beta = tid < CH && tid < cur.m ? bf16_to_f32(b[(size_t)(cur.t0 + tid) * HV + cur.hv]) : 0.f;

  for (int i = 0; task < ntasks; ++i, task += P) {
    bf16_t (*sIn)[CH][PF_BS] = (i & 1) ? sIn1 : sIn0;
    // the next task's rows and parameters, in flight while this one computes
    const int nxt = task + P;
    OvlTask nt = cur;
    float nbias = 0.f, nA2 = 0.f, nbeta = 0.f;
    if (nxt < ntasks) {
      nt = ovl_task(nxt, chunk_order, chunk_start, chunk_len, ws);
      ovl_issue((i & 1) ? sIn0 : sIn1, nt, q, k, v, a, tid);
      nbias = dt_bias[nt.hv * KDIM + tid];
      nA2 = A_log[nt.hv];
      nbeta = tid < CH && tid < nt.m ? bf16_to_f32(b[(size_t)(nt.t0 + tid) * HV + nt.hv]) : 0.f;
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (tid < CH) sB[tid] = tid < cur.m ? rcp(1.f + ex2(-PF_LOG2E * beta)) : 0.f;
    asm volatile("cp.async.wait_group 1;" ::: "memory");       // this task's rows have landed
    __syncthreads();
    pf_chunk<0>(sIn, sKp, sQp, sKm, sCG, sCL, sRq, sRk, sB, cur.blob, cur.m, bias, A2, scale, tid, lane, warp, g, t);

    // publish: every thread's blob stores before the flag (fence, barrier, release store)
    __threadfence();
    __syncthreads();
    if (tid == 0) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + cur.slot), "r"(1u) : "memory");
    cur = nt;
    bias = nbias;
    A2 = expf(nA2) * PF_LOG2E;
    beta = nbeta;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}
