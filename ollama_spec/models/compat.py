"""Can this draft model speculate for this target?

The rules are llama.cpp's `common_speculative_are_compatible` (common/speculative.cpp): same
vocabulary type, same add-BOS/add-EOS flags and ids, vocab sizes within 128 of each other, and
identical token text from id 5 up to the smaller vocabulary. We report every difference found,
and one more limit of our own loop: recurrent and hybrid models cannot roll their cache back. An EAGLE-3
head is held to the same vocabulary rules and to those of models/heads (the target's width, depth and
vocabulary it was made for).
"""

from __future__ import annotations

from dataclasses import dataclass

from ollama_spec.errors import IncompatibleDraft
from ollama_spec.models.architectures import has_recurrent_state, is_recurrent
from ollama_spec.models.gguf_info import ModelInfo
from ollama_spec.models.heads import head_problems, is_head

MAX_VOCAB_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
FIRST_CHECKED_TOKEN = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID
LLAMA3_EOT = "<|eot_id|>"
LLAMA3_EOS = "<|end_of_text|>"
LLAMA3_BOS = "<|begin_of_text|>"


@dataclass(frozen=True)
class Compatibility:
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_compatibility(target: ModelInfo, draft: ModelInfo) -> Compatibility:
    problems = [
        f"the {role} is a {'recurrent' if is_recurrent(info.architecture) else 'hybrid'} model "
        f"({info.architecture}) whose cache cannot drop rejected draft tokens; run it without a draft"
        for role, info in (("target", target), ("draft", draft))
        if has_recurrent_state(info.architecture)
    ]
    if is_head(target):
        problems.append("the target is an EAGLE-3 head, which drafts for a target and cannot be one")
    problems += head_problems(target, draft)
    if target.vocab_type != draft.vocab_type:
        problems.append(f"vocabulary types differ: '{target.vocab_type}' in target, '{draft.vocab_type}' in draft")
    if bool(target.add_bos) != bool(draft.add_bos) or (target.add_bos and target.bos_id != draft.bos_id):
        problems.append(
            f"BOS differs: add_bos {target.add_bos} / id {target.bos_id} in target, "
            f"add_bos {draft.add_bos} / id {draft.bos_id} in draft"
        )
    if bool(target.add_eos) != bool(draft.add_eos) or (target.add_eos and target.eos_id != draft.eos_id):
        problems.append(
            f"EOS differs: add_eos {target.add_eos} / id {target.eos_id} in target, "
            f"add_eos {draft.add_eos} / id {draft.eos_id} in draft"
        )
    if abs(target.vocab_size - draft.vocab_size) > MAX_VOCAB_SIZE_DIFFERENCE:
        problems.append(
            f"vocab sizes {target.vocab_size} vs {draft.vocab_size} differ by more than {MAX_VOCAB_SIZE_DIFFERENCE}"
        )
    elif target.tokens is not None and draft.tokens is not None:
        for token_id in range(FIRST_CHECKED_TOKEN, min(len(target.tokens), len(draft.tokens))):
            if target.tokens[token_id] != draft.tokens[token_id]:
                problems.append(
                    f"token {token_id} is {target.tokens[token_id]!r} in target, {draft.tokens[token_id]!r} in draft"
                )
                break
    return Compatibility(tuple(problems))


def require_compatible(target_name: str, target: ModelInfo, draft_name: str, draft: ModelInfo) -> None:
    """Raise IncompatibleDraft, listing every problem, unless `draft` can draft for `target`."""
    verdict = check_compatibility(target, draft)
    if not verdict.ok:
        raise IncompatibleDraft(f"{draft_name} cannot draft for {target_name}: " + "; ".join(verdict.problems))


@dataclass(frozen=True)
class MetadataFix:
    """A correction applied at load time for a known metadata gap."""

    description: str
    kv_overrides: tuple[tuple[str, str | int], ...] = ()
    extra_stop_ids: tuple[int, ...] = ()


def load_kv_overrides(info: ModelInfo) -> tuple[tuple[str, str | int], ...]:
    """The llama.cpp kv_overrides that every loader of this model applies (see llama3_metadata_fixes)."""
    return tuple(kv for fix in llama3_metadata_fixes(info) for kv in fix.kv_overrides)


def llama3_metadata_fixes(info: ModelInfo) -> tuple[MetadataFix, ...]:
    """Fixes for Llama 3 GGUFs that lack `tokenizer.ggml.pre` or end turns with `<|end_of_text|>`.

    Ollama patches both in memory; plain llama.cpp warns about degraded tokenization and never
    stops on `<|eot_id|>`. We override the pre-tokenizer and add `<|eot_id|>` as a stop token.
    """
    if info.tokens is None or LLAMA3_BOS not in info.tokens:
        return ()
    fixes = []
    if info.vocab_type == "gpt2" and info.pre_tokenizer in (None, "", "default"):
        fixes.append(
            MetadataFix(
                "tokenizer.ggml.pre is missing: using the Llama 3 pre-tokenizer 'llama-bpe'",
                kv_overrides=(("tokenizer.ggml.pre", "llama-bpe"),),
            )
        )
    if info.token_text(info.eos_id) == LLAMA3_EOS and LLAMA3_EOT in info.tokens:
        eot = info.tokens.index(LLAMA3_EOT)
        if info.eot_id != eot:
            fixes.append(
                MetadataFix(
                    f"EOS is {LLAMA3_EOS} but chat turns end with {LLAMA3_EOT}: also stopping on token {eot}",
                    kv_overrides=(("tokenizer.ggml.eot_token_id", eot),),
                    extra_stop_ids=(eot,),
                )
            )
    return tuple(fixes)
