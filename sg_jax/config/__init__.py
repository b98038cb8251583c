"""The run config below `sg_jax.configlib`: values given per seed (`per_seed`), the
validation of a resolved config (`checks`) and the commands' shared options
(`cli_options`); the shared presets of the config string (`presets`)."""
