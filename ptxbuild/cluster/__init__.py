"""Several GPUs for one build (issue 32): one worker per GPU, on this machine (local.py: worker
processes pinned with CUDA_VISIBLE_DEVICES) or on the GPUs of a Ray cluster (ray_lanes.py: one
actor per GPU, `pip install 'ptxbuild[cluster]'`). Each GPU is a lane: an object with GpuSession's
methods (verify, measure, baselines, memcheck, fingerprint, copy_tbps, abort, close) that returns
results and never touches the cache; build/spread.py runs a target's problems over them and the
driver alone writes the cache."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def attached(ctx, gpus: int | None, cluster: str | None, say=print, **session):
    """`ctx` with lanes for the length of a command: `gpus` GPUs of this machine, or with `cluster`
    (an address, or "auto") `gpus` GPUs of that Ray cluster (all by default); ToolError when they
    cannot be had. A Ray connection made here is left at the end (a Ray instance it started on
    this machine stops); close `ctx` inside, so that its lanes go first."""
    from ..gpu.fingerprint import match_gpu
    from .local import local_lanes
    from .ray_lanes import connected, ray_lanes, shutdown

    mine = cluster is not None and not connected()
    try:
        if cluster is not None:
            ctx.lanes = ray_lanes(cluster, gpus, note=say, **session)
        else:
            ctx.lanes = local_lanes(gpus or 1, **session)
        ctx.gpu = ctx.lanes[0]
        ctx.gpu_match = lambda fp, g: match_gpu(fp, g.name, {**g.as_dict(), "models": [g.model]})
        for g in ctx.lanes:
            say(f"gpu: {g.where}: {g.fingerprint}; copy bandwidth {g.copy_tbps:.2f} TB/s")
        yield ctx
    finally:
        if mine:
            shutdown()
