"""keras, keras-jax: Keras 3 layers on its torch and JAX backends, each backend in a persistent child
process (opt-in)."""
