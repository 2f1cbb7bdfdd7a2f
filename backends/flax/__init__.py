"""flax: Flax linen's norm layers under jax.jit, gradients through jax.vjp (opt-in)."""
