"""The data plane: what moves a query's windows from the sites' local stages to its results.

Below the site runtime, each module one job:

- :mod:`~jetstream.dataplane.partials`: a window's partial rows as a batch, and its codec
  (``jetstream.v1.PartialBatch``); :mod:`~jetstream.dataplane.keydict`, the key dictionary
  that sends each key once a link;
- :mod:`~jetstream.dataplane.transport`: the sender (``PartialSender``) and the receiving
  ``DataPlane`` service; :mod:`~jetstream.dataplane.router`, a sender's split of a window over
  its parent's key-partitioned workers; :mod:`~jetstream.dataplane.asks`, TPUT's rounds on the
  wire;
- :mod:`~jetstream.dataplane.merger`: a site's merge of its inputs' windows;
  :mod:`~jetstream.dataplane.uplink`, a run's link to its parent;
  :mod:`~jetstream.dataplane.finish`, the root's final step;
- :mod:`~jetstream.dataplane.cubes`: what a site keeps of what it sends, rolled up;
  :mod:`~jetstream.dataplane.history`, questions about the past answered from it;
- :mod:`~jetstream.dataplane.options`, :mod:`~jetstream.dataplane.run` and
  :mod:`~jetstream.dataplane.site`: what a site is told to run and how, one query's run, and
  the site's runtime that keeps them.

The local stage (the Spark job that makes a site's partials) is :mod:`jetstream.stage`; the
control plane that deploys all this is :mod:`jetstream.control`.
"""
