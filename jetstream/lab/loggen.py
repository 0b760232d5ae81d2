"""Synthetic CDN access logs (CDN_LOG_SCHEMA) for demos, tests and benchmarks: realistic traffic,
vectorised with numpy so millions of lines take seconds, and the same seed gives the same bytes."""

from __future__ import annotations

import functools
import math
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from numbers import Integral, Real
from pathlib import Path

import numpy as np

from jetstream.errors import DataError, PlanError
from jetstream.schema import CDN_LOG_SCHEMA

__all__ = ["FlashCrowd", "LogSpec", "generate", "to_csv", "write_live", "write_logs"]

# Site and domain names go into CSV cells unquoted, so they may not hold commas or quotes.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DOMAIN = re.compile(r"^site(\d+)\.example\.com$")

# Object kinds a CDN serves: extension, share of URLs, median size in bytes, log-size spread.
_ASSETS = (("js", 0.25, 60e3, 1.0), ("css", 0.10, 20e3, 0.8), ("html", 0.10, 30e3, 0.7),
           ("jpg", 0.25, 120e3, 1.0), ("png", 0.15, 40e3, 1.2), ("woff2", 0.05, 35e3, 0.3),
           ("mp4", 0.10, 1.5e6, 0.8))
_EXT = tuple(a[0] for a in _ASSETS)
_KIND_CDF = np.cumsum([a[1] for a in _ASSETS])
_MEDIAN_BYTES = np.array([a[2] for a in _ASSETS])
_SIGMA_BYTES = np.array([a[3] for a in _ASSETS])
_MAX_BYTES = 200e6

_STATUS = np.array([200, 206, 304, 404, 500, 503])
_STATUS_CDF = np.cumsum([0.893, 0.03, 0.05, 0.017, 0.005, 0.005])  # 5xx: 1%
_HIT_RATIO = 0.85
_CLIENT_ZIPF = 0.8  # a few busy clients (NATs, crawlers) and a long tail
# First octets of client addresses: not private, loopback, shared, link-local or documentation.
_PUBLIC_FIRST_OCTETS = np.setdiff1d(np.arange(1, 224), [10, 100, 127, 169, 172, 192, 198, 203])
_HIT_MS, _MISS_MS = 4.0, 45.0  # median time to first byte; a miss goes back to the origin
_HIT_BYTES_PER_MS, _MISS_BYTES_PER_MS = 50_000.0, 10_000.0
# A small share of requests stall (retransmits, slow clients): a Pareto tail, cut at a timeout.
_TAIL_SHARE, _TAIL_MS, _TAIL_ALPHA, _TIMEOUT_MS = 0.01, 100.0, 1.5, 30_000.0
# Rows turned into text at a time when writing a file, so a big file needs no giant string.
_ROWS_PER_WRITE = 200_000


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise PlanError(msg)


@dataclass(frozen=True)
class FlashCrowd:
    """A surge of requests for one domain at one site, e.g. a launch or a viral video."""

    domain: str  # e.g. "site500.example.com"
    site: str  # the site where it surges
    start_s: float  # seconds after the start of the generated period
    end_s: float
    share: float = 0.3  # share of that site's requests going to the domain while it lasts

    def __post_init__(self) -> None:
        what = f"flash crowd {self.domain}@{self.site}"
        _require(isinstance(self.domain, str) and bool(_NAME.match(self.domain)),
                 f"{what}: domain {self.domain!r} must be a host name (letters, digits, "
                 "'.', '-'), e.g. 'site500.example.com'")
        _require(isinstance(self.site, str) and bool(_NAME.match(self.site)),
                 f"{what}: site {self.site!r} must be a site name (letters, digits, '.', "
                 "'-', '_')")
        _require(_is_number(self.start_s) and _is_number(self.end_s)
                 and 0 <= self.start_s < self.end_s,
                 f"{what}: start_s and end_s must be seconds with 0 <= start_s < end_s, "
                 f"got {self.start_s!r} and {self.end_s!r}")
        _require(_is_number(self.share) and 0 < self.share <= 1,
                 f"{what}: share must be in (0, 1], got {self.share!r}")


