"""Tests of sg_jax.checkpointing.convert_torch: a numpy-built reference state_dict, converted, must give the same
logits as an independent numpy forward pass of the reference architecture (post-LN, per-head
interleaved key/value projection)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.checkpointing import convert_torch
from sg_jax.models.transformer import TransformerLM, init_params, sinusoidal_positions

V, D, H, F, LAYERS = 11, 16, 4, 32, 2


def torch_float32_positions(max_len, d_model):
  """The original's `pos.pe` buffer [max_len, 1, d_model], computed in float32 as torch does:
  position = arange(max_len, float32)[:, None]; div = exp(arange(0, d, 2, float32) *
  float32(-log(10000) / d)); even features sin(position * div), odd cos(position * div)."""
  position = np.arange(max_len, dtype=np.float32)[:, None]
  div = np.exp(np.arange(0, d_model, 2, dtype=np.float32) * np.float32(-math.log(10000.0)
                                                                       / d_model))
  angle = position * div  # float32 [max_len, d / 2]
  assert angle.dtype == np.float32
  pe = np.zeros((max_len, d_model), np.float32)
  pe[:, 0::2] = np.sin(angle)
  pe[:, 1::2] = np.cos(angle)
  return pe[:, None, :]


def _state_dict(seed=0, d=D, layers=LAYERS, pe_rows=64):
  rng = np.random.default_rng(seed)
  w = lambda *shape: rng.normal(0, 0.3, size=shape).astype(np.float32)
  sd = {"input_embedding.weight": w(V, d), "output_map.weight": w(V, d), "output_map.bias": w(V),
        "pos.pe": torch_float32_positions(pe_rows, d), "int_seq": np.arange(float(pe_rows))}
  for i in range(layers):
    pre = f"trafo.encoder.layers.{i}."
    sd.update({
        pre + "self_attn.data_to_q.weight": w(d, d),
        pre + "self_attn.data_to_kv.weight": w(2 * d, d),
        pre + "self_attn.multi_head_merge.weight": w(d, d),
        pre + "linear1.weight": w(F, d), pre + "linear1.bias": w(F),
        pre + "linear2.weight": w(d, F), pre + "linear2.bias": w(d),
        pre + "norm1.weight": 1 + w(d), pre + "norm1.bias": w(d),
        pre + "norm2.weight": 1 + w(d), pre + "norm2.bias": w(d),
    })
  sd["trafo.decoder.layers.0.linear1.weight"] = w(F, d)  # unused decoder: must be skipped
  return sd


def _layer_norm(x, g, b, eps=1e-5):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * g + b


def _numpy_forward(sd, tokens, heads=H):
  """The reference TransformerLM written directly from the state_dict (float64)."""
  sd = {k: v.astype(np.float64) for k, v in sd.items()}
  D = sd["input_embedding.weight"].shape[1]  # pylint: disable=invalid-name
  H = heads  # pylint: disable=invalid-name
  p = D // H
  length = len(tokens)
  x = sd["input_embedding.weight"][tokens] * math.sqrt(D) + sd["pos.pe"].reshape(-1, D)[:length]
  causal = np.tril(np.ones((length, length), bool))
  for i in range(len({k.split(".")[3] for k in sd if k.startswith("trafo.encoder.layers.")})):
    g = lambda name: sd[f"trafo.encoder.layers.{i}.{name}"]
    q = x @ g("self_attn.data_to_q.weight").T
    kv = x @ g("self_attn.data_to_kv.weight").T
    heads = []
    for h in range(H):
      qh = q[:, h * p:(h + 1) * p]
      kh = kv[:, 2 * h * p:2 * h * p + p]
      vh = kv[:, 2 * h * p + p:2 * h * p + 2 * p]
      logits = np.where(causal, qh @ kh.T / math.sqrt(p), -np.inf)
      att = np.exp(logits - logits.max(-1, keepdims=True))
      att /= att.sum(-1, keepdims=True)
      heads.append(att @ vh)
    attn = np.concatenate(heads, -1) @ g("self_attn.multi_head_merge.weight").T
    x = _layer_norm(x + attn, g("norm1.weight"), g("norm1.bias"))
    ff = np.maximum(x @ g("linear1.weight").T + g("linear1.bias"), 0) @ g("linear2.weight").T
    x = _layer_norm(x + ff + g("linear2.bias"), g("norm2.weight"), g("norm2.bias"))
  return x @ sd["output_map.weight"].T + sd["output_map.bias"]


def _check_logits(params, config, sd):
  tokens = np.array([V - 1, 3, 5, 2, 7, 1, 9], np.int32)
  logits = TransformerLM(config).apply({"params": jax.tree_util.tree_map(jnp.asarray, params)},
                                       jnp.asarray(tokens)[None], deterministic=True)[0]
  np.testing.assert_allclose(logits, _numpy_forward(sd, tokens, config.num_heads), atol=1e-4,
                             rtol=1e-4)


def test_converted_logits_equal_numpy_reference_forward():
  sd = _state_dict()
  params, config = convert_torch.convert_state_dict(sd, num_heads=H)
  assert (config.vocab_size, config.num_layers, config.d_model, config.num_heads, config.d_ff) == (
      V, LAYERS, D, H, F)
  # same tree structure and shapes as a freshly initialised sg_jax model
  ref = init_params(config, jax.random.PRNGKey(0))
  assert jax.tree_util.tree_structure(ref) == jax.tree_util.tree_structure(params)
  assert all(a.shape == b.shape for a, b in zip(jax.tree_util.tree_leaves(ref),
                                                jax.tree_util.tree_leaves(params)))
  _check_logits(params, config, sd)


def test_npz_file_with_prefix_round_trip(tmp_path):
  sd = _state_dict(1)
  path = os.path.join(tmp_path, "model.npz")
  np.savez(path, **{"module." + k: v for k, v in sd.items()})
  params, config = convert_torch.convert_state_dict(convert_torch.load_state_dict(path),
                                                    num_heads=H)
  _check_logits(params, config, sd)


def test_errors():
  sd = _state_dict()
  with pytest.raises(ValueError, match="cannot represent"):
    convert_torch.convert_state_dict({**sd, "trafo.encoder.norm.weight": np.ones(D)}, num_heads=H)
  bad = dict(sd)
  del bad["trafo.encoder.layers.1.linear2.bias"]
  with pytest.raises(ValueError, match="missing"):
    convert_torch.convert_state_dict(bad, num_heads=H)
  with pytest.raises(ValueError, match="divisible"):
    convert_torch.convert_state_dict(sd, num_heads=3)
  with pytest.raises(ValueError, match="sinusoidal"):
    convert_torch.convert_state_dict({**sd, "pos.pe": sd["pos.pe"] + 1}, num_heads=H)
  with pytest.raises(FileNotFoundError):
    convert_torch.load_state_dict("/nonexistent/model.pt")


def test_torch_file(tmp_path):
  torch = pytest.importorskip("torch")
  sd = _state_dict(2)
  path = os.path.join(tmp_path, "model.pt")
  torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, path)
  params, config = convert_torch.convert_state_dict(convert_torch.load_state_dict(path),
                                                    num_heads=H)
  _check_logits(params, config, sd)


def test_corrupt_npz_is_one_line_naming_the_file(tmp_path):
  sd = _state_dict(2)
  path = os.path.join(tmp_path, "model.npz")
  np.savez(path, **sd)
  with open(path, "rb") as f:
    head = f.read(200)
  with open(path, "wb") as f:  # truncated
    f.write(head)
  with pytest.raises(ValueError, match=r"cannot read .*model\.npz") as e:
    convert_torch.load_state_dict(path)
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_corrupt_file_one_line(tmp_path):
  path = os.path.join(tmp_path, "model.npz")
  with open(path, "wb") as f:
    f.write(b"PK\x03\x04 not really a zip archive")
  out = subprocess.run(
      [sys.executable, "-m", "sg_jax.checkpointing.convert_torch", f"--checkpoint={path}", "--task=question",
       f"--out={tmp_path}/converted"], capture_output=True, text=True, timeout=120,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.returncode == 1
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: cannot read") and path in lines[0], \
      out.stderr
  assert not os.path.exists(os.path.join(tmp_path, "converted"))


def test_torch_file_truncated_or_unsafe(tmp_path):
  torch = pytest.importorskip("torch")
  sd = _state_dict(2)
  path = os.path.join(tmp_path, "model.pt")
  torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, path)
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(ValueError, match=r"cannot read .*model\.pt as a PyTorch") as e:
    convert_torch.load_state_dict(path)
  assert "\n" not in str(e.value)
  # A pickle that would call a function when loaded is refused (weights_only=True), and the
  # function never runs.
  marker = os.path.join(tmp_path, "ran")
  evil = os.path.join(tmp_path, "evil.pt")
  torch.save({"x": _Evil(marker)}, evil)
  with pytest.raises(ValueError, match="weights_only=True"):
    convert_torch.load_state_dict(evil)
  assert not os.path.exists(marker)


class _Evil:
  """Unpickling calls `open(marker, 'w')`: a stand-in for arbitrary code in a pickle."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


