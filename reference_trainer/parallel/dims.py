"""ParallelDims: the degrees of every parallelism, validated, and the one DeviceMesh they share.

Rank layout (row-major, innermost last):  pp x dp_replicate x dp_shard x tp

TP is innermost so that on a GPU node the ranks of one TP group are neighbours (same NVLink
island): TP talks on every layer, PP only at stage boundaries, DP once per step.

Expert parallelism is not an axis of its own: it *borrows* the data-parallel ranks, as
torchtitan does. The data-parallel ranks (dp_replicate x dp_shard, flattened as "dp") are
re-viewed as dp_mod_ep x ep: the `ep` ranks of a group each hold 1/ep of the experts and
swap tokens by all-to-all, while dense weights stay data-parallel over all of "dp". So
`--ep` costs no extra GPUs and must divide dp_replicate x dp_shard.

Every mesh below is a view of one root world mesh, so DTensors placed on different views
compose (FSDP over "dp_shard" on top of TP over "tp"). The views come from DeviceMesh's
private `_unflatten`/`_flatten`, as in torchtitan: the only way to get several layouts of
the same ranks under one root. Each view's axes cost one process group per axis.

In torch 2.9 and older DeviceMesh has no `_unflatten` (and before 2.6 no `_flatten`): there the
dense axes come from one public `init_device_mesh` over the dense shape (its slices still
share a root, so FSDP and TP compose), and the flattened "dp" and the EP views, which only
lend their process groups, are meshes of their own built with the public constructor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CP_UNSUPPORTED = (
    "context parallelism is not available: torch's ring attention (context_parallel) "
    "shards only the CUDA SDPA kernels; on CPU it fails with "
    "'aten._scaled_dot_product_flash_attention_for_cpu does not have a sharding strategy', "
    "so --cp must be 1"
)


# Pipeline schedules -> pipeline stages each rank holds ("looped": rank i holds i, i + pp).
PP_SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved1f1b": 2}


class ParallelDimsError(ValueError):
    """A degree combination that cannot run; the message is one line for the user."""


@dataclass
class ParallelDims:
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    world_size: int = 1
    _meshes: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        flags = {"dp": self.dp_replicate, "fsdp": self.dp_shard, "cp": self.cp,
                 "tp": self.tp, "pp": self.pp, "ep": self.ep}
        for flag, degree in flags.items():
            if degree < 1:
                raise ParallelDimsError(f"--{flag} {degree}: a degree must be >= 1")
        if self.cp > 1:
            raise ParallelDimsError(f"--cp {self.cp}: {CP_UNSUPPORTED}")
        product = self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp
        if product != self.world_size:
            used = " x ".join(f"--{f} {d}" for f, d in flags.items() if d > 1 and f != "ep")
            raise ParallelDimsError(
                f"{used or 'all degrees 1'} = {product} rank(s), but the job has "
                f"WORLD_SIZE={self.world_size}; the degrees of --dp, --fsdp, --tp, --pp "
                "must multiply to the world size"
            )
        if self.dp % self.ep:
            raise ParallelDimsError(
                f"--ep {self.ep} borrows data-parallel ranks, so it must divide "
                f"--dp x --fsdp = {self.dp}"
            )

    # --- degrees ----------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """All data-parallel ranks: replicas x shards."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index on each axis (pure arithmetic: works before any mesh exists)."""
        rank, tp = divmod(rank, self.tp)
        rank, dp_shard = divmod(rank, self.dp_shard)
        pp, dp_replicate = divmod(rank, self.dp_replicate)
        dp = dp_replicate * self.dp_shard + dp_shard
        return {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "tp": tp,
                "dp": dp, "ep": dp % self.ep, "dp_mod_ep": dp // self.ep}

    # --- meshes -----------------------------------------------------------------------------
    def build_mesh(self, device_type: str) -> None:
        """Create the world mesh and its named views. Collective: every rank must call it."""
        from torch.distributed.device_mesh import init_device_mesh

        world = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("world",))
        axes = [(n, d) for n, d in (("pp", self.pp), ("dp_replicate", self.dp_replicate),
                                    ("dp_shard", self.dp_shard), ("tp", self.tp)) if d > 1]
        self._meshes = {"world": world}
        if not axes:
            return
        names = tuple(n for n, _ in axes)
        if hasattr(world, "_unflatten"):
            dense = world._unflatten(0, tuple(d for _, d in axes), names)
        else:
            dense = init_device_mesh(device_type, tuple(d for _, d in axes),
                                     mesh_dim_names=names)
        for name in names:
            self._meshes[name] = dense[name]
        dp_names = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
        if len(dp_names) == 2:
            self._meshes["hsdp"] = dense[dp_names]  # 2-D (replicate, shard) for HSDP
            self._meshes["dp"] = (dense[dp_names]._flatten("dp")
                                  if hasattr(dense, "_flatten") else
                                  self._own_mesh(device_type, [("dp", self.dp)])["dp"])
        elif dp_names:
            self._meshes["dp"] = dense[dp_names[0]]
        if self.ep_enabled:
            sizes, ep_names = (self.dp // self.ep, self.ep), ("dp_mod_ep", "ep")
            if sizes[0] == 1:
                sizes, ep_names = sizes[1:], ep_names[1:]
            if hasattr(self._meshes["dp"], "_unflatten"):
                sparse = self._meshes["dp"]._unflatten(0, sizes, ep_names)
            else:
                sparse = self._own_mesh(device_type, list(zip(ep_names, sizes, strict=True)))
            for name in ep_names:
                self._meshes[name] = sparse[name]

    def _own_mesh(self, device_type: str, dp_axes: list[tuple[str, int]]):
        """A mesh of its own (public constructor) whose data-parallel ranks are split into
        `dp_axes`, between the pp and tp axes of the documented layout; only its process
        groups are used. Collective: every rank must call it."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        axes = [("pp", self.pp), *dp_axes, ("tp", self.tp)]
        axes = [(n, d) for n, d in axes if d > 1 or n in dict(dp_axes)]
        layout = torch.arange(self.world_size).reshape(tuple(d for _, d in axes))
        return DeviceMesh(device_type, layout, mesh_dim_names=tuple(n for n, _ in axes))

    def mesh(self, name: str):
        """The DeviceMesh of axis `name` ("pp", "dp_replicate", "dp_shard", "hsdp", "dp",
        "tp", "ep", "dp_mod_ep", "world"). Only axes with degree > 1 exist."""
        try:
            return self._meshes[name]
        except KeyError:
            raise KeyError(f"no mesh axis {name!r} (degree 1 or build_mesh not called); "
                           f"have {sorted(self._meshes)}") from None

    def has_mesh(self, name: str) -> bool:
        return name in self._meshes
