"""Can a model serve as a target or a draft at all? Checked from its header, before any load.

A GGUF can be a valid file and still hold nothing to run: no architecture, an architecture or
tokenizer this llama.cpp does not know, no vocabulary (an embedding-only or adapter file), no
layers. `pair`,
`check` and the engine refuse such a model up front, saying what it lacks, instead of failing
later on a memory-sizing or load message that does not say why. What this llama.cpp knows is
the caller's to say (`knows`: llama/backends.llama_cpp_knows asks the installed one).
"""

from __future__ import annotations

from collections.abc import Callable

from ollama_spec.errors import UnusableModel
from ollama_spec.models.gguf_header import MAX_LAYERS, shown
from ollama_spec.models.gguf_info import ModelInfo
from ollama_spec.models.heads import is_head

# Ollama's own converter writes a multimodal model (gemma3, mistral-small3.1, qwen2.5vl, llama4)
# as one file, its vision or audio tower beside the text model; llama.cpp loads only text-model
# files ("wrong number of tensors") and keeps a tower in a separate mmproj file.
TOWER_PREFIXES = ("v.", "mm.", "a.")
GGUF_FOR_LLAMA_CPP = "use a GGUF made for llama.cpp (ollama-spec pull hf.co/<user>/<repo>:<quant>)"


def usability_problems(info: ModelInfo, knows: Callable[[str], bool]) -> tuple[str, ...]:
    """What this model lacks to run (empty when nothing); `knows(name)`: does the llama.cpp that
    will load it know this architecture, tokenizer or pre-tokenizer?"""
    problems = []
    arch = info.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        problems.append("no architecture (general.architecture)")
    elif arch == "gptoss":
        problems.append(
            "architecture 'gptoss', Ollama's own layout of gpt-oss, which llama.cpp cannot load: "
            "use a GGUF made for llama.cpp (ollama-spec pull hf.co/ggml-org/gpt-oss-20b-GGUF)"
        )
    elif not knows(arch):
        problems.append(f"architecture {shown(arch)}, which this llama.cpp does not know")
    if not info.n_tokens or info.vocab_type in ("none", "no_vocab"):
        problems.append("no vocabulary (tokenizer.ggml.tokens)")
    elif info.vocab_type is None:
        problems.append("no tokenizer model (tokenizer.ggml.model)")
    elif not knows(info.vocab_type):
        problems.append(f"tokenizer {shown(info.vocab_type)}, which this llama.cpp does not know")
    elif info.pre_tokenizer and not knows(info.pre_tokenizer):
        problems.append(f"pre-tokenizer {shown(info.pre_tokenizer)}, which this llama.cpp does not know")
    if not info.block_count:
        layers = info.metadata.get(f"{info.architecture}.block_count")
        if isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_LAYERS:
            problems.append(f"{layers} layers, more than llama.cpp's {MAX_LAYERS}")
        else:
            problems.append("no layers (block_count)")
    if not info.tensors:
        problems.append("no tensors")
    tower = sum(t.name.startswith(TOWER_PREFIXES) for t in info.tensors)
    if tower:
        problems.append(
            f"a vision or audio tower in its file ({tower} tensors), as Ollama stores multimodal "
            f"models, which llama.cpp cannot load: {GGUF_FOR_LLAMA_CPP}"
        )
    return tuple(problems)


def require_usable(name: str, info: ModelInfo, role: str, knows: Callable[[str], bool]) -> None:
    """Raise UnusableModel naming `name` and everything it lacks to run as `role` (target, draft)."""
    problems = usability_problems(info, knows)
    if role == "target" and is_head(info):
        problems += ("an EAGLE-3 head's single layer, which drafts for a target (name it with --draft)",)
    if problems:
        raise UnusableModel(f"{name} cannot be the {role}: it has " + ", ".join(problems))
