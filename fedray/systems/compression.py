"""Upload compression (``systems.compression``; docs/guide/systems.md, "Compression").

A client compresses its model-weight update Δ_k = w_k − w (against the broadcast weights w, in
float32 as a device holds it) into the tensors it sends; the server decodes them, and what it decodes
is what it aggregates. :func:`~fedray.systems.clock.payload_bytes` of the encoded tensors is what
the client's ``bytes_up`` counts. Every upload kind is compressed (:func:`compressed_uploads`, :func:`compressed_parts`):
:data:`~fedray.algorithms.uploads.MODEL_WEIGHTS` as the update Δ_k (from ``sums["weights"] /
sums["num_samples"]``), a client's own weights sent in its payload (the keys an upload declares
``model_weights``: FedSKC's outside ``gda_mode: fedavg``, which the server then receives as
w + decode(C(Δ_k))), and the other float tensors each upload declares ``compressed`` (prototype and
representation sums, logit knowledge, SCAFFOLD's control-variate deltas, Hetero-SSFL's
representations), each as one vector of its own, as it is: these are values the server uses as
they arrive, not updates against a broadcast reference. What an upload leaves out (per-class counts,
presence masks, the weights' ``num_samples``: a few numbers a class) travels as it is. An algorithm
that declares no upload is refused before Ray starts (:func:`check_compression`).
``systems.compression.method``:

- ``fp16``: Δ in half precision (2 bytes an entry).
- ``int8``: unbiased stochastic quantisation (QSGD: Alistarh et al., "QSGD: Communication-Efficient
  SGD via Gradient Quantization and Encoding", NeurIPS 2017, §3.1: Q_s with s = 127 levels and
  bucketing, each bucket of ``bucket_size`` entries scaled by its largest magnitude m = ‖v‖_∞ instead
  of ‖v‖₂, so that fewer entries round to zero): entry v_i of a bucket becomes
  sign(v_i) · m/s · ℓ_i, where ℓ_i = ⌊s·|v_i|/m⌋ + 1 with probability s·|v_i|/m − ⌊s·|v_i|/m⌋ and
  ⌊s·|v_i|/m⌋ otherwise, so E[Q(v)] = v (the paper's Lemma 3.1, whose proof holds for any scale
  m ≥ max |v_i|). 1 byte an entry plus a float32 scale a bucket; the random draws are seeded by
  (seed, round, client id).
- ``topk``: the k = ⌈``topk_fraction`` · d⌉ entries of largest magnitude (Aji & Heafield 2017;
  Stich et al. 2018), sent as float32 values and int32 indices (8 bytes an entry kept).

Error feedback (``error_feedback: true``; Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory",
NeurIPS 2018, Algorithm 1; Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
Compression Schemes", ICML 2019, Algorithm 2, EF-SGD): a client compresses p_k = Δ_k + e_k instead
of Δ_k and keeps e_k ← p_k − decode(C(p_k)), what the server did not receive, for its next upload.
Each compressed tensor has its own residual. For an update (the model weights, SCAFFOLD's Δc_i,
which the server accumulates) this is the method of the papers above; for a value the server uses
as it arrives (a prototype sum, logit knowledge) the same memory makes each client's received
values right on average over its uploads rather than in each round. The residuals are client state:
they are stored with the algorithm's own client state (:data:`RESIDUAL_KEY`, :func:`join_client_state`), versioned and checkpointed like it, so a client
that drops or is late keeps the residual of its last upload that arrived, and a resumed run
continues bit-identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from fedray.algorithms.uploads import MODEL_WEIGHTS, Upload, no_uploads
from fedray.config import ConfigError, RunConfig
from fedray.config.schema import CompressionConfig
from fedray.seeding import derive_seed
from fedray.systems.clock import payload_bytes
from fedray.systems.draws import COMPRESSION_STREAM

if TYPE_CHECKING:
    from fedray.algorithms.base import Algorithm

#: The key of a client's error-feedback residual of its model weights in its stored client state (never
#: shown to the algorithm); another compressed tensor's residual is under ``RESIDUAL_KEY:<its key>``.
RESIDUAL_KEY = "fedray.compression_residual"
#: A client's residuals by the key of what they belong to, :data:`WEIGHTS` for its model weights.
Residuals = dict[str, torch.Tensor]
WEIGHTS = "weights"
INT8_LEVELS = 127  # s of QSGD: ℓ ∈ {-127, ..., 127}


class Compressor:
    """Encodes a float32 vector into the tensors a client sends (:meth:`encode`) and decodes them as
    the server does (:meth:`decode`)."""

    def encode(self, vector: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def decode(self, message: dict[str, torch.Tensor], numel: int) -> torch.Tensor:
        raise NotImplementedError


class HalfPrecision(Compressor):
    """``fp16``: the vector in IEEE half precision."""

    def encode(self, vector: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return {"values": vector.to(torch.float16)}

    def decode(self, message: dict[str, torch.Tensor], numel: int) -> torch.Tensor:
        return message["values"].to(torch.float32)


@dataclass(frozen=True)
class StochasticInt8(Compressor):
    """``int8``: QSGD's Q_s with s = :data:`INT8_LEVELS` and a ‖·‖_∞ scale per bucket (module docstring)."""

    bucket_size: int

    def _buckets(self, vector: torch.Tensor) -> torch.Tensor:
        padding = -vector.numel() % self.bucket_size
        return torch.nn.functional.pad(vector, (0, padding)).view(-1, self.bucket_size)

    def encode(self, vector: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        buckets = self._buckets(vector)
        scales = buckets.abs().amax(dim=1)
        levels_per_unit = torch.where(scales > 0, INT8_LEVELS / scales, torch.zeros_like(scales))
        magnitude = buckets.abs() * levels_per_unit[:, None]  # s·|v_i|/m, in [0, s]
        uniform = torch.rand(magnitude.shape, generator=generator, dtype=magnitude.dtype).to(magnitude.device)
        levels = torch.floor(magnitude + uniform).clamp_(max=INT8_LEVELS)  # the clamp only catches float rounding above s
        signed = (levels * torch.sign(buckets)).view(-1)[: vector.numel()]
        return {"values": signed.to(torch.int8), "scales": scales.to(torch.float32)}

    def decode(self, message: dict[str, torch.Tensor], numel: int) -> torch.Tensor:
        levels = self._buckets(message["values"].to(torch.float32))
        return (levels * (message["scales"] / INT8_LEVELS)[:, None]).view(-1)[:numel]


@dataclass(frozen=True)
class TopK(Compressor):
    """``topk``: the ⌈fraction · d⌉ entries of largest magnitude, with their indices."""

    fraction: float

    def kept(self, numel: int) -> int:
        return max(1, math.ceil(self.fraction * numel))

    def encode(self, vector: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        indices = torch.topk(vector.abs(), self.kept(vector.numel()), sorted=False).indices
        index_dtype = torch.int32 if vector.numel() <= torch.iinfo(torch.int32).max else torch.int64
        return {"values": vector[indices], "indices": indices.to(index_dtype)}

    def decode(self, message: dict[str, torch.Tensor], numel: int) -> torch.Tensor:
        values = message["values"]
        return torch.zeros(numel, dtype=values.dtype, device=values.device).scatter_(0, message["indices"].long(), values)


def build_compressor(config: CompressionConfig) -> Compressor:
    """The compressor ``systems.compression.method`` names (not ``none``)."""
    if config.method == "fp16":
        return HalfPrecision()
    if config.method == "int8":
        return StochasticInt8(config.bucket_size)
    if config.method == "topk":
        return TopK(config.topk_fraction)
    raise ValueError(f"no compressor for systems.compression.method={config.method!r}")


@dataclass(frozen=True)
class CompressedUpdate:
    """One client's compressed update: what the server decodes (float32), the client's new
    error-feedback residual (None without error feedback) and the bytes of the encoded tensors."""

    received: torch.Tensor
    residual: torch.Tensor | None
    wire_bytes: int


class UploadCompression:
    """The compression step of a run's upload path (:mod:`fedray.runtime.upload_path`)."""

    def __init__(self, config: CompressionConfig, seed: int) -> None:
        self.compressor = build_compressor(config)
        self.error_feedback = config.error_feedback
        self.seed = seed

    @classmethod
    def for_run(cls, config: RunConfig) -> "UploadCompression | None":
        compression = config.systems.compression
        return cls(compression, config.seed) if compression_enabled(config) else None

    def compress(self, round: int, client_id: int, delta: torch.Tensor, residual: torch.Tensor | None, part: int = 0) -> CompressedUpdate:
        """Client ``client_id``'s ``delta`` (Δ_k, or another tensor, flat) as the server receives it in
        ``round``; ``residual`` is its e_k (None: it has none yet, or error feedback is off). ``part``
        numbers the tensor among the client's compressed tensors (0: the model weights, then
        :func:`compressed_parts` from 1), so that each draws its own random stream."""
        vector = delta.to(torch.float32)
        if self.error_feedback and residual is not None:
            vector = vector + residual.to(vector.device)
        if not bool(torch.isfinite(vector).all()):  # sent as it is: the server excludes it, and its state is not stored
            return CompressedUpdate(vector, residual, payload_bytes(vector))
        keys = (self.seed, COMPRESSION_STREAM, round, client_id) + ((part,) if part else ())
        generator = torch.Generator().manual_seed(derive_seed(*keys))
        message = self.compressor.encode(vector, generator)
        received = self.compressor.decode(message, vector.numel())
        return CompressedUpdate(received, vector - received if self.error_feedback else None, payload_bytes(message))


def compression_enabled(config: RunConfig) -> bool:
    return config.systems.enabled and config.systems.compression.method != "none"


def keeps_client_state(config: RunConfig, algorithm: type[Algorithm]) -> bool:
    """Whether a run's clients store state: the algorithm's own, or an error-feedback residual."""
    return algorithm.keeps_client_state or (compression_enabled(config) and config.systems.compression.error_feedback)


def split_client_state(state: dict[str, torch.Tensor] | None) -> tuple[dict[str, torch.Tensor] | None, Residuals]:
    """A client's stored state as (the algorithm's own state, or None if it has none; its residuals,
    empty if it has none). ``state`` itself is not changed (it may be the store's cached copy)."""
    if state is None or not any(key.startswith(RESIDUAL_KEY) for key in state):
        return state, {}
    own: dict[str, torch.Tensor] = {}
    residuals: Residuals = {}
    for key, value in state.items():
        if key == RESIDUAL_KEY:
            residuals[WEIGHTS] = value
        elif key.startswith(f"{RESIDUAL_KEY}:"):
            residuals[key.removeprefix(f"{RESIDUAL_KEY}:")] = value
        else:
            own[key] = value
    return own or None, residuals


def join_client_state(state: dict[str, torch.Tensor] | None, residuals: Residuals) -> dict[str, torch.Tensor] | None:
    """The client state to store: the algorithm's ``state`` with each of ``residuals`` under its
    :data:`RESIDUAL_KEY` key."""
    if not residuals:
        return state
    stored = {RESIDUAL_KEY if key == WEIGHTS else f"{RESIDUAL_KEY}:{key}": value for key, value in residuals.items()}
    return {**(state or {}), **stored}


def compressed_uploads(algorithm: Algorithm) -> list[Upload]:
    """The uploads of ``algorithm``'s run that compression encodes as model-weight updates:
    :data:`MODEL_WEIGHTS` (the weights' sums) and those declaring ``model_weights`` (a client's own
    weights in its payload)."""
    return sorted(
        (upload for upload in algorithm.run_uploads() if upload == MODEL_WEIGHTS or upload.model_weights), key=lambda upload: upload.kind
    )


def compressed_parts(algorithm: Algorithm) -> list[tuple[str, Literal["sums", "payload"]]]:
    """The tensors other than model weights that compression encodes, as (key, where it travels), in a
    fixed order (their random streams and residuals are numbered by it, from 1): each upload's
    ``compressed`` keys, the uploads by kind."""
    return [
        (key, "sums" if key in upload.sums else "payload")
        for upload in sorted(algorithm.run_uploads(), key=lambda upload: upload.kind)
        for key in upload.compressed
    ]


def compression_problems(config: RunConfig, algorithm: Algorithm) -> list[tuple[str | None, str]]:
    """Why ``systems.compression`` cannot apply to ``algorithm`` (empty: it can, or it is off): it
    declares nothing to compress (:func:`compressed_uploads`, :func:`compressed_parts`)."""
    if not compression_enabled(config) or compressed_uploads(algorithm) or compressed_parts(algorithm):
        return []
    cls = type(algorithm)
    name = cls.name or cls.__name__
    uploads = ", ".join(sorted(upload.kind for upload in algorithm.run_uploads()))
    what = f"{name} uploads {uploads}, none of it declared compressible" if uploads else no_uploads(cls)
    return [
        (
            "systems.compression.method",
            f"compression encodes the uploads an algorithm declares, but {what}; "
            "use an algorithm that declares them (fedavg, fedprox, scaffold, fedproto, ...)",
        )
    ]


def check_compression(config: RunConfig, algorithm: Algorithm) -> None:
    """Refuse compression for an algorithm that declares nothing to compress (before Ray starts)."""
    problems = compression_problems(config, algorithm)
    if problems:
        raise ConfigError(*problems[0])
