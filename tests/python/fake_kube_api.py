"""A stand-in Kubernetes API server on loopback, written from the API's documented wire format
(https://kubernetes.io/docs/reference/using-api/api-concepts/), for ditto's pod discovery.

- `GET /api/v1/namespaces/NS/pods?labelSelector=...`: a `PodList` whose
  `metadata.resourceVersion` is the store's current version (equality-based selectors).
- `...&watch=true&resourceVersion=RV`: a chunked stream of JSON lines
  `{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}` with every change after RV
  (a pod leaving the selector arrives as DELETED, entering as ADDED, as the API server filters);
  `BOOKMARK` objects carry only `metadata.resourceVersion` (sent when `allowWatchBookmarks` is
  set). A version older than the last compaction gets an `ERROR` event with a 410 `Status`
  (reason `Expired`) and the stream ends, which the client must answer with a new list.
- InferencePools under `/apis/GROUP/VERSION/namespaces/NS/inferencepools[/NAME]` (get, list and
  watch with `fieldSelector=metadata.name=NAME`), served only for the versions configured.
- Nodes: `GET /api/v1/nodes/NAME` (cluster-scoped) answers a `Node` with its labels (e.g. GPU
  feature discovery's `nvidia.com/gpu.product`), 404 `NotFound` for an unknown node; with
  `forbid_nodes()` every node read gets the API server's 403 for a service account without a
  ClusterRole (`... cannot get resource "nodes" in API group "" at the cluster scope`).
- Pods may carry a container spec (`containers=[{"name", "image", "command", "args",
  "resources": {"limits": {"nvidia.com/gpu": "2"}}}]`, the PodSpec's fields) and a
  `spec.nodeName` (`node=`).
- Lists honour `limit` and `continue` (the continue token is opaque to the client; here the
  offset of the next item), as the API server pages large lists.
- Faults: `fail(kind, code, times)` answers the next requests of a kind with a `Status` of that
  code (403 `Forbidden` with the API server's message, 500 `InternalError`); a kind
  `pods:watch` or `pods:list` fails only watches or only lists; `end_watches()` closes every
  open watch cleanly; `expire(change)` applies a change without a watch event (as if compacted
  away) and sends 410 to every open watch.
- A hostile API server (what a broken or malicious one can send within the same wire format):
  `hostile_watch("long_line", size=N)` (`hostile_pool_watch` for InferencePools) makes the next
  pod watch send N bytes of one event
  with no newline; `hostile_watch("hang")` makes it send half an event and then nothing, held
  open past its `timeoutSeconds`; `leak_namespaces = True` lists and watches pods of every
  namespace, as if the namespace in the path were ignored. `hostile_pool_get(size, times)`
  makes the next `times` GETs of a named InferencePool answer 200 with the object padded to
  `size` bytes (a `Content-Length` body, sent in 1 MiB pieces while the client reads).
"""

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POOL_GROUPS = {"v1": "inference.networking.k8s.io", "v1alpha2": "inference.networking.x-k8s.io"}


def matches(selector, labels):
    """Equality-based label selectors: `k=v`, `k==v`, `k!=v`, comma-joined."""
    if not selector:
        return True
    for requirement in selector.split(","):
        requirement = requirement.strip()
        if "!=" in requirement:
            key, value = requirement.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in requirement:
            key, value = requirement.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif requirement.startswith("!"):
            if requirement[1:] in labels:
                return False
        elif requirement not in labels:
            return False
    return True


