"""The pieces of the training step and of the training loop, one concern per module; the spine
(`sg_jax.step`: the one training body; `sg_jax.train`: the loop driver) puts them together.
Nothing is imported here.

* `state`: one seed's `TrainState`, its initialisation and its random streams.
* `sampling`: which training lines each seed sees at each step.
* `options`: the loop's typed options (`LoopOptions`: steps, call size, when to log, evaluate
  and checkpoint).
* `logs`: what the loop writes between calls (evaluations, training metrics, compilations).
* `calls`: the loop's compiled calls and what happens between them (`run_calls`).
"""
