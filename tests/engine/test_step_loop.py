"""The step loop: one thread owns the slots, runs every pass, and learns the passes' costs online."""

import math
import threading
import time

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.engine.prompt_chunks import MIN_CHUNK
from ollama_spec.engine.sinks import Collected, stream
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)


def request(prompt, **fields):
    fields = {
        "max_tokens": 24,
        "ignore_eos": True,
        "sampling": GREEDY,
        "speculation": SpeculationSettings(None),
    } | fields
    return Request(prompt, raw=True, **fields)


def run(engine, req):
    ticket, pieces = stream(engine.loop, req, engine.prompt_tokens(req))
    text = "".join(pieces)
    return ticket, text


def test_a_drafting_pair_with_nothing_cached_times_nothing_and_prices_auto_from_its_passes(
    tiny_models, tmp_path, monkeypatch
):
    """serve's way (costs.online): no calibration at load nor before the first request; the loop's own
    passes price -k auto from the first steps on."""
    from ollama_spec.engine import costs as costs_module
    from ollama_spec.engine.calibration import StepCostCache

    def timed(*args, **kwargs):
        raise AssertionError("steps were timed before a request could run")

    monkeypatch.setattr(costs_module, "measure_step_costs", timed)
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        engine.costs.cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.online = True
        ticket, text = run(engine, request("The quick brown fox"))
        assert text and ticket.generation.result.speculation.drafted > 0
        policy = ticket.generation.policy
        # priced by the passes (about a millisecond on the tiny pair), not by the prior's shape (a
        # second a pass), and not by its own step times (timed alone, it learns nothing of its own)
        assert policy._priced and policy.costs.verify_s[0] < 0.5


def test_a_long_prompt_is_read_in_chunks_inside_the_other_slots_passes(tiny_models, monkeypatch):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        long_prompt = " ".join(["word"] * 100)  # about 300 tokens
        alone = {
            key: run(engine, req)[0].generation.result.tokens
            for key, req in {"short": request("Once upon a time", max_tokens=40), "long": request(long_prompt)}.items()
        }
        passes = []
        real = engine.target.decode_many

        def decode_many(items):
            passes.append([len(tokens) for _, tokens, _ in items])
            return real(items)

        monkeypatch.setattr(engine.target, "decode_many", decode_many)
        engine.clear_cache()
        with engine.loop.together():
            short = stream(
                engine.loop,
                request("Once upon a time", max_tokens=40),
                engine.prompt_tokens(request("Once upon a time")),
            )
            long = stream(engine.loop, request(long_prompt), engine.prompt_tokens(request(long_prompt)))
        "".join(short[1]), "".join(long[1])
        chunk = engine.generate(request("x"), slot=0).prompt_chunk
        assert chunk and chunk < 300
        # the long prompt's chunks (the batch's piece at most, as few as MIN_CHUNK beside a running
        # stream) each share a pass with the short request's steps: it never waits for the whole
        # prompt to be read
        shared = [sizes for sizes in passes if len(sizes) == 2 and max(sizes) >= MIN_CHUNK]
        assert len(shared) >= 3
        assert all(max(sizes) <= chunk + 1 for sizes in passes[: len(shared)])
        assert short[0].generation.result.tokens == alone["short"]
        assert long[0].generation.result.tokens == alone["long"]


class Counted:
    """A Sink that notes, at each hand-on (on the loop's thread), the loop's finished steps and the
    request's tokens so far."""

    def __init__(self, loop):
        self.loop, self.calls, self.done = loop, [], threading.Event()

    def pieces(self, ticket, pieces):
        self.calls.append((self.loop.steps, len(ticket.generation.result.tokens)))

    def end(self, ticket):
        self.done.set()

    def fail(self, ticket, error):
        self.done.set()
        raise AssertionError(f"the request failed: {error}")


def submitted(engine, prompt, **fields):
    """`prompt` (tokens) submitted to the loop: (its sink, ticket, the loop's finished steps then)."""
    sink, steps = Counted(engine.loop), engine.loop.steps
    return sink, engine.loop.submit(request("", **fields), prompt, sink), steps


