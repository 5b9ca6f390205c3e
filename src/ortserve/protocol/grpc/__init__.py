"""The Open Inference Protocol over gRPC: the .proto, its generated message classes, and the codec."""
