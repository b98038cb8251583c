"""The docs-vs-data check: every table in docs/ marked as generated from `results/` must equal
what `results/` gives today (`sg_jax.results.docs`); and the report of exported runs."""

import os
import subprocess
import sys

import numpy as np
import pytest

from sg_jax import claims
from sg_jax.report import build as report
from sg_jax.report import crossed_seeds
from sg_jax.report import reading
from sg_jax.results import docs as docs_lib
from sg_jax.results import export

import results_fixtures  # pylint: disable=wrong-import-order  (tests/ is on the path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_docs_match_the_committed_results():
  """Every generated block of docs/ equals its table rendered from results/ (a block naming a
  study that is not in results/ fails too) and sits in a results page, docs/results/<study>.md.
  Passes, and says so, when there is none yet."""
  results, docs = os.path.join(ROOT, "results"), os.path.join(ROOT, "docs")
  found = [b for path in docs_lib.markdown_files(docs) for b in docs_lib.blocks(path, results)]
  stale = [f"{os.path.relpath(b.doc, ROOT)}:{b.line} {b.study}/{b.table}" for b in found
           if b.current != b.expected]
  # measurements live in the results pages (docs/results/<study>.md), never in a how-to page
  outside = sorted({os.path.relpath(b.doc, ROOT) for b in found
                    if os.path.dirname(b.doc) != os.path.join(docs, "results")})
  assert not outside, f"generated tables outside docs/results/: {outside}"
  assert not stale, ("docs tables that disagree with results/ (run `python -m sg_jax.results "
                     f"render-docs`): {stale}")
  if not found:
    print(f"no generated tables in docs/ yet; {len(docs_lib.studies(results))} studies in "
          "results/")


def _study(tmp_path, finals_by_depth):
  """results/tiny_study/depth<D>: exports of hand-made tiny workdirs."""
  results = tmp_path / "results"
  for depth, finals in finals_by_depth.items():
    work = results_fixtures.make_workdir(str(tmp_path / "runs" / f"depth{depth}"), depth=depth,
                                         finals=finals, analysis=False, pruning=False)
    export.export_run(work, str(results / "tiny_study" / f"depth{depth}"))
  return str(results)


DOC = """# A page

Some text.

<!-- results: tiny_study/depths -->
| depth | seeds | final gen. mean [95% t-interval] | median | seeds > 0.8 | early stop, first best | early stop, last best |
|---|---|---|---|---|---|---|
| 1 | 2 | 0.600 [-3.212, 4.412] | 0.6 | 1/2 | 0.100 | 0.600 |
<!-- /results -->

More text, left as it is.

```
<!-- results: not_a_study/claims -->
an example in a code fence is not a generated block
<!-- /results -->
```
"""


def test_check_fails_on_a_mismatch_and_render_docs_fixes_it(tmp_path):
  results = _study(tmp_path, {1: (0.9, 0.3)})
  doc = tmp_path / "docs" / "page.md"
  doc.parent.mkdir()
  doc.write_text(DOC)
  block, = docs_lib.blocks(str(doc), results)
  assert block.current == block.expected  # the hand-written table is what the data give
  assert docs_lib.stale_blocks(str(doc.parent), results) == []
  # the data change (a seed ends elsewhere): the doc no longer matches
  _study(tmp_path, {1: (0.9, 0.1)})
  stale, = docs_lib.stale_blocks(str(doc.parent), results)
  assert (stale.study, stale.table, stale.line) == ("tiny_study", "depths", 5)
  docs_lib.render_docs(str(doc.parent), results)
  text = doc.read_text()
  assert "| 1 | 2 | 0.500 [-4.582, 5.582] | 0.5 | 1/2 | 0.100 | 0.500 |" in text
  assert text.startswith("# A page\n\nSome text.\n") and text.endswith(DOC[DOC.index("\nMore"):])
  assert docs_lib.stale_blocks(str(doc.parent), results) == []


