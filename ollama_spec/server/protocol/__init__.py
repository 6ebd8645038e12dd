"""The two wire formats over the serving core: each API's request models and answers, what both share (the
streaming driver, framing, log-probabilities, draft spans), and the errors' status and body."""
