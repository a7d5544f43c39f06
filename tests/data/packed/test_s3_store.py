"""S3Store against a real S3 API: a moto server this module starts on 127.0.0.1 (as s3fs's tests do), no mocks.

A TCP proxy of the test's own stands between the store and the server where a test needs the network to fail: it
cuts a download short, or stops answering.
"""

import contextlib
import http.client
import logging
import multiprocessing
import os
import pickle
import random
import socket
import subprocess
import sys
import threading
import time
import uuid

import boto3
import pytest

from kfast.data.packed import _s3_retry
from kfast.data.packed.s3_store import S3Store

pytestmark = pytest.mark.timeout(120)

SECRET = "kfast-TEST-secret-9f8e7d6c5b4a"  # distinctive, so that a leak anywhere is found by a plain search
KEY_ID = "KFASTTESTKEYID0000"
SHARD = 10_000  # bytes; three shards are 30 kB
NAMES = ["shard-00000.array_record", "shard-00001.array_record", "shard-00002.array_record"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log_path, "wb") as log:  # a file, not a pipe: the server logs every request, and a full pipe stalls it
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                pytest.fail(f"the moto server ended with status {server.returncode}:\n{log_path.read_text()}")
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)  # no proxy from the environment
            try:
                connection.request("GET", "/")
                connection.getresponse().read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the moto server did not answer on port {port} in 60 s:\n{log_path.read_text()}")
                time.sleep(0.1)
            finally:
                connection.close()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(autouse=True)
def aws_env(endpoint, monkeypatch, tmp_path):
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "HTTP_PROXY", "HTTPS_PROXY",
                 "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))  # this machine's own config stays out
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _shard(seed):
    return random.Random(seed).randbytes(SHARD)


@pytest.fixture
def pack():
    """A fresh bucket holding kfast-pack.json and three 10 kB shards under `pack/`; yields (uri, boto3 client)."""
    client = boto3.client("s3")
    bucket = f"kfast-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="pack/kfast-pack.json", Body=b'{"shards": 3}')
    for i, name in enumerate(NAMES):
        client.put_object(Bucket=bucket, Key=f"pack/{name}", Body=_shard(i))
    client.put_object(Bucket=bucket, Key="pack/nested/other.bin", Body=b"not a shard of this pack")
    yield f"s3://{bucket}/pack", client
    client.close()


@pytest.fixture
def store_of(tmp_path):
    """Makes stores on one cache folder and closes them after the test."""
    stores = []

    def make(uri, **kwargs):
        stores.append(S3Store(uri, cache_dir=str(tmp_path / "cache"), **kwargs))
        return stores[-1]

    yield make
    for store in stores:
        store.close()


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _shards_in(folder):
    return {n: os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if not n.startswith(".")}


def test_local_path_gives_the_uploaded_bytes_and_read_text_the_text(pack, store_of, tmp_path):
    uri, _ = pack
    store = store_of(uri)
    assert store.read_text("kfast-pack.json") == '{"shards": 3}'
    for i, name in enumerate(NAMES):
        path = store.local_path(name)
        assert path.startswith(str(tmp_path / "cache")) and path.endswith(name)
        assert _read(path) == _shard(i)
    assert (store.stats.downloads, store.stats.bytes_downloaded, store.stats.evictions) == (3, 3 * SHARD, 0)
    assert repr(store) == f"S3Store({uri!r})"


def test_a_second_local_path_is_a_cache_hit(pack, store_of):
    store = store_of(pack[0])
    first = store.local_path(NAMES[0])
    assert store.local_path(NAMES[0]) == first
    assert (store.stats.downloads, store.stats.cache_hits) == (1, 1)