def test_a_block_naming_missing_data_fails(tmp_path):
  results = _study(tmp_path, {1: (0.9, 0.3)})
  doc = tmp_path / "page.md"
  doc.write_text("<!-- results: gone_study/claims -->\n| x |\n<!-- /results -->\n")
  with pytest.raises(docs_lib.DocsError, match="page.md:1: results/gone_study"):
    docs_lib.stale_blocks(str(doc), results)
  doc.write_text("<!-- results: tiny_study/nope -->\n<!-- /results -->\n")
  with pytest.raises(docs_lib.DocsError, match="no table 'nope'"):
    docs_lib.stale_blocks(str(doc), results)


def test_claims_and_seeds_tables_render(tmp_path):
  results = _study(tmp_path, {1: (0.9, 0.3), 2: (0.8, 0.7)})
  claims_md = docs_lib.render(results, "tiny_study", "claims")
  assert claims_md.startswith("| claim | setting | seeds per arm | test |")
  assert "murty.grokking | question formation, depth 1 | 2 |" in claims_md
  assert "no runs" not in claims_md  # only claims the study can test
  seeds_md = docs_lib.render(results, "tiny_study", "seeds").splitlines()
  assert seeds_md[2] == "| depth1 | 1 | 0 | 1 | 0.9 |  |"
  assert len(seeds_md) == 2 + 4


def test_claims_table_same_from_workdir_and_export(tmp_path):
  work = results_fixtures.make_workdir(str(tmp_path / "runs" / "w"), depth=2,
                                       finals=(0.9, 0.3, 0.6))
  out = str(tmp_path / "results" / "study" / "w")
  export.export_run(work, out)
  rows = [claims.evaluate([reading.load_run(folder)]) for folder in (work, out)]
  assert rows[0] == rows[1]
  assert {r["claim"] for r in rows[0] if r["verdict"] != claims.NO_RUNS} >= {
      "murty.grokking", "murty.early_stopping", "bhaskar.shared_core", "bhaskar.core_ablation"}


@pytest.mark.slow
def test_report_of_an_export_equals_the_report_of_its_workdir(tmp_path):
  work = results_fixtures.make_workdir(str(tmp_path / "runs" / "w"), depth=2,
                                       finals=(0.9, 0.3, 0.6))
  out = tmp_path / "results" / "study" / "w"
  export.export_run(work, str(out))
  listing = lambda: sorted(os.path.relpath(os.path.join(d, n), tmp_path / "results")
                           for d, _, names in os.walk(tmp_path / "results") for n in names)
  before = listing()
  a = report.build_report(work, str(tmp_path / "report_work"))
  b = report.build_report(str(out.parent))
  assert b["out_dir"] == str(tmp_path / "runs" / "results_reports" / "study")
  assert listing() == before  # nothing written into results/
  for name in ("summary.csv", "summary_seeds.csv", "claims.csv", "summary_pruning.csv",
               "summary_pruning_seeds.csv"):
    left = (tmp_path / "report_work" / name).read_text()
    right = (tmp_path / "runs" / "results_reports" / "study" / name).read_text()
    assert left == right, name
  claims_csv = (tmp_path / "report_work" / "claims.csv").read_text().splitlines()
  assert claims_csv[0].startswith("claim,setting,seeds per arm,test,statistic,p or interval,"
                                  "detectable effect,verdict,")
  summary = (tmp_path / "report_work" / "summary.md").read_text()
  assert "\n## Claims\n" in summary
  assert "| murty.grokking | question formation, depth 2 |" in summary
  assert len(a["figures"]) == len(b["figures"])


