"""Compiling sg_jax for TPUs and GPUs on a CPU-only machine, and what the compiler says.

* `targets`: the accelerators (published memory, peaks, bandwidth) and compile-only JAX devices
  for them (libtpu; the jax-cuda12 plugin with XLA's GPU target descriptions in `gpu_specs/`).
* `programs`: a run's training call, every enabled evaluator's programs and the analysis
  programs, built as `sg_jax.main` and `sg_jax.analyze` build them, compiled for a target;
  memory and cost analyses.
* `analysis_programs`: the jitted, seed-vmapped functions of `sg_jax.analyze`'s quantities with
  the batches it would give them.
* `roofline`: FLOPs and bytes per seed-step, arithmetic intensity, memory- or compute-bound.
* `hlo_checks`: no f64, no host transfer or callback, no collective in a seed-sharded step.
* `table`: the table `python -m sg_jax.aot` prints.
* `planning`: seeds per chip from a few compiles (a linear memory fit), chip-hours of a grid.
* `hlo_traffic`: a compiled program's memory traffic by part (forward, backward, other) and by
  the sg_jax function that emitted it.
* `profiling`: `--profile_steps=A:B` of `sg_jax.main` (a JAX profiler trace of those steps).

docs/performance.md, "Compiling for TPU and GPU ahead of time", says what a compile proves and
what it does not.
"""
