"""`python -m sg_jax.data`: generate a task's data splits (`sg_jax.data.generate`)."""

from absl import app

from sg_jax.data import generate

if __name__ == "__main__":
  app.run(generate.main)
