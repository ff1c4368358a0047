"""Generated protobuf/gRPC stubs (make proto). Do not edit."""
