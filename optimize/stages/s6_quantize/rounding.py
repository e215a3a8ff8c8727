"""Weight codes rounded so that their errors compensate each other on the calibration rows (GPTQ).

Rounding each weight to its nearest code leaves the product's error to chance: on all-mpnet-base-v2 the FFN's
down-projections of layers 1-5 lose 1.4-2.5% of their product to it at 8 bits, as much as their activations lose.
Taken one input channel at a time, each channel's rounding error is spread over the channels not yet rounded,
weighted by how the calibration rows move together (the inverse of their Gram matrix), so the error that is left
is what those rows cannot see. The column scales are the plain ones, so the graph and its kernels do not change.
The Gram matrix is damped towards the identity by its mean diagonal: a few hundred calibration rows of a 3072-wide
input span little of it, and undamped codes fit those rows and nothing else.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_triangular

BLOCK = 128  # channels rounded between two matrix updates of the rest


@dataclass(frozen=True)
class Compensation:
    """How one input's rows spread a channel's rounding error: the channel order and the upper Cholesky factor of
    the damped Gram matrix's inverse, in that order. Shared by every MatMul reading the input."""
    order: np.ndarray
    upper: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray, damping: float) -> Compensation:
        """From the rows [tokens, in] the weights multiply; `damping` x the mean diagonal is added to their Gram
        matrix."""
        rows = rows.astype(np.float32)
        gram = rows.T @ rows
        diagonal = np.diag(gram)
        order = np.argsort(-diagonal, kind="stable")  # the channels that carry most first
        gram = gram[order][:, order]
        # a channel the rows never use gets a unit diagonal: its error spreads nowhere, its nearest code is kept
        gram[np.diag_indices_from(gram)] += damping * float(diagonal.mean()) + (diagonal[order] == 0)
        # G^-1 = U^T U with U upper: with J G J = L L^T (J reverses the order), U = J L^-1 J; no inverse of G
        lower = np.linalg.cholesky(gram[::-1, ::-1])
        inverse = solve_triangular(lower, np.eye(len(gram), dtype=lower.dtype), lower=True)
        return cls(order, np.ascontiguousarray(inverse[::-1, ::-1]))


def column_scales(weight: np.ndarray, bits: int) -> np.ndarray:
    """Symmetric per output column of `weight` [in, out]: its largest magnitude is code 2^(bits-1) - 1."""
    return (np.maximum(np.abs(weight).max(axis=0), 1e-12) / (2 ** (bits - 1) - 1)).astype(np.float32)


def quantize_weight(weight: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes, column scales): each weight's nearest code in [-(2^(bits-1) - 1), 2^(bits-1) - 1]."""
    limit = 2 ** (bits - 1) - 1
    scale = column_scales(weight, bits)
    return np.clip(np.round(weight / scale), -limit, limit).astype(np.int8), scale


def compensated_codes(weight: np.ndarray, compensation: Compensation, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes, column scales) of `weight` [in, out] with quantize_weight's scales, each channel's rounding error
    spread over the channels after it."""
    limit = 2 ** (bits - 1) - 1
    scale = column_scales(weight, bits)
    order, upper = compensation.order, compensation.upper
    width = weight.shape[0]
    left = weight.astype(np.float32)[order]
    codes = np.empty(left.shape, np.int8)
    for start in range(0, width, BLOCK):
        end = min(start + BLOCK, width)
        block = left[start:end].copy()
        errors = np.empty_like(block)
        for i in range(end - start):
            rounded = np.clip(np.round(block[i] / scale), -limit, limit)
            codes[start + i] = rounded
            errors[i] = (block[i] - rounded * scale) / upper[start + i, start + i]
            block[i:] -= np.outer(upper[start + i, start + i:end], errors[i])
        left[end:] -= upper[start:end, end:].T @ errors
    restored = np.empty_like(codes)
    restored[order] = codes
    return restored, scale


class CompensatedRounding:
    """Compensated codes for the MatMuls of one build's graphs, from each input's calibration rows. Remembered by
    what they depend on (the input, its smoothing, the smoothed weight, the bits), so the parity search's trials,
    which quantize the same nodes again and again, round each weight once."""

    def __init__(self, samples: Mapping[str, np.ndarray], damping: float) -> None:
        self.samples, self.damping = samples, damping
        # the last input's basis only (Q, K and V read one input in a row): a 4096-wide input's is 64 MB
        self._basis: tuple[tuple[str, bytes], Compensation] | None = None
        self._codes: dict[tuple[str, bytes, bytes, int], tuple[np.ndarray, np.ndarray]] = {}

    def covers(self, tensor: str) -> bool:
        return tensor in self.samples

    def codes(self, tensor: str, weight: np.ndarray, divided: np.ndarray | None,
              bits: int) -> tuple[np.ndarray, np.ndarray]:
        """`weight` [in, out] as the MatMul multiplies it, reading `tensor` divided per channel by `divided`."""
        smoothing = b"" if divided is None else _digest(divided)
        key = (tensor, smoothing, _digest(weight), bits)
        if key not in self._codes:
            if self._basis is None or self._basis[0] != (tensor, smoothing):
                rows = self.samples[tensor] if divided is None else self.samples[tensor] * divided
                self._basis = (tensor, smoothing), Compensation.of(rows, self.damping)
            self._codes[key] = compensated_codes(weight, self._basis[1], bits)
        return self._codes[key]


def _digest(array: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).digest()