@dataclass(frozen=True)
class LogSpec:
    """The shape of the generated traffic; the same for every site."""

    domains: int = 2000  # domain popularity is Zipf(zipf) over this many domains
    zipf: float = 1.1
    urls_per_domain: int = 50  # URL popularity within a domain is Zipf(zipf) too
    clients_per_site: int = 5000
    #: Share of a site's requests that follow the site's own (shuffled) popularity order:
    #: regional differences between PoPs.
    regional: float = 0.3
    out_of_order_s: float = 2.0  # records are up to this many seconds out of event-time order
    late_fraction: float = 0.001  # share of records stamped late_s behind (after the watermark)
    late_s: float = 30.0
    flash_crowds: tuple[FlashCrowd, ...] = ()

    def __post_init__(self) -> None:
        for name in ("domains", "urls_per_domain", "clients_per_site"):
            value = getattr(self, name)
            _require(_is_int(value) and value >= 1,
                     f"log spec: {name} must be a whole number >= 1, got {value!r}")
        _require(_is_number(self.zipf) and self.zipf > 0,
                 f"log spec: zipf must be a number > 0 (about 1 for web traffic), "
                 f"got {self.zipf!r}")
        for name in ("regional", "late_fraction"):
            value = getattr(self, name)
            _require(_is_number(value) and 0 <= value <= 1,
                     f"log spec: {name} must be a share in [0, 1], got {value!r}")
        for name in ("out_of_order_s", "late_s"):
            value = getattr(self, name)
            _require(_is_number(value) and value >= 0,
                     f"log spec: {name} must be seconds >= 0, got {value!r}")
        given = self.flash_crowds
        crowds = tuple(given) if isinstance(given, Iterable) and not isinstance(given, str) \
            else None
        _require(crowds is not None and all(isinstance(c, FlashCrowd) for c in crowds),
                 f"log spec: flash_crowds must be a tuple of FlashCrowd, got {given!r}")
        object.__setattr__(self, "flash_crowds", crowds)  # a list would not hash


def generate(site: str, start_ms: int, duration_s: float, rate: float, spec: LogSpec,
             seed: int) -> dict[str, np.ndarray]:
    """The records one site logs in ``duration_s`` seconds from ``start_ms``, as columns.

    Parameters
    ----------
    site
        The site (``pop`` column); with ``seed`` it seeds the random generator, so the same
        seed gives the same logs and different sites differ.
    start_ms, duration_s, rate
        The period (epoch milliseconds, seconds) and records per second: ``rate * duration_s``
        records, rounded.
    spec
        The shape of the traffic; flash crowds count from ``start_ms``.
    seed
        A whole number >= 0.

    Returns
    -------
    dict
        numpy arrays named and ordered like ``CDN_LOG_SCHEMA``, one row per record in arrival
        order: ``ts``, ``status``, ``bytes`` int64, ``latency_ms`` float64 (two decimals), the
        rest object arrays of str.

    Raises
    ------
    PlanError
        If an argument is out of range.
    """
    _check_period(start_ms, duration_s, rate, seed)
    model = _site_model(_checked_site(site), spec, seed)
    duration_ms = _ms(duration_s)
    return _records(model, spec, seed, 0, start_ms, duration_ms, _count(rate, duration_ms),
                    start_ms)


def to_csv(columns: Mapping[str, np.ndarray]) -> str:
    """CSV text of ``columns``: a header row, then one line per record; floats with 2 decimals.

    Raises
    ------
    DataError
        If the columns have different lengths.
    """
    if not columns:
        return ""
    return ",".join(columns) + "\n" + _lines(columns)