def running(engine, n, text="Once upon a time"):
    """n requests generating (K=2, long answers), each past its first tokens."""
    streams = [
        submitted(engine, engine.prompt_tokens(request(f"{text} {i}")), max_tokens=400, speculation=FIXED_K)
        for i in range(n)
    ]
    deadline = time.monotonic() + 60
    while not all(ticket.generation and len(ticket.generation.result.tokens) >= 4 for _, ticket, _ in streams):
        assert time.monotonic() < deadline, "the streams made no progress"
        time.sleep(0.001)
    return streams


def fresh_prompt(engine, n, opener):
    """n tokens of text, opened by `opener` right after BOS: no other prompt shares more than BOS with it."""
    words = engine.prompt_tokens(request(" ".join(["harbour pier rope tar lighthouse"] * (n // 4 + 4))))
    return [words[0], opener, *words[1 : n - 1]]


FIXED_K = SpeculationSettings(2)


def test_a_request_arriving_beside_three_streams_gets_its_first_token_within_two_steps_of_alone(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4, n_ctx=512)) as engine:
        chunk = engine.generate(request("x"), slot=1).prompt_chunk
        prompt_alone, prompt_beside = fresh_prompt(engine, 60, 300), fresh_prompt(engine, 60, 301)
        sink, _, at = submitted(engine, prompt_alone, max_tokens=2, speculation=FIXED_K)
        sink.done.wait()
        (step, tokens), *_ = sink.calls
        alone = step - at + 1
        assert tokens == 1 and alone >= math.ceil(59 / chunk)  # its chunks, the last one's step giving the token
        streams = running(engine, 3)
        sink, _, at = submitted(engine, prompt_beside, max_tokens=2, speculation=FIXED_K)
        sink.done.wait()
        (step, tokens), *_ = sink.calls
        for _, ticket, _ in streams:
            ticket.cancel()
        # admitted before the target pass of the step under way when it came, or at the next turn; then its chunks
        assert tokens == 1 and step - at + 1 <= alone + 2


def test_a_request_sent_during_the_draft_passes_gets_its_first_token_before_that_steps_target_pass(
    tiny_models, monkeypatch
):
    """A request that comes while the running slots draft is admitted before the next pass and its prompt
    read at once: its slot does not sit out the step under way (a client's next request comes so every
    time), nor wait for the others' drafts."""
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4, n_ctx=512)) as engine:
        prompt = fresh_prompt(engine, 20, 303)
        streams = running(engine, 3)
        sent = []
        draft_pass = engine.draft.decode_many

        def decode_many(items):  # on the loop's thread, between a step's draft passes
            if not sent:
                sent.append(submitted(engine, prompt, max_tokens=2, speculation=FIXED_K))
            return draft_pass(items)

        monkeypatch.setattr(engine.draft, "decode_many", decode_many)
        deadline = time.monotonic() + 60
        while not sent:
            assert time.monotonic() < deadline, "no draft pass ran"
            time.sleep(0.001)
        (sink, _, at), *_ = sent
        assert sink.done.wait(60)
        for _, other, _ in streams:
            other.cancel()
        (step, tokens), *_ = sink.calls
        assert tokens == 1 and step == at


def beside_three_streams(engine, prompt, monkeypatch):
    """`prompt`'s tokens alone (12 at most), then the same request submitted beside three running streams:
    (its tokens alone, its (sink, ticket, step it came at), every target pass as (the loop's step,
    [(sequence, tokens read)])), the streams cancelled once it is done."""
    sink, ticket, _ = submitted(engine, prompt, max_tokens=12)
    assert sink.done.wait(60)
    alone = ticket.generation.result.tokens
    engine.clear_cache()
    streams = running(engine, 3)
    passes = []
    target_pass = engine.target.decode_many

    def decode_many(items):
        passes.append((engine.loop.steps, [(seq, len(tokens)) for seq, tokens, _ in items]))
        return target_pass(items)

    monkeypatch.setattr(engine.target, "decode_many", decode_many)
    beside = submitted(engine, prompt, max_tokens=12)
    assert beside[0].done.wait(60)
    for _, other, _ in streams:
        other.cancel()
    return alone, beside, passes


def test_a_short_prompt_arriving_beside_streams_is_read_at_once_in_a_pass_of_its_own(tiny_models, monkeypatch):
    """Not after the others' draft passes, beside their verify rows (padded to its width, or split off in
    a pass more): its first token comes after the pass under way and its own, and its answer is the one
    it gets alone."""
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4, n_ctx=512)) as engine:
        prompt = fresh_prompt(engine, 40, 304)
        alone, (sink, ticket, at), passes = beside_three_streams(engine, prompt, monkeypatch)
        read = [items for _, items in passes if (ticket.slot, len(prompt)) in items]
        assert read == [[(ticket.slot, len(prompt))]]
        (step, tokens), *_ = sink.calls
        assert tokens == 1 and step - at <= 1  # before the target pass of the step under way, or the next
        assert ticket.generation.result.tokens == alone


