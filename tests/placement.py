"""llama.cpp's layer placement, written out from its source independently of ollama_spec.planning.memory.

From llama-cpp-python 0.3.36's vendored src/llama-model.cpp, `load_tensors`:

    const int i_gpu_start    = std::max(n_layer_all + 1 - n_gpu_layers, 0);
    const int act_gpu_layers = devices.empty() ? 0 : std::min(n_gpu_layers, n_layer_all + 1);
    // layer il goes to a GPU unless il < i_gpu_start || (il - i_gpu_start) >= act_gpu_layers
    pimpl->dev_input  = { cpu_dev, ... };                      // token_embd: always the CPU
    pimpl->dev_output = get_layer_buft_list(n_layer_all);      // the output layer is index n_layer

So n_gpu_layers = g puts the output layer (index n_layer) on the GPU as soon as g >= 1, with the
last g - 1 repeating layers; g = n_layer + 1 puts everything but token_embd there.
"""

from __future__ import annotations

from ollama_spec.models.gguf_info import ModelInfo


def gpu_layer_indices(n_layer: int, n_gpu_layers: int) -> set[int]:
    """Indices llama.cpp places on the GPU; n_layer stands for the output layer."""
    start = max(n_layer + 1 - n_gpu_layers, 0)
    return {il for il in range(n_layer + 1) if il >= start and il - start < min(n_gpu_layers, n_layer + 1)}


def weight_bytes_by_layer(info: ModelInfo) -> dict[int, int]:
    """Tensor bytes per llama.cpp layer index: blk.N -> N, output tensors -> n_layer, token_embd -> -1."""
    n_layer = info.block_count
    by_layer: dict[int, int] = {}
    for tensor in info.tensors:
        parts = tensor.name.split(".")
        index = int(parts[1]) if parts[0] == "blk" else -1 if tensor.name == "token_embd.weight" else n_layer
        by_layer[index] = by_layer.get(index, 0) + tensor.n_bytes
    if not any(t.name == "output.weight" for t in info.tensors):  # tied: token_embd is loaded again as the output
        by_layer[n_layer] = by_layer.get(n_layer, 0) + by_layer[-1]
    return by_layer


def gpu_weight_bytes(info: ModelInfo, n_gpu_layers: int) -> int:
    """Weights llama.cpp puts on the GPU with this n_gpu_layers."""
    by_layer = weight_bytes_by_layer(info)
    return sum(by_layer.get(il, 0) for il in gpu_layer_indices(info.block_count, n_gpu_layers))