def write_logs(out_dir: Path, sites: Sequence[str], *, start_ms: int, duration_s: float,
               rate: float, spec: LogSpec = LogSpec(), seed: int = 0, files: int = 1,
               on_file: Callable[[Path, int], None] | None = None) -> dict[str, list[Path]]:
    """Write ``out_dir/<site>/part-NNN.csv`` for each site: the period cut into ``files``
    consecutive files, ``rate`` records per second per site.

    Each file is written under a hidden temporary name and then renamed, as a log shipper
    would, so a reader watching the folder never sees half a file. ``on_file(path, records)``
    is called after each file. With ``files=1``, a site's file is ``to_csv(generate(...))``.

    Returns
    -------
    dict
        Each site's files, in time order.

    Raises
    ------
    PlanError
        If an argument is out of range, or a flash crowd is at none of ``sites``.
    """
    _check_period(start_ms, duration_s, rate, seed)
    _check_sites(sites, spec)
    _require(_is_int(files) and files >= 1,
             f"write_logs: files must be a whole number >= 1, got {files!r}")
    duration_ms = _ms(duration_s)
    bounds = [round(i * duration_ms / files) for i in range(files + 1)]
    width = max(3, len(str(files - 1)))
    written: dict[str, list[Path]] = {}
    for site in sites:
        model = _site_model(site, spec, seed)
        folder = Path(out_dir) / site
        folder.mkdir(parents=True, exist_ok=True)
        written[site] = []
        for part, (lo, hi) in enumerate(pairwise(bounds)):
            count = _count(rate, hi) - _count(rate, lo)
            columns = _records(model, spec, seed, part, start_ms + lo, hi - lo, count, start_ms)
            path = folder / f"part-{part:0{width}d}.csv"
            _write_atomically(path, columns)
            written[site].append(path)
            if on_file is not None:
                on_file(path, count)
    return written


def write_live(out_dir: Path, sites: Sequence[str], *, rate: float, spec: LogSpec = LogSpec(),
               seed: int = 0, chunk_s: float = 1.0, stop: threading.Event,
               clock: Callable[[], float] = time.time,
               on_chunk: Callable[[int, int], None] | None = None,
               on_file: Callable[[Path, int], None] | None = None) -> int:
    """Write logs as they happen until ``stop`` is set: every ``chunk_s`` seconds of ``clock``,
    each site's records of the chunk just past (event times = now) as a new file
    ``out_dir/<site>/live-<chunk start ms>.csv``, atomically renamed.

    Flash crowds count from the first call of ``clock``. ``on_file(path, records)`` is called
    after each file, as by :func:`write_logs`; ``on_chunk(chunk_index, records)`` after each
    chunk, with the records of every site. A chunk that falls behind the
    clock is written at once, so the rate holds on average.

    Returns
    -------
    int
        Records written.
    """
    _check_period(0, 0.0, rate, seed)
    _check_sites(sites, spec)
    _require(_is_number(chunk_s) and chunk_s >= 0.001,
             f"write_live: chunk_s must be at least 0.001 seconds, got {chunk_s!r}")
    models = [_site_model(site, spec, seed) for site in sites]
    for site in sites:
        (Path(out_dir) / site).mkdir(parents=True, exist_ok=True)
    chunk_ms = _ms(chunk_s)
    begin_ms = round(clock() * 1000)
    written = chunk = 0
    while not stop.is_set():
        lo, hi = chunk * chunk_ms, (chunk + 1) * chunk_ms
        ahead_s = (begin_ms + hi) / 1000 - clock()
        if ahead_s > 0:
            stop.wait(ahead_s)  # returns at once when stopped
            continue
        count = _count(rate, hi) - _count(rate, lo)
        for model in models:
            columns = _records(model, spec, seed, chunk, begin_ms + lo, chunk_ms, count,
                               begin_ms)
            path = Path(out_dir) / model.site / f"live-{begin_ms + lo:013d}.csv"
            _write_atomically(path, columns)
            if on_file is not None:
                on_file(path, count)
        written += count * len(models)
        if on_chunk is not None:
            on_chunk(chunk, count * len(models))
        chunk += 1
    return written


