"""The service's Prometheus metrics, in a registry of its own (one per service, so that several
in one process, as in the tests, never collide)."""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client as prom

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
  """requests by route and status, suggestion latency, batch sizes, queue depth, model step,
  compilations, draining, requests answered without their user's past."""

  def __init__(self, max_batch: int, compilations: Callable[[], int] = lambda: 0):
    self.registry = prom.CollectorRegistry()
    r = self.registry
    self.requests = prom.Counter('mtn_serve_requests', 'HTTP requests answered, by route and '
                                 'status', ['route', 'status'], registry=r)
    # By status: an overloaded service's quick refusals (503) would pull the answers' mean down.
    self.latency = prom.Histogram('mtn_serve_suggest_seconds', 'Time to answer POST '
                                  '/v1/suggest, by status', ['status'],
                                  buckets=LATENCY_BUCKETS, registry=r)
    buckets = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_batch})
    self.batch_size = prom.Histogram('mtn_serve_batch_size', 'Requests per batch run (before '
                                     'padding)', buckets=[b for b in buckets if b <= max_batch],
                                     registry=r)
    self.batch_seconds = prom.Histogram('mtn_serve_batch_seconds', 'Time to run a batch',
                                        buckets=LATENCY_BUCKETS, registry=r)
    self.queue_depth = prom.Gauge('mtn_serve_queue_depth', 'Requests waiting for a batch',
                                  registry=r)
    self.model_step = prom.Gauge('mtn_serve_model_step', 'Checkpoint step of the model '
                                 'answering', registry=r)
    self.reloads = prom.Counter('mtn_serve_reloads', 'Model reloads, by outcome', ['outcome'],
                                registry=r)
    self.compilations = prom.Gauge('mtn_serve_compilations', 'Programs JAX compiled in this '
                                   'process (flat after warm-up)', registry=r)
    self.compilations.set_function(compilations)
    self.draining = prom.Gauge('mtn_serve_draining', '1 while draining after SIGTERM',
                               registry=r)
    self.history_errors = prom.Counter('mtn_serve_history_errors', 'Requests answered '
                                       "without their user's past: the history database "
                                       'failed (locked by another process, unwritable)',
                                       registry=r)

  def render(self) -> tuple[bytes, str]:
    return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
