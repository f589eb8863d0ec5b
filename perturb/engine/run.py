"""Apply ops to batches with keyed parameters, record what was applied, replay records.

    out, records = perturb.apply(images, "gaussian_blur", severity=3, sample_keys=ids, seed=0)
    again = perturb.replay(records, images)          # bit for bit on the same device

A sample's parameters and noise fields depend only on (seed, sample key, op, severity,
variant), never on the batch, so a sample's output is the same in any batch, order or process.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, overload

import numpy as np
import torch

from perturb import rng
from perturb.catalog.bounds import params_problem
from perturb.catalog.ops import Op, get_op
from perturb.catalog.specs import check_severity
from perturb.contracts.keys import check_sample_keys
from perturb.contracts.record import Record
from perturb.errors import InputError, UnknownNameError
from perturb.ops import backend as backends
from perturb.ops._host import scene_held
from perturb.ops.composite import scene_extension_alpha, scene_extension_fill
from perturb.scene import Scene, kind_of, radiograph
from perturb.scene.analysis import analysed

SHARED_SEVERITY = 0
SUPPORTED_DTYPES = {torch.float32: 1.0, torch.uint8: 255.0, torch.uint16: 65535.0}


# ---------------------------------------------------------------------------------------------
# Input validation


def validate_images(images: object, op: Op | None = None) -> tuple[torch.Tensor, torch.dtype]:
    """Check a BCHW batch and return it as float32 in [0, 1] with its original dtype."""
    dtype = check_images(images, op)
    assert isinstance(images, torch.Tensor)
    if dtype == torch.float32:
        return images, dtype
    return images.to(torch.float32) / SUPPORTED_DTYPES[dtype], dtype


def check_images(images: object, op: Op | None = None) -> torch.dtype:
    """Check a BCHW batch (float32 in [0, 1], uint8 or uint16) and return its dtype."""
    if not isinstance(images, torch.Tensor):
        raise InputError(
            f"images must be a torch.Tensor of shape (B, C, H, W), got {type(images).__name__}; "
            "convert with torch.from_numpy(array).permute(0, 3, 1, 2) for NHWC arrays"
        )
    if images.ndim != 4:
        hint = " (add a batch axis with images.unsqueeze(0))" if images.ndim == 3 else ""
        raise InputError(
            f"images must have 4 dims (B, C, H, W), got shape {tuple(images.shape)}{hint}"
        )
    b, c, h, w = images.shape
    if b == 0:
        raise InputError("empty batch: pass at least one image (shape (B, C, H, W) with B >= 1)")
    if c not in (1, 3):
        hint = {
            4: " (drop the alpha channel with images[:, :3])",
            2: " (gray + alpha: drop the alpha channel with images[:, :1])",
        }.get(c, "")
        raise InputError(f"images must have 1 or 3 channels, got {c}{hint}; layout is (B, C, H, W)")
    if h < 2 or w < 2:
        raise InputError(f"images must be at least 2x2 pixels, got {h}x{w}")
    if op is not None and c not in op.spec.channels:
        need = " or ".join(str(n) for n in op.spec.channels)
        fix = (
            "repeat the gray channel with images.expand(-1, 3, -1, -1)"
            if c == 1
            else "convert to gray first"
        )
        raise InputError(f"op {op.name!r} needs {need}-channel images, got {c}; {fix}")
    if images.dtype not in SUPPORTED_DTYPES:
        raise InputError(
            f"images dtype {images.dtype} is not supported; use float32 in [0, 1] "
            "(images.float()), uint8 or uint16"
        )
    if images.dtype == torch.float32:
        lo, hi = torch.aminmax(images.detach())
        lo_v, hi_v = float(lo), float(hi)
        if not (np.isfinite(lo_v) and np.isfinite(hi_v)):
            raise InputError(
                "images contain NaN or inf; replace them (torch.nan_to_num) before perturbing"
            )
        if lo_v < 0.0 or hi_v > 1.0:
            raise InputError(
                f"float images must lie in [0, 1], got min {lo_v:.4g} and max {hi_v:.4g}; "
                "scale them (e.g. images / 255) or clamp them; normalised images (mean/std): "
                "perturb before normalising"
            )
    return images.dtype


def _restore_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        return x
    scale = SUPPORTED_DTYPES[dtype]
    return (x * scale).round_().clamp_(0, scale).to(dtype)


def _per_sample(value: object, n: int, name: str) -> list[Any]:
    """One value per sample from a scalar or a sequence of length ``n``."""
    if isinstance(value, list | tuple | np.ndarray | torch.Tensor):
        values = value.tolist() if isinstance(value, np.ndarray | torch.Tensor) else list(value)
        if len(values) != n:
            raise InputError(
                f"{name} has {len(values)} entries for a batch of {n}; pass one per image or a single int"
            )
        return values
    return [value] * n


def _check_variant(variant: object) -> int:
    if isinstance(variant, bool) or not isinstance(variant, int | np.integer) or variant < 0:
        raise InputError(f"variant must be a non-negative integer, got {variant!r}")
    return int(variant)


# ---------------------------------------------------------------------------------------------
# Parameters


def collate(params: Sequence[dict[str, Any]], device: torch.device) -> dict[str, torch.Tensor]:
    """Stack per-sample parameter dicts into float32 tensors (B, ...); ragged lists are padded
    with zeros (kernels treat zero entries of a list as absent)."""
    out: dict[str, torch.Tensor] = {}
    for name in params[0]:
        values = [p[name] for p in params]
        if all(type(v) is float or type(v) is int for v in values):  # scalars: one conversion
            out[name] = torch.tensor(values, dtype=torch.float64).to(device, torch.float32)
            continue
        arrays = [np.asarray(p[name], dtype=np.float64) for p in params]
        shape = tuple(
            max(a.shape[d] if a.ndim > d else 0 for a in arrays) for d in range(arrays[0].ndim)
        )
        stacked = np.zeros((len(arrays), *shape), dtype=np.float64)
        for i, a in enumerate(arrays):
            index: tuple[int | slice, ...] = (i, *(slice(0, s) for s in a.shape))
            stacked[index] = a
        out[name] = torch.from_numpy(stacked.astype(np.float32)).to(device)
    return out


def draw_key(seed: int, sample_key: str, op: str, variant: int) -> int:
    """The key a sample's parameters and fields are drawn with.

    Common random numbers across severities: the key leaves the severity out, so a sample's
    five severities are one perturbation at five strengths (same quantiles, same noise field,
    same glare placement). Severity curves are then monotone per sample."""
    return rng.derive_key(seed, sample_key, op, SHARED_SEVERITY, variant)


def sample_params(
    op: Op, key: int, severity: int | Mapping[str, tuple[float, float]]
) -> dict[str, Any]:
    """Keyed host-side draw of one sample's parameters (JSON-able) at ``severity`` (1..5) or
    from explicit per-parameter ranges (e.g. interpolated between two severities)."""
    level = op.spec.level(severity) if isinstance(severity, int) else severity
    return as_json(op.entry.sampler(rng.scalar_rng(key), level))


def as_json(value: Any) -> Any:
    """``json.loads(json.dumps(value))`` (plain JSON types, exactly as a record stores them),
    copied directly where ``value`` is dicts with string keys, lists, tuples, str, int, float
    (NumPy float64 included: a float subclass), bool and None; anything else goes through
    ``json``, which converts or rejects it as it always has."""
    out = _plain(value)
    return json.loads(json.dumps(value)) if out is _NOT_PLAIN else out


_NOT_PLAIN = object()  # what ``_plain`` returns for a value it leaves to ``json``


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind is float or kind is str or kind is bool or kind is int or value is None:
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            item = _plain(v)
            if type(k) is not str or item is _NOT_PLAIN:
                return _NOT_PLAIN
            out[k] = item
        return out
    if isinstance(value, list | tuple):
        items = [_plain(v) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
    if isinstance(value, float):  # np.float64 and other float subclasses: json writes their repr
        return float(value)
    return _NOT_PLAIN


def make_record(
    op: Op,
    severity: int,
    sample_key: str,
    *,
    seed: int,
    variant: int,
    protect_border: bool,
    device: torch.device,
    params: dict[str, Any] | None = None,
    param_key: str | None = None,
    level: Mapping[str, tuple[float, float]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Record:
    """The record of ``op`` on one sample; its parameters are drawn at ``severity`` (or from the
    explicit ranges ``level``) unless ``params`` are given. They are drawn under the sample's key,
    or under ``param_key``'s when given: scalar parameters shared by every image of a group (e.g.
    the views of a study), while per-pixel fields still follow the sample's own key."""
    key = draw_key(seed, sample_key, op.name, variant)
    extra = {} if extra is None else dict(extra)
    if params is None:
        draw = key
        if param_key is not None and param_key != sample_key:
            draw = draw_key(seed, param_key, op.name, variant)
            extra["param_key"] = param_key
        params = sample_params(op, draw, severity if level is None else level)
        if op.entry.device_params is not None:  # keyed by (seed, variant), not the sample
            params = {**params, **as_json(op.entry.device_params(seed, variant))}
    return Record(
        op=op.name,
        op_version=op.spec.version,
        severity=severity,
        variant=variant,
        seed=seed,
        sample_key=sample_key,
        key=rng.key_to_hex(key),
        params=params,
        protect_border=protect_border,
        backend=backends.resolve(device),
        device=device.type,
        extra=extra,
    )


