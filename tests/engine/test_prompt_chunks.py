"""How many prompt tokens a turn reads: the batch's piece, bounded by time beside running streams."""

from ollama_spec.engine.prompt_chunks import MIN_CHUNK, ChunkSizer


def turns(sizer, seconds, *, reading, generating=True, left=1000, start=0.0):
    """Turns of `seconds` each, a prompt being read in each when `reading`: the chunks it took."""
    now, taken = start, []
    for _ in range(8):
        if reading:
            taken.append(sizer.take(left, left))
        sizer.turn(now, generating=generating, reading=reading)
        now += seconds if not reading else seconds + taken[-1] * TOKEN_S
    return now, taken


TOKEN_S = 0.0004  # what a prompt token adds to a turn (a CPU: a 63-token chunk 25 ms beside a 10 ms step)


def test_beside_running_streams_a_chunk_costs_about_one_of_their_steps():
    sizer = ChunkSizer(63)
    now, _ = turns(sizer, 0.010, reading=False)  # 3 streams' steps, 10 ms each
    _, taken = turns(sizer, 0.010, reading=True, start=now)
    assert taken[0] == 63  # nothing timed of a prompt token yet: the batch's piece
    assert abs(taken[-1] - 0.010 / TOKEN_S) <= 1  # then what costs one step more: 25 tokens


def test_where_prompt_tokens_cost_little_the_piece_is_the_bound():
    sizer = ChunkSizer(63)
    now, _ = turns(sizer, 0.500, reading=False)  # a step of half a second: a GPU-like pass or a big model
    _, taken = turns(sizer, 0.500, reading=True, start=now)
    assert taken[-1] == 63


def test_nobody_generating_or_a_short_prompt_reads_whole_pieces():
    sizer = ChunkSizer(63)
    sizer.step_s, sizer.token_s = 0.001, 0.004  # dear tokens, but nobody to slow down
    assert sizer.take(500, 500) == 63
    sizer.generating = True
    assert sizer.take(63, 63) == 0  # a short prompt: its first step reads it whole, beside streams too
    assert sizer.take(63, 500) == MIN_CHUNK  # a long one's end: read as bounded


def test_beside_streams_a_prompt_of_two_pieces_is_read_in_whole_pieces():
    """Its first piece in the turn it comes, its last at once at the next turn's start: its first token
    within about two of the streams' steps of its time alone; one piece more is read as bounded."""
    sizer = ChunkSizer(63)
    sizer.generating, sizer.step_s, sizer.token_s = True, 0.001, 0.004
    assert sizer.take(125, 126) == 63
    assert sizer.take(126, 127) == MIN_CHUNK


def test_a_long_read_is_never_cut_below_the_minimum():
    sizer = ChunkSizer(63)
    sizer.turn(0.0, generating=True, reading=False)
    sizer.turn(0.001, generating=True, reading=True)
    sizer.step_s, sizer.token_s = 0.001, 0.010
    assert sizer.take(500, 500) == MIN_CHUNK


def test_a_wait_for_work_is_not_timed_as_a_step():
    sizer = ChunkSizer(63)
    now, _ = turns(sizer, 0.010, reading=False)
    sizer.turn(now + 30.0, generating=True, reading=False, waited=True)  # the loop sat idle for 30 s
    assert sizer.step_s < 0.011


def test_a_turn_a_prompt_joined_after_it_began_is_not_timed_as_a_step():
    sizer = ChunkSizer(63)
    now, _ = turns(sizer, 0.010, reading=False)
    sizer.reading()  # a short prompt admitted before this turn's target pass, read whole in it
    sizer.turn(now + 0.050, generating=True, reading=False)
    assert abs(sizer.step_s - 0.010) < 1e-9
