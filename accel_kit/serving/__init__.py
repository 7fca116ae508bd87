"""Serving: a real OpenAI-compatible server on the loopback under load (the serve kind's machinery).

``model_dir`` writes a preset as a folder a server loads, ``server`` starts and stops an engine's server,
``load`` drives it (fixed concurrency or Poisson arrivals, streamed completions), ``stats`` reduces the
requests to the point's metrics. The kind itself is ``accel_kit.engine.serve_measure``.
"""
