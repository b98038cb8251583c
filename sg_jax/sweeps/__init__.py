"""Sweeps over config fields: the grid's expansion into jobs and seed-axis values (`grid`)."""
