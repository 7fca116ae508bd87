"""The decoder pieces our families share (after torchtitan's ``models/common``), each module by its full name:

- ``rope``: RoPE tables (Llama 3.1's frequency scaling included) and their application;
- ``norm``: RMSNorm, numerically transformers' ``LlamaRMSNorm``;
- ``attention``: ``SelfAttention``, the causal forward and the KV-cache forward every family's attention
  runs, and ``RotaryAttention`` (RoPE, GQA, optional QK-norm), the RoPE families';
- ``block``: ``PreNormBlock`` (x + attn(norm(x)), then + mlp(norm(x))), ``DecoderBlock`` (Llama's layer) and
  ``SwiGLU``;
- ``lm``: ``CausalLM``, the forward / ``forward_blocks`` / ``head`` / ``forward_cached`` skeleton, and
  ``RotaryCausalLM``, the RoPE families' model;
- ``hf``: ``StateMap``, our state dict under transformers' names and back.

GPT-2 (``gpt2/``) uses ``SelfAttention``, ``PreNormBlock``, ``CausalLM`` and ``StateMap``; Llama (``llama/``)
and the MoE family (``moe/``) all of them. How a new family uses them: docs/model-families.md.
"""
