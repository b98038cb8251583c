"""The optimiser of the training step: clipping + AdamW with a learning-rate schedule, one seed at
a time (docs/REFERENCE.md §1; docs/usage.md "Per-seed hyperparameters and split seeds").

One module per concern; the training step (`sg_jax.step`) builds the optimiser from the run's
typed `OptimOptions`, built once at the top of the loop:

* `options`: `OptimOptions`, the resolved `optim` section (one value per seed).
* `schedules`: the learning rate per step, compiled in (`make_schedule`) or as data
  (`schedule_at`), and each seed's logged value (`learning_rates`).
* `adamw`: optax's chain with one value of each field compiled in (`make_optimizer`) and the
  same update with each seed's values as data (`PerSeedAdamW`, `make_per_seed_optimizer`).
"""
