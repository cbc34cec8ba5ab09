"""The lean on-device side of edgeopt: runs a model in its runtime and measures it.

Everything under ``edgeopt.device`` imports only numpy, the standard library and the runtime a model
needs (openvino or onnxruntime), so it runs on a device without torch, nncf or click.
"""
