"""The embedded default text corpus, and how to prepare OpenWebText instead.

The paper (arXiv 2310.04607) pre-trains GPT-2 XL on OpenWebText. This machine-independent
default needs no download: the English reference prose that ships with every Python
(``pydoc_data.topics.topics``, ~80 topics, ~460 kB), one document per topic. It is far too
small to train a useful model, but it exercises the whole pipeline and gives real (not
uniform random) token statistics for throughput runs.

Preparing OpenWebText when you have it locally
----------------------------------------------
Either a Hugging Face ``save_to_disk`` folder (needs ``pip install datasets``)::

    # once, on a machine with internet access:
    #   import datasets
    #   datasets.load_dataset("openwebtext").save_to_disk("/data/openwebtext")
    accel-kit prepare text /data/openwebtext --out /data/owt-gpt2

or JSON Lines files with a ``"text"`` field (plain or gzip, a folder of them is fine)::

    accel-kit prepare text /data/owt/*.jsonl.gz --out /data/owt-gpt2

From Python: ``accel_kit.data.prepare_text(["/data/openwebtext"], "/data/owt-gpt2")``. The
result is ``train.bin`` / ``val.bin`` (uint16 GPT-2 ids, EOS 50256 after each document,
0.05% of documents held out) and ``meta.json``. OpenWebText's ~8M documents give ~9B tokens
(~18 GB of .bin); at the ~2 M tokens/s measured on 2 cores that is a bit over an hour, less
with more cores. Re-running with the same inputs returns at once.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from accel_kit.atomic import write_bytes_atomic
from accel_kit.json_types import JSONObject

DEFAULT_CORPUS_NAME = "pydoc_topics.jsonl"


def default_text_documents() -> list[tuple[str, str]]:
    """The embedded corpus as ``(topic, text)`` pairs, sorted by topic, empty ones dropped."""
    from pydoc_data.topics import topics

    return [(name, topics[name]) for name in sorted(topics) if topics[name].strip()]


def default_text_corpus(directory: str | os.PathLike) -> Path:
    """Write the embedded corpus as JSON Lines (``{"topic": ..., "text": ...}`` per line).

    The file's content depends only on the Python version (pydoc's topics change between
    releases), so repeated calls produce identical bytes and a prepared folder is reused.

    Args:
        directory: folder to write into (created if needed).

    Returns:
        The path of ``pydoc_topics.jsonl`` inside ``directory``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / DEFAULT_CORPUS_NAME
    lines = [json.dumps({"topic": name, "text": text}, ensure_ascii=False)
             for name, text in default_text_documents()]
    content = ("\n".join(lines) + "\n").encode("utf-8")
    # Only rewrite when different, so the file's mtime (and any watcher) stays quiet.
    if not path.is_file() or path.read_bytes() != content:
        write_bytes_atomic(path, content)
    return path


def prepare_default_text(out_dir: str | os.PathLike, **options: object) -> JSONObject:
    """Prepare the embedded corpus into ``out_dir`` (the corpus file is kept beside it).

    Args:
        out_dir: output folder for :func:`accel_kit.data.prepare_text`.
        **options: passed on to ``prepare_text`` (``tokenizer``, ``val_fraction`` ...).

    Returns:
        The meta dict.
    """
    from accel_kit.data.text import prepare_text

    out_dir = Path(out_dir)
    corpus = default_text_corpus(out_dir.absolute().parent / f".{out_dir.name}.corpus")
    return prepare_text([corpus], out_dir, **options)
