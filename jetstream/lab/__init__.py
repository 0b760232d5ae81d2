"""The lab: what shows and measures JetStream-py rather than runs it. The CDN log generator
(``loggen``), the live demo (``demo``), the emulated wide area (``emulate``), the benchmarks
against the gzip backhaul (``bench``, ``latency_bench``, and the backhaul's own Spark job,
``baseline``), and the soak (``soak``). The control plane (``jetstream.control``) does not
import it; the CLI's ``demo``, ``emulate``, ``bench`` and ``gen-logs`` commands do."""
