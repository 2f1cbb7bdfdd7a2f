"""hf-llama, hf-gemma, hf-t5, hf-olmo2, hf-cohere, hf-nemotron: the norm classes of Hugging Face
transformers' model families (opt-in)."""
