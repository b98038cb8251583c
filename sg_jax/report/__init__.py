"""Report: the structural-grokking figures and summary tables of a sweep or a single run.

`build.build_report` writes them; `python -m sg_jax.report` is the command line. The
module docstring of `build` lists every figure and table.
"""
