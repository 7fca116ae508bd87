"""Helpers shared by the tests of accel_kit.data: a small corpus, writing JSONL, reading prepared tokens."""
import json

import numpy as np

from accel_kit.data import read_meta


DOCS = ["Hello world.", "Second document,\nwith two lines.", "Ünïcödé 🙂 and <tags>"]


def write_jsonl(path, texts, opener=open):
    with opener(path, "wt", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text, "id": 1}) + "\n")
    return path


def read_tokens(folder, split="train"):
    meta = read_meta(folder)
    return np.fromfile(folder / meta["splits"][split]["file"], dtype=meta["dtype"])


def expected_stream(tokenizer, texts):
    return [token for text in texts for token in tokenizer.encode(text) + [tokenizer.eos_id]]
