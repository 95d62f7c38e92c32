"""Ships the checkout's ``conf/`` inside the package, as ``pfl/conf`` (``pfl.runner.config_files`` finds it
there), so an installed pfl has its experiment configs. Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, find_packages, setup

CONF = ["pfl.conf", *(f"pfl.conf.{name}" for name in find_namespace_packages("conf"))]

setup(
    packages=[*find_packages(include=["pfl", "pfl.*"]), *CONF],
    package_dir={"pfl.conf": "conf"},
    # fit_help.json: the index `pfl fit --help` is rendered from (pfl.runner.fit_help)
    package_data={"pfl": ["py.typed"], "pfl.runner": ["fit_help.json"], **{package: ["*.yaml"] for package in CONF}},
)
