"""onnxruntime, onnxruntime-gn18, onnxruntime-contrib, onnx-export, onnx-export-opset21,
onnx-export-optimized: hand-built ONNX graphs and torch.onnx exports run by ONNX Runtime. ``graphs``
(one graph builder for every ONNX runtime) is public: OpenVINO runs the same graphs."""
