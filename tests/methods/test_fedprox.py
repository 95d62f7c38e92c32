"""Tests of pfl/methods/fedprox.py: the registry-wide properties (tests/methods/registry_properties.py),
which tests/methods/conftest.py adds to each method module's test file, are all it needs."""
