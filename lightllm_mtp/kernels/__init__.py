"""Compute kernels. Each module's public wrapper `<op>(...)` is the dispatch point (it validates shapes and
dtypes, then runs the PyTorch reference `<op>_ref`); Triton GPU implementations plug in behind the wrappers
(a later issue).

Shape conventions: T = total tokens of a ragged batch, B = requests, `b_` prefix = one entry per request
[B], `b1_` prefix = prefix sums [B+1]. Index tensors are int32 unless stated (int64 is accepted too).
"""
