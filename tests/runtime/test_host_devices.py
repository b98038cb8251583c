"""`host_devices.configure_cpu_devices` splits CPU-only hosts only: where JAX will run on a GPU
or TPU (JAX_PLATFORMS, or a plugin together with its device file) it leaves XLA_FLAGS alone.
The environment, device files and plugins are faked; JAX is not started."""

import sys

import pytest

from sg_jax.runtime import host_devices


@pytest.fixture
def fresh(monkeypatch, tmp_path):
  """A process as before JAX starts, on a host with no accelerator: returns `setup(platforms=None,
  gpu_file=False, plugin=False, tpu_file=False, libtpu=False)` -> configure_cpu_devices()."""
  for name in ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_PLATFORM_NAME", "TPU_LIBRARY_PATH"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.delitem(sys.modules, "jax", raising=False)  # restored after the test
  monkeypatch.setattr(host_devices, "_configured", None)
  monkeypatch.setattr(host_devices, "GPU_DEVICE_FILES", (str(tmp_path / "nvidia0"),))
  monkeypatch.setattr(host_devices, "TPU_DEVICE_GLOBS", (str(tmp_path / "accel*"),))

  def setup(platforms=None, gpu_file=False, plugin=False, tpu_file=False, libtpu=False):
    if platforms is not None:
      monkeypatch.setenv("JAX_PLATFORMS", platforms)
    if gpu_file:
      (tmp_path / "nvidia0").write_text("")
    if tpu_file:
      (tmp_path / "accel0").write_text("")
    if libtpu:
      monkeypatch.setenv("TPU_LIBRARY_PATH", str(tmp_path / "libtpu.so"))
    monkeypatch.setattr(host_devices, "_jax_plugins", lambda: ["xla_cuda13"] if plugin else [])
    return host_devices.configure_cpu_devices(3)

  return setup


@pytest.mark.parametrize("host", [
    {},  # a plain CPU machine
    {"platforms": "cpu", "gpu_file": True, "plugin": True},  # GPU there, JAX told to use the CPU
    {"gpu_file": True},  # an NVIDIA device without JAX's CUDA plugin: JAX stays on the CPU
    {"plugin": True},  # the CUDA plugin on a machine without a GPU
    {"tpu_file": True},  # a TPU device without libtpu
])
def test_cpu_only_hosts_get_the_device_count_flag(fresh, monkeypatch, host):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=true")
  assert fresh(**host) is True
  assert host_devices.os.environ["XLA_FLAGS"] == (
      "--xla_cpu_use_thunk_runtime=true --xla_force_host_platform_device_count=3")
  assert host_devices._configured == 3


@pytest.mark.parametrize("host", [
    {"platforms": "cuda"}, {"platforms": "tpu"}, {"platforms": "cuda,cpu"},
    {"platforms": " GPU "},
    {"gpu_file": True, "plugin": True},  # JAX_PLATFORMS unset: JAX picks the GPU
    {"tpu_file": True, "libtpu": True},  # a TPU VM
])
def test_accelerator_hosts_are_left_alone(fresh, host):
  assert fresh(**host) is False
  assert "XLA_FLAGS" not in host_devices.os.environ
  assert host_devices._configured is None
  assert host_devices.share_among_processes(2) is None  # nothing to share either


def test_legacy_platform_variable_and_plugin_listing(fresh, monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_PLATFORM_NAME", "gpu")
  assert host_devices.accelerator_expected() is True
  monkeypatch.setenv("JAX_PLATFORM_NAME", "cpu")
  assert host_devices.accelerator_expected() is False
  # A plugin module in the `jax_plugins` namespace package, as jax-cuda13-pjrt installs one.
  (tmp_path / "site" / "jax_plugins" / "xla_fake").mkdir(parents=True)
  (tmp_path / "site" / "jax_plugins" / "xla_fake" / "__init__.py").write_text("")
  before = host_devices._jax_plugins()
  assert "xla_fake" not in before
  monkeypatch.syspath_prepend(str(tmp_path / "site"))
  assert "xla_fake" in host_devices._jax_plugins()
