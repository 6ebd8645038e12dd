"""SlotPool over stand-in models: the slot a prompt gets, and the prefixes kept in host RAM."""

from ollama_spec.engine.slots import MIN_SAVED_TOKENS, SlotPool


class Model:
    """Sequences as plain token lists; a saved state is the bytes of its tokens."""

    def __init__(self, n_seq):
        self.seqs = [[] for _ in range(n_seq)]
        self.saves = 0
        self.expected = []  # sequences freed with a cache worth saving

    def cached_of(self, seq):
        return self.seqs[seq]

    def save_sequence(self, seq):
        self.saves += 1
        return bytes(t % 256 for t in self.seqs[seq])

    def expect_save(self, seq, most):
        self.expected.append(seq)

    def drop_save(self, seq):
        if seq in self.expected:
            self.expected.remove(seq)

    def restore_sequence(self, seq, state, tokens):
        self.seqs[seq] = list(tokens)
        return True

    def clear_sequence(self, seq):
        self.seqs[seq] = []


LONG = MIN_SAVED_TOKENS * 2


def chat(n):
    return list(range(n, n + LONG))


def test_a_prompt_goes_to_the_slot_that_holds_its_prefix():
    model = Model(2)
    pool = SlotPool([model], 2)
    model.seqs[1] = chat(0)
    assert pool.acquire(chat(0) + [7]) == 1


def test_a_slot_taken_by_another_prompt_is_saved_and_comes_back():
    model = Model(1)
    pool = SlotPool([model], 1)
    model.seqs[0] = chat(0)
    seq = pool.acquire(chat(1000))  # mostly throws the chat away: saved first
    model.seqs[seq] = chat(1000)
    pool.release(seq)
    seq = pool.acquire(chat(0) + [1, 2])
    assert model.seqs[seq] == chat(0) and pool.restored_tokens == LONG


def test_the_saved_prefixes_keep_to_their_budget_least_recent_out():
    model = Model(1)
    pool = SlotPool([model], 1, saved_mib=1)
    pool.budget = 3 * LONG  # room for three chats' states (a byte a token here)
    for n in range(5):
        model.seqs[0] = chat(n * 1000)
        pool.release(pool.acquire(chat(n * 1000 + 500)))
    assert [key[0] for key in pool._saved] == [2000, 3000, 4000]
    assert pool._saved_bytes == 3 * LONG


def test_a_prefix_brought_back_is_the_last_to_go():
    model = Model(1)
    pool = SlotPool([model], 1, saved_mib=1)
    pool.budget = 2 * LONG
    for n in (0, 1):
        model.seqs[0] = chat(n * 1000)
        pool.release(pool.acquire(chat(n * 1000 + 500)))
    model.seqs[0] = chat(9000)
    pool.release(pool.acquire(chat(0) + [1]))  # chat 0 comes back: 9000 is saved, 1000 goes
    assert [key[0] for key in pool._saved] == [0, 9000] and model.seqs[0] == chat(0)


def test_a_prompt_goes_next_to_the_busy_slots_and_its_prefix_comes_along():
    """Every batch pass spans the busy slots from the lowest to the highest, each idle one between them
    padded (llama/passes.py): a request takes a slot next to the busy ones, and the prefix a far slot
    holds is brought to it through host RAM."""
    model = Model(4)
    pool = SlotPool([model], 4)
    model.seqs[3] = chat(0)
    first = pool.acquire([5, 6, 7])  # nothing busy: any slot will do, an empty one first
    assert first == 0
    seq = pool.acquire(chat(0) + [7])
    assert seq == 1 and model.seqs[1] == chat(0) and pool.restored_tokens == LONG
    assert pool.acquire(chat(5000)) == 2  # next to them again, though 3 has the older cache


def test_a_cache_saved_as_it_is_is_not_saved_again_only_kept_longer():
    model = Model(1)
    pool = SlotPool([model], 1, saved_mib=1)
    pool.budget = 2 * LONG
    model.seqs[0] = chat(0)
    pool.release(pool.acquire(chat(1000)))  # chat 0 saved
    model.seqs[0] = chat(1000)
    pool.release(pool.acquire(chat(0) + [1]))  # chat 1000 saved; chat 0 restored, and left as it was
    assert model.seqs[0] == chat(0) and model.saves == 2
    pool.release(pool.acquire(chat(2000)))  # chat 0 is saved as it is: kept, used last
    assert model.saves == 2
    model.seqs[0] = chat(2000)
    pool.release(pool.acquire(chat(3000)))  # chat 2000 saved: 1000, the least recently used, goes
    assert [key[0] for key in pool._saved] == [0, 2000]


def test_a_cache_grown_past_its_saved_prefix_is_saved_again():
    model = Model(1)
    pool = SlotPool([model], 1)
    model.seqs[0] = chat(0)
    pool.release(pool.acquire(chat(1000)))
    model.seqs[0] = chat(0)[:-1] + [99999]  # the same length, another last token
    pool.release(pool.acquire(chat(2000)))
    assert model.saves == 2


def test_a_slot_freed_with_a_cache_worth_saving_has_its_save_made_ready():
    """Host memory for the save that may come is touched while the slot waits (llama/host_memory.py)."""
    model = Model(2)
    pool = SlotPool([model], 2)
    short, long = pool.acquire([1, 2, 3]), pool.acquire(chat(0))
    model.seqs[short], model.seqs[long] = [1, 2, 3], chat(0)
    pool.release(short)
    pool.release(long)
    assert model.expected == [long]
    pool.acquire(chat(0) + [7])  # taken again as it is: no save of it to be ready for
    assert model.expected == []
