"""Random Q4_K and Q6_K weight matrices written directly as blocks, some sub-blocks zero.

Quantizing 8 billion floats in numpy takes minutes; random block bytes take seconds, and the
weights of a synthetic model only need the right types, sizes and statistics. Each value is
d·scale·q (minus dmin·min for Q4_K) with q uniform, so the scale fields set the standard
deviation; a sub-block whose scale is 0 is all zeros, which is how a bigger model embeds a
smaller one (nested.py). Layouts: ggml-quants.h (block_q4_K, block_q6_K) and gguf-py's
dequantizers, which tests use to check these blocks.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

QK_K = 256
SUB = {T.Q4_K: 32, T.Q6_K: 16}  # values per sub-block (each has its own scale)
BLOCK_BYTES = {T.Q4_K: 144, T.Q6_K: 210}
# Q4_K: value = d·sc·q − dmin·m, q uniform in 0..15 (std 4.61, mean 7.5): m·dmin = 7.5·sc·d centres it.
Q4K_SC, Q4K_M, Q4K_Q_STD = 32, 60, float(np.sqrt((16**2 - 1) / 12))
# Q6_K: value = d·scale·(q − 32), q uniform in 0..63 (std 18.47; the mean −0.5 shifts every weight alike).
Q6K_SCALE, Q6K_Q_STD = 16, float(np.sqrt((64**2 - 1) / 12))


def random_blocks(
    qtype: T, rows: int, cols: int, std: float, rng: np.random.Generator, live: np.ndarray | None = None
) -> np.ndarray:
    """A (rows, cols) matrix of `qtype` as uint8 block bytes, shape (rows, cols // 256 * block bytes).

    `live` (rows, cols // sub-block) says which sub-blocks hold random values; the others are 0.
    """
    if cols % QK_K:
        raise ValueError(f"{qtype.name} rows need a multiple of {QK_K} values, not {cols}")
    n_blocks, per = rows * cols // QK_K, QK_K // SUB[qtype]
    live = np.ones((rows, cols // SUB[qtype]), dtype=bool) if live is None else live
    on = live.reshape(n_blocks, per)
    blocks = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES[qtype]), dtype=np.uint8)
    if qtype == T.Q4_K:
        d = np.float16(std / (Q4K_SC * Q4K_Q_STD))
        dmin = np.float16(float(d) * 7.5 * Q4K_SC / Q4K_M)
        blocks[:, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
        blocks[:, 2:4] = np.frombuffer(dmin.tobytes(), np.uint8)
        blocks[:, 4:16] = _pack_q4k_scales(np.where(on, Q4K_SC, 0), np.where(on, Q4K_M, 0))
    elif qtype == T.Q6_K:
        d = np.float16(std / (Q6K_SCALE * Q6K_Q_STD))
        blocks[:, 192:208] = np.where(on, Q6K_SCALE, 0).astype(np.int8).view(np.uint8)
        blocks[:, 208:210] = np.frombuffer(d.tobytes(), np.uint8)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return blocks.reshape(rows, -1)


def _pack_q4k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins per block into Q4_K's 12 bytes (inverse of gguf's Q4_K.get_scale_min)."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return out


def live_mask(qtype: T, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Sub-block mask from live rows and live columns; every sub-block must be all live or all dead."""
    sub = cols.reshape(-1, SUB[qtype])
    if (sub.any(axis=1) != sub.all(axis=1)).any():
        raise ValueError("a sub-block is partly live: the nested shapes do not line up with the sub-blocks")
    return rows[:, None] & sub.all(axis=1)[None, :]
