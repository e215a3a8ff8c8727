"""Text Embeddings Inference's gRPC services (tei.v1) beside HTTP: `infinity serve --grpc-port N`."""