def make_records(
    op: Op,
    severities: Sequence[int],
    sample_keys: Sequence[str],
    *,
    seed: int,
    variants: Sequence[int],
    protect_border: bool,
    device: torch.device,
    param_keys: Sequence[str] | None = None,
) -> list[Record]:
    """``make_record`` for each sample of a batch (the same records), with the batch's host
    work done once: the scalar streams of all keys seeded in one pass (``rng.scalar_streams``),
    each severity's table and the backend looked up once; what stays per sample is the key's
    hash, the sampler's few draws and the record itself."""
    keys = [draw_key(seed, k, op.name, v) for k, v in zip(sample_keys, variants, strict=True)]
    draws = list(keys)
    if param_keys is not None:
        for i, (k, g, v) in enumerate(zip(sample_keys, param_keys, variants, strict=True)):
            if g != k:
                draws[i] = draw_key(seed, g, op.name, v)
    levels = {s: op.spec.level(s) for s in set(severities)}
    backend = backends.resolve(device)
    sampler, device_params = op.entry.sampler, op.entry.device_params
    records = []
    for i, stream in enumerate(rng.scalar_streams(draws)):
        extra: dict[str, Any] = {}
        if param_keys is not None and param_keys[i] != sample_keys[i]:
            extra["param_key"] = param_keys[i]
        params = as_json(sampler(stream, dict(levels[severities[i]])))  # type: ignore[arg-type]
        if device_params is not None:
            params = {**params, **as_json(device_params(seed, variants[i]))}
        records.append(
            Record(
                op=op.name,
                op_version=op.spec.version,
                severity=severities[i],
                variant=variants[i],
                seed=seed,
                sample_key=sample_keys[i],
                key=rng.key_to_hex(keys[i]),
                params=params,
                protect_border=protect_border,
                backend=backend,
                device=device.type,
                extra=extra,
            )
        )
    return records