# -- the model --------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Catalogue:
    """What every site shares: popularity curves and the domain names."""

    domains: int
    domain_cdf: np.ndarray
    url_cdf: np.ndarray
    client_cdf: np.ndarray
    extra_domains: tuple[str, ...]  # flash crowd domains beyond site1..siteN, coded after them

    def code(self, domain: str) -> int:
        m = _DOMAIN.match(domain)
        if m and 1 <= int(m.group(1)) <= self.domains:
            return int(m.group(1)) - 1
        return self.domains + self.extra_domains.index(domain)

    def name(self, code: int) -> str:
        if code < self.domains:
            return f"site{code + 1}.example.com"  # rank 1 is the most popular domain
        return self.extra_domains[code - self.domains]


@dataclass(frozen=True, eq=False)
class _SiteModel:
    """What stays fixed at one site: its regional popularity order, clients and speed."""

    site: str
    catalogue: _Catalogue
    regional_order: np.ndarray  # the site's own rank -> domain code
    client_ips: np.ndarray  # IPv4 addresses as int64, the busiest first
    speed: float  # latency multiplier: some PoPs are slower than others
    crowds: tuple[tuple[int, int, float, int], ...]  # (start ms, end ms, share, domain code)


@functools.lru_cache(maxsize=8)
def _catalogue(spec: LogSpec) -> _Catalogue:
    extra = dict.fromkeys(c.domain for c in spec.flash_crowds
                          if not ((m := _DOMAIN.match(c.domain))
                                  and 1 <= int(m.group(1)) <= spec.domains))
    return _Catalogue(spec.domains, _zipf_cdf(spec.domains, spec.zipf),
                      _zipf_cdf(spec.urls_per_domain, spec.zipf),
                      _zipf_cdf(spec.clients_per_site, _CLIENT_ZIPF), tuple(extra))


