"""Every `python -m sg_jax...` command of README.md and docs/ (how-to and results pages), dry-run
so that it cannot go stale: its flags must exist and parse, and `sg_jax.main`'s config must build
and validate (`--dry_run`: nothing is trained and no workdir is touched).

Commands are read from fenced shell blocks (backslash continuations joined, `for v in a b; do`
variables set to their first value) and from inline code spans of README.md. A synopsis (an
argument `...`, `[--optional]` or `<placeholder>`) or a config file outside configs/ (the
user's own, as in the docs' how-tos) is checked for its flag names only.

Run as a script, this file is the checker of one command module (one subprocess each, since
the commands define clashing absl flags): `python tests/repo/test_doc_commands.py MODULE JSON`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = re.compile(r"^(sg_jax(?:\.\w+)*)$")
_SHELL_LANGS = ("", "bash", "sh", "shell", "console")


def _fenced_blocks(text: str):
  """(first line number, block text) of the fenced shell blocks of a markdown text."""
  inside, lang, start, body = False, "", 0, []
  for number, line in enumerate(text.split("\n"), 1):
    if line.strip().startswith("```"):
      if inside:
        if lang in _SHELL_LANGS:
          yield start, "\n".join(body)
        inside, body = False, []
      else:
        inside, lang, start = True, line.strip()[3:].strip(), number
    elif inside:
      body.append(line)


def _commands_of_line(line: str) -> list[tuple[str, list[str]]]:
  """[(module, argv)] of the `python -m sg_jax...` commands on one shell line."""
  lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
  lexer.whitespace_split = True
  tokens = list(lexer)
  found = []
  for i, token in enumerate(tokens[:-2]):
    if token in ("python", "python3") and tokens[i + 1] == "-m" and COMMAND.match(tokens[i + 2]):
      argv = []
      for arg in tokens[i + 3:]:
        if arg in (";", "&", "&&", "|", "||", "|&", ";;"):
          break
        argv.append(arg)
      found.append((tokens[i + 2], argv))
  return found


def doc_commands() -> list[dict]:
  """[{'where': 'file:line', 'module', 'argv', 'synopsis'}] of README.md and docs/**/*.md."""
  out = []
  paths = [os.path.join(ROOT, "README.md")] + sorted(
      glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
  for path in paths:
    text = open(path, encoding="utf-8").read()
    where = os.path.relpath(path, ROOT)
    sources = list(_fenced_blocks(text))
    if where == "README.md":  # its headline commands are inline code spans
      sources += [(text[:m.start()].count("\n") + 1, m.group(1))
                  for m in re.finditer(r"`(python -m sg_jax[^`]*)`", text)]
    for start, block in sources:
      loops = {m.group(1): m.group(2).split()[0]
               for m in re.finditer(r"for (\w+) in ([^;\n]+);", block)}
      block = re.sub(r"\\\n\s*", " ", block)
      block = re.sub(r"\$\{?(\w+)\}?", lambda m: loops.get(m.group(1), m.group(0)), block)
      for line in block.split("\n"):
        if "#" in line:  # a comment (no command quotes a '#')
          line = line[:line.index("#")]
        if "sg_jax" not in line:  # e.g. a folder listing in a plain block
          continue
        for module, argv in _commands_of_line(line):
          synopsis = any(a == "..." or a.startswith(("[", "<")) or "<" in a or "=..." in a
                         or "$" in a for a in argv)
          config = [a.split("=", 1)[1].split(":")[0] for a in argv if a.startswith("--config=")]
          if config and not config[0].startswith("configs/"):
            synopsis = True  # the user's own config file (a how-to)
          out.append({"where": f"{where}:{start}", "module": module, "argv": argv,
                      "synopsis": synopsis})
  return out


def test_the_docs_commands_are_found():
  commands = doc_commands()
  modules = {c["module"] for c in commands}
  assert {"sg_jax.main", "sg_jax.analyze", "sg_jax.report", "sg_jax.prune", "sg_jax.prune_core",
          "sg_jax.sweep", "sg_jax.data", "sg_jax.results"} <= modules
  headline = {"where": "README.md", "module": "sg_jax.main", "synopsis": False,
              "argv": ["--config=configs/question.py:grok_cpu", "--workdir=runs/grok_cpu"]}
  assert any({**c, "where": c["where"].split(":")[0]} == headline for c in commands)
  assert len(commands) >= 100
  # a loop variable takes its first value; a quoted command inside an argument is no command
  loop = [c for c in commands if c["where"].startswith("docs/results/objectives.md")
          and "--workdir=runs/objectives/lm" in c["argv"]]
  assert loop and loop[0]["argv"][0] == "--config=configs/question.py:grok_cpu,objective=lm"
  assert all(c["argv"][:1] != ["--config=..."] or c["synopsis"] for c in commands)


@pytest.mark.slow
def test_every_docs_command_parses():
  by_module: dict[str, list[dict]] = {}
  # Stale commands the check must catch (and only these may be reported).
  canaries = [
      ("sg_jax.main", ["--config=configs/question.py:quick", "--workdir=w",
                       "--config.train.num_stepz=3"]),  # an unknown config field
      ("sg_jax.main", ["--config=configs/question.py:quick", "--workdir=w",
                       "--config.optim.learning_rate=-1"]),  # built, but invalid
      ("sg_jax.main", ["--config=configs/question.py:quickk", "--workdir=w"]),  # no such preset
      ("sg_jax.analyze", ["--workdir=w", "--num_sentencez=3"]),  # a renamed flag
      ("sg_jax.report", ["--root=r", "--threshold=high"]),  # not a number
      ("sg_jax.aot", ["--config=configs/tense.py:tiny", "--config.model.dtypo=bfloat16",
                      "--target=v5e:1x1"]),  # an unknown config field of another command
  ]
  for module, argv in canaries:
    by_module.setdefault(module, []).append(
        {"where": "canary", "module": module, "argv": argv, "synopsis": False})
  for command in doc_commands():
    by_module.setdefault(command["module"], []).append(command)
  env = dict(os.environ, PYTHONPATH=ROOT)
  procs = {module: subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), module, json.dumps(commands)], cwd=ROOT,
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for module, commands in by_module.items()}
  problems = []
  for module, proc in procs.items():
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{module}: {err[-2000:]}"
    problems += json.loads(out.strip().split("\n")[-1])
  caught = [p for p in problems if p.startswith("canary:")]
  assert len(caught) == len(canaries), "\n".join(caught)
  assert "num_stepz" in caught[0] and "learning_rate must be > 0" in caught[1]
  assert "quickk" in caught[2] and "num_sentencez" in caught[3] and "threshold" in caught[4]
  assert "dtypo" in caught[5]
  stale = [p for p in problems if not p.startswith("canary:")]
  assert not stale, "\n".join(stale)


# ---------------------------------------------------------------------------------------------
# The checker of one command module (a subprocess of the test above).


class _DryRun(Exception):
  """Raised instead of a command's work once its arguments have parsed."""


