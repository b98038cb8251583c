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


GPU = """HloModule jit_chunk, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%fused_slice (param_0: f32[2,12,4]) -> f32[2,4,4] {
  %param_0 = f32[2,12,4]{2,1,0} parameter(0)
  %slice.1 = f32[2,4,4]{2,1,0} slice(%param_0), slice={[0:2], [4:8], [0:4]}
  %bitcast.1 = f32[2,4,4]{2,1,0} bitcast(%slice.1)
  ROOT %transpose.1 = f32[2,4,4]{2,1,0} transpose(%bitcast.1), dimensions={0,2,1}
}

%fused_update (param_0.1: f32[2,100], param_1.1: f32[2,1], param_2.1: s32[]) -> f32[2,100] {
  %param_0.1 = f32[2,100]{1,0} parameter(0)
  %param_1.1 = f32[2,1]{1,0} parameter(1)
  %param_2.1 = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = f32[2,100]{1,0} dynamic-update-slice(%param_0.1, %param_1.1, %zero, %param_2.1)
}

%fused_gather (param_0.2: s32[1000,30], param_1.2: s32[8,1]) -> s32[8,30] {
  %param_0.2 = s32[1000,30]{1,0} parameter(0)
  %param_1.2 = s32[8,1]{1,0} parameter(1)
  ROOT %gather = s32[8,30]{1,0} gather(%param_0.2, %param_1.2), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,30}
}

%fused_reduce (param_0.3: f32[2,12,4]) -> f32[2] {
  %param_0.3 = f32[2,12,4]{2,1,0} parameter(0)
  %c = f32[] constant(0)
  ROOT %r = f32[2]{0} reduce(%param_0.3, %c), dimensions={1,2}, to_apply=%add
}

%body (arg: (s32[], f32[2,12,4], f32[2,100])) -> (s32[], f32[2,12,4], f32[2,100]) {
  %arg = (s32[], f32[2,12,4]{2,1,0}, f32[2,100]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %w = f32[2,12,4]{2,1,0} get-tuple-element(%arg), index=1
  %log = f32[2,100]{1,0} get-tuple-element(%arg), index=2
  %q = f32[2,4,4]{2,1,0} fusion(%w), kind=kInput, calls=%fused_slice
  %norm = f32[2]{0} fusion(%w), kind=kInput, calls=%fused_reduce
  %row = f32[2,1]{1,0} bitcast(%norm)
  %log.1 = f32[2,100]{1,0} fusion(%log, %row, %i), kind=kLoop, calls=%fused_update
  %w.1 = f32[2,12,4]{2,1,0} copy(%w)
  ROOT %t = (s32[], f32[2,12,4]{2,1,0}, f32[2,100]{1,0}) tuple(%i, %w.1, %log.1)
}

%cond (arg.1: (s32[], f32[2,12,4], f32[2,100])) -> pred[] {
  %arg.1 = (s32[], f32[2,12,4]{2,1,0}, f32[2,100]{1,0}) parameter(0)
  ROOT %done = pred[] constant(false)
}

ENTRY %main (w.0: f32[2,12,4], log.0: f32[2,100], data: s32[1000,30], idx: s32[8,1]) -> (s32[8,30], f32[2,12,4]) {
  %w.0 = f32[2,12,4]{2,1,0} parameter(0)
  %log.0 = f32[2,100]{1,0} parameter(1)
  %data = s32[1000,30]{1,0} parameter(2)
  %idx = s32[8,1]{1,0} parameter(3)
  %batch = s32[8,30]{1,0} fusion(%data, %idx), kind=kLoop, calls=%fused_gather
  %i.0 = s32[] constant(0)
  %init = (s32[], f32[2,12,4]{2,1,0}, f32[2,100]{1,0}) tuple(%i.0, %w.0, %log.0)
  %loop = (s32[], f32[2,12,4]{2,1,0}, f32[2,100]{1,0}) while(%init), condition=%cond, body=%body
  %w.2 = f32[2,12,4]{2,1,0} get-tuple-element(%loop), index=1
  %cat = f32[2,12,4]{2,1,0} custom-call(%w.2), custom_call_target="ConcatBitcast"
  ROOT %out = (s32[8,30]{1,0}, f32[2,12,4]{2,1,0}) tuple(%batch, %cat)
}
"""


def test_fusion_operands_read_as_the_fusion_body_uses_them():
  """A GPU-like module: a fusion that only slices an operand reads the slice (through a
  bitcast); a dynamic-update-slice in place neither reads its buffer nor writes more than the
  update; a gather reads the rows it gathers; a reducer's body, the loop's parameters, tuples,
  get-tuple-elements, bitcasts and a TPU ConcatBitcast move nothing; the loop body is counted
  once."""
  got = hlo_traffic.traffic(GPU)
  w, q, norm, update, step = 2 * 12 * 4 * 4, 2 * 4 * 4 * 4, 2 * 4, 2 * 1 * 4, 4
  batch = 8 * 30 * 4
  expected = {"(fusion)": (q + q)  # %q: the slice read, the transpose written
                          + (w + norm)  # %norm: the whole operand read, the norm written
                          + (update + update + step)  # %log.1: the update read and written
                          + (batch + 8 * 4 + batch),  # %batch: the rows, the indices, the rows
              "(copy)": w + w}
  assert got["by_function"] == expected
  assert got["total"] == sum(expected.values()) and got["instructions"] == 5
  assert hlo_traffic.traffic(GPU, hbm_only=True)["total"] == got["total"]  # no S(1) here


def test_traffic_of_arrays_of_given_sizes():
  """`sizes` counts only arrays of those sizes (a slice of one counts as the array does)."""
  w, q = 2 * 12 * 4 * 4, 2 * 4 * 4 * 4
  got = hlo_traffic.traffic(GPU, sizes={w})
  assert got["total"] == q + w + 2 * w  # the slice of w read, w reduced, w copied


CONDITIONAL = """HloModule m

%small (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%a)
}

%large (b: f32[4]) -> f32[4] {
  %b = f32[4]{0} parameter(0)
  %x = f32[4,4]{1,0} broadcast(%b), dimensions={0}
  ROOT %s = f32[4]{0} slice(%x), slice={[0:4], [0:1]}
}

ENTRY %main (p: s32[], v: f32[4]) -> f32[4] {
  %p = s32[] parameter(0)
  %v = f32[4]{0} parameter(1)
  ROOT %c = f32[4]{0} conditional(%p, %v, %v), branch_computations={%small, %large}
}
"""


def test_a_conditional_counts_its_largest_branch():
  """small: negate, 16 + 16 bytes; large: broadcast, 64 + 16, and a slice of it, 16 read and
  16 written; one branch runs: the larger counts."""
  got = hlo_traffic.traffic(CONDITIONAL)
  assert got["by_function"] == {"(broadcast)": 64 + 16, "(slice)": 16 + 16}
