"""Kernel warm-up: the Triton variants a server can reach, found by shadow runs of its own code
(``shadow.py``, ``variants.py``), compiled in parallel before and while it serves."""
