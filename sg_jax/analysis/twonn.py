"""TwoNN intrinsic dimension (Facco, d'Errico, Rodriguez, Laio, Sci. Rep. 7:12140, 2017).

For each point i of a set, let r1 and r2 be the distances to its first and second nearest
neighbours and mu_i = r2 / r1. If the density is locally uniform on a d-dimensional manifold
(at the scale of the second neighbour), mu follows a Pareto law whatever the density:
f(mu) = d mu^(-d-1), F(mu) = 1 - mu^(-d), so -log(1 - F(mu)) = d log(mu). The estimator
(Facco et al., "TWO-NN estimator") sorts the N ratios, sets the empirical F(mu_(i)) = i / N,
discards the 10% largest ratios (`DISCARD`: the tail is where the local-uniformity assumption
fails first) and fits a straight line through the origin to the points
(log mu_(i), -log(1 - i / N)); d is its slope (least squares: sum x y / sum x^2).

Applied to the token representations of a layer (Ansuini, Laio, Macke, Zoccolan, NeurIPS 2019,
"Intrinsic dimension of data representations in deep neural networks", who use the same
estimator on each layer's outputs). Coinciding points (r1 = 0) have no ratio: a point is dropped
when it coincides with an earlier point of the set (so one copy of each distinct point stays).
`training_dynamics` feeds only tokens with distinct contexts, whose representations differ.

`ratios` (JAX, one seed and one layer, jit-able) computes the mu of every point; `dimension`
(numpy, on the host) fits d.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Fraction of the largest ratios left out of the fit (Facco et al. 2017 keep 90% of the points).
DISCARD = 0.1
# Neighbour candidates per point: the nearest by the Gram-matrix form of the squared distances
# (|x|^2 + |y|^2 - 2 x.y, float32 rounding of about 1e-7 of the squared norms), whose distances
# are then recomputed exactly from the differences; r1 and r2 are the two nearest of them.
CANDIDATES = 8
# Exact squared distances at most this times the mean squared norm of the (centred) points count
# as coinciding points.
COINCIDE = 1e-12


def ratios(x_MxD: Array) -> Array:
  """mu = r2 / r1 of every point (module docstring), for one seed and one layer.

  Args:
    x_MxD: float [m, d] points (m >= 3).

  Returns:
    float32 [m]: r2 / r1 of each point among the others; NaN for a point that coincides with an
    earlier one (it is dropped) and for a point whose two nearest distinct points are not
    found (fewer than 3 distinct points).

  Raises:
    ValueError: fewer than 3 points.
  """
  m = x_MxD.shape[0]
  if m < 3:
    raise ValueError(f"TwoNN needs at least 3 points, got {m}")
  x = x_MxD.astype(jnp.float32)
  x = x - jnp.mean(x, axis=0)
  sq = jnp.sum(x * x, axis=1)
  approx_MxM = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
  approx_MxM = jnp.where(jnp.eye(m, dtype=bool), jnp.inf, approx_MxM)
  k = min(CANDIDATES, m - 1)
  near_MxK = jax.lax.top_k(-approx_MxM, k)[1]  # [m, k] candidate neighbours
  d2_MxK = jnp.sum(jnp.square(x[:, None, :] - x[near_MxK]), axis=-1)  # exact
  same_MxK = d2_MxK <= COINCIDE * jnp.mean(sq)
  kept_M = ~jnp.any(same_MxK & (near_MxK < jnp.arange(m)[:, None]), axis=1)
  # neighbours: kept candidates that do not coincide with the point.
  d2 = jnp.where(kept_M[near_MxK] & ~same_MxK, d2_MxK, jnp.inf)
  two = -jax.lax.top_k(-d2, 2)[0]  # [m, 2] the two smallest squared distances
  mu = jnp.sqrt(two[:, 1] / two[:, 0])
  return jnp.where(kept_M & jnp.isfinite(mu), mu, jnp.nan)


def dimension(mu: np.ndarray, discard: float = DISCARD) -> float:
  """The TwoNN estimate of the intrinsic dimension from the ratios of a set (module docstring).

  Args:
    mu: [m] ratios r2 / r1 (`ratios`); NaN entries (dropped points) are ignored.
    discard: fraction of the largest ratios left out of the fit, in [0, 1).

  Returns:
    d (float); NaN with fewer than 3 finite ratios.

  Raises:
    ValueError: `discard` outside [0, 1).
  """
  if not 0 <= discard < 1:
    raise ValueError(f"discard must be in [0, 1), got {discard}")
  mu = np.sort(np.asarray(mu, np.float64)[np.isfinite(mu)])
  n = mu.size
  if n < 3:
    return float("nan")
  keep = min(max(int(np.floor(n * (1 - discard))), 2), n - 1)  # F_emp = 1 has no log
  x = np.log(mu[:keep])
  y = -np.log(1.0 - np.arange(1, keep + 1) / n)  # F_emp(mu_(i)) = i / N
  denominator = float(np.sum(x * x))
  return float(np.sum(x * y) / denominator) if denominator > 0 else float("nan")
