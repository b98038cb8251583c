"""Results kept as data: compact copies of runs under `results/<study>/<run>`, and the docs'
tables generated from them.

  python -m sg_jax.results export --workdir=runs/qf_depth --out=results/qf_depth
  python -m sg_jax.results render-docs            # rewrite docs/ tables from results/
  python -m sg_jax.results render-docs --check    # exit 1 if a doc's table disagrees with its data
  python -m sg_jax.report --root=results/qf_depth # the report, written outside results/

`export` (module `export`) writes a run's config, command, commit, package versions and its
metric, analysis and pruning tables gzip-compressed, no checkpoints; `sg_jax.report` reads such
a folder exactly as the workdir. `docs` renders the tables marked in docs/ (docs/claims.md).
"""
