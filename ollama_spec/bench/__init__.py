"""`ollama-spec bench`: how much faster speculative decoding is, and at which K.

- `settings`: what to measure (frozen dataclasses, the -k list parser);
- `prompts`: the built-in prompt set and `--prompts FILE`;
- `model`: Leviathan et al.'s predicted speed-up, pure functions;
- `samples`: one timed generation, rows of them, their medians, peak memory;
- `runner`: target alone and speculative rows through the engine, plus cost calibration;
- `reference`: llama-cpp-python's own draft_model path and prompt-lookup decoding;
- `remote`: `--url`, any OpenAI-compatible streaming server;
- `report`: terminal table, results.json, results.md and the plot.
"""