@functools.lru_cache(maxsize=64)
def _site_model(site: str, spec: LogSpec, seed: int) -> _SiteModel:
    rng = _rng(seed, site, 0)
    catalogue = _catalogue(spec)
    regional_order = rng.permutation(spec.domains)
    # Clients come from a few ISP blocks near the PoP, so they share /16 prefixes.
    blocks = max(1, spec.clients_per_site // 256)
    first = rng.choice(_PUBLIC_FIRST_OCTETS, blocks) * 256 + rng.integers(0, 256, blocks)
    n = spec.clients_per_site
    ips = (first[rng.integers(0, blocks, n)] << 16) + rng.integers(0, 256, n) * 256 \
        + rng.integers(1, 255, n)
    crowds = tuple((round(c.start_s * 1000), round(c.end_s * 1000), float(c.share),
                    catalogue.code(c.domain)) for c in spec.flash_crowds if c.site == site)
    return _SiteModel(site, catalogue, regional_order, ips,
                      float(rng.lognormal(0.0, 0.3)), crowds)



def _records(model: _SiteModel, spec: LogSpec, seed: int, part: int, start_ms: int,
             duration_ms: int, n: int, period_start_ms: int) -> dict[str, np.ndarray]:
    """``n`` records arriving in ``[start_ms, start_ms + duration_ms)``; ``part`` picks the
    random stream, so consecutive pieces of one period differ."""
    rng = _rng(seed, model.site, part + 1)
    cat = model.catalogue
    arrival = start_ms + np.floor(np.sort(rng.random(n)) * duration_ms).astype(np.int64)

    rank = _ranks(rng, cat.domain_cdf, n)
    domain = np.where(rng.random(n) < spec.regional, model.regional_order[rank], rank)
    since = arrival - period_start_ms
    for begin, end, share, code in model.crowds:
        surge = (since >= begin) & (since < end) & (rng.random(n) < share)
        domain[surge] = code

    codes = cat.domains + len(cat.extra_domains)
    url_code = domain * spec.urls_per_domain + _ranks(rng, cat.url_cdf, n)
    urls, url_of = _distinct(url_code, codes * spec.urls_per_domain)
    kind = np.searchsorted(_KIND_CDF, _unit(_hash(urls, 3 * seed)), side="right")
    kind = np.minimum(kind, len(_ASSETS) - 1)
    url_names = np.array(
        [f"http://{cat.name(c // spec.urls_per_domain)}/asset/{c % spec.urls_per_domain}"
         f".{_EXT[k]}" for c, k in zip(urls.tolist(), kind.tolist(), strict=True)],
        dtype=object)
    # A URL's size comes from a hash of the URL, so it is the same on every site and run.
    z = np.sqrt(-2 * np.log1p(-_unit(_hash(urls, 3 * seed + 1)))) \
        * np.cos(2 * np.pi * _unit(_hash(urls, 3 * seed + 2)))
    size = np.minimum(_MEDIAN_BYTES[kind] * np.exp(_SIGMA_BYTES[kind] * z), _MAX_BYTES)[url_of]

    status = _STATUS[_ranks(rng, _STATUS_CDF, n)]
    miss = (rng.random(n) >= _HIT_RATIO) | (status >= 500)  # an origin error is never cached
    body = np.select([status == 200, status == 206, status == 304],
                     [size, size * rng.uniform(0.02, 1.0, n), 0.0],
                     default=rng.uniform(100, 1500, n))  # an error page
    nbytes = np.ceil(body).astype(np.int64) + rng.integers(200, 600, n)  # plus headers

    first_byte = rng.lognormal(np.where(miss, math.log(_MISS_MS), math.log(_HIT_MS)),
                               np.where(miss, 0.6, 0.5)) * model.speed
    transfer = nbytes / np.where(miss, _MISS_BYTES_PER_MS, _HIT_BYTES_PER_MS)
    stall = np.where(rng.random(n) < _TAIL_SHARE, _TAIL_MS * (1 + rng.pareto(_TAIL_ALPHA, n)), 0)
    latency = np.round(np.minimum(first_byte + transfer + stall, _TIMEOUT_MS), 2)

    client = _ranks(rng, cat.client_cdf, n)
    # A line is logged when the request ends, stamped with when it began: out of order.
    ts = arrival - np.floor(rng.random(n) * _ms(spec.out_of_order_s)).astype(np.int64)
    ts[rng.random(n) < spec.late_fraction] -= _ms(spec.late_s)

    columns = {
        "ts": ts,
        "pop": np.full(n, model.site, dtype=object),
        "client_ip": _labelled(client, len(cat.client_cdf),
                               lambda i: _dotted(int(model.client_ips[i]))),
        "domain": _labelled(domain, codes, cat.name),
        "url": url_names[url_of],
        "status": status.astype(np.int64),
        "bytes": nbytes,
        "latency_ms": latency,
        "cache": np.where(miss, "MISS", "HIT").astype(object),
    }
    assert tuple(columns) == CDN_LOG_SCHEMA.names
    return columns


# -- helpers ----------------------------------------------------------------------------------

def _zipf_cdf(n: int, exponent: float) -> np.ndarray:
    cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -exponent)
    return cdf / cdf[-1]


def _ranks(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    """``n`` draws of a rank (0 = the likeliest) by inverse CDF."""
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(cdf) - 1)


def _labelled(codes: np.ndarray, bound: int, label: Callable[[int], str]) -> np.ndarray:
    """An object array of ``label(code)`` per code in ``[0, bound)``, calling ``label`` once
    per distinct code."""
    distinct, index = _distinct(codes, bound)
    return np.array([label(c) for c in distinct.tolist()], dtype=object)[index]


