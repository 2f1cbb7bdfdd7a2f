"""torch-eager, torch-nn, torch-functional, torch-compile: PyTorch's own normalization layers and
functions, eager and compiled by inductor. ``modules`` (the torch.nn module for a case) is public:
onnx-export exports those modules."""