# ---------------------------------------------------------------------------------------------
# Running


def run_records(
    x: torch.Tensor,
    records: Sequence[Record],
    record_scenes: bool = False,
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """Run one op over a batch with the parameters in ``records`` (one per sample).

    ``x`` is float32 in [0, 1], uint8 or uint16 (BCHW); the result has the dtype of ``x``.
    On the CPU (``opencv`` backend) an op's registered host path runs per sample on the
    dtype it reads (uint8 stays uint8; uint16 stays uint16 where the path reads it, else each
    sample goes through float32); otherwise, and on CUDA, the torch kernel runs on float32 and
    integer batches are rounded back. ``record_scenes``: a border-protecting record without a
    stored scene gets the descriptor of the scene analysed for it (``extra["scene"]``).
    ``scenes`` (one ``perturb.scene.Scene`` or descriptor per record, None where not known), as
    in ``apply``: scenes already at hand (e.g. one per source image, reused by every op of a
    chain, so what they derive from a frame is computed once per image, not per op)."""
    if scenes is not None and len(scenes) != len(records):
        raise InputError(f"scenes has {len(scenes)} entries for {len(records)} records; pass one per record")
    found = None if scenes is None else BatchScenes(records, x, given=scenes, record=record_scenes)
    return _run_records(x, records, found, record_scenes=record_scenes)


def run_records_into(
    src: torch.Tensor,
    dst: torch.Tensor,
    rows: Sequence[int],
    records: Sequence[Record],
    record_scenes: bool = False,
) -> None:
    """``dst[rows] = run_records(src[rows], records)``, in place; ``src`` is not modified and
    must not share memory with ``dst``. On the CPU path the op's host path reads each sample's
    row of ``src`` and writes its row of ``dst`` (no gathered copy of the rows, no batch-sized
    output to scatter back); elsewhere the rows are gathered, run as one batch and put back."""
    if len(records) != len(rows):
        raise InputError(f"{len(records)} records for {len(rows)} rows")
    if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:] or src.device != dst.device:
        raise ValueError("src and dst must be batches of one dtype, image shape and device")
    op = _checked_op(records)
    if (
        _cpu_path(op, src) is None
        or not src.is_contiguous()
        or not dst.is_contiguous()
        or src.requires_grad
    ):
        put_rows(
            dst,
            rows,
            _run_records(take_rows(src, rows), records, checked=True, record_scenes=record_scenes),
        )
        return
    fast = _cpu_path(op, src)
    assert fast is not None
    host_params = [r.params for r in records]
    scenes = BatchScenes(records, src, rows=rows, record=record_scenes)
    spatial = op.spec.spatial and any(r.protect_border for r in records)
    backends.run_cpu(
        fast[0],
        src,
        collate(host_params, src.device),
        [rng.key_from_hex(r.key) for r in records],
        scenes,
        dtypes=fast[1],
        uses_scene=backends.cpu_uses_scene(op.name),
        kernel_scenes=scenes,
        extend=spatial,
        rows=rows,
        out=dst,
        shadow=op.entry.shadow,
    )