def _distinct(codes: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct codes in ``[0, bound)``, and each code's index among them: what
    ``np.unique(codes, return_inverse=True)`` gives, without its sort when ``bound`` is small
    next to the number of codes (a chunk of a million records: three times as fast)."""
    if bound > 4 * len(codes):
        distinct, index = np.unique(codes, return_inverse=True)
        return distinct, index
    seen = np.bincount(codes, minlength=bound) > 0
    return np.flatnonzero(seen), (np.cumsum(seen) - 1)[codes]


def _dotted(ip: int) -> str:
    return f"{ip >> 24}.{ip >> 16 & 255}.{ip >> 8 & 255}.{ip & 255}"


def _hash(keys: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64's finaliser: well-spread uint64s from integer keys (arithmetic wraps)."""
    z = keys.astype(np.uint64) + np.uint64((salt + 1) * 0x9E3779B97F4A7C15 % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _unit(h: np.ndarray) -> np.ndarray:
    """Uniform floats in [0, 1) from hashes."""
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _rng(seed: int, site: str, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(site.encode()), stream])


def _lines(columns: Mapping[str, np.ndarray]) -> str:
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        msg = f"to_csv: columns differ in length ({lengths}); pass the columns of one record set"
        raise DataError(msg)
    cells = [_cells(values) for values in columns.values()]
    n, width = len(cells[0]), 2 * len(cells)
    # Cells and separators interleaved in one list, joined once: the slicing runs in C, about
    # twice as fast as joining a tuple per line.
    flat = [","] * (width * n)
    for i, column in enumerate(cells):
        flat[2 * i::width] = column
    flat[width - 1::width] = ["\n"] * n
    try:
        return "".join(flat)
    except TypeError:  # an object column holding something other than str
        return "".join(map(str, flat))


def _cells(values: np.ndarray) -> list[str]:
    if values.dtype.kind == "f":
        return list(map("{:.2f}".format, values.tolist()))  # 2 decimals, as in a log line
    if values.dtype.kind in "iu" and len(values):
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < len(values) // 8:  # few values (status codes): format each one once
            table = np.array(list(map(str, range(lo, hi + 1))), dtype=object)
            return list(table[values - lo].tolist())
    if values.dtype.kind == "O":
        return list(values.tolist())  # str already, as generate makes them; _lines checks
    return list(map(str, values.tolist()))


def _write_atomically(path: Path, columns: Mapping[str, np.ndarray]) -> None:
    # Hidden and not *.csv: Spark's file source and run_local skip it until the rename.
    temporary = path.with_name(f".{path.name}.tmp")
    n = len(columns["ts"])
    try:
        with temporary.open("wb") as out:
            out.write((",".join(columns) + "\n").encode())
            for lo in range(0, n, _ROWS_PER_WRITE):
                piece = {name: values[lo:lo + _ROWS_PER_WRITE]
                         for name, values in columns.items()}
                out.write(_lines(piece).encode())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _check_period(start_ms: int, duration_s: float, rate: float, seed: int) -> None:
    _require(_is_int(start_ms) and start_ms >= 0,
             f"start_ms must be epoch milliseconds >= 0, got {start_ms!r}")
    _require(_is_number(duration_s) and duration_s >= 0,
             f"duration_s must be seconds >= 0, got {duration_s!r}")
    _require(_is_number(rate) and rate >= 0,
             f"rate must be records per second >= 0, got {rate!r}")
    _require(_is_int(seed) and seed >= 0, f"seed must be a whole number >= 0, got {seed!r}")


def _checked_site(site: str) -> str:
    _require(isinstance(site, str) and bool(_NAME.match(site)),
             f"site {site!r} must be a site name (letters, digits, '.', '-', '_')")
    return site


def _check_sites(sites: Sequence[str], spec: LogSpec) -> None:
    _require(not isinstance(sites, str) and len(sites) > 0,
             f"sites must be a non-empty list of site names, got {sites!r}")
    for site in sites:
        _checked_site(site)
    _require(len(set(sites)) == len(sites), f"sites {list(sites)} name a site twice")
    for crowd in spec.flash_crowds:
        _require(crowd.site in sites,
                 f"flash crowd {crowd.domain}@{crowd.site}: {crowd.site!r} is not among the "
                 f"sites written ({', '.join(sites)})")


def _count(rate: float, ms: int) -> int:
    """Records in the first ``ms`` of a period; pieces of a period add up to the whole."""
    return round(rate * ms / 1000)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
