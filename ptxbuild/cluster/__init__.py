"""Several GPUs for one build (issue 32): one worker per GPU, on this machine (local.py: worker
processes pinned with CUDA_VISIBLE_DEVICES) or on the GPUs of a Ray cluster (ray_lanes.py: one
actor per GPU, `pip install 'ptxbuild[cluster]'`). Each GPU is a lane: an object with GpuSession's
methods (verify, measure, baselines, memcheck, fingerprint, copy_tbps, abort, close) that returns
results and never touches the cache; build/spread.py runs a target's problems over them and the
driver alone writes the cache."""

from __future__ import annotations

from contextlib import contextmanager

from ..errors import ConfigError, ToolError


@contextmanager
def attached(ctx, gpus: int | None, cluster: str | None, say=print, **kw):
    """attach() for the length of a command; a Ray connection this made is left at the end (a Ray
    instance it started on this machine stops). Close `ctx` inside it, so its lanes go first."""
    from .ray_lanes import connected, shutdown

    mine = cluster is not None and not connected()
    try:
        yield attach(ctx, gpus, cluster, say, **kw)
    finally:
        if mine:
            shutdown()


def attach(ctx, gpus: int | None, cluster: str | None, say=print, **kw) -> None:
    """Give `ctx` its lanes: `gpus` GPUs of this machine, or with `cluster` (an address, or "auto")
    `gpus` GPUs of that Ray cluster (all of them by default); ToolError when they cannot be had."""
    from ..gpu.fingerprint import match_gpu

    if gpus is not None and gpus < 1:
        raise ConfigError(f"--gpus {gpus}: give 1 or more")
    if cluster is not None:
        from .ray_lanes import ray_lanes

        lanes = ray_lanes(cluster, gpus, note=say, **kw)
    else:
        from .local import local_lanes

        lanes = local_lanes(gpus or 1, **kw)
    ctx.lanes, ctx.gpu = lanes, lanes[0]
    ctx.gpu_match = lambda fp, gpu: match_gpu(
        fp, gpu.name, {**gpu.as_dict(), "models": [gpu.model]}
    )
    for line in describe(lanes):
        say(f"gpu: {line}")


def describe(lanes: list) -> list[str]:
    """One line per GPU fingerprint: how many GPUs have it, where they are, their copy bandwidth."""
    groups: dict[str, list] = {}
    for g in lanes:
        groups.setdefault(str(g.fingerprint), []).append(g)
    return [
        f"{len(gs)} x {fp} at {', '.join(getattr(g, 'where', '?') for g in gs)}; copy bandwidth "
        + " / ".join(f"{g.copy_tbps:.2f}" for g in gs)
        + " TB/s"
        for fp, gs in groups.items()
    ]


def close_all(lanes: list) -> None:
    """Close every lane, even when one of them fails to."""
    errors = []
    for g in lanes:
        try:
            g.close()
        except Exception as exc:  # noqa: BLE001 - the others are closed all the same
            errors.append(exc)
    if errors:
        raise ToolError(f"closing {len(errors)} GPU worker(s) failed: {errors[0]}")