def test_a_two_piece_prompt_beside_streams_reads_its_last_piece_at_once_at_the_next_turn(tiny_models, monkeypatch):
    """Its first piece in the passes of the turn it came in, its last in a target pass of its own at the
    next turn's start, not after the others' draft passes (nor in pieces bounded by their steps): its
    first token one turn after its first piece, its answer the one it gets alone."""
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4, n_ctx=512)) as engine:
        chunk = engine.generate(request("x"), slot=1).prompt_chunk
        prompt = fresh_prompt(engine, 2 * chunk - 4, 305)
        alone, (sink, ticket, at), passes = beside_three_streams(engine, prompt, monkeypatch)
        piece = len(prompt) - chunk  # the smaller piece: longer than any step's drafts and verify row
        reads = [(step, items) for step, items in passes for seq, n in items if seq == ticket.slot and n >= piece]
        (first_step, _), (last_step, last) = reads
        assert [n for _, items in reads for seq, n in items if seq == ticket.slot] == [chunk, len(prompt) - chunk]
        assert last == [(ticket.slot, len(prompt) - chunk)] and last_step == first_step + 1
        (step, tokens), *_ = sink.calls
        assert tokens == 1 and step == last_step and step - at <= 2
        assert ticket.generation.result.tokens == alone


def test_beside_other_slots_a_turns_text_is_handed_on_just_before_the_next_pass(tiny_models, monkeypatch):
    """The readers a sink wakes then run while llama_decode has let go of the GIL, not against the
    loop's next turn (its admissions, its K): at the end of a turn only where no pass follows."""
    from ollama_spec.engine.step_loop import StepLoop

    events = []

    class Logged(Counted):
        def pieces(self, ticket, pieces):
            events.append("pieces")

    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        for model in (engine.target, engine.draft):
            monkeypatch.setattr(
                model, "decode_many", lambda items, real=model.decode_many: events.append("pass") or real(items)
            )
        admit = StepLoop._admit
        monkeypatch.setattr(StepLoop, "_admit", lambda loop: events.append("admit") or admit(loop))
        sinks = [Logged(engine.loop), Logged(engine.loop)]
        with engine.loop.together():
            for i, sink in enumerate(sinks):
                engine.loop.submit(
                    request("", max_tokens=24, speculation=FIXED_K), fresh_prompt(engine, 12, 310 + i), sink
                )
        assert all(sink.done.wait(60) for sink in sinks)
    handed = [i for i, event in enumerate(events) if event == "pieces"]
    assert len(handed) > 4
    after = [next((e for e in events[i + 1 :] if e != "pieces"), None) for i in handed]
    assert set(after) <= {"pass", None}  # None: the last turn's, no pass after it


def test_a_long_prompt_read_beside_three_streams_takes_a_chunk_a_pass_of_either_model(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4, n_ctx=768)) as engine:
        chunk = engine.generate(request("x"), slot=1).prompt_chunk
        long_prompt = fresh_prompt(engine, 500, 302)
        streams = running(engine, 3)
        engine.loop.passes = passes = []
        before = [len(ticket.generation.result.tokens) for _, ticket, _ in streams]
        sink, _, at = submitted(engine, long_prompt, max_tokens=3, speculation=FIXED_K)
        sink.done.wait()
        engine.loop.passes = None
        after = [len(ticket.generation.result.tokens) for _, ticket, _ in streams]
        for _, ticket, _ in streams:
            ticket.cancel()
        (step, _), *_ = sink.calls
        # the prompt reaches neither model more than a chunk a pass (the draft reads it beside the
        # target: its first draft then has at most the last chunk and the first token to catch up on)
        assert max(p.widest for p in passes if p.model == 0) <= chunk
        assert max(p.widest for p in passes if p.model == 1) <= chunk + 1
        assert sum(p.model == 1 and p.widest > 1 for p in passes) >= 500 // chunk
        # and no step goes by without every stream's tokens: nothing waits for the prompt
        assert all(b - a >= step - at for a, b in zip(before, after))


