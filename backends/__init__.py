"""Built-in backend adapters, registered through the ``normconf.backends`` entry points like any other.

One subpackage per family (torch, onnx, triton, flax, keras, openvino, transformers); ``common`` holds
only what several families share. Each adapter imports its framework (torch, ...) itself and uses only
``conformance``'s adapter and model layers; nothing here is imported by ``conformance``, and no family
imports another's modules except the public ones the import contracts in pyproject.toml name.
"""
