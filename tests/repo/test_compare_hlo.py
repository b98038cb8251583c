"""scripts/compare_hlo.py: equal programs with other source locations compare equal, others not."""
import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "compare_hlo.py"
_spec = importlib.util.spec_from_file_location("compare_hlo", _PATH)
compare_hlo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_hlo)

_HLO = """HloModule jit_{name}, entry_computation_layout={{(f32[2]{{0}})->f32[2]{{0}}}}

FileNames
1 "{file}"

FunctionNames
1 "f"

FileLocations
1 {{file_name_id=1 function_name_id=1 line={line} end_line={line} column=2 end_column=8}}

StackFrames
1 {{file_location_id=1 parent_frame_id=1}}

ENTRY %main (x: f32[2]) -> f32[2] {{
  %x = f32[2]{{0}} parameter(0), metadata={{op_name="x" source_file="{file}" source_line={line}}}
  ROOT %y = f32[2]{{0}} {op}(%x, %x), metadata={{op_name="jit(f)/{op}" stack_frame_id=1}}
}}
"""


def _dump(folder, **kw):
  folder.mkdir()
  text = _HLO.format(**{"name": "f", "file": "/a/x.py", "line": 3, "op": "add", **kw})
  (folder / "module_0001.jit_f.cpu_after_optimizations.txt").write_text(text)
  return str(folder)


def test_source_locations_are_ignored(tmp_path, capsys):
  old = _dump(tmp_path / "old")
  new = _dump(tmp_path / "new", file="/b/elsewhere.py", line=97, name="f_1")
  assert compare_hlo.main([old, new]) == 0
  assert "identical" in capsys.readouterr().out


def test_another_op_is_different(tmp_path, capsys):
  old = _dump(tmp_path / "old")
  new = _dump(tmp_path / "new", op="multiply")
  assert compare_hlo.main([old, new]) == 1
  assert "DIFFERENT" in capsys.readouterr().out
