"""Generated protobuf/gRPC stubs for proto/asyncdapo/contracts/v1 (`make proto`); do not edit."""
