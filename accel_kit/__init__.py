"""accel-kit: reproducible benchmarks of LLM training on AI accelerators.

Importing the package imports torch but never a vendor SDK: device adapters are loaded
lazily by name (see ``accel_kit.devices``).
"""
__version__ = "0.1.0"

SCHEMA_VERSION = 1  # of the result records written by accel_kit.results