def _check_module(module_name: str, commands: list[dict]) -> list[str]:
  """['file:line: problem'] of `commands`, all of `module_name`."""
  # pylint: disable=import-outside-toplevel
  import importlib
  from absl import flags
  from ml_collections import config_flags

  if module_name == "sg_jax.main":
    from sg_jax.runtime import host_devices
    host_devices.configure_cpu_devices()
  module = importlib.import_module(
      module_name + (".__main__" if module_name in ("sg_jax.report", "sg_jax.results",
                                                    "sg_jax.data") else ""))
  for name in ("define_flags", "_define_flags"):
    if hasattr(module, name):
      getattr(module, name)()
  problems = []
  for command in commands:
    argv = [module_name] + command["argv"]
    where = f"{command['where']}: python -m {module_name} {' '.join(command['argv'])}"
    if module_name == "sg_jax.analysis.onsets":  # argparse: parse, then stop before the work
      def stop(*args, **kwargs):
        raise _DryRun()
      module.workdir_onsets = stop
      try:
        module.main(command["argv"])
      except _DryRun:
        pass
      except SystemExit as e:
        problems.append(f"{where}: exit {e.code}")
      continue
    args = command["argv"][:command["argv"].index("--")] if "--" in command["argv"] else \
        command["argv"]  # after `--`: flags of another command (sweep passes them to main)
    names = [a[2:].split("=")[0] for a in args if a.startswith("--")]
    unknown = [name for name in names if name and not name.startswith("config.")
               and name not in flags.FLAGS
               and not (name.startswith("no") and name[2:] in flags.FLAGS)]
    problems += [f"{where}: no flag --{name}" for name in unknown]
    if command["synopsis"] or unknown:
      continue
    flags.FLAGS.unparse_flags()
    try:
      if module_name == "sg_jax.main":
        # config_flags defines the --config.<field> flags from the command line it is given when
        # the flag is defined (sys.argv by default): each command's config is built with a fresh
        # flag set; the other flags parse globally.
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        module.parse_flags([a for a in argv if a not in overrides])
        config_argv = [module_name] + [a for a in argv[1:] if a.startswith("--config")]
        fresh = flags.FlagValues()
        config_flags.DEFINE_config_file("config", None, "", flag_values=fresh, lock_config=True,
                                        sys_argv=config_argv)
        fresh(config_argv)
        module.dry_run(fresh.config)
      else:
        # `--config.<field>` overrides of another command with a --config flag (aot): the
        # config is built with a fresh flag set, as for sg_jax.main, the other flags globally.
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        flags.FLAGS([a for a in argv if a not in overrides])
        if overrides:
          config_argv = [module_name] + [a for a in argv[1:] if a.startswith("--config")]
          fresh = flags.FlagValues()
          config_flags.DEFINE_config_file("config", None, "", flag_values=fresh,
                                          lock_config=True, sys_argv=config_argv)
          fresh(config_argv)
    except SystemExit as e:
      problems.append(f"{where}: {e.code}")
    except (flags.Error, ValueError, KeyError, AttributeError) as e:
      problems.append(f"{where}: {type(e).__name__}: {str(e).splitlines()[-1]}")
  return problems


if __name__ == "__main__":
  print(json.dumps(_check_module(sys.argv[1], json.loads(sys.argv[2]))))
