"""HLO traffic by part and function (issue 53 item 3) on a hand-written optimised HLO module:
fusion bodies and free instructions move nothing; every other instruction moves its output and
its operands; parts from the name stack, functions from the stack-frame table."""

import pytest

from sg_jax.accelerators import hlo_traffic

HLO = """HloModule jit_step, is_scheduled=true

FileNames
1 "sg_jax/step.py"

FunctionNames
1 "apply_gradients"
2 "TransformerLM.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=1 function_name_id=2 line=20 end_line=20 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}

%fused_computation (param_0: f32[4,8], param_1: f32[4,8]) -> f32[4,8] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %param_1 = f32[4,8]{1,0} parameter(1)
  ROOT %add.9 = f32[4,8]{1,0} add(%param_0, %param_1)
}

ENTRY %main (p: f32[4,8], g: f32[4,8], x: bf16[2,4]) -> (f32[4,8], /*index=1*/bf16[2,8]) {
  %p = f32[4,8]{1,0} parameter(0)
  %g = f32[4,8]{1,0} parameter(1)
  %x = bf16[2,4]{1,0} parameter(2)
  %convert = f32[4,8]{1,0} bitcast(%p)
  %dot.1 = bf16[2,8]{1,0} dot(%x, %convert), lhs_contracting_dims={1}, metadata={op_name="jit(step)/jvp(TransformerLM)/dot" stack_frame_id=2}
  %dot.2 = f32[4,8]{1,0} dot(%x, %dot.1), metadata={op_name="jit(step)/transpose(jvp(TransformerLM))/dot" stack_frame_id=2}
  %fusion = f32[4,8]{1,0} fusion(%p, %dot.2), kind=kLoop, calls=%fused_computation, metadata={op_name="jit(step)/add" stack_frame_id=1}
  ROOT %tuple = (f32[4,8]{1,0}, /*index=1*/bf16[2,8]{1,0}) tuple(%fusion, %dot.1)
}
"""


def test_shape_bytes():
  assert hlo_traffic.shape_bytes("f32[2,3]{1,0}") == 24
  assert hlo_traffic.shape_bytes("(s32[], bf16[4], /*index=2*/pred[3])") == 4 + 8 + 3


def test_traffic_of_a_hand_written_module():
  got = hlo_traffic.traffic(HLO)
  forward = 32 + 16 + 128  # dot.1: bf16[2,8] out, bf16[2,4] and f32[4,8] (the bitcast) in
  backward = 128 + 16 + 32  # dot.2: f32[4,8] out, x and dot.1 in
  other = 128 * 3  # the fusion: f32[4,8] out, p and dot.2 in; its body is not counted
  assert got["by_part"] == {"forward": forward, "backward": backward, "other": other}
  assert got["by_function"] == {"__call__": forward + backward, "apply_gradients": other}
  assert got["total"] == forward + backward + other and got["instructions"] == 3


ASYNC = """HloModule m

ENTRY %main (w: f32[2,8]) -> f32[2,8] {
  %w = f32[2,8]{1,0} parameter(0)
  %copy-start = (f32[2,8]{1,0:S(1)}, f32[2,8]{1,0}, u32[]) copy-start(%w)
  %copy-done = f32[2,8]{1,0:S(1)} copy-done(%copy-start)
  %slice-start = ((f32[2,8]{1,0}), f32[1,8]{1,0:S(1)}, s32[]) slice-start(%w), slice={[0:1], [0:8]}
  %slice-done = f32[1,8]{1,0:S(1)} slice-done(%slice-start)
  ROOT %neg = f32[2,8]{1,0} negate(%copy-done)
}
"""


def test_async_moves_and_the_hbm_only_count():
  """copy-start: 64 bytes read from HBM, 64 written on chip; slice-start: 32 read from HBM,
  32 written on chip; negate: 64 read on chip, 64 written to HBM."""
  every = hlo_traffic.traffic(ASYNC)
  assert every["total"] == (64 + 64) + (32 + 32) + (64 + 64)
  assert every["by_function"] == {"(copy-start)": 128, "(slice-start)": 64, "(negate)": 128}
  assert hlo_traffic.traffic(ASYNC, hbm_only=True)["total"] == 64 + 32 + 64
  assert hlo_traffic.shape_bytes("(f32[2]{0:S(1)}, f32[2]{0})", hbm_only=True) == 8
