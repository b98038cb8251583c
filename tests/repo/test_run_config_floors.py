"""The run config stays at the top (issue 51 item 3): below the training loop, functions take the
typed options they use (`input_pipeline.DataOptions`, `packing.BatchLayout`, `composition.Mix`,
`terms.Schedule`, `model.ModelConfig`, `optim.OptimOptions`, ...), never the whole ConfigDict.

The check reads every module of sg_jax/ (AST, nothing imported) and finds each function
parameter that is THE RUN CONFIG:

* a parameter annotated as a `ConfigDict` (`from_section(section: ConfigDict)`, a section
  only, is told apart by its name: `config`, `cfg`, `run_config`, `run`, `c`);
* or any parameter, whatever its name and annotation, whose function reads a section only the
  run config has: `<param>.<section>` or `<param>.get("<section>")` for `train`, `optim`, `eval`,
  `evals`, `checkpoint`; `<param>.<section>.<field>` for `data`, `seeds`, `sas`, `tree` (names a
  typed object may use for a field of its own, as `inputs.seeds`, a list), and
  `<param>.model.get(...)` (a section's method; `context.model.apply` is a model). A typed
  options object may also hold a `first_seed` or a `task` of its own, so these do not count;
* or any parameter handed on to a builder named `from_config` or `*_from_config`
  (`tasks.from_config(config)`): what a builder reads is the run config.

(A `ModelConfig` or a typed options object named `config` reads none of these: `config.d_model`,
`options.task.constructions`, `options.layout.batch_size` are not the run config.)

Such a parameter is allowed only in:

* modules ABOVE the loop (`ABOVE`): the spine (`train`, `main`, `configlib`, `config_checks`),
  the commands and their bodies (analysis, pruning, sweeps, reports, results, the AOT planner),
  and the run-level services that store or size the whole run (checkpoints' metadata and resume
  check, the memory estimate, the per-seed hyperparameter arrays);
* BUILDERS anywhere, the functions that turn the run config into typed options once at the top:
  `from_config`, `*_from_config`, `terms.active` (the active loss terms);
* CHECKS anywhere: `validate`, `check`, `check_*` (each feature's rules of a config, run by
  `config_checks.validate`);
* `PENDING`: functions named one by one, each with its reason; an entry is removed when its
  function takes typed options (the test fails on a stale entry).

Anything else fails with one line per offence naming the module, the function and the
parameter. `test_a_function_below_the_loop_taking_the_run_config_is_caught` shows the check
failing on hand-made offenders.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUN_CONFIG_NAMES = {"config", "cfg", "run_config", "run", "c"}
# Sections only the run config has: read as `<param>.<section>` (RUN_CONFIG_SECTIONS) or, for
# names a typed object may use too, as `<param>.<section>.<field>` (NESTED_SECTIONS).
RUN_CONFIG_SECTIONS = {"train", "optim", "eval", "evals", "checkpoint"}
NESTED_SECTIONS = {"data", "seeds", "sas", "tree"}

# Modules (paths under sg_jax/, a folder for a whole package) above the training loop.
ABOVE = (
    "train.py", "main.py", "configlib.py", "config/checks.py",  # the spine
    "analyze.py", "prune.py", "prune_core.py", "sweep.py", "aot.py",  # commands
    "data/generate.py", "data/__main__.py",  # the data command
    "sweeps/", "report/", "results/", "accelerators/",  # command bodies (accelerators: AOT plan)
    "analysis/driver.py", "pruning/driver.py", "pruning/core_driver.py",  # the commands' work
    "analysis/pipeline.py",  # the analyze command's reading of a run
    "pruning/inputs.py",  # the prune command's reading of a run
    "runtime/", "checkpointing/",  # the run's config stored, compared on resume
    "runtime/cost_check.py",  # the memory estimate of the whole run, before anything is allocated
    "config/per_seed.py",  # the per-seed hyperparameter arrays, built from the run config
)
BUILDERS = {"from_config", "active"}
CHECKS = {"validate", "check"}

# (module, function): still given the run config, and why. Remove an entry once its function
# takes typed options.
PENDING: dict[tuple[str, str], str] = {}


def _run_config_names(function: ast.AST) -> set[str]:
  """The names whose run-config sections `function` reads or that it hands on to a builder
  (module docstring), from one walk of its body."""
  names = set()
  for node in ast.walk(function):
    if isinstance(node, ast.Attribute):
      if isinstance(node.value, ast.Name) and node.attr in RUN_CONFIG_SECTIONS:
        names.add(node.value.id)
      inner = node.value
      if (isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name)
          and (inner.attr in NESTED_SECTIONS or (inner.attr == "model" and node.attr == "get"))):
        names.add(inner.value.id)
    elif isinstance(node, ast.Call):
      func = node.func
      if (isinstance(func, ast.Attribute) and func.attr == "get"
          and isinstance(func.value, ast.Name) and node.args
          and isinstance(node.args[0], ast.Constant)
          and node.args[0].value in RUN_CONFIG_SECTIONS | NESTED_SECTIONS):
        names.add(func.value.id)
      callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
      if callee == "from_config" or callee.endswith("_from_config"):
        names |= {a.id for a in node.args if isinstance(a, ast.Name)}
  return names


def run_config_params(source: str) -> list[tuple[str, str]]:
  """(function, parameter) of every parameter of `source`'s functions that is the run config
  (module docstring), builders and checks included."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    args = node.args
    params = [a for a in args.posonlyargs + args.args + args.kwonlyargs
              if a.arg not in ("self", "cls")]
    if not params:
      continue
    used = _run_config_names(node)
    for arg in params:
      annotated = (arg.annotation is not None and arg.arg in RUN_CONFIG_NAMES
                   and "ConfigDict" in ast.unparse(arg.annotation))
      if annotated or arg.arg in used:
        found.append((node.name, arg.arg))
  return found


