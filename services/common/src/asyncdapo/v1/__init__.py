"""Generated protobuf/gRPC stubs for proto/asyncdapo/v1 (`make proto`); do not edit."""
