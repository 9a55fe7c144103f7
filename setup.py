"""Package layout: engine/, collectors/ and dashboard/ install as mixdiag.engine, mixdiag.collectors
and mixdiag.dashboard, so no generic top-level module (``engine``, ``dashboard``) lands in
site-packages. Everything else is declared in pyproject.toml."""
from setuptools import find_packages, setup

MAPPED = {"mixdiag": "mixdiag", "mixdiag.engine": "engine",
          "mixdiag.collectors": "collectors", "mixdiag.dashboard": "dashboard"}

packages = []
for name, folder in MAPPED.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=MAPPED, include_package_data=True)