def test_write_checkpoint_round_trip(tmp_path):
  tasks = pytest.importorskip("sg_jax.tasks")
  if not hasattr(tasks, "get_task"):
    pytest.skip("sg_jax.tasks (data module) not available yet")
  from sg_jax import checkpointing  # pylint: disable=import-outside-toplevel
  vocab_size = tasks.get_task("question").vocab().size
  rng = np.random.default_rng(3)
  sd = _state_dict(3)
  sd["input_embedding.weight"] = rng.normal(size=(vocab_size, D)).astype(np.float32)
  sd["output_map.weight"] = rng.normal(size=(vocab_size, D)).astype(np.float32)
  sd["output_map.bias"] = rng.normal(size=(vocab_size,)).astype(np.float32)
  params, config = convert_torch.convert_state_dict(sd, num_heads=H)
  out = os.path.join(tmp_path, "converted")
  convert_torch.write_checkpoint(params, config, "question", out, step=300, seed_id=7)
  restored = checkpointing.restore(out, params_only=True)
  assert restored.step == 300 and restored.seeds == [7]
  assert restored.config.model.num_layers == LAYERS and restored.config.model.num_heads == H
  for a, b in zip(jax.tree_util.tree_leaves(params),
                  jax.tree_util.tree_leaves(restored.state["params"])):
    np.testing.assert_array_equal(np.asarray(b)[0], a)
  with pytest.raises(ValueError, match="vocabulary rows"):
    convert_torch.write_checkpoint(*convert_torch.convert_state_dict(_state_dict(), num_heads=H),
                                   "question", os.path.join(tmp_path, "bad"))


