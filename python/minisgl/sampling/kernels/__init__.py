"""The sampler's Triton kernels. Import the submodules directly (each imports triton; this file
stays free of it so that ``minisgl.sampling`` imports on any machine):

- ``launch``: ``sample_rows``, which launches the kernels below for one batch
- ``split``: the split-row path (a grid of row x chunk programs; the default for large vocabularies)
- ``row``: one program per row, finishing the rows the split path flags (or alone)
"""
