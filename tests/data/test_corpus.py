"""accel_kit.data.corpus: the embedded pydoc corpus."""
from accel_kit.data import default_text_corpus, prepare_default_text
from accel_kit.data.corpus import default_text_documents


def test_default_pydoc_corpus(tmp_path, gpt2):
    meta = prepare_default_text(tmp_path / "out", progress=False)
    documents = [text for _, text in default_text_documents()]
    assert meta["documents"] == len(documents) > 50
    assert meta["tokens"] == sum(len(ids) + 1 for ids in gpt2.encode_batch(documents))
    assert meta["splits"]["val"]["documents"] >= 1  # a positive fraction gives val a document
    assert default_text_corpus(tmp_path / "again").read_bytes() == \
        (tmp_path / ".out.corpus" / "pydoc_topics.jsonl").read_bytes()
