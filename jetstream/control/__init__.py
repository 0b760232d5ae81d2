"""The global controller, the site controllers and their workers, their thin gRPC servicers,
the dashboard, the launcher that starts a topology's processes on one machine, and the CLI's
remote calls. The demo, the benchmarks and the emulator are in ``jetstream.lab``."""
