"""specdec-lab: prove, with numbers, that speculative decoding is lossless.

Notation everywhere in this package (Leviathan et al. 2023): **p is the target** model's
next-token law, **q is the draft** model's.
"""

__version__ = "0.1.0"
