"""The package version, importable from anywhere without importing the package face."""

__version__ = "0.1.0"