@pytest.mark.slow
def test_command_line_export_and_render_docs(tmp_path):
  work = results_fixtures.make_workdir(str(tmp_path / "w"), pruning=False, analysis=False)
  env = {**os.environ, "PYTHONPATH": ROOT}
  run = lambda *args: subprocess.run([sys.executable, "-m", "sg_jax.results", *args], cwd=ROOT,
                                     env=env, capture_output=True, text=True, timeout=300)
  done = run("export", f"--workdir={work}", f"--out={tmp_path}/results/s/depth1",
             "--command=python -m sg_jax.main --config=configs/question.py:tiny")
  assert done.returncode == 0, done.stderr
  assert "exported w: 3 files" in done.stdout
  doc = tmp_path / "docs" / "p.md"
  doc.parent.mkdir()
  doc.write_text("<!-- results: s/seeds -->\nold\n<!-- /results -->\n")
  args = (f"--docs={doc.parent}", f"--results={tmp_path}/results")
  check = run("render-docs", "--check", *args)
  assert check.returncode == 1 and "p.md:1: s/seeds stale" in check.stdout
  assert run("render-docs", *args).returncode == 0
  assert run("render-docs", "--check", *args).returncode == 0
  assert "| depth1 | 1 | 0 | 1 | 0.9 |  |" in doc.read_text()


def test_section_table_picks_the_table_under_its_heading():
  lines = ["", "## A", "", "| x |", "|---|", "| 1 |", "", "text", "| y |", "|---|",
           "### B", "| z |"]
  assert docs_lib.section_table(lines, "## A") == ["| x |", "|---|", "| 1 |"]
  assert docs_lib.section_table(lines, "## A", 1) == ["| y |", "|---|"]
  assert docs_lib.section_table(lines, "## A", 2) == []  # stops at the next heading
  assert docs_lib.section_table(lines, "### B") == ["| z |"]
  assert docs_lib.section_table(lines, "## missing") == []


def _one_run_study(tmp_path, finals, config_extra, pruning=False):
  results = tmp_path / "results"
  work = results_fixtures.make_workdir(str(tmp_path / "runs" / "w"), depth=2, finals=finals,
                                       config_extra=config_extra, analysis=False,
                                       pruning=pruning)
  export.export_run(work, str(results / "study" / "w"))
  return str(results)


def test_groups_tables_render_the_reports_seed_groups(tmp_path):
  finals = (0.9, 0.7, 0.3, 0.2)
  results = _one_run_study(tmp_path, finals, {"sas": {"lambdas": [0.0, 0.0, 1.0, 1.0]}})
  lines = docs_lib.render(results, "study", "groups").splitlines()
  assert lines[0].startswith("| run | group | seeds |")
  rows = {l.split(" | ")[1]: l for l in lines[2:]}
  assert set(rows) == {"lambdas=0.0", "lambdas=1.0"}
  # the out_of_domain/accuracy column: the group's seed mean with its t-interval
  assert " 0.8 [" in rows["lambdas=0.0"] and " 0.25 [" in rows["lambdas=1.0"]
  assert "| 1/2 |" in rows["lambdas=0.0"]  # seeds above 0.8 at the end
  tests = docs_lib.render(results, "study", "group-tests")
  assert "lambdas=1.0 | lambdas=0.0 | final generalisation |" in tests
  assert docs_lib.render(results, "study", "crossed") == "\n"  # no crossed design here


def test_crossed_tables_give_the_grid_and_the_variance_shares(tmp_path):
  # init 0: 0.9, 0.7; init 1: 0.3, 0.1 (data 0, 1): the initialisation explains most
  finals = (0.9, 0.7, 0.3, 0.1)
  results = _one_run_study(tmp_path, finals,
                           {"seeds": {"init": [0, 0, 1, 1], "data": [0, 1, 0, 1]}})
  grid = docs_lib.render(results, "study", "crossed").splitlines()
  assert grid[0] == "| w: init \\ data | data 0 | data 1 | mean |"
  assert grid[2].startswith("| init 0 | 0.900 (") and grid[2].endswith("| 0.800 |")
  assert grid[3].startswith("| init 1 | 0.300 (") and grid[3].endswith("| 0.200 |")
  assert grid[4] == "| mean | 0.600 | 0.400 | 0.500 |"
  shares = docs_lib.render(results, "study", "crossed-shares").splitlines()
  mean = sum(finals) / 4
  total = sum((v - mean) ** 2 for v in finals)
  init_ss = 2 * ((0.8 - mean) ** 2 + (0.2 - mean) ** 2)
  data_ss = 2 * ((0.6 - mean) ** 2 + (0.4 - mean) ** 2)
  row = next(l for l in shares if "final generalisation | seeds.init" in l)
  assert f"| {init_ss / total:.2f} |" in row
  row = next(l for l in shares if "final generalisation | seeds.data" in l)
  assert f"| {data_ss / total:.2f} |" in row
  # the same tables in the report's summary.md section
  run = reading.load_run(os.path.join(results, "study", "w"))
  section = crossed_seeds.markdown_lines([run])
  assert section[1] == "## Initialisation x data order" and grid[0] in section
  # ... and its figure: the grid as a heat map, rows init, columns data order
  fig = crossed_seeds.plot_cells(run, crossed_seeds.run_analysis(run),
                                 str(tmp_path / "crossed.png"), "")
  assert os.path.exists(tmp_path / "crossed.png")
  np.testing.assert_allclose(np.asarray(fig.axes[0].images[0].get_array()),
                             [[0.9, 0.7], [0.3, 0.1]], atol=1e-6)
  assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["init 0  0.80",
                                                                    "init 1  0.20"]
  plain = reading.load_run(os.path.join(_one_run_study(tmp_path / "plain", finals, None),
                                        "study", "w"))
  assert crossed_seeds.plot_cells(plain, crossed_seeds.run_analysis(plain),
                                  str(tmp_path / "n.png"), "") is None  # no crossed design


