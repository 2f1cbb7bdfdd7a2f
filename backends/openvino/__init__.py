"""openvino, openvino-default: OpenVINO's CPU runtime running the onnx family's graphs (opt-in)."""
