"""The numbers `-k auto`'s rule (k_policy.AutoK) decides by, each with the measurement that set it: how
often it probes while the target alone wins, the margins for taking up and keeping drafting, and when a
draft's tokens are weighed one by one."""

PROBE_EVERY = 8  # while K = 0 wins, still draft one token every few steps to keep α current
# A probe that paid for itself halves the wait for the next, not back to PROBE_EVERY at once: a pair
# with α ≈ 0.5, where half the probes pay by chance, then probed 8 % of its steps, each a loss (1.5
# tokens for the price of 1.7). And it is followed by another at once, until one does not pay or α says
# draft: each costs less than the target alone would, and waiting 8 steps between them kept K at 0 for
# ~40 steps after a quote the draft could not follow (the copy pair).
# Each probe that finds drafting still does not pay doubles the wait for the next, up to this: a probe
# costs the draft a short read (proposers.PROBE_WINDOW) and a step, and a verify batch of 2, so on a
# pair where drafting never pays (the quantized synth pair, 2-core CPU) probes every 64 steps cost
# 0.94x of the target alone, every 128 0.97x (interleaved runs, two each). The first probe of a request
# whose draft has read nothing reads the whole text (DraftModelProposer), ~20 ms there: at every 128th
# step that was once in each answer of 192 tokens, 5 % of the time; every 256th, 1.5 %.
PROBE_MAX_EVERY = 256
# Where no acceptance at all would make drafting pay at the costs seen (every draft accepted, and still
# under DRAFT_GAIN_MARGIN: a compute-bound CPU verifying a quantized target), probes can learn nothing
# that changes K: only this rarely one still runs, to time a draft step and a batch of 2 again (on the
# quantized pair, 8 probes in 950 steps cost 2.5 % of the target's time). Only once the probes have
# backed off to PROBE_MAX_EVERY, each timed as not paying, so that costs calibrated or saved too dear
# (a busy moment) are still relearned by probes that pay.
PROBE_CEILING_EVERY = 1024
# What a probe asks, as KPolicy.probing says it to the proposer. Where some acceptance would make
# drafting pay, whether the draft's acceptance is back: its guess must come from the whole text
# (DraftModelProposer). Where none would, only what a draft step and a batch of 2 cost now: a guess
# from the text's end will do, and its acceptance, not the draft's with the whole text, is not learned.
PROBE_ACCEPTANCE = "acceptance"
PROBE_COSTS = "costs"
# A lone step the step loop has draft to price the draft passes again while the rule keeps K at 0
# (engine/batch_k.py): what its passes cost, not a full catch-up on what K=0 skipped (an EAGLE-3
# head's, of every position since it drafted, the prompt's too: 1.5-2.5 ms on the tiny pair, each
# 128th step), so it is proposed as a probe is; its acceptance is learned, and it is no probe of the
# rule's (the waits between those stay).
PROBE_EXPLORE = "explore"
# Drafting is chosen only where the model says it beats the target alone by this much: the modelled
# gain of a barely-paying pair is within the model's error (per-step overheads, the draft's first step
# reading two tokens), and there drafting loses. On the weak pair (α ≈ 0.5) the model says K=1 gives
# 1.04x; measured, every fixed K is 0.46-0.81x of the target alone.
DRAFT_GAIN_MARGIN = 0.1
# Once drafting, it is kept while the model says it beats the target alone by this much: every step
# at K=0 learns nothing of the acceptance, and one early rejection, read from a handful of drafts,
# made the modelled gain of a pair whose drafts pay 1.2x (the tiny pair, α 0.9) fall under
# DRAFT_GAIN_MARGIN: K=0 until a probe, on 40-60 % of its steps.
DRAFT_KEEP_MARGIN = 0.0
# A lookup at K=0 costs no draft step, only a longer verify batch, and its acceptance is learned from
# this text's own matches (those it proposed and those it left): it is taken for a smaller gain.
LOOKUP_GAIN_MARGIN = 0.05
# While learning costs: every so many drafting steps try a neighbouring K (one more, then one fewer;
# with confidence stops, one token past the stop), so that its cost is measured again too. Otherwise
# a calibration that made K+1 look dear (a busy moment, a stale cache) would never be corrected:
# only the costs of the Ks tried are updated.
EXPLORE_EVERY = 8
# A lone rule that drafts keeps the K it drafted at the last step unless another K's modelled rate beats
# it by this much: each change of K costs that graph rebuild (~50 us on the tiny pair, a quarter of a
# 0.2 ms step), which the prices, each a size's fastest recent pass, leave out; and pricings a few
# percent apart (a shared CPU's noise) moved K at one step in three (tiny pair, 64 tokens a prompt).
SWITCH_MARGIN = 0.05
SWITCH_STEPS = 8  # ... or where the other K has been the best at this many drafting steps in a row
# A lone rule that keeps drafting works its best K out again (best_drafting_k over every K up to K_max,
# and the acceptance by position it reads: ~10 us of Python) only once its steps since have taken this
# much modelled time; a step that drafts after K=0 (a probe), or new prices, at once. Where a step takes
# milliseconds (the demo pair) that is every step; on the tiny pair (0.2-0.4 ms a step, of which the
# K rule's Python was 40-80 us against 20 for a fixed K) every few, while K barely moves between them.
# 3 ms, not 1: tiny pair in process, auto ÷ K=1 over 12 alternated runs, 0.897 against 0.887, every
# quantile up by about 0.01 (a text the draft stops following is left at once: k_steady's cap).
RECHOOSE_S = 0.003
# Confidence stops weigh each drafted token (its margin, and whether the next one pays): ~10 us of
# Python a token on a 2-core CPU, which pays where a draft step costs milliseconds (the demo pair) but
# not where it costs 40-60 us, itself mostly Python (the tiny pair: lone -k auto drafting token by
# token made 0.7-0.75x of its best fixed K, its drafting steps 100 us dearer than a fixed K's). Below
# this draft step cost the step drafts the K its acceptance by position says, as a fixed K does.
STOPS_MIN_DRAFT_S = 0.0005
# Weighing a token also reads the draft's whole row of logits (a softmax over the vocabulary, for its
# margin): ~0.9 ns a logit, 110-120 us for Llama 3's 128,256, on this VM and on the H200's host. There
# (docs/benchmarks/h200-8b-1b: 8B-shaped target 4.6 ms a step, 1B-shaped draft 1.38 ms) the tokens
# weighed one by one cost 2.0-2.3 ms of Python a step against 0.5 for K=2, and drafted deep on a pass
# model that priced steps 25-35 % under their time: -k auto made 0.86 and 0.88x the best fixed K; with
# whole steps priced by their own times, 1.00 and 0.97x, 0.42 ms of Python a step. So a step is
# weighed token by token only where its draft step costs this many times the weighing of a row.
STOPS_WEIGH_RATIO = 20
WEIGH_S_PER_LOGIT = 1e-9


def stops_min_draft_s(n_vocab: int) -> float:
    """The draft step below which tokens are not weighed one by one, for a draft of `n_vocab` logits:
    0.5 ms up to ~25k tokens (the demo pair's 3,072), 2.6 ms for Llama 3's 128,256."""
    return max(STOPS_MIN_DRAFT_S, STOPS_WEIGH_RATIO * WEIGH_S_PER_LOGIT * n_vocab)


# Alone, the step loop prices the steps from its own passes again every few steps (engine/batch_k.py),
# each size from its last few passes: on a shared 2-core CPU one pricing's verify line rose 9 us a
# token and the next's 38, its draft step 40 us and a later one's 235, and each such pricing that said
# drafting no longer pays put the tiny pair (drafts paying 1.4x) at K=0 until the next. The rule
# decides by the median of its last this many pricings: one or two far off the rest move nothing.
PRICINGS_KEPT = 5
SEEDED_WEIGHT = 16.0  # a band's acceptance from an earlier run counts for this many tried drafts
RATE_DECAY = 0.9  # per step: the rate a next token must beat follows the last ~10 steps
