"""The Python a lone request's pass costs outside llama.cpp, as CPU time of the thread that runs it.

The tiny pair's five prompts are generated once for real (greedy, fixed K), each pass's logits kept;
then llama_decode is skipped and each pass's logits are replayed as recorded, ROUNDS times, the
answers checked token for token. What is left is the engine's own Python: the step loop's turn, the
steps, the batch filled, the text handed on. CPU time of the thread, not wall time, so that other
work on a shared machine moves it less; run two checkouts' copies alternately to compare them:

    PYTHONPATH=. python scripts/python_per_pass.py STORE [ROUNDS] [K] [TOKENS]

STORE: a demo store with the tiny pair (`ollama-spec demo-store STORE`).
"""

import statistics
import sys
import time

import llama_cpp

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, EngineSettings, Request
from ollama_spec.models.resolve import resolve_model

PROMPTS = ["Once upon a time", "The quick brown fox", "In the beginning", "Write a poem about the sea", "Tell me about"]


def main() -> None:
    store = sys.argv[1]
    rounds, k, tokens = (int(a) for a in (sys.argv[2:] + ["20", "3", "96"][len(sys.argv) - 2 :]))
    settings = EngineSettings(n_ctx=512, n_threads=1, memory_check=False)
    with Engine(resolve_model("tiny-target", store), resolve_model("tiny-draft", store), settings) as engine:
        sampling, speculation = SamplingSettings(temperature=0), SpeculationSettings(k)

        def answers() -> list[list[int]]:
            out = []
            for prompt in PROMPTS:
                engine.clear_cache()
                request = Request(
                    prompt, raw=True, max_tokens=tokens, ignore_eos=True, sampling=sampling, speculation=speculation
                )
                generation = engine.generate(request)
                "".join(generation)
                out.append(generation.result.tokens)
            return out

        models = [engine.target, engine.draft]
        recorded: dict[int, list] = {id(m): [] for m in models}
        for model in models:
            model._read_logits = _recording(model._read_logits, recorded[id(model)])
        expected = answers()
        passes = sum(map(len, recorded.values()))
        at = dict.fromkeys(recorded, 0)

        def replayed(key: int):
            def read(n: int):
                at[key] += 1
                return recorded[key][at[key] - 1]

            return read

        for model in models:
            model._read_logits = replayed(id(model))
        llama_cpp.llama_decode = lambda ctx, batch: 0  # every other llama.cpp call stays real
        per_pass = []
        for _ in range(rounds):
            at.update(dict.fromkeys(at, 0))
            started = time.thread_time()
            assert answers() == expected, "a replayed answer differs from the real one"
            per_pass.append((time.thread_time() - started) / passes * 1e6)
    per_pass.sort()
    print(
        f"K={k}, {tokens} tokens x {len(PROMPTS)} prompts, {passes} passes a round, {rounds} rounds: "
        f"{statistics.median(per_pass):.1f} us of Python a pass ({per_pass[0]:.1f}-{per_pass[-1]:.1f})"
    )


def _recording(read, kept: list):
    def recorded(n: int):
        kept.append(read(n))
        return kept[-1]

    return recorded


if __name__ == "__main__":
    main()
