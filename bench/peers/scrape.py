"""The Prometheus side of the `trimq-metrics` system: scrape `/metrics` as a Prometheus server
would, and read exact counts back so a row can never measure a broker that does not count.

`Scraper` is a thread of the harness that GETs every endpoint each `interval` seconds (5 s, as
the compose cluster's deploy/prometheus.yml) for as long as the system runs; parsing uses
`prometheus_client`'s own text parser.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

INTERVAL_S = 5.0


def fetch(url: str, timeout: float = 5.0) -> str:
    """One scrape of `url` (http://127.0.0.1:PORT/metrics): its text."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
    return body.decode()


def sample_value(text: str, name: str, labels: Mapping[str, str]) -> float | None:
    """The value of sample `name` whose labels include `labels` (summed over the matches),
    None when there is none."""
    total: float | None = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total = (total or 0.0) + s.value
    return total


class Scraper:
    """Scrape `urls` every `interval` s in a thread until `stop`; counts scrapes and failures
    (a failure is kept, not raised: the run goes on and the report shows it)."""

    def __init__(self, urls: Sequence[str], interval: float = INTERVAL_S) -> None:
        self.urls = list(urls)
        self.interval = interval
        self.scrapes = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for url in self.urls:
                try:
                    fetch(url)
                    self.scrapes += 1
                except OSError as exc:
                    self.failures.append(f"{url}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
