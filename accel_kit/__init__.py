"""accel-kit: reproducible benchmarks of LLM training on AI accelerators.

Importing the package imports torch but never a vendor SDK: device adapters are loaded
lazily by name (see ``accel_kit.devices``).
"""
__version__ = "0.1.0"

# Of the result records written by accel_kit.results. 2: a record names its point's ``kind`` (train,
# block, ...) and its metrics are the names declared in accel_kit.metrics; a version-1 record is read
# as version 2 (its kind from its study: results.upgrade).
SCHEMA_VERSION = 2