def test_released_float32_position_table_is_accepted_on_the_rows_used():
  # The released models: d_model 512 and a 5,000-row float32 table. Its float32 rounding passes
  # 1e-4 (the former check over all rows) from about row 1,100 on.
  sd = _state_dict(4, d=512, layers=1, pe_rows=5000)
  err = np.abs(sd["pos.pe"][:, 0] - sinusoidal_positions(5000, 512)).max(-1)
  assert err[:512].max() < 1e-4 < err.max()
  params, config = convert_torch.convert_state_dict(sd, num_heads=8)
  assert config.max_len == 512
  _check_logits(params, config, sd)
  # rows past max_len are never read, so they are not checked ...
  sd["pos.pe"] = sd["pos.pe"].copy()
  sd["pos.pe"][600:] += 0.5
  convert_torch.convert_state_dict(sd, num_heads=8)
  # ... unless the model uses them; the message names the row and the rows checked.
  with pytest.raises(ValueError, match=r"row 600 differs by 0\.5.*checked rows 0\.\.999 "
                                       r"\(the positions of max_len=1000"):
    convert_torch.convert_state_dict(sd, num_heads=8, max_len=1000)
  # an error in a used row that float32 rounding cannot explain is still refused.
  sd["pos.pe"][100, 0, 7] += 2e-4
  with pytest.raises(ValueError, match=r"row 100 differs by 0\.000[12].*float32 rounding"):
    convert_torch.convert_state_dict(sd, num_heads=8)


def test_released_weight_norm_of_a_converted_checkpoint_includes_the_decoder(tmp_path):
  tasks = pytest.importorskip("sg_jax.tasks")
  from sg_jax.analysis import driver as analyze  # pylint: disable=import-outside-toplevel
  vocab_size = tasks.get_task("question").vocab().size
  rng = np.random.default_rng(5)
  sd = _state_dict(5)
  sd["input_embedding.weight"] = rng.normal(size=(vocab_size, D)).astype(np.float32)
  sd["output_map.weight"] = rng.normal(size=(vocab_size, D)).astype(np.float32)
  sd["output_map.bias"] = rng.normal(size=(vocab_size,)).astype(np.float32)
  # a decoder the LM never calls (a layer and its final norm), as the original module builds.
  sd["trafo.decoder.layers.0.multihead_attn.data_to_q.weight"] = rng.normal(
      size=(D, D)).astype(np.float32)
  sd["trafo.decoder.norm.weight"] = np.ones(D, np.float32)
  square = lambda keys: sum(float(np.sum(sd[k].astype(np.float64) ** 2)) for k in keys)
  buffers = ("pos.pe", "int_seq")
  decoder_keys = [k for k in sd if k.startswith("trafo.decoder.")]
  model_keys = [k for k in sd if k not in buffers and k not in decoder_keys]
  by_hand = math.sqrt(square(model_keys) + square(decoder_keys))  # every parameter of the module

  dec_norm, dec_count = convert_torch.decoder_norm({"module." + k: v for k, v in sd.items()})
  assert dec_count == F * D + D * D + D
  np.testing.assert_allclose(dec_norm, math.sqrt(square(decoder_keys)), rtol=1e-12)
  out = os.path.join(tmp_path, "converted")
  convert_torch.write_checkpoint(*convert_torch.convert_state_dict(sd, num_heads=H), "question",
                                 out, step=300, seed_id=7, released_decoder_norm=dec_norm)
  analyze.analyze(out, groups=["weight_norm"])
  with open(os.path.join(out, "analysis.csv")) as f:
    got = {r.split(",")[2]: float(r.split(",")[3]) for r in f.read().splitlines()[1:]}
  np.testing.assert_allclose(got["weight_norm_released"], by_hand, rtol=1e-6)
  np.testing.assert_allclose(got["weight_norm"], math.sqrt(square(model_keys)), rtol=1e-6)
  assert got["weight_norm_released"] > got["weight_norm"] * 1.01
