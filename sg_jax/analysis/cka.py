"""Linear CKA with the unbiased HSIC estimator, in its minibatch form.

Centered kernel alignment (Kornblith, Norouzi, Lee, Hinton, ICML 2019, "Similarity of neural
network representations revisited") compares two representations X [n, d] and Y [n, e] of the
same n examples:

    CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)),   K = X X^T, L = Y Y^T (linear kernels).

HSIC is estimated with the unbiased estimator of Song, Smola, Gretton, Bedo, Borgwardt (JMLR
2012, "Feature selection via dependence maximization", eq. 5): with K~, L~ = K, L with their
diagonals set to 0 and 1 the all-ones vector,

    HSIC_1(K, L) = [tr(K~ L~) + (1^T K~ 1)(1^T L~ 1) / ((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1]
                   / (n (n-3)).

Minibatch CKA (Nguyen, Raghu, Kornblith, ICLR 2021, "Do wide and deep networks learn the same
things?", eq. 2-3) averages HSIC_1 over k fixed minibatches of n examples each,

    CKA_minibatch = mean_i HSIC_1(K_i, L_i) / sqrt(mean_i HSIC_1(K_i, K_i) mean_i HSIC_1(L_i, L_i)),

which is unbiased in each HSIC term, so that it does not depend on the minibatch size the way
the biased estimator does, and never holds an [N, N] Gram matrix of the whole set.

Computation. Every term is computed from the features, without the [n, n] Gram matrices:
tr(K~ L~) = ||X^T Y||_F^2 - sum_i K_ii L_ii, 1^T K~ 1 = ||X^T 1||^2 - sum_i K_ii and
K~ 1 = X (X^T 1) - diag(K), so one minibatch costs O(n d e). HSIC_1 is unchanged by a translation
of the features (it estimates HSIC, which is), so each minibatch is centered first, which keeps
the float32 sums well conditioned. With linear kernels CKA is invariant to an orthogonal
transform and an isotropic scaling of either representation (Kornblith et al. 2019, §3):
`tests/analysis/test_training_dynamics.py` checks CKA(X, s X Q) = 1.

All functions are written for ONE seed; `training_dynamics` maps them over seeds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# Examples (tokens) per minibatch. Nguyen et al. (2021) use minibatches of 256 examples.
MINIBATCH = 256


def hsic1(x_NxD: Array, y_NxE: Array) -> Array:
  """The unbiased HSIC estimator of linear kernels on one minibatch (module docstring).

  Args:
    x_NxD: float [n, d] features of n examples (n >= 4).
    y_NxE: float [n, e] features of the same examples.

  Returns:
    float32 scalar HSIC_1(X X^T, Y Y^T).

  Raises:
    ValueError: the two have different numbers of examples, or fewer than 4.
  """
  n = x_NxD.shape[0]
  if y_NxE.shape[0] != n or n < 4:
    raise ValueError(f"hsic1 needs the same n >= 4 examples in both, got {x_NxD.shape} and "
                     f"{y_NxE.shape}")
  x = x_NxD.astype(jnp.float32)
  y = y_NxE.astype(jnp.float32)
  x = x - jnp.mean(x, axis=0)
  y = y - jnp.mean(y, axis=0)
  diag_k, diag_l = jnp.sum(x * x, axis=1), jnp.sum(y * y, axis=1)  # [n]
  row_k = x @ jnp.sum(x, axis=0) - diag_k  # [n] K~ 1
  row_l = y @ jnp.sum(y, axis=0) - diag_l
  trace = jnp.sum(jnp.square(x.T @ y)) - jnp.sum(diag_k * diag_l)  # tr(K~ L~)
  return (trace + jnp.sum(row_k) * jnp.sum(row_l) / ((n - 1) * (n - 2))
          - 2.0 / (n - 2) * jnp.dot(row_k, row_l)) / (n * (n - 3))


def hsic_sums(x_KxNxD: Array, y_KxNxE: Array) -> Array:
  """The three HSIC_1 terms of minibatch CKA, summed over k minibatches.

  Args:
    x_KxNxD: float [k, n, d] features of k minibatches of n examples.
    y_KxNxE: float [k, n, e] features of the same examples.

  Returns:
    float32 [3]: sum_i HSIC_1(K_i, L_i), sum_i HSIC_1(K_i, K_i), sum_i HSIC_1(L_i, L_i).
  """
  one = lambda x, y: jnp.stack([hsic1(x, y), hsic1(x, x), hsic1(y, y)])
  return jnp.sum(jax.vmap(one)(x_KxNxD, y_KxNxE), axis=0)


def cka_from_sums(sums_Sx3: Array) -> Array:
  """Minibatch CKA from `hsic_sums` (any leading axes [..., 3] -> [...]).

  The denominator is clipped at 0 before the square root: HSIC_1 of a representation with
  itself is an unbiased estimate of a non-negative number and may come out slightly negative
  for a (nearly) constant representation, whose CKA is then NaN.
  """
  xy, xx, yy = sums_Sx3[..., 0], sums_Sx3[..., 1], sums_Sx3[..., 2]
  denominator = jnp.sqrt(jnp.maximum(xx, 0.0) * jnp.maximum(yy, 0.0))
  return jnp.where(denominator > 0, xy / jnp.where(denominator > 0, denominator, 1.0), jnp.nan)


def minibatch_cka(x_KxNxD: Array, y_KxNxE: Array) -> Array:
  """Linear minibatch CKA of two representations of the same k x n examples.

  Args:
    x_KxNxD: float [k, n, d] (k minibatches of n examples).
    y_KxNxE: float [k, n, e].

  Returns:
    float32 scalar in [-1, 1] up to estimation noise (1 = the same up to rotation and scale;
    the unbiased estimate can be slightly negative for unrelated representations).
  """
  return cka_from_sums(hsic_sums(x_KxNxD, y_KxNxE))
