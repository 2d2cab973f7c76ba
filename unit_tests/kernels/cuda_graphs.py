"""Capture a kernel call in a CUDA graph the way the engine does: one warm-up run on a side stream first (Triton
compiles outside the capture), then the capture. Shared by the kernels' graph-replay GPU tests."""

import torch


def capture(run):
    """(graph, out): `run()` captured once; replaying the graph rewrites `out` from the inputs' current contents."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile outside the capture
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out
