"""Shared pytest configuration: custom markers."""


def pytest_configure(config):
  config.addinivalue_line("markers", "tfds: builds TFDS datasets (imports tensorflow_datasets)")