def test_the_cache_keeps_within_its_budget_evicting_the_least_recently_used(pack, store_of):
    store = store_of(pack[0], cache_bytes=int(2.5 * SHARD))
    a = store.local_path(NAMES[0])
    b = store.local_path(NAMES[1])
    assert store.local_path(NAMES[0]) == a  # now shard 1 is the least recently used
    c = store.local_path(NAMES[2])
    folder = os.path.dirname(a)
    assert store.stats.evictions == 1 and not os.path.exists(b) and os.path.exists(a) and os.path.exists(c)
    assert sum(_shards_in(folder).values()) <= store.cache_bytes
    assert _read(store.local_path(NAMES[1])) == _shard(1)  # evicted: fetched again, and shard 0 goes
    assert (store.stats.downloads, store.stats.evictions) == (4, 2) and not os.path.exists(a)
    assert sum(_shards_in(folder).values()) <= store.cache_bytes


def test_a_shard_over_the_whole_budget_is_still_handed_out(pack, store_of):
    store = store_of(pack[0], cache_bytes=SHARD // 2)
    for i, name in enumerate(NAMES):
        assert _read(store.local_path(name)) == _shard(i)
    assert len(_shards_in(os.path.dirname(store.local_path(NAMES[2])))) == 1


def test_a_new_store_on_the_same_cache_downloads_only_what_changed(pack, store_of):
    uri, client = pack
    first = store_of(uri)
    paths = [first.local_path(name) for name in NAMES]
    again = store_of(uri)
    assert [again.local_path(name) for name in NAMES] == paths
    assert (again.stats.downloads, again.stats.cache_hits) == (0, 3)

    changed = bytes(reversed(_shard(1)))  # the same size: only the ETag tells it apart
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    client.put_object(Bucket=bucket, Key=f"{prefix}/{NAMES[1]}", Body=changed)
    later = store_of(uri)
    assert [_read(later.local_path(name)) for name in NAMES] == [_shard(0), changed, _shard(2)]
    assert later.stats.downloads == 1
    assert len(_shards_in(os.path.dirname(paths[0]))) == 3  # the old version of shard 1 is gone


def test_prefetched_shards_are_read_with_no_download_and_fetched_once(pack, store_of):
    store = store_of(pack[0])
    store.prefetch(NAMES)
    store.prefetch(NAMES[1:])  # overlapping names queue nothing twice
    deadline = time.monotonic() + 30
    while store.stats.downloads < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    store.prefetch(NAMES)
    time.sleep(0.2)  # a duplicate download, if any, would show now
    assert (store.stats.downloads, store.stats.cache_hits) == (3, 0)
    assert [_read(store.local_path(name)) for name in NAMES] == [_shard(i) for i in range(3)]
    assert (store.stats.downloads, store.stats.cache_hits) == (3, 3)


def test_local_path_waits_for_a_prefetch_of_the_same_shard_under_way(pack, store_of):
    store = store_of(pack[0])
    store.prefetch(NAMES)
    assert [_read(store.local_path(name)) for name in NAMES] == [_shard(i) for i in range(3)]
    assert store.stats.downloads == 3


def test_a_missing_shard_or_bucket_fails_at_once_naming_it(pack, store_of):
    uri, _ = pack
    with pytest.raises(FileNotFoundError, match=f"{uri}/shard-99999.array_record: S3 answered"):
        store_of(uri).local_path("shard-99999.array_record")
    with pytest.raises(FileNotFoundError, match="s3://kfast-no-such-bucket/pack/x: S3 answered NoSuchBucket"):
        store_of("s3://kfast-no-such-bucket/pack").local_path("x")
    with pytest.raises(FileNotFoundError, match="s3://kfast-no-such-bucket/pack/x"):
        store_of("s3://kfast-no-such-bucket/pack").read_text("x")


def test_bad_arguments_say_what_was_expected(store_of):
    with pytest.raises(ValueError, match="got uri='/data/pack'; it must be s3://bucket/prefix"):
        S3Store("/data/pack")
    with pytest.raises(ValueError, match="got cache_bytes=0; it must be a positive int"):
        S3Store("s3://b/p", cache_bytes=0)
    with pytest.raises(ValueError, match="got shard name 'a/b'"):
        store_of("s3://b/p").local_path("a/b")


class _Proxy:
    """A TCP proxy to the moto server that cuts the next `cuts` responses to `GET <path>` short, or stops."""

    def __init__(self, endpoint):
        self._target = int(endpoint.rsplit(":", 1)[1])
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.path, self.cuts, self._lock, self._sockets = b"", 0, threading.Lock(), []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        with contextlib.suppress(OSError):  # the listener closed: stop()
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self._target))
                self._sockets += [client, upstream]
                cut = threading.Event()
                threading.Thread(target=self._requests, args=(client, upstream, cut), daemon=True).start()
                threading.Thread(target=self._responses, args=(upstream, client, cut), daemon=True).start()

    def _requests(self, client, upstream, cut):
        while data := _recv(client):
            with self._lock:
                if self.cuts and data.startswith(b"GET " + self.path):
                    self.cuts -= 1
                    cut.set()
            upstream.sendall(data)

    def _responses(self, upstream, client, cut):
        seen = b""
        while data := _recv(upstream):
            if not cut.is_set():
                client.sendall(data)
                continue
            seen += data
            head = seen.find(b"\r\n\r\n")
            if head >= 0 and len(seen) > head + 4 + 1000:
                client.sendall(seen[:head + 4 + 1000])  # the headers and 1000 bytes of the body, then nothing
                break
        self.stop(client, upstream)

    def stop(self, *sockets):
        for s in sockets or [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def _recv(s):
    try:
        return s.recv(1 << 16)
    except OSError:
        return b""


@pytest.fixture
def proxy(endpoint, monkeypatch):
    proxy = _Proxy(endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    yield proxy
    proxy.stop()


def test_a_download_cut_short_is_tried_again(pack, store_of, proxy):
    uri, _ = pack
    proxy.path, proxy.cuts = f"/{uri[len('s3://'):]}/{NAMES[1]}".encode(), 1
    store = store_of(uri)
    assert _read(store.local_path(NAMES[1])) == _shard(1)
    assert proxy.cuts == 0 and (store.stats.downloads, store.stats.retries) == (1, 1)
    assert not [n for n in os.listdir(os.path.dirname(store.local_path(NAMES[1]))) if n.startswith(".part-")]


def test_a_server_that_stops_answering_fails_within_bound_naming_the_key_and_attempts(pack, store_of, proxy,
                                                                                      monkeypatch):
    monkeypatch.setattr(_s3_retry, "ATTEMPTS", 2)
    monkeypatch.setattr(_s3_retry, "BOTOCORE_ATTEMPTS", 2)
    monkeypatch.setattr(_s3_retry, "BACKOFF_S", 0.05)
    uri, _ = pack
    store = store_of(uri)
    assert _read(store.local_path(NAMES[0])) == _shard(0)
    proxy.stop()
    start = time.monotonic()
    with pytest.raises(OSError, match=f"could not read {uri}/{NAMES[1]} in 2 attempts, each of up to 2 requests"):
        store.local_path(NAMES[1])
    assert time.monotonic() - start < 15
    assert store.stats.retries == 1


def test_the_store_pickles_as_its_settings_and_works_in_another_process(pack, store_of):
    store = store_of(pack[0], cache_bytes=10 * SHARD)
    store.local_path(NAMES[0])
    data = pickle.dumps(store)
    assert SECRET.encode() not in data and KEY_ID.encode() not in data
    copy = pickle.loads(data)
    assert (copy.uri, copy.cache_bytes, copy.stats.downloads) == (store.uri, store.cache_bytes, 0)
    assert copy.local_path(NAMES[0]) == store.local_path(NAMES[0]) and copy.stats.cache_hits == 1
    child = ("import pickle, sys\n"
             "store = pickle.loads(sys.stdin.buffer.read())\n"
             "paths = [store.local_path(n) for n in sys.argv[1:]]\n"
             "print(store.stats.downloads, store.stats.cache_hits, *paths)\n")
    run = subprocess.run([sys.executable, "-c", child, *NAMES[:2]], input=data, capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr.decode()
    downloads, hits, first, second = run.stdout.decode().split()
    assert (downloads, hits, first) == ("1", "1", store.local_path(NAMES[0]))
    assert _read(second) == _shard(1)


def _in_a_forked_child(store, parent_client, answers):
    path = store.local_path(NAMES[2])
    answers.put((store._s3 is not parent_client and store._s3 is not None, store.stats.downloads, path))


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12's
def test_a_forked_child_makes_its_own_client(pack, store_of):
    store = store_of(pack[0])
    store.local_path(NAMES[0])
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_in_a_forked_child, args=(store, store._s3, answers))
    child.start()
    own_client, downloads, path = answers.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and own_client and downloads == 1 and _read(path) == _shard(2)
    assert store.stats.downloads == 1  # the parent's counts are its own


def _read_all(store, order, answers):
    answers.put([_read(store.local_path(name)) == _shard(NAMES.index(name)) for name in order])


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12's
def test_processes_sharing_a_cache_folder_each_get_whole_shards(pack, store_of):
    store = store_of(pack[0])
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    children = [context.Process(target=_read_all, args=(store, order, answers)) for order in [NAMES, NAMES[::-1]] * 2]
    for child in children:
        child.start()
    results = [answers.get(timeout=60) for _ in children]
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0] * 4 and results == [[True] * 3] * 4
    folder = os.path.dirname(store.local_path(NAMES[0]))
    assert store.stats.downloads == 0 and len(_shards_in(folder)) == 3
    assert not [n for n in os.listdir(folder) if n.startswith(".part-")]


def test_credentials_appear_in_no_message_repr_pickle_or_log(pack, store_of, proxy, monkeypatch, caplog, capfd):
    monkeypatch.setattr(_s3_retry, "ATTEMPTS", 2)
    monkeypatch.setattr(_s3_retry, "BOTOCORE_ATTEMPTS", 2)
    monkeypatch.setattr(_s3_retry, "BACKOFF_S", 0.01)
    caplog.set_level(logging.DEBUG, logger="kfast")
    uri, _ = pack
    texts = []
    for store, name in [(store_of(uri), "missing"), (store_of("s3://kfast-no-such-bucket/p"), "x")]:
        texts.append(repr(store))
        with pytest.raises(OSError) as error:
            store.local_path(name)
        texts += [str(error.value), repr(error.value), str(error.value.__cause__),
                  pickle.dumps(store).decode("latin-1")]
    store = store_of(uri)
    store.local_path(NAMES[0])
    proxy.stop()
    with pytest.raises(OSError) as error:
        store.local_path(NAMES[1])
    texts += [str(error.value), str(error.value.__cause__), caplog.text, *capfd.readouterr()]
    assert "trying again" in caplog.text  # the retries were logged, and are searched
    for text in texts:
        assert SECRET not in text and KEY_ID not in text


def test_a_packed_dataset_trains_from_the_bucket_through_loader_processes(tmp_path):
    """The whole road: `kfast pack` locally, upload, PackedDataset("s3://...") read by FastLoader's workers, a window
    of shards at a time; every sample once per epoch; a second epoch downloads nothing more. Worker threads: the
    loader's fork server may have started before this test set the server's credentials in the environment."""
    import numpy as np

    from kfast.data import FastLoader, PackedDataset
    from kfast.data import pack as pack_data

    x = np.arange(300, dtype="int64").reshape(300, 1)
    local = pack_data((x, x[:, 0] % 3), str(tmp_path / "local"), shard_size=50, verbose=0)
    client = boto3.client("s3")
    bucket = f"kfast-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    for name in sorted(os.listdir(local)):
        client.upload_file(os.path.join(local, name), bucket, f"data/{name}")
    client.close()
    cache = tmp_path / "cache"
    data = PackedDataset(f"s3://{bucket}/data", batch_size=20, seed=5, shuffle_window=2, cache_dir=str(cache))
    with FastLoader(data, training=True, workers=2, use_multiprocessing=False) as loader:
        for _ in range(2):
            seen = sorted(int(v) for xb, _ in loader for v in xb[:, 0])
            assert seen == list(range(300))
    cached = [p for p in cache.rglob("*.array_record")]
    assert len(cached) == 6  # each shard downloaded once, kept for the next run