def status(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class Store:
    """Objects of one kind with a resourceVersion log."""

    def __init__(self, api):
        self.api = api
        self.objects = {}  # (namespace, name) -> object
        self.log = []  # (rv, old, new)

    def put(self, obj, silent=False):
        meta = obj["metadata"]
        k = (meta["namespace"], meta["name"])
        old = self.objects.get(k)
        rv = self.api.bump()
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(rv)
        obj["metadata"].setdefault("uid", f"uid-{meta['name']}-{rv}")
        self.objects[k] = obj
        if not silent:
            self.log.append((rv, old, obj))
        return obj

    def delete(self, namespace, name, silent=False):
        old = self.objects.pop((namespace, name), None)
        if old is None:
            return
        rv = self.api.bump()
        gone = json.loads(json.dumps(old))
        gone["metadata"]["resourceVersion"] = str(rv)
        if not silent:
            self.log.append((rv, old, None))
        return gone


class FakeKubeApi:
    def __init__(self, pool_versions=("v1",)):
        self.lock = threading.Condition()
        self.rv = 100
        self.compacted = 0
        self.pods = Store(self)
        self.pools = Store(self)
        self.nodes = {}  # name -> Node object
        self.nodes_forbidden = False
        self.pool_versions = pool_versions
        self.faults = {}  # kind -> [code, times]
        self.requests = []  # (kind, query dict)
        self.generation = 0  # bumped to end open watches
        self.expired_generation = 0
        self.hostile = []  # behaviours of the next pod watches
        self.hostile_pools = []  # behaviours of the next InferencePool watches
        self.hostile_pool_gets = []  # sizes of the next InferencePool GETs' answers
        self.leak_namespaces = False
        self.closing = threading.Event()
        handler = make_handler(self)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bump(self):
        self.rv += 1
        return self.rv

    def kubeconfig(self, path, namespace="llm-d"):
        with open(path, "w") as f:
            f.write(
                "apiVersion: v1\nkind: Config\n"
                f"clusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{self.port}\n"
                "users:\n- name: tester\n  user: {}\n"
                f"contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n    namespace: {namespace}\n"
                "current-context: fake\n"
            )
        return path

    # --- pods -----------------------------------------------------------------------------
    def pod(self, name, ip, labels, ready=True, phase="Running", namespace="llm-d", silent=False,
            containers=None, node=None):
        if containers is None:
            containers = [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                           "ports": [{"containerPort": 8200, "protocol": "TCP"}]}]
        obj = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "creationTimestamp": "2026-11-25T10:00:00Z"},
            "spec": {"containers": containers},
            "status": {
                "phase": phase, "podIP": ip, "podIPs": [{"ip": ip}] if ip else [],
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True" if ready else "False"},
                ],
            },
        }
        if not ip:
            del obj["status"]["podIP"]
        if node is not None:
            obj["spec"]["nodeName"] = node
        with self.lock:
            self.pods.put(obj, silent=silent)
            self.lock.notify_all()

    # --- nodes ----------------------------------------------------------------------------
    def node(self, name, labels):
        """A Node with these labels (e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})."""
        with self.lock:
            self.nodes[name] = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels},
                             "resourceVersion": str(self.bump()), "uid": f"uid-node-{name}"},
                "spec": {},
                "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
            }

    def forbid_nodes(self):
        """Every node read answers 403 from now on (no ClusterRole for nodes)."""
        with self.lock:
            self.nodes_forbidden = True

    def delete_pod(self, name, namespace="llm-d", silent=False):
        with self.lock:
            self.pods.delete(namespace, name, silent=silent)
            self.lock.notify_all()

    def pool(self, name, labels, port, namespace="llm-d"):
        with self.lock:
            for version in self.pool_versions:
                if version == "v1":
                    spec = {"selector": {"matchLabels": labels}, "targetPorts": [{"number": port}],
                            "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}}}
                else:
                    spec = {"selector": labels, "targetPortNumber": port,
                            "extensionRef": {"name": f"{name}-epp"}}
                obj = {"apiVersion": f"{POOL_GROUPS[version]}/{version}", "kind": "InferencePool",
                       "metadata": {"name": name, "namespace": namespace}, "spec": spec}
                self.pools.put(obj)
            self.lock.notify_all()

    def bulk_pods(self, names_and_ips, labels, namespace="llm-d"):
        """Many Ready pods at once (each a change with its own resourceVersion)."""
        with self.lock:
            for name, ip in names_and_ips:
                obj = {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace, "labels": labels},
                    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
                    "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                               "conditions": [{"type": "Ready", "status": "True"}]},
                }
                self.pods.put(obj)
            self.lock.notify_all()

    # --- faults ---------------------------------------------------------------------------
    def hostile_watch(self, mode, size=0):
        """The next pod watch misbehaves: `long_line` (size bytes, no newline) or `hang`."""
        with self.lock:
            self.hostile.append((mode, size))

    def hostile_pool_watch(self, mode, size=0):
        """The next InferencePool watch misbehaves (as `hostile_watch`)."""
        with self.lock:
            self.hostile_pools.append((mode, size))

    def hostile_pool_get(self, size, times=1):
        """The next `times` GETs of a named InferencePool answer an object of `size` bytes."""
        with self.lock:
            self.hostile_pool_gets.extend([size] * times)

    def fail(self, kind, code, times):
        with self.lock:
            self.faults[kind] = [code, times]

    def end_watches(self):
        with self.lock:
            self.generation += 1
            self.lock.notify_all()

    def expire(self, change):
        """Applies `change()` (silent changes) and expires every older resourceVersion."""
        with self.lock:
            change()
            self.compacted = self.rv
            self.expired_generation += 1
            self.lock.notify_all()

    def count(self, kind, watch):
        with self.lock:
            return sum(1 for k, q in self.requests if k == kind and (q.get("watch") in ("true", "1")) == watch)

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def make_handler(api):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send_json(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
            parts = url.path.strip("/").split("/")
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                self.get_node(parts[3])
                return
            # /api/v1/namespaces/NS/pods  |  /apis/G/V/namespaces/NS/inferencepools[/NAME]
            if parts[:2] == ["api", "v1"] and len(parts) == 5 and parts[2] == "namespaces" and parts[4] == "pods":
                kind, namespace, store, name = "pods", parts[3], api.pods, None
                select = lambda obj: matches(query.get("labelSelector", ""), obj["metadata"].get("labels", {}))  # noqa: E731
                list_kind = "PodList"
            elif (
                len(parts) in (6, 7) and parts[0] == "apis" and parts[3] == "namespaces" and parts[5] == "inferencepools"
                and parts[2] in api.pool_versions and POOL_GROUPS.get(parts[2]) == parts[1]
            ):
                kind, namespace, store = "inferencepools", parts[4], api.pools
                name = parts[6] if len(parts) == 7 else None
                version = parts[2]
                field = query.get("fieldSelector", "")
                wanted = field.split("=", 1)[1] if field.startswith("metadata.name=") else None
                select = lambda obj: obj["apiVersion"].endswith("/" + version) and (  # noqa: E731
                    wanted is None or obj["metadata"]["name"] == wanted)
                list_kind = "InferencePoolList"
            else:
                self.send_json(404, status(404, "NotFound", "the server could not find the requested resource"))
                return
            watching = query.get("watch") in ("true", "1")
            with api.lock:
                api.requests.append((kind, query))
                code = None
                for key in (f"{kind}:{'watch' if watching else 'list'}", kind):
                    fault = api.faults.get(key)
                    if fault and fault[1] > 0:
                        fault[1] -= 1
                        code = fault[0]
                        break
            if code == 403:
                self.send_json(403, status(403, "Forbidden",
                    f'{kind} is forbidden: User "system:serviceaccount:{namespace}:ditto" cannot '
                    f'{"watch" if query.get("watch") else "list"} resource "{kind}" in API group "" in the namespace "{namespace}"'))
                return
            if code is not None:
                self.send_json(code, status(code, "InternalError", "Internal error occurred: etcdserver: request timed out"))
                return
            if name is not None:
                with api.lock:
                    obj = store.objects.get((namespace, name))
                    found = obj is not None and select(obj)
                    padded = api.hostile_pool_gets.pop(0) if found and kind == "inferencepools" and api.hostile_pool_gets else None
                if padded is not None:
                    self.send_padded(obj, padded)
                elif not found:
                    self.send_json(404, status(404, "NotFound", f'{kind}.{parts[1]} "{name}" not found'))
                else:
                    self.send_json(200, obj)
                return
            if query.get("watch") in ("true", "1"):
                self.watch(store, namespace, select, query)
                return
            with api.lock:
                leak = api.leak_namespaces and kind == "pods"
                items = [o for (ns, _), o in sorted(store.objects.items()) if (ns == namespace or leak) and select(o)]
                metadata = {"resourceVersion": str(api.rv)}
                offset = int(query.get("continue") or 0)
                limit = int(query.get("limit") or 0)
                if limit > 0:
                    if offset + limit < len(items):
                        metadata["continue"] = str(offset + limit)
                    items = items[offset:offset + limit]
                body = {"kind": list_kind, "apiVersion": "v1", "metadata": metadata, "items": items}
            self.send_json(200, body)

        def send_padded(self, obj, size):
            """`obj` with a string field that brings the body to `size` bytes."""
            head = json.dumps(obj).encode()[:-1] + b', "padding": "'
            tail = b'"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            piece = b"x" * (1 << 20)
            left = size - len(head) - len(tail)
            try:
                self.wfile.write(head)
                while left > 0 and not api.closing.is_set():
                    self.wfile.write(piece[:left])
                    left -= len(piece)
                self.wfile.write(tail)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def get_node(self, name):
            with api.lock:
                api.requests.append(("nodes", {"name": name}))
                forbidden, obj = api.nodes_forbidden, api.nodes.get(name)
            if forbidden:
                self.send_json(403, status(403, "Forbidden",
                    f'nodes "{name}" is forbidden: User "system:serviceaccount:llm-d:ditto" cannot '
                    'get resource "nodes" in API group "" at the cluster scope'))
            elif obj is None:
                self.send_json(404, status(404, "NotFound", f'nodes "{name}" not found'))
            else:
                self.send_json(200, obj)

        def chunk(self, obj):
            data = (json.dumps(obj) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def watch(self, store, namespace, select, query):
            since = int(query.get("resourceVersion") or 0)
            bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
            timeout = float(query.get("timeoutSeconds") or 290)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            deadline = time.monotonic() + timeout
            with api.lock:
                generation, expired = api.generation, api.expired_generation
                gone = since < api.compacted and since != 0
                hostile = api.hostile.pop(0) if api.hostile and store is api.pods else None
                if api.hostile_pools and store is api.pools:
                    hostile = api.hostile_pools.pop(0)
                leak = api.leak_namespaces and store is api.pods
            try:
                if hostile is not None:
                    self.misbehave(*hostile)
                    return
                if gone:
                    self.chunk({"type": "ERROR", "object": status(410, "Expired",
                               f"too old resource version: {since} ({api.compacted})")})
                    self.wfile.write(b"0\r\n\r\n")
                    return
                cursor = since
                if bookmarks:
                    with api.lock:
                        rv = api.rv
                    self.chunk({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(max(cursor, since))}}})
                while time.monotonic() < deadline:
                    with api.lock:
                        pending = [(rv, old, new) for rv, old, new in store.log if rv > cursor]
                        if not pending:
                            api.lock.wait(timeout=0.2)
                        ended = api.generation != generation
                        expired_now = api.expired_generation != expired
                    for rv, old, new in pending:
                        cursor = rv
                        obj = new if new is not None else old
                        if obj["metadata"]["namespace"] != namespace and not leak:
                            continue
                        was, now = old is not None and select(old), new is not None and select(new)
                        if new is None:
                            gone_obj = json.loads(json.dumps(old))
                            gone_obj["metadata"]["resourceVersion"] = str(rv)
                            if was:
                                self.chunk({"type": "DELETED", "object": gone_obj})
                        elif was and now:
                            self.chunk({"type": "MODIFIED", "object": new})
                        elif now:
                            self.chunk({"type": "ADDED", "object": new})
                        elif was:
                            self.chunk({"type": "DELETED", "object": new})
                    if expired_now:
                        self.chunk({"type": "ERROR", "object": status(410, "Expired",
                                   f"too old resource version: {cursor} ({api.compacted})")})
                        break
                    if ended:
                        break
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def misbehave(self, mode, size):
            """One event that never ends (`long_line`), or half of one and silence (`hang`)."""
            if mode == "long_line":
                head = b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"'
                self.wfile.write(b"%x\r\n%s\r\n" % (len(head), head))
                piece = b"x" * (1 << 20)
                sent = len(head)
                while sent < size and not api.closing.is_set():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    sent += len(piece)
                self.wfile.flush()
                api.closing.wait(60)
            elif mode == "hang":
                half = b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"na'
                self.wfile.write(b"%x\r\n%s\r\n" % (len(half), half))
                self.wfile.flush()
                api.closing.wait(600)

    return Handler