def _allowed(module: str, function: str) -> bool:
  if any(module == a or (a.endswith("/") and module.startswith(a)) for a in ABOVE):
    return True
  if function in BUILDERS or function.endswith("_from_config"):
    return True
  if function in CHECKS or function.startswith(("check_", "_check")):
    return True
  return (module, function) in PENDING


def offences(module: str, source: str, params: list | None = None) -> list[str]:
  """One line per function of `module` (a path under sg_jax/) below the loop that takes the
  run config (`params`: its `run_config_params(source)`, when known)."""
  params = run_config_params(source) if params is None else params
  return [f"sg_jax/{module}: {function}({param}) takes the run config; give it the typed "
          f"options it reads (built once at the top by a from_config builder)"
          for function, param in params if not _allowed(module, function)]


def _modules():
  base = os.path.join(ROOT, "sg_jax")
  for folder, _, files in os.walk(base):
    for name in sorted(files):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
          yield os.path.relpath(path, base).replace(os.sep, "/"), f.read()


def test_no_function_below_the_loop_takes_the_run_config():
  found, params, modules = [], set(), set()
  for module, source in _modules():
    taken = run_config_params(source)
    found += offences(module, source, taken)
    params |= {(module, function) for function, _ in taken}
    modules.add(module)
  assert not found, "\n".join(found)
  # (An entry of a module not present yet, e.g. before a package lands, is not checked.)
  stale = sorted(k for k in set(PENDING) - params if k[0] in modules)
  assert not stale, f"PENDING entries whose function no longer takes the run config: {stale}"


def test_a_function_below_the_loop_taking_the_run_config_is_caught():
  offender = (
      "def padding_fraction(config, lengths):\n"
      "  return config.train.batch_size\n"
      "def renamed(settings):\n"  # another name, used as the run config
      "  return settings.get('eval').every\n"
      "def seeds(cfg: ml_collections.ConfigDict):\n"
      "  return cfg\n"
      "def steps(run):\n"
      "  return run.train.num_steps\n"
      "def is_eval_step(step, schedule):\n"  # a section through an alias
      "  e = schedule.eval\n  return step % e.every == 0\n"
      "def handed_on(settings):\n"
      "  return tasks.from_config(settings).vocab()\n")
  lines = offences("data/packing.py", offender)
  assert [line.split(":")[1].strip().split(" ")[0] for line in lines] == [
      "padding_fraction(config)", "renamed(settings)", "seeds(cfg)", "steps(run)",
      "is_eval_step(schedule)", "handed_on(settings)"]
  assert lines[0] == ("sg_jax/data/packing.py: padding_fraction(config) takes the run config; give "
                      "it the typed options it reads (built once at the top by a from_config "
                      "builder)")
  # The same function is allowed above the loop, as a builder or as a check, and a parameter
  # named config of another type (a ModelConfig) or reading no run field is not the run config.
  assert offences("train.py", offender) == []
  allowed = ("class Options:\n"
             "  @classmethod\n"
             "  def from_config(cls, config):\n    return config.train\n"
             "def mixes_from_config(config):\n  return config.data\n"
             "def validate(config):\n  assert config.num_seeds\n"
             "def forward(params, config: ModelConfig):\n  return config.d_model\n"
             "def layout(section: ml_collections.ConfigDict):\n  return section.batch_size\n"
             "def widths(model_config, data):\n  return model_config.d_model, data.lengths\n"
             "def report(inputs, context):\n  return inputs.seeds, context.model.apply\n"
             "def seed_pools(options, split):\n"
             "  return options.task.constructions, options.first_seed\n")
  assert offences("data/packing.py", allowed) == []
