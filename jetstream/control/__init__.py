"""The global controller, the site controllers, their thin gRPC servicers, and the CLI's remote
calls. Coming in the control-plane issue."""
