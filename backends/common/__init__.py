"""What several backend families share: the torch tensor plumbing (torch, onnx-export, triton, keras on
torch, the Hugging Face classes), ONNX Runtime sessions (onnx, openvino), JAX arrays (flax, keras on
JAX), parameter translations and the host CPU's name. It imports no family."""
