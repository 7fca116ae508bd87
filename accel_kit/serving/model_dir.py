"""A preset written as a folder a server loads: transformers' config, random weights, tokenizer files.

Both engines (``transformers serve``, ``vllm serve``) load a model by folder, the way a hub download
lies on disk, so any preset of our families (or an ``hf:`` config) serves by being written as one:
the family's ``hf_config`` saved with ``save_pretrained``, weights drawn from a seed (vLLM's
``--load-format dummy`` needs none), and the GPT-2 byte-level BPE the project embeds as the
tokenizer. A vocabulary narrower than GPT-2's keeps the BPE's first ids (the 256 bytes, then the
merges that make ids below the width) and its last id as end of text, so every id the tokenizer
gives is a row of the embedding.
"""
from __future__ import annotations

from pathlib import Path

from accel_kit.errors import ParameterError

#: the fewest ids the byte-level BPE needs: the 256 single bytes, plus end of text
MIN_VOCAB = 257


def write_model_dir(preset: str, folder: Path, *, weights: bool = True, seed: int = 0) -> Path:
    """Write ``preset`` into ``folder`` (config.json, tokenizer files, and ``weights`` drawn from ``seed``).

    Returns:
        ``folder``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from accel_kit.models.registry import family_of, get_config

    cfg = get_config(preset)
    family = family_of(cfg)
    hf = family.hf_config(cfg)
    hf.use_cache = True  # a server decodes with its KV cache; our training configs turn it off
    folder.mkdir(parents=True, exist_ok=True)
    vocab = int(hf.vocab_size)
    # the tokenizer's real width: a padded vocabulary's extra rows are never produced by the BPE
    n_ids = min(vocab, family.shape(cfg).vocab_size)
    eos_id = write_tokenizer(folder, n_ids)
    hf.eos_token_id = hf.bos_token_id = eos_id
    if weights:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32)
        model.generation_config.eos_token_id = eos_id
        model.save_pretrained(folder)
    else:
        hf.save_pretrained(folder)
    return folder


def write_tokenizer(folder: Path, n_ids: int) -> int:
    """Save the GPT-2 byte-level BPE, cut to ``n_ids`` ids, as transformers' tokenizer files; returns the
    end-of-text id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from accel_kit.tokenizers.gpt2 import EOS_TOKEN, VOCAB_SIZE, read_gpt2_vocab

    if n_ids < MIN_VOCAB:
        raise ParameterError(f"a vocabulary of {n_ids} ids cannot hold the byte-level BPE's {MIN_VOCAB} "
                             "(256 bytes and end of text): this preset cannot be served")
    vocab, merges = read_gpt2_vocab()
    if n_ids < VOCAB_SIZE:
        # GPT-2's merge i makes id 256 + i, so the first n_ids - 257 merges make exactly the ids kept
        kept = n_ids - 1
        vocab = {tok: i for tok, i in vocab.items() if i < kept}
        merges = merges[:kept - 256]
        vocab[EOS_TOKEN] = kept
    eos_id = vocab[EOS_TOKEN]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN,
                                   unk_token=EOS_TOKEN, model_max_length=10**9)
    # a plain template so /v1/chat/completions works too: the messages' text, one after another
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(folder)
    return eos_id