def take_rows(x: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """``x[rows]`` as a new batch. On the CPU through NumPy: torch's CPU gather/stack of
    uint8 batches runs an order of magnitude slower than a memory copy."""
    if _on_host(x):
        return torch.from_numpy(x.numpy()[list(rows)])
    return x.index_select(0, torch.tensor(list(rows), device=x.device))


def put_rows(out: torch.Tensor, rows: Sequence[int], values: torch.Tensor) -> None:
    """``out[rows] = values`` in place (every dtype, uint16 included)."""
    if _on_host(out) and _on_host(values):
        out.numpy()[list(rows)] = values.numpy()
        return
    for j, i in enumerate(rows):  # torch has no index_put for uint16
        out[i].copy_(values[j])


def _on_host(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and not x.requires_grad


def _checked_op(records: Sequence[Record]) -> Op:
    """The one op of ``records``, each record checked (parameters in bounds, op version)."""
    names = {r.op for r in records}
    if len(names) != 1:
        raise InputError(f"records of one call must share an op, got {sorted(names)}")
    op = get_op(records[0].op)
    for r in records:
        problem = params_problem(op.spec, r.params)
        if problem is not None:
            raise InputError(f"record of {r.op} ({r.sample_key!r:.60}): {problem}; not replayed")
        if r.op_version != op.spec.version:
            raise InputError(
                f"record of {r.op} v{r.op_version} cannot be replayed by v{op.spec.version}; "
                "use the perturb version named in the record"
            )
    return op


def _run_records(
    x: torch.Tensor,
    records: Sequence[Record],
    scenes: BatchScenes | None = None,
    checked: bool = False,
    record_scenes: bool = False,
) -> torch.Tensor:
    """``run_records``; ``scenes``: the batch's scenes where the caller has them (``apply``);
    ``checked``: the records were checked already (``_checked_op``) or drawn here;
    ``record_scenes``: as in ``run_records``."""
    op = get_op(records[0].op) if checked else _checked_op(records)
    if len(records) != x.shape[0]:
        raise InputError(f"{len(records)} records for a batch of {x.shape[0]} images")
    host_params = [r.params for r in records]
    params = collate(host_params, x.device)
    keys = [rng.key_from_hex(r.key) for r in records]
    if scenes is None:
        scenes = BatchScenes(records, x, record=record_scenes)
    if op.spec.spatial and any(r.protect_border for r in records):
        if _cpu_path(op, x) is not None:  # extended, filtered and composited per sample
            return _run_kernel(op, x, params, keys, scenes, host_params, compose=True, extend=True)
        x_in = extend_tissue(x, scenes)
        out = _run_kernel(op, x_in, params, keys, scenes, host_params)
        return compose_tissue(x, out, scenes)
    return _run_kernel(op, x, params, keys, scenes, host_params, compose=True)


class BatchScenes(Sequence[Scene | None]):
    """The scene of each record of a batch (None where it does not protect the border), and the
    batch's clean pixels on the host (``host``), copied from the device once per batch: the
    analysis of a scene and the glyph cover of its text lines read them there.

    Scenes come, in this order, from ``given`` (one ``Scene`` or descriptor per record, e.g. the
    scenes generation computed once per source image), from the descriptor a record stores
    (``extra["scene"]``), else from the analysis of the sample's clean pixels, made where the
    scene is first asked for (on the CPU path: in the worker that runs the sample, while its
    pixels are in cache). ``record``: each record gets its scene's descriptor as it is known.
    ``rows``: record i is the sample ``x[rows[i]]`` (default: ``x[i]``)."""

    def __init__(
        self,
        records: Sequence[Record],
        x: torch.Tensor,
        given: Sequence[Any] | None = None,
        record: bool = False,
        rows: Sequence[int] | None = None,
    ) -> None:
        self._records, self._x, self._record = records, x, record
        self._rows = None if rows is None else list(rows)
        self._host: np.ndarray | None = None
        self._lock = threading.Lock()
        size = (int(x.shape[-2]), int(x.shape[-1]))
        self._scenes: list[Scene | None] = []
        kinds = {op: scene_kind(op) for op in {r.op for r in records}}
        self._kinds = [kinds[r.op] for r in records]
        for i, r in enumerate(records):
            found: Scene | None = None
            if r.protect_border and given is not None and given[i] is not None:
                found = _fitting(
                    given[i] if isinstance(given[i], Scene) else Scene.from_descriptor(given[i]),
                    size,
                )
            elif r.protect_border and "scene" in r.extra:
                found = _fitting(Scene.from_descriptor(r.extra["scene"]), size)
            if found is not None and found.kind != self._kinds[i]:
                found = None  # e.g. an endoscopy scene given for an X-ray op: analysed as its kind
            self._scenes.append(found)
        if record and given is not None:
            for r, s in zip(records, self._scenes, strict=True):
                if s is not None:
                    r.extra["scene"] = s.descriptor  # the record's own dict, made by make_record

    def host(self) -> np.ndarray:
        """The batch as an (B, C, H, W) NumPy array of its dtype: one device-to-host transfer
        per batch, made on first use (a view of a CPU batch; with ``rows``, a copy of them)."""
        if self._host is None:
            with self._lock:
                if self._host is None:
                    host = self._x.detach().cpu().numpy()
                    self._host = host if self._rows is None else host[self._rows]
        return self._host

    def _analyse(self, i: int) -> Scene:
        if self._kinds[i] == "radiograph":
            desc, text, key = radiograph.analysed(self.host()[i], chw=True)
        else:
            desc, text, key = analysed(self.host()[i], chw=True)
        if self._record:
            self._records[i].extra["scene"] = json.loads(text)  # the record's own copy
        return Scene.keyed(desc, key)

    def complete(self) -> None:
        """Analyse every scene not yet asked for (each ``record`` then carries its scene)."""
        for _ in self:
            pass

    def __len__(self) -> int:
        return len(self._scenes)

    @overload
    def __getitem__(self, i: int) -> Scene | None: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Scene | None]: ...
    def __getitem__(self, i: int | slice) -> Scene | Sequence[Scene | None] | None:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        scene = self._scenes[i]
        if scene is None and self._records[i].protect_border:
            scene = self._scenes[i] = self._analyse(i)
        return scene

    def __iter__(self) -> Iterator[Scene | None]:
        return (self[i] for i in range(len(self)))


def scene_kind(op: str) -> str:
    """The scene an op's records composite with: a radiograph's annotation layer for an X-ray
    op (``perturb.scene.radiograph``), else an endoscopy frame's layers."""
    return "radiograph" if get_op(op).spec.modalities == ["xray"] else "endoscopy"


def _fitting(scene: Scene, size: tuple[int, int]) -> Scene:
    if scene.size != size:
        raise InputError(
            f"record's scene is for a {scene.size[0]}x{scene.size[1]} image, got {size[0]}x{size[1]}; "
            "replay records on the images they were made from"
        )
    return scene


def _cpu_path(op: Op, x: torch.Tensor) -> tuple[Any, Any] | None:
    """The op's registered host path for ``x``'s dtype where the batch takes the OpenCV path."""
    return backends.cpu_path(op.name, x.dtype) if backends.opencv_path(x) else None


def _run_kernel(
    op: Op,
    x: torch.Tensor,
    params: dict[str, torch.Tensor],
    keys: Sequence[int],
    scenes: Sequence[Scene | None],
    host_params: Sequence[Mapping[str, Any]],
    compose: bool = False,
    extend: bool = False,
) -> torch.Tensor:
    """The op's CPU path or torch kernel on ``x`` (its dtype out); ``host_params``: each
    sample's recorded parameters, for a kernel that takes them; ``compose``: composited
    into ``x`` as the tissue layer of the samples that have a scene; ``extend`` (CPU path
    only): the path reads each such sample with its surround replaced by the extension of its
    tissue (``perturb.ops.composite.extend_numpy``)."""
    dtype = x.dtype
    fast = _cpu_path(op, x)
    if fast is not None:
        return backends.run_cpu(
            fast[0],
            x,
            params,
            keys,
            scenes if compose else [None] * len(scenes),
            dtypes=fast[1],
            uses_scene=backends.cpu_uses_scene(op.name),
            kernel_scenes=scenes,
            extend=extend,
            shadow=op.entry.shadow if compose else None,
        )
    if extend:
        raise ValueError("extend runs on the CPU path only")
    xf = x.to(torch.float32) / SUPPORTED_DTYPES[dtype] if dtype != torch.float32 else x
    extra: dict[str, Any] = {}
    if op.entry.uses_scene:
        extra["scenes"] = scenes
    if op.entry.host_params:
        extra["host_params"] = host_params
    with torch.no_grad():
        out = op.entry.kernel(xf, params, keys, **extra)
    out = _restore_dtype(out, dtype)
    if compose:
        out = compose_tissue(x, out, scenes, _stopped(op, xf, params, scenes))
    return out


def _stopped(
    op: Op, x: torch.Tensor, params: dict[str, torch.Tensor], scenes: Sequence[Scene | None]
) -> torch.Tensor | None:
    """(B, 1, H, W) float32: the share of the beam ``op`` stopped (its ``KernelEntry.shadow``),
    where some scene is a radiograph with a lead marker; else None."""
    if op.entry.shadow is None:
        return None
    if not any(
        s is not None
        and radiograph.is_radiograph(s.descriptor)
        and radiograph.lead_mask(s.descriptor, s.key).any()
        for s in scenes
    ):
        return None
    return op.entry.shadow(x, params)


def _host_of(x: torch.Tensor, scenes: Sequence[Scene | None]) -> Callable[[], np.ndarray]:
    """The batch's clean pixels on the host, copied at most once: ``scenes``' copy where it
    holds one (``BatchScenes``), else ``x``'s, made on first use."""
    if isinstance(scenes, BatchScenes):
        return scenes.host
    held: list[np.ndarray] = []

    def host() -> np.ndarray:
        if not held:
            held.append(x.detach().cpu().numpy())
        return held[0]

    return host


def _alphas(x: torch.Tensor, scenes: Sequence[Scene | None], kind: str) -> torch.Tensor | None:
    """(B, 1, H, W) float32 on ``x``'s device: each scene's ``composite_alpha`` or
    ``extension_alpha`` with its clean sample (1 without a scene); None where no sample has a
    scene. An alpha is computed once per image (``Scene`` keeps it) and uploaded once per image:
    a scene whose alpha reads no pixels keeps its device copy (``Scene.held_on``), so the later
    ops of its chain neither copy the batch to the host nor upload anything. What is missing is
    computed on the host (the batch copied there once, only where a scene reads glyph pixels)
    and uploaded in one transfer."""
    if all(s is None for s in scenes):
        return None
    h, w = x.shape[-2:]

    def build(scene: Scene, image: np.ndarray | None) -> np.ndarray:
        alpha = scene.composite_alpha(image) if kind == "composite" else scene_extension_alpha(scene, image)
        return alpha[None]

    parts = scene_held(x, scenes, kind, _host_of(x, scenes), build, (1, h, w), np.float32)
    if len(parts) == 1 and parts[0] is not None:
        return parts[0].unsqueeze(0)
    ones = torch.ones((1, h, w), dtype=torch.float32, device=x.device)
    return torch.stack([ones if p is None else p for p in parts])


def extend_tissue(x: torch.Tensor, scenes: Sequence[Scene | None]) -> torch.Tensor:
    """``x`` with each scene's surround and overlays replaced by a smooth extension of its
    tissue (``perturb.ops.composite.extend_numpy``, the same bytes), for spatial (PSF) ops: each
    image's fill and alpha are computed once on the host (``scene_extension_fill`` and
    ``scene_extension_alpha``, from the batch's one host copy), uploaded as one batch each, and
    blended in one batched step on ``x``'s device."""
    alpha = _alphas(x, scenes, "extension")
    if alpha is None:
        return x
    host = _host_of(x, scenes)()
    fills = np.empty(host.shape, host.dtype)
    for i, s in enumerate(scenes):
        fills[i] = host[i] if s is None else scene_extension_fill(s, host[i])
    fill = torch.from_numpy(fills).to(x.device).to(torch.float32)
    xf = x.to(torch.float32)
    mixed = fill + alpha * (xf - fill)  # the host's (src - fill) * alpha + fill, exactly
    out = torch.where(alpha >= 1.0, xf, mixed)
    if x.dtype == torch.float32:
        return out
    return out.round_().clamp_(0.0, SUPPORTED_DTYPES[x.dtype]).to(x.dtype)


def record_scene(record: Record, image: torch.Tensor) -> Scene:
    """The scene a tissue-layer record composites with: the descriptor it stores
    (``extra["scene"]``, written by ``apply`` from the clean input), else the scene of
    ``image`` (CHW), analysed now."""
    desc = record.extra.get("scene")
    kind = scene_kind(record.op)
    if desc is not None and kind_of(desc) == kind:
        return _fitting(Scene.from_descriptor(desc), (int(image.shape[-2]), int(image.shape[-1])))
    return Scene.of(image, kind)


def compose_tissue(
    x: torch.Tensor,
    out: torch.Tensor,
    scenes: Sequence[Scene | None],
    shadow: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out`` where the tissue layer shows, ``x`` elsewhere (BCHW, both of one dtype): the
    surround and the on-screen overlays keep their input pixels (of a burned-in text line, its
    glyph strokes: ``perturb.scene.masks.composite_alpha``); samples without a scene keep
    ``out``. Partial alpha mixes ``x + a (out - x)`` in float32 (integer levels rounded half to
    even), the arithmetic of ``perturb.ops.composite.compose_numpy``. One batched blend: the
    alphas are computed once per image on the host (``Scene.composite_alpha``) and uploaded as
    one (B, 1, H, W) tensor. ``shadow`` (B, 1, H, W): the share of the beam the op stopped
    (``KernelEntry.shadow``); a radiograph's lead marker (``radiograph.lead_mask``: a physical
    object on the detector, unlike burned-in text) is not pasted back there, in that share:
    under a collimator blade it was never imaged."""
    a = _alphas(x, scenes, "composite")
    if a is None:
        return out
    if shadow is not None:
        lead = torch.stack([_lead_of(s, x) for s in scenes])
        a = a + (1.0 - a) * lead * shadow.to(a.device, torch.float32)
    if x.dtype == torch.float32:
        mixed = x + a * (out - x)
    else:
        xf, of = x.to(torch.float32), out.to(torch.float32)
        mixed = (xf + a * (of - xf)).round_().clamp_(0, SUPPORTED_DTYPES[x.dtype]).to(x.dtype)
    return torch.where(a >= 1.0, out, mixed)


def _lead_of(scene: Scene | None, x: torch.Tensor) -> torch.Tensor:
    """(1, H, W) float32 on ``x``'s device: 1 on a radiograph scene's lead marker pixels."""
    h, w = x.shape[-2:]
    if scene is None or not radiograph.is_radiograph(scene.descriptor):
        return torch.zeros((1, h, w), dtype=torch.float32, device=x.device)
    lead = radiograph.lead_mask(scene.descriptor, scene.key)
    return torch.from_numpy(lead.astype(np.float32))[None].to(x.device)


def apply(
    images: torch.Tensor,
    op: str,
    severity: int | Sequence[int],
    sample_keys: Sequence[str | int],
    *,
    seed: int = 0,
    variant: int | Sequence[int] = 0,
    protect_border: bool | None = None,
    param_keys: Sequence[str | int] | None = None,
    scenes: Sequence[Any] | None = None,
) -> tuple[torch.Tensor, list[Record]]:
    """Perturb a batch with ``op`` at ``severity`` (1..5) and return (images, records).

    ``sample_keys`` names each image stably (e.g. its img_id); with ``seed``, ``op``,
    severity and ``variant`` it fixes every random quantity of that sample. uint8 and uint16
    batches come back in their dtype; float32 batches must lie in [0, 1].
    ``protect_border`` (default: the op's spec): the op acts on the tissue layer of an
    endoscopy frame (``perturb.scene``): inside the field of view, with the dark surround and
    the on-screen overlays kept as they are; for an X-ray op, on the film under its burned-in
    annotations (``perturb.scene.radiograph``: kept as they are); each record stores the
    scene's descriptor.
    ``param_keys`` (default: ``sample_keys``) key the scalar parameters alone: images with one
    param key (e.g. the views of one study) share their parameters, while per-pixel fields still
    follow each image's own sample key; the record keeps the param key in ``extra``.
    ``scenes`` (one ``perturb.scene.Scene`` or descriptor per image, None where not known)
    reuses scenes already computed for these images instead of analysing each input again.
    """
    spec_op = get_op(op)
    check_images(images, spec_op)
    x = images
    n = x.shape[0]
    severities = [check_severity(s) for s in _per_sample(severity, n, "severity")]
    variants = [_check_variant(v) for v in _per_sample(variant, n, "variant")]
    sample_keys = check_sample_keys(sample_keys, n, severities, variants)
    protect = spec_op.spec.protects_border if protect_border is None else bool(protect_border)
    if param_keys is not None and (isinstance(param_keys, str | bytes) or len(param_keys) != n):
        raise InputError(
            f"param_keys must be a sequence with one key per image ({n}), got {param_keys!r:.80}"
        )
    groups = None if param_keys is None else [str(k) for k in param_keys]
    records = make_records(
        spec_op,
        severities,
        sample_keys,
        seed=int(seed),
        variants=variants,
        protect_border=protect,
        device=x.device,
        param_keys=groups,
    )
    if protect and scenes is not None and len(scenes) != n:
        raise InputError(f"scenes has {len(scenes)} entries for a batch of {n}; pass one per image")
    records = with_codecs(records, x)
    if not protect:
        return _run_records(x, records, checked=True), records
    # the scene of each clean input: given, or analysed where its sample runs; recorded so
    # replay composites identically, whatever the op's path asked for
    found = BatchScenes(records, x, given=scenes, record=True)
    out = _run_records(x, records, found, checked=True)
    found.complete()
    _note_scene_decisions(records, found)
    return out, records


def _note_scene_decisions(records: Sequence[Record], scenes: Sequence[Scene | None]) -> None:
    """Each record whose op took a decision from its film's scene (an X-ray overlay op that
    follows or avoids the annotations already there: ``perturb.ops.overlay.SCENE_NOTES``) says why
    in ``extra["note"]``."""
    from perturb.ops.overlay import SCENE_NOTES

    note = SCENE_NOTES.get(records[0].op) if records else None
    if note is None:
        return
    for r, s in zip(records, scenes, strict=True):
        if s is not None:
            why = note(r.params, s, *s.size)
            if why is not None:
                r.extra["note"] = why


def with_codecs(records: Sequence[Record], images: torch.Tensor) -> list[Record]:
    """``records`` with each codec op's record naming, as its ``backend``, the codec that runs
    where ``images`` are (the op's registered ``codec``, e.g. ``perturb.ops.jpeg.jpeg_backend``);
    other records as they are."""
    codecs: dict[str, str | None] = {}
    out = []
    for r in records:
        if r.op not in codecs:
            codec = get_op(r.op).codec
            codecs[r.op] = None if codec is None else codec(images)
        name = codecs[r.op]
        out.append(r if name is None else replace(r, backend=name))
    return out


def check_replayable(rec: Record) -> None:
    """``rec`` names an op of this catalog at its version, with the parameters that op draws
    (no more, no fewer); otherwise InputError naming the record's field, before any work."""
    try:
        op = get_op(rec.op)
    except UnknownNameError:
        raise InputError(
            f"record field op: no op {rec.op!r} in this perturb (renamed or removed since perturb "
            f"{rec.perturb_version} made the record); replay it with that version"
        ) from None
    if rec.op_version != op.spec.version:
        raise InputError(
            f"record field op_version: {rec.op} version {rec.op_version} was recorded, this perturb "
            f"has version {op.spec.version}; replay it with perturb {rec.perturb_version}"
        )
    if not isinstance(rec.params, dict):
        raise InputError(
            f"record field params: a mapping of {rec.op}'s parameters is needed, got {rec.params!r:.60}"
        )
    try:
        expected = set(sample_params(op, rng.key_from_hex(rec.key), rec.severity))
        if op.entry.device_params is not None:
            expected |= set(op.entry.device_params(rec.seed, rec.variant))
    except Exception:  # a record drawn from explicit ranges, or a bad key: the run checks those
        return
    missing, unknown = sorted(expected - set(rec.params)), sorted(set(rec.params) - expected)
    if missing or unknown:
        what = "; ".join(
            part
            for part in (
                f"missing params.{', params.'.join(missing)}" if missing else "",
                f"unknown params.{', params.'.join(unknown)}" if unknown else "",
            )
            if part
        )
        raise InputError(
            f"record field params: {what} for op {rec.op} (expected {', '.join(sorted(expected))}); "
            f"the record was edited or made by another perturb version ({rec.perturb_version})"
        )


def replay(records: Record | dict | Sequence[Record | dict], images: torch.Tensor) -> torch.Tensor:
    """Re-apply recorded ops: one record per image of ``images`` (CHW or BCHW), or a chain of
    records applied in order to a single image."""
    if isinstance(records, Record | dict):
        records = [records]
    recs = [r if isinstance(r, Record) else Record.from_dict(r) for r in records]
    for rec in recs:
        check_replayable(rec)
    single = images.ndim == 3
    batch = images.unsqueeze(0) if single else images
    check_images(batch)
    x = batch
    if len(recs) == x.shape[0]:
        out = torch.cat([run_records(x[i : i + 1], [r]) for i, r in enumerate(recs)])
    elif x.shape[0] == 1:
        out = x
        for r in recs:
            out = run_records(out, [r])
    else:
        raise InputError(f"{len(recs)} records for {x.shape[0]} images: pass one record per image")
    return out[0] if single else out
