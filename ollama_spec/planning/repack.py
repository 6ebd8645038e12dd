"""Which weights llama.cpp's CPU backend copies into an extra, repacked buffer, and how big it is.

With `use_extra_bufts` on (llama.cpp's default), a matrix that stays on the CPU is loaded a
second time into an AMX or CPU_REPACK buffer when the CPU has a kernel for its type and shape;
the mapped file stays too, so the copy is extra memory. The rules are read from the vendored
llama.cpp of llama-cpp-python 0.3.36 (ggml/src/ggml-cpu: `ggml_repack_get_optimal_repack_type`
in repack.cpp, `qtype_has_amx_kernels` and the AMX `supports_op` in amx/, the buffer order in
`ggml_backend_cpu_get_extra_buffer_types`: AMX first, then CPU_REPACK). The CPU features are
what llama.cpp itself reports (`llama_print_system_info`), so they match the build, not just
the chip (llama/backends.cpu_features reads them).
"""

from __future__ import annotations

from ollama_spec.models.gguf_info import TensorInfo

# AMX: types with AMX kernels and the input-size multiple each needs; F16 is stored unpacked.
_AMX_ALIGN = {"Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256, "F16": 16}
# Bytes per block of the types AMX repacks, and what it adds per block (Q8_0's compensation
# sums; Q4_K/Q5_K unpacked scales; IQ4_XS its own): mmq.cpp's get_row_size.
_AMX_BLOCK = {
    "Q4_0": (32, 18, 0),
    "Q4_1": (32, 20, 0),
    "Q8_0": (32, 34, 4),
    "Q4_K": (256, 144, 4),
    "Q5_K": (256, 176, 4),
    "Q6_K": (256, 210, 0),
    "IQ4_XS": (256, 136, 2),
}
_AMX_TILE_N2 = 32  # the AMX kernel wants output rows in multiples of 2 x TILE_N


def features_from_system_info(text: str) -> frozenset[str]:
    """The features in llama.cpp's system info line ("CPU : SSE3 = 1 | AVX2 = 1 | ..."), as cpu_features gives them."""
    features = set()
    for part in text.replace("\n", "|").split("|"):
        name, _, value = part.rpartition("=")
        name, value = name.split(":")[-1].strip(), value.strip()
        if name and value == "1":
            features.add(name)
        elif name and value.isdigit():
            features.add(f"{name}={value}")
    return frozenset(features)


def has_extra_buffers(features: frozenset[str]) -> bool:
    """Whether this llama.cpp build can repack at all (the choice of use_extra_bufts matters)."""
    return bool(features & {"AMX_INT8", "REPACK", "KLEIDIAI"})


def is_matmul_weight(tensor: TensorInfo) -> bool:
    """A weight llama.cpp multiplies with: a layer's matrix (3-D: experts), or the output matrix."""
    if tensor.name == "output.weight":
        return True
    if not (tensor.name.startswith("blk.") and tensor.name.endswith(".weight")):
        return False
    return len(tensor.shape) == 2 or (len(tensor.shape) == 3 and "_exps." in tensor.name)


def repacked_bytes(tensor: TensorInfo, features: frozenset[str], *, as_output: bool = False) -> int:
    """Bytes of the extra-buffer copy llama.cpp makes of `tensor` when it stays on the CPU (0: none).

    `as_output`: tied embeddings, where llama.cpp loads `token_embd` a second time as the output matrix.
    """
    if not (as_output or is_matmul_weight(tensor)):
        return 0
    if "AMX_INT8" in features and (size := _amx_bytes(tensor)):
        return size
    if "REPACK" in features and _repacks(tensor.type_name, tensor.shape[1] if len(tensor.shape) > 1 else 0, features):
        return tensor.n_bytes
    return 0


def _amx_bytes(tensor: TensorInfo) -> int:
    if len(tensor.shape) != 2 or tensor.type_name not in _AMX_ALIGN:
        return 0
    k, n = tensor.shape  # inputs, outputs
    if k % _AMX_ALIGN[tensor.type_name] or n % _AMX_TILE_N2:
        return 0
    if tensor.type_name == "F16":
        return tensor.n_bytes
    block_values, block_bytes, extra = _AMX_BLOCK[tensor.type_name]
    return n * (k // block_values) * (block_bytes + extra)


def _repacks(type_name: str, rows: int, f: frozenset[str]) -> bool:
    """repack.cpp's choice: a kernel for this type on these features, and a row count it tiles."""
    neon_i8mm = "NEON" in f and "MATMUL_INT8" in f
    neon_dot = "NEON" in f and "DOTPROD" in f
    if type_name == "Q4_0":
        sve = "SVE" in f and "MATMUL_INT8" in f and "SVE_CNT=32" in f
        return (("AVX2" in f or sve) and rows % 8 == 0) or ((neon_i8mm or neon_dot or "VXE" in f) and rows % 4 == 0)
    if type_name == "Q4_K":
        return ("AVX2" in f or neon_i8mm or neon_dot) and rows % 8 == 0
    if type_name == "Q2_K":
        return "AVX512" in f and rows % 8 == 0
    if type_name in ("Q5_K", "Q6_K"):
        return (neon_i8mm or neon_dot) and rows % 8 == 0
    if type_name in ("IQ4_NL", "MXFP4"):
        return ("AVX2" in f and rows % 8 == 0) or (neon_dot and rows % 4 == 0)
    if type_name in ("Q8_0", "Q1_0"):
        return (neon_i8mm or neon_dot) and rows % 4 == 0
    return False
