"""The Open Inference Protocol over gRPC: the .proto, its generated stubs, and the codec."""