def test_pruning_tables_render_from_an_export(tmp_path):
  results = _one_run_study(tmp_path, (0.9, 0.3), None, pruning=True)
  levels = docs_lib.render(results, "study", "pruning").splitlines()
  assert levels[0].startswith("| run | step | seed | sparsity |")
  assert len(levels) == 2 + 2  # two seeds at one level, at the last step
  seeds = docs_lib.render(results, "study", "pruning-seeds").splitlines()
  assert seeds[0].startswith("| run | step | seed | full in-domain acc. |")


def test_phase_tables_name_one_run_and_equal_the_reports(tmp_path):
  """`phases` / `phase-order` of one run, named as <study>/<run> when the study holds several
  with dynamics curves: equal to the report's "Phase transitions" tables of the workdir."""
  from sg_jax.report import phase_transitions  # pylint: disable=import-outside-toplevel
  results = tmp_path / "results"
  steps = results_fixtures.STEPS
  for name, rise in (("a", 300), ("b", 600)):
    work = results_fixtures.make_workdir(str(tmp_path / "runs" / name), finals=(0.9, 0.3, 0.5),
                                         analysis=False, pruning=False)
    cka = {s: (steps, 1.0 / (1.0 + np.exp(-(steps - rise - 50 * s) / 40.0))) for s in range(3)}
    results_fixtures.write_series(os.path.join(work, "analysis.csv"), {"cka_final": cka})
    export.export_run(work, str(results / "study" / name))
  with pytest.raises(docs_lib.DocsError, match="exactly one run .* found 2 .*a, b"):
    docs_lib.render(str(results), "study", "phases")
  run = reading.load_run(str(tmp_path / "runs" / "b"))
  expected = phase_transitions.markdown_lines([(run, phase_transitions.onsets(run))])
  onsets = docs_lib.render(str(results), "study/b", "phases").splitlines()
  assert onsets == docs_lib.section_table(expected, "### `b`")
  assert onsets[0].startswith("| seed | ") and "cka_final" in onsets[0]
  assert [l.split(" | ")[0] for l in onsets[2:]] == ["| 0", "| 1", "| 2", "| mean [95% CI]",
                                                      "| resolution"]
  order = docs_lib.render(str(results), "study/b", "phase-order").splitlines()
  assert order[0].startswith("Order of the mean onsets") and order[0] in expected
  assert order[2:] == docs_lib.section_table(expected, "### `b`", 1)
  # a doc block naming the run is rendered and checked like any other
  doc = tmp_path / "page.md"
  doc.write_text("x\n<!-- results: study/a/phases -->\n| old |\n<!-- /results -->\n")
  assert [(b.study, b.table) for b in docs_lib.render_docs(str(doc), str(results))] == [
      ("study/a", "phases")]
  assert docs_lib.stale_blocks(str(doc), str(results)) == []