def target_alone(engine, prompts, max_tokens):
    """Each prompt's greedy tokens from the target alone, by prompt."""
    alone = {}
    for prompt in prompts:
        generation = engine.generate(request(prompt, max_tokens=max_tokens), use_draft=False)
        "".join(generation)
        alone[prompt] = generation.result.tokens
    return alone


def stream_together(engine, prompts, max_tokens):
    """The prompts admitted at the same turn (their steps share every pass), each read to its end: the
    tickets, in the prompts' order."""
    with engine.loop.together():
        streams = [
            stream(engine.loop, request(p, max_tokens=max_tokens), engine.prompt_tokens(request(p))) for p in prompts
        ]
    for _, pieces in streams:
        "".join(pieces)
    return [ticket for ticket, _ in streams]


def test_slots_drafting_beside_each_other_stop_together_and_write_what_each_alone_writes(
    tiny_models, tmp_path, monkeypatch
):
    """-k auto beside other slots: the loop stops every slot's drafts together where the next draft pass
    no longer pays (`Declined`), and each request's greedy text is still the target's alone. The passes
    cost what `PassClock` says (a draft pass a tenth of a target pass), so that drafting pays whatever
    this machine's speed, and what is declined depends on the drafts alone; every drafted token is
    weighed (no draft step too cheap to weigh: as where a draft step is dear)."""
    from ollama_spec.decoding.evals import Declined
    from ollama_spec.engine import costs
    from ollama_spec.engine.calibration import StepCostCache
    from ollama_spec.engine.step_loop import StepLoop

    prompts = ["Once upon a time", "The harbour at dawn", "def add(a, b):"]
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=3, n_ctx=512)) as engine:
        alone = target_alone(engine, prompts, 96)
        engine.costs.cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.online = True  # priced from the passes only (nothing timed on the real clock)
        PassClock(engine, monkeypatch, draft_python_s=0.0)
        monkeypatch.setattr(costs, "stops_min_draft_s", lambda n_vocab: 0.0)
        widths = []
        advance = StepLoop._advance

        def advanced(self, slot, rows):
            if isinstance(rows, Declined):
                widths.append(rows.keep)
            return advance(self, slot, rows)

        monkeypatch.setattr(StepLoop, "_advance", advanced)
        tickets = stream_together(engine, prompts, 96)
        assert [ticket.generation.result.tokens for ticket in tickets] == [alone[prompt] for prompt in prompts]
        assert widths  # some steps stopped drafting before the batch's cap


def test_slots_whose_drafts_are_too_cheap_to_weigh_draft_the_planned_k_unweighed(tiny_models, tmp_path, monkeypatch):
    """-k auto beside other slots where a draft pass costs less than weighing its tokens (STOPS_MIN_DRAFT_S,
    as for a slot alone): no drafted token's margin is worked out and no draft pass is declined; the
    slots draft the K planned for them, and each request's greedy text is still the target's alone."""
    from ollama_spec.decoding import drafting
    from ollama_spec.decoding.evals import Declined
    from ollama_spec.engine.calibration import StepCostCache
    from ollama_spec.engine.step_loop import StepLoop

    prompts = ["Once upon a time", "The harbour at dawn", "def add(a, b):"]
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=3, n_ctx=512)) as engine:
        alone = target_alone(engine, prompts, 64)
        engine.costs.cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.online = True
        PassClock(engine, monkeypatch, draft_python_s=0.0)
        weighed, declined = [], []
        margin = drafting._top_prob_and_margin
        monkeypatch.setattr(drafting, "_top_prob_and_margin", lambda logits: weighed.append(1) or margin(logits))
        advance = StepLoop._advance
        monkeypatch.setattr(
            StepLoop,
            "_advance",
            lambda self, slot, rows: (
                (isinstance(rows, Declined) and declined.append(rows)) or advance(self, slot, rows)
            ),
        )
        tickets = stream_together(engine, prompts, 64)
        assert [ticket.generation.result.tokens for ticket in tickets] == [alone[prompt] for prompt in prompts]
        assert sum(ticket.generation.result.speculation.drafted for ticket in tickets) > 0
        assert not weighed and not declined


