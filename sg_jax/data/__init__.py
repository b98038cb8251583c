"""The data a run reads: task splits (`sg_jax.tasks`) made into training arrays and
evaluation batches (`input_pipeline`), each seed's share of the training lines
(`composition`), packed rows (`packing`), and the generation command
(`python -m sg_jax.data`, `generate`)."""
