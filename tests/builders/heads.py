"""EAGLE-3 head GGUFs for tests: converted from a synthetic checkpoint, or copied with some metadata changed."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from ollama_spec.models.resolve import resolve_model
from ollama_spec.pull.head_checkpoint import iter_tensors, read_head_config, weight_files
from ollama_spec.pull.head_convert import convert_head
from ollama_spec.synthetic import PAIRS
from ollama_spec.synthetic.eagle3_checkpoint import head_for, write_head_checkpoint


def converted_head(store: Path, out: Path, target: str = "tiny-target", layout: str = "eagle", **shape) -> Path:
    """A head checkpoint shaped for the tiny pair's target (`shape`: HeadCheckpoint fields), converted to `out`."""
    folder = write_head_checkpoint(out.with_suffix(""), head_for(PAIRS["tiny"], **shape), layout)
    config = read_head_config(folder / "config.json", str(folder))
    resolved = resolve_model(target, str(store))
    convert_head(config, list(iter_tensors(weight_files(folder), str(folder))), resolved.info, target, out)
    return out


def rewritten(source: Path, out: Path, **metadata) -> Path:
    """A copy of the GGUF `source` with `metadata` keys (dots written as `__`) set: ints, strings, lists of ints."""
    changes = {key.replace("__", "."): value for key, value in metadata.items()}
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch=arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in changes:
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for name, value in changes.items():
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        else:
            writer.add_uint32(name, value)
    for tensor in reader.tensors:
        writer.add_tensor(
            tensor.name, tensor.data, raw_shape=tuple(reversed(tensor.shape.tolist())), raw_dtype=tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