class PassClock:
    """A clock that moves only by the seconds given to each llama.cpp pass and to the Python that reads
    a pass's rows: the loop's timings then say exactly what each part of a step was made to cost."""

    def __init__(self, engine, monkeypatch, draft_python_s, scale=1.0):
        """`scale`: every pass and the step's Python that many times as long."""
        from types import SimpleNamespace

        from ollama_spec.decoding import loop
        from ollama_spec.engine import step_loop

        self.now = 0.0
        for module in (step_loop, loop):  # the loop's passes, and the steps' own timing
            monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: self.now))
        monkeypatch.setattr(engine.loop._k, "clock", lambda: self.now)  # when the lone slot is priced again
        for model, seconds in (
            (engine.draft, lambda tokens: scale * 0.0001),
            (engine.target, lambda tokens: scale * (0.001 + 0.00005 * tokens)),
        ):
            monkeypatch.setattr(model, "decode_many", self.decoding(model.decode_many, seconds))
        advance = step_loop.StepLoop._advance

        def slow_advance(loop, slot, rows):  # a draft token's Python, or the step's (verify, the next begun)
            if rows is not None:
                self.now += draft_python_s if slot.model is engine.draft else scale * 0.0002
            advance(loop, slot, rows)

        monkeypatch.setattr(step_loop.StepLoop, "_advance", slow_advance)

    def decoding(self, decode_many, seconds):
        def timed(items):
            self.now += seconds(sum(len(tokens) for _, tokens, _ in items))
            return decode_many(items)

        return timed


def test_a_lone_slot_prices_its_passes_with_the_python_between_them_and_drafts_by_that(
    tiny_models, tmp_path, monkeypatch
):
    """Where a draft token's Python costs as much as a target pass, drafting does not pay whatever its
    decode costs: a lone -k auto request priced by its passes alone drafts on, priced with the Python
    between them it stops."""
    from ollama_spec.engine.calibration import StepCostCache

    drafted = {}
    for python_s in (0.0, 0.002):
        with Engine(tiny_models[0], tiny_models[1], engine_settings(n_ctx=512)) as engine:
            engine.costs.cache = StepCostCache(tmp_path / f"costs-{python_s}.json")
            engine.costs.online = True  # priced from the passes only (nothing timed on the real clock)
            PassClock(engine, monkeypatch, draft_python_s=python_s)
            prices, observed = engine.costs.passes, []
            observe = prices.observe
            monkeypatch.setattr(
                prices, "observe", lambda *seen, log=observed, real=observe: log.append(seen) or real(*seen)
            )
            generation = engine.generate(request("The quick brown fox", max_tokens=64))
            "".join(generation)
            # each draft token priced by its decode and its Python; each target pass, the step's Python too
            draft_prices = [seconds for draft, _, seconds in observed if draft]
            assert draft_prices and draft_prices == [pytest.approx(0.0001 + python_s)] * len(draft_prices)
            assert all(
                seconds == pytest.approx(0.0012 + 0.00005 * size) for draft, size, seconds in observed if not draft
            )
            drafted[python_s] = generation.result.speculation.drafted
            monkeypatch.undo()
    assert drafted[0.0] >= 32 and drafted[0.002] <= drafted[0.0] // 4


def test_the_text_handed_on_is_priced_with_the_steps_target_pass_not_the_pass_after_it(tiny_models, monkeypatch):
    """A step's text is handed on before the next step's first pass, whichever that is: its time (a reader
    woken takes the GIL, on a busy machine the core too) is the step's, as its verify is. Counted in the
    first draft pass, a step drafting one column had its draft pass priced far above the next column's."""
    with Engine(tiny_models[0], tiny_models[1], engine_settings(n_ctx=512)) as engine:
        clock = PassClock(engine, monkeypatch, draft_python_s=0.0001)
        observed = []
        observe = engine.costs.passes.observe
        monkeypatch.setattr(
            engine.costs.passes, "observe", lambda *seen, real=observe: observed.append(seen) or real(*seen)
        )

        class Slow(Counted):
            def pieces(self, ticket, pieces):
                clock.now += 0.01  # handing the text on

        sink = Slow(engine.loop)
        engine.loop.submit(
            request("", max_tokens=24, speculation=SpeculationSettings(1)), fresh_prompt(engine, 12, 330), sink
        )
        assert sink.done.wait(60)
    drafts = [seconds for draft, _, seconds in observed if draft]
    targets = [(size, seconds) for draft, size, seconds in observed if not draft]
    assert drafts and drafts == [pytest.approx(0.0002)] * len(drafts)  # its decode and its Python only
    base = [seconds - (0.0012 + 0.00005 * size) for size, seconds in targets]
    assert all(extra == pytest.approx(0.0) or extra == pytest.approx(0.01) for extra in base)
    assert sum(extra == pytest.approx(0.01) for extra in base) >= len(targets) - 2  # each step's text, once


