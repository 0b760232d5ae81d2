"""Generated protobuf and gRPC code for protos/jetstream/v1 (scripts/gen_protos.py; do not edit)."""
