r"""Import a state_dict of the original PyTorch structural-grokking LM into an sg_jax checkpoint.

  python -m sg_jax.checkpointing.convert_torch --checkpoint=model.pt --task=question --out=runs/converted
  python -m sg_jax.analyze --workdir=runs/converted

The original code (Murty et al., ACL 2023) saves `model.state_dict()` of its "TransformerLM"
(`docs/REFERENCE.md` §1 "Model"). Its keys:
  input_embedding.weight [V, d]; output_map.weight [V, d], output_map.bias [V];
  pos.pe (sinusoid buffer); int_seq (index buffer);
  trafo.encoder.layers.{i}.self_attn.data_to_q.weight [d, d],
      .self_attn.data_to_kv.weight [2d, d], .self_attn.multi_head_merge.weight [d, d],
      .linear1.weight [F, d] / .bias [F], .linear2.weight [d, F] / .bias [d],
      .norm1.weight / .bias [d], .norm2.weight / .bias [d];
  trafo.decoder.* (an unused 6-layer decoder: not converted, but its L2 norm is recorded in the
      checkpoint metadata, because the released weight norm includes it).
PyTorch's Linear stores [out, in]. Output features of data_to_q are grouped per head, [hp, hp + p)
for head h; data_to_kv interleaves per head: [2hp, 2hp + p) are head h's keys and
[2hp + p, 2hp + 2p) its values; the merge projection's INPUT features are [hp, hp + p) per head.
The head count is not stored in the file (default 8, the released models; `--num_heads`).

Input files: a torch pickle (`torch.load(..., weights_only=True)`: tensors and plain containers
only, so a file that would run code when unpickled is refused; torch is an optional dependency
needed only for that),
or a `.npz` holding the same keys (numpy only). A leading key prefix such as `module.` or `model.`
is stripped. The output is an sg_jax checkpoint with one seed (`--seed_id`) at `--step`.

sg_jax's model computes its own position table; the stored `pos.pe` (5,000 rows in float32) is
only checked, on the `max_len` rows the model uses, at float32 tolerance (`check_positions`).
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from typing import Any, Mapping

import jax
import numpy as np
from absl import app
from absl import flags
from absl import logging

from sg_jax import checkpointing
from sg_jax import configlib
from sg_jax import tasks
from sg_jax.analysis.weight_norm import DECODER_NORM_META_KEY
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import sinusoidal_positions

_LAYER = re.compile(r"^trafo\.encoder\.layers\.(\d+)\.(.+)$")
_SKIP_PREFIXES = ("trafo.decoder.",)
_SKIP_KEYS = ("int_seq",)


def _to_numpy(x: Any) -> np.ndarray:
  if hasattr(x, "detach"):  # torch tensor
    x = x.detach().cpu().float().numpy()
  return np.asarray(x, dtype=np.float32)


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def load_state_dict(path: str) -> dict[str, np.ndarray]:
  """Reads a state_dict from a `.npz` (numpy) or a torch pickle (needs torch) as float32 numpy.

  A dict wrapping the state_dict under 'state_dict' / 'model_state_dict' / 'model' is unwrapped.

  Raises:
    FileNotFoundError: missing file.
    ImportError: a torch file but torch is not installed.
    ValueError: the file is truncated or corrupt, is a pickle holding more than tensors and
      plain containers (refused: torch files are loaded with `weights_only=True`, so a malicious
      pickle cannot run code), or holds no state_dict.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f"no such checkpoint file: {path}")
  if path.endswith(".npz"):
    try:
      with np.load(path, allow_pickle=False) as data:
        return {k: _to_numpy(data[k]) for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
      raise ValueError(f"cannot read {path} as a .npz state_dict: {_first_line(e)}") from e
  try:
    import torch  # pylint: disable=import-outside-toplevel  (optional: only for torch files)
  except ImportError as e:
    raise ImportError(f"reading {path} needs torch (pip install torch), or convert the "
                      "state_dict to .npz first") from e
  try:
    # weights_only: tensors and plain containers only; a pickle that would run code is refused.
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except  (torch raises RuntimeError, UnpicklingError, EOFError, ...)
    raise ValueError(f"cannot read {path} as a PyTorch state_dict (loaded with "
                     f"weights_only=True): {_first_line(e)}") from e
  for wrapper in ("state_dict", "model_state_dict", "model"):
    if isinstance(obj, Mapping) and isinstance(obj.get(wrapper), Mapping):
      obj = obj[wrapper]
  if not isinstance(obj, Mapping):
    raise ValueError(f"{path} does not hold a state_dict (got {type(obj).__name__})")
  return {k: _to_numpy(v) for k, v in obj.items() if hasattr(v, "shape")}


def _strip_prefix(sd: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  emb = [k for k in sd if k.endswith("input_embedding.weight")]
  if len(emb) != 1:
    raise ValueError("state_dict has no (unique) 'input_embedding.weight'; keys: "
                     f"{sorted(sd)[:10]}...")
  prefix = emb[0][: -len("input_embedding.weight")]
  return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


# A float32 angle pos * div (div <= 1) is off by a few float32 ulps of pos; the sine / cosine of
# it is then off by as much, so the tolerance of row `pos` is this many ulps of max(pos, 1).
_PE_ULPS = 4


def check_positions(pe: np.ndarray, max_len: int) -> None:
  """Checks a stored position table against sg_jax's sinusoid on the rows the model uses.

  The original code stores a long (5,000-row) table computed in float32, where the angle
  `pos * div` loses about one float32 ulp of `pos`: at d_model 512 the table is off by more than
  1e-4 from row ~1,100 (numpy's float32 sin/cos) or ~2,700 (torch's) on, 1.7e-4 to 4.5e-4 at
  row 4,999. sg_jax computes the table itself (in float64, then float32), so only rows
  0 .. max_len - 1 matter; they must agree within `_PE_ULPS` float32 ulps of the position
  (4 * 1.19e-7 * max(pos, 1): 2.4e-4 at row 511). Later rows are never read and not checked.

  Args:
    pe: float [rows, d_model] the stored `pos.pe` buffer (any leading singleton axis removed).
    max_len: positions sg_jax's model uses (`ModelConfig.max_len`).

  Raises:
    ValueError: a checked row differs by more than float32 rounding (naming the row, the error
      and the rows checked).
  """
  rows = min(pe.shape[0], max_len)
  ref = sinusoidal_positions(rows, pe.shape[1]).astype(np.float64)
  err = np.max(np.abs(pe[:rows].astype(np.float64) - ref), axis=-1)  # [rows]
  tol = _PE_ULPS * np.finfo(np.float32).eps * np.maximum(np.arange(rows), 1.0)
  bad = np.nonzero(~(err <= tol))[0]  # NaN counts as bad
  if bad.size:
    r = int(bad[0])
    raise ValueError(
        f"pos.pe is not the sinusoidal table sg_jax's model uses: row {r} differs by "
        f"{err[r]:.3g}, more than float32 rounding ({tol[r]:.2g}); checked rows 0..{rows - 1} "
        f"(the positions of max_len={max_len}; later rows are not used)")


def decoder_norm(state_dict: Mapping[str, Any]) -> tuple[float, int]:
  """Global L2 norm of the unused decoder (`trafo.decoder.*`) that the original module builds.

  The original LM never calls it, so its parameters stay at initialisation, but the released
  weight norm counts them: released global norm = sqrt(weight_norm ** 2 + decoder_norm ** 2),
  where `weight_norm` is that of the converted (sg_jax) parameters
  (`sg_jax.analysis.weight_norm.released_weight_norm`).

  Args:
    state_dict: key -> array (numpy or torch); a leading key prefix such as `module.` is allowed.

  Returns:
    (norm, number of decoder entries): float64 norm, 0.0 and 0 when the file has no decoder.
  """
  sd = _strip_prefix({k: _to_numpy(v) for k, v in state_dict.items()})
  sq, count = 0.0, 0
  for key in sorted(sd):
    if key.startswith(_SKIP_PREFIXES):
      value = sd[key].astype(np.float64)
      sq += float(np.sum(value * value))
      count += value.size
  return float(np.sqrt(sq)), count


def convert_state_dict(state_dict: Mapping[str, Any], *, num_heads: int = 8,
                       max_len: int | None = None) -> tuple[dict, ModelConfig]:
  """Maps the reference state_dict onto `TransformerLM` parameters of ONE seed.

  Args:
    state_dict: key -> array (numpy or torch), as described in the module docstring.
    num_heads: attention heads of the original model (8 in the released code).
    max_len: positions of the returned config (default `ModelConfig.max_len`, 512); only these
      rows of `pos.pe` are checked (`check_positions`).

  Returns:
    (params pytree of float32 numpy arrays, ModelConfig with vocab size, depth, widths).

  Raises:
    ValueError: missing or unexpected keys, inconsistent shapes, a head count that does not divide
      d_model, or a `pos.pe` table that is not the standard sinusoid on the rows used.
  """
  sd = _strip_prefix({k: _to_numpy(v) for k, v in state_dict.items()})
  used: set[str] = set()

  def take(key: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    if key not in sd:
      raise ValueError(f"state_dict is missing {key!r}")
    used.add(key)
    value = sd[key]
    if shape is not None and value.shape != shape:
      raise ValueError(f"{key!r} has shape {value.shape}, expected {shape}")
    return value

  emb = take("input_embedding.weight")
  vocab, d = emb.shape
  if d % num_heads:
    raise ValueError(f"d_model {d} is not divisible by num_heads {num_heads}")
  p = d // num_heads
  layers = sorted({int(m.group(1)) for k in sd if (m := _LAYER.match(k))})
  if not layers or layers != list(range(len(layers))):
    raise ValueError(f"encoder layers must be numbered 0..L-1, found {layers}")
  d_ff = take("trafo.encoder.layers.0.linear1.weight").shape[0]

  max_len = max_len or ModelConfig.max_len
  if "pos.pe" in sd:
    check_positions(take("pos.pe").reshape(-1, d), max_len)
  used.update(k for k in _SKIP_KEYS if k in sd)

  params: dict[str, Any] = {"embedding": {"embedding": emb}}
  for i in layers:
    pre = f"trafo.encoder.layers.{i}."
    wq = take(pre + "self_attn.data_to_q.weight", (d, d))
    wkv = take(pre + "self_attn.data_to_kv.weight", (2 * d, d))
    wm = take(pre + "self_attn.multi_head_merge.weight", (d, d))
    kv = wkv.T.reshape(d, num_heads, 2, p)  # out feature 2hp + c*p + e -> (h, c, e)
    params[f"layer_{i}"] = {
        "attention": {
            "query": {"kernel": wq.T.reshape(d, num_heads, p)},
            "key": {"kernel": np.ascontiguousarray(kv[:, :, 0, :])},
            "value": {"kernel": np.ascontiguousarray(kv[:, :, 1, :])},
            "out": {"kernel": wm.T.reshape(num_heads, p, d)},
        },
        "norm1": {"scale": take(pre + "norm1.weight", (d,)),
                  "bias": take(pre + "norm1.bias", (d,))},
        "linear1": {"kernel": take(pre + "linear1.weight", (d_ff, d)).T,
                    "bias": take(pre + "linear1.bias", (d_ff,))},
        "linear2": {"kernel": take(pre + "linear2.weight", (d, d_ff)).T,
                    "bias": take(pre + "linear2.bias", (d,))},
        "norm2": {"scale": take(pre + "norm2.weight", (d,)),
                  "bias": take(pre + "norm2.bias", (d,))},
    }
  params["output"] = {"kernel": take("output_map.weight", (vocab, d)).T,
                      "bias": take("output_map.bias", (vocab,))}
  params = _contiguous(params)

  unused = sorted(k for k in sd if k not in used and not k.startswith(_SKIP_PREFIXES))
  if unused:
    raise ValueError(f"state_dict has keys sg_jax's model cannot represent: {unused}")
  config = ModelConfig(vocab_size=vocab, num_layers=len(layers), d_model=d, num_heads=num_heads,
                       d_ff=d_ff, max_len=max_len)
  return params, config


def _contiguous(tree):
  if isinstance(tree, dict):
    return {k: _contiguous(v) for k, v in tree.items()}
  return np.ascontiguousarray(tree, dtype=np.float32)


def write_checkpoint(params: dict, model_config: ModelConfig, task: str, out: str, *,
                     step: int = 0, seed_id: int = 0,
                     released_decoder_norm: float | None = None) -> str:
  """Saves converted parameters as an sg_jax checkpoint (one seed) in workdir `out`.

  The checkpoint state is `{'params': params with a leading seed axis of size 1}`; its metadata
  carries the task's default config with the model section set from `model_config`, and the
  task's vocabulary. Also writes `out/config.json` and `out/vocab.json` like a training run.

  Args:
    params, model_config: from `convert_state_dict`.
    task: task name (its vocabulary must match).
    out: output workdir.
    step, seed_id: step and seed id to record.
    released_decoder_norm: the original's unused-decoder norm (`decoder_norm`); stored in the
      metadata (`DECODER_NORM_META_KEY`: {seed id (str): norm}) so that `sg_jax.analyze` can
      also report the released global norm (`weight_norm_released`). None stores nothing.

  Returns:
    the workdir `out`.

  Raises:
    ValueError: the vocabulary size differs from the task's.
  """
  vocab = tasks.get_task(task).vocab()
  if vocab.size != model_config.vocab_size:
    raise ValueError(f"the state_dict has {model_config.vocab_size} vocabulary rows but task "
                     f"{task!r} has {vocab.size}")
  config = configlib.base_config(task)
  config.model.num_layers = model_config.num_layers
  config.model.d_model = model_config.d_model
  config.model.num_heads = model_config.num_heads
  config.model.d_ff = model_config.d_ff
  config.model.tied_embeddings = False
  config.first_seed = seed_id
  config.num_seeds = 1
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "config.json"), "w") as f:
    f.write(config.to_json(indent=2))
  with open(os.path.join(out, "vocab.json"), "w") as f:
    f.write(vocab.to_json())
  state = {"params": jax.tree_util.tree_map(lambda x: np.asarray(x)[None], params)}
  meta = checkpointing.make_meta(config, vocab.to_json(), [seed_id])
  if released_decoder_norm is not None:
    meta[DECODER_NORM_META_KEY] = {str(seed_id): float(released_decoder_norm)}
  manager = checkpointing.make_manager(out, asynchronous=False)
  try:
    checkpointing.save(manager, step, state, meta)
    manager.wait_until_finished()
  finally:
    manager.close()
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  try:
    sd = load_state_dict(f.checkpoint)
    params, config = convert_state_dict(sd, num_heads=f.num_heads)
    dec_norm, dec_count = decoder_norm(sd)
    write_checkpoint(params, config, f.task, f.out, step=f.step, seed_id=f.seed_id,
                     released_decoder_norm=dec_norm)
  except (ValueError, OSError, ImportError, checkpointing.WorkdirError) as e:
    sys.exit(f"error: {e}")
  print(f"converted {f.checkpoint}: {config.num_layers} layers, d_model {config.d_model}, "
        f"{config.num_heads} heads, d_ff {config.d_ff}, vocab {config.vocab_size} -> "
        f"{f.out} (step {f.step}, seed {f.seed_id}); unused decoder: {dec_count} entries, "
        f"L2 norm {dec_norm:.6g} (recorded for weight_norm_released)")


def _define_flags():
  flags.DEFINE_string("checkpoint", None,
                      "state_dict file (torch pickle, or .npz of the same keys)")
  flags.DEFINE_string("task", None, "task of the model: question | tense | dyck")
  flags.DEFINE_string("out", None, "output workdir for the sg_jax checkpoint")
  flags.DEFINE_integer("num_heads", 8, "attention heads of the original model (released: 8)")
  flags.DEFINE_integer("step", 0, "training step to record the checkpoint under")
  flags.DEFINE_integer("seed_id", 0, "seed id to record")
  flags.mark_flags_as_required(["checkpoint", "task", "out"])


if __name__ == "__main__":
  _define_flags()
  app.run(main)