def test_a_target_pass_that_reads_a_prompt_beside_streams_is_not_priced_as_a_step(tiny_models, monkeypatch):
    """A prompt's first piece read in the streams' verify pass makes that pass's size the piece's padded
    shape (piece x slots), whose rows cost less each than a step's: on the line the K is chosen by, one
    such pass flattens it and deep drafts look cheap. Only the steps' own passes are priced."""
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4, n_ctx=512)) as engine:
        chunk = engine.generate(request("x"), slot=1).prompt_chunk
        streams = running(engine, 3)
        observed = []  # from here on: the streams past their prompts
        observe = engine.costs.observe
        monkeypatch.setattr(engine.costs, "observe", lambda *seen: observed.append(seen) or observe(*seen))
        sink, ticket, _ = submitted(engine, fresh_prompt(engine, 2 * chunk - 4, 306), max_tokens=4, speculation=FIXED_K)
        assert sink.done.wait(60)
        for _, other, _ in streams:
            other.cancel()
    assert ticket.generation.result.tokens  # its prompt read, the first piece beside the streams
    verify_rows = FIXED_K.num_speculative_tokens + 1
    targets = [size for draft, size, _ in observed if not draft]
    assert targets and max(targets) <= 4 * verify_rows


def test_a_target_pass_beside_others_is_priced_by_the_tokens_it_computes(tiny_models, monkeypatch):
    """Without flash attention each sequence brings two tokens to an exact pass at least (llama/passes.py):
    two streams of the target alone, a token each, make a pass of four, and it is priced as one. Priced
    at two tokens, a pass of K=0 looked half as dear as K=1's, the same pass, and the batch stayed at 0."""
    settings = engine_settings(parallel=2, n_ctx=512, flash_attention="off")
    with Engine(tiny_models[0], tiny_models[1], settings) as engine:
        assert engine.target.min_width == 2
        observed = []
        observe = engine.costs.observe
        monkeypatch.setattr(engine.costs, "observe", lambda *seen: observed.append(seen) or observe(*seen))
        asked = [request(f"Once upon a time {i}", max_tokens=8) for i in range(2)]
        with engine.loop.together():
            sinks = [Collected() for _ in asked]
            for one, sink in zip(asked, sinks):
                engine.loop.submit(one, engine.prompt_tokens(one), sink, use_draft=False)
        for sink in sinks:
            "".join(sink)
    targets = [size for draft, size, _ in observed if not draft]
    assert targets and set(targets) == {4}


@pytest.mark.parametrize("k", [1, 3])
def test_a_draft_pass_of_another_shape_than_the_one_before_is_told_as_such(tiny_models, monkeypatch, k):
    """llama.cpp builds its graph again for a pass of another shape (decoding/pass_line.RESHAPED): beside
    each other, slots at K=1 read their bonus token and last draft in every draft pass, the same shape
    pass after pass; at K=3 a step after one whose drafts were all accepted reads two tokens a slot in its
    first draft pass and one in the next ones, and the first two of them change shape."""
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        told = []
        observe = engine.loop._k.observe
        monkeypatch.setattr(
            engine.loop._k, "observe", lambda draft, *rest: (draft and told.append(rest[-1])) or observe(draft, *rest)
        )
        asked = [request(f"Once upon a time {i}", max_tokens=32, speculation=SpeculationSettings(k)) for i in range(2)]
        with engine.loop.together():
            sinks = [Collected() for _ in asked]
            for one, sink in zip(asked, sinks):
                engine.loop.submit(one, engine.prompt_tokens(one), sink)
        for sink in sinks:
            "".join(sink)
    share = sum(told) / len(told)
    assert share < 0.3 if k == 1 else 0.3 < share < 0.8  # after a rejection a first pass reads one token too
